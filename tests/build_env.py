"""An interpreter that can run ``setup.py`` of this checkout.

pip builds cuda_debug in an isolated environment holding pyproject.toml's
``[build-system] requires`` (setuptools >= 77, NumPy), whatever the venv has:
a fresh venv has setuptools 65 (Python 3.10, 3.11) or none (3.12+). The tests
that run ``setup.py`` themselves (build_py, build_ext with a missing compiler)
and ``.ci/sanitize.sh`` (build_ext --inplace with the sanitizers) need the same:
``python()`` returns this interpreter when it already meets the requirements
(a machine with no package index, where the install used
``--no-build-isolation``), else the Python of a venv made for them, once, and
kept in the temp dir (keyed by interpreter and requirements).

    python3 tests/build_env.py      # prints that interpreter's path

Standard library only (and pip, to fill the venv)."""
import hashlib
import os
import re
import shutil
import subprocess
import sys
import tempfile

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


class Unavailable(Exception):
    """The build requirements cannot be had here (no package index): why."""


def requirements(root=ROOT):
    """pyproject.toml's [build-system] requires, as written."""
    text = open(os.path.join(root, "pyproject.toml"), encoding="utf-8").read()
    m = re.search(r"^\[build-system\][^\[]*?^requires\s*=\s*\[(.*?)\]", text, re.S | re.M)
    if not m:
        raise Unavailable("no [build-system] requires in %s/pyproject.toml" % root)
    return re.findall(r"\"([^\"]+)\"", m.group(1))


def _version(text):
    return tuple(int(x) for x in re.findall(r"\d+", text)[:3])


def met(reqs, python=sys.executable):
    """Whether `python` has every requirement (``name>=version`` or a bare name)."""
    code = ("import sys, importlib.metadata as m\n"
            "for name in sys.argv[1:]:\n"
            "    try: print(m.version(name))\n"
            "    except m.PackageNotFoundError: print('-')\n")
    names = [re.split(r"[<>=!~ ;\[]", r, maxsplit=1)[0] for r in reqs]
    p = subprocess.run([python, "-c", code] + names, capture_output=True, text=True, timeout=60)
    if p.returncode:
        return False
    for req, have in zip(reqs, p.stdout.split()):
        if have == "-":
            return False
        m = re.search(r">=\s*([\d.]+)", req)
        if m and _version(have) < _version(m.group(1)):
            return False
    return True


def python(root=ROOT):
    """This interpreter if it meets the build requirements, else a venv's that does."""
    reqs = requirements(root)
    if met(reqs):
        return sys.executable
    key = hashlib.sha256(("%s\0%s\0%s" % (os.path.realpath(sys.executable), sys.version,
                                           "\0".join(reqs))).encode()).hexdigest()[:16]
    home = os.path.join(tempfile.gettempdir(), "cuda_debug_buildenv_%s" % key)
    exe = os.path.join(home, "bin", "python")
    if os.path.exists(exe) and met(reqs, exe):
        return exe
    if os.path.islink(home) and not os.path.exists(exe):      # its venv was cleaned away
        os.unlink(home)
    work = tempfile.mkdtemp(prefix="cuda_debug_buildenv_tmp_")
    try:
        # The venv is made where it will stay (a venv cannot be moved): in `work`,
        # then published with a rename under a name that says where it lives.
        venv = os.path.join(work, "env")
        subprocess.run([sys.executable, "-m", "venv", venv], check=True, capture_output=True,
                       timeout=300)
        p = subprocess.run([os.path.join(venv, "bin", "python"), "-m", "pip", "install", "-q",
                            "--disable-pip-version-check"] + reqs,
                           capture_output=True, text=True, timeout=600)
        if p.returncode:
            raise Unavailable("pip could not install the build requirements %s (no package "
                              "index?): %s" % (" ".join(reqs), (p.stderr or p.stdout)[-500:]))
        final = os.path.join(work, "published")
        os.symlink(venv, final)
        try:
            os.rename(final, home)                   # atomic: concurrent sessions race harmlessly
        except OSError:
            if not (os.path.exists(exe) and met(reqs, exe)):
                raise
            shutil.rmtree(work, ignore_errors=True)
            return exe
    except BaseException:
        shutil.rmtree(work, ignore_errors=True)
        raise
    return exe


if __name__ == "__main__":
    try:
        print(python(sys.argv[1] if len(sys.argv) > 1 else ROOT))
    except Unavailable as e:
        sys.exit("build_env: %s" % e)
