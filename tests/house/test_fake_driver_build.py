"""How the fake CUDA driver (tests/fake_cuda/) is built: from the project's own
declarations (csrc/base/cuda_api.h), never from a CUDA toolkit's headers, so
that the fake-driver tests run where no toolkit is installed, as the package
builds there (.ci/run runs the whole suite with /usr/local/cuda* hidden)."""
import os
import re
import shutil
import subprocess
import sys

import pytest

import fake_cuda


def _cc():
    cc = fake_cuda.compiler()
    if not cc:
        pytest.skip("no C compiler")
    return cc


def _included(cc, source):
    """Every header the compiler opens for `source`, with the fakes' flags (-H)."""
    p = subprocess.run([cc] + fake_cuda.cflags() + ["-fsyntax-only", "-H",
                                                    os.path.join(fake_cuda.HERE, source)],
                       capture_output=True, text=True, timeout=120)
    assert p.returncode == 0, p.stderr
    return [os.path.realpath(m.group(1)) for m in re.finditer(r"^\.+ (\S+)$", p.stderr, re.M)]


@pytest.mark.parametrize("source", list(fake_cuda.LIBCUDA_SOURCES) + ["fake_cupti.c"])
def test_the_fakes_include_the_projects_declarations_and_no_cuda_header(source):
    cc = _cc()
    headers = _included(cc, source)
    assert os.path.realpath(fake_cuda.CUDA_API_H) in headers
    cuda = [h for h in headers if re.match(r"(cuda|cupti|cublas)\w*\.h$", os.path.basename(h))
            and os.path.realpath(os.path.dirname(h)) != os.path.realpath(fake_cuda.CSRC + "/base")]
    assert cuda == []
    toolkit = [os.path.realpath(d) + os.sep for d in fake_cuda.cuda_include_dirs() or []]
    assert [h for h in headers if h.startswith(tuple(toolkit))] == []


def test_the_fakes_build_with_the_toolkit_hidden(tmp_path):
    """In a private mount namespace whose /usr/local/cuda* are empty folders
    (as .ci/install_without_toolkit.sh hides them)."""
    cc = _cc()
    if not shutil.which("unshare") or subprocess.run(["unshare", "-rm", "true"],
                                                     capture_output=True).returncode:
        pytest.skip("no private mount namespace here (unshare -rm)")
    hide = " ".join("mount --bind %s %s;" % (tmp_path / "empty", os.path.realpath(d))
                    for d in sorted({os.path.realpath(p) for p in _toolkits()}))
    (tmp_path / "empty").mkdir()
    out = tmp_path / "out"
    out.mkdir()
    cmds = fake_cuda.commands(cc, str(out))
    script = "set -e; %s test ! -e /usr/local/cuda/include/cuda.h; %s" % (
        hide, " && ".join(" ".join("'%s'" % a for a in c) for c in cmds))
    p = subprocess.run(["unshare", "-rm", "bash", "-c", script], capture_output=True, text=True,
                       timeout=300)
    assert p.returncode == 0, p.stderr[-3000:]
    assert (out / fake_cuda.LIBCUDA).is_file() and (out / fake_cuda.LIBCUPTI).is_file()


def _toolkits():
    import glob
    return [d for d in glob.glob("/usr/local/cuda*") if os.path.isdir(d)]


def test_callback_ids_come_from_the_projects_header_and_match_cupti():
    ids = fake_cuda.cbids()
    assert ids["cuLaunchKernel"] == 307
    assert {"cuStreamBeginCaptureToGraph", "cuGraphLaunch", "cuLaunchKernelEx"} <= set(ids)
    for d in fake_cuda.cuda_include_dirs() or []:          # where a toolkit is: the same numbers
        path = os.path.join(d, "cupti_driver_cbid.h")
        if os.path.exists(path):
            real = dict((m.group(1), int(m.group(2))) for m in re.finditer(
                r"CUPTI_DRIVER_TRACE_CBID_(\w+)\s*=\s*(\d+)", open(path).read()))
            assert {k: real[k] for k in ids} == ids
            break


def test_a_missing_declaration_is_named_with_the_fix(tmp_path, monkeypatch):
    """A fake naming a CUDA function cuda_api.h lacks: the build says which
    generator to rerun."""
    here = tmp_path / "fake_cuda"
    shutil.copytree(fake_cuda.HERE, here, ignore=shutil.ignore_patterns("__pycache__"))
    with open(here / "fake_cuda.c", "a") as f:
        f.write("\nCUresult CUDAAPI cuTheFutureApi(CUdevice d) { return cuNoSuchThing(d); }\n")
    monkeypatch.setattr(fake_cuda, "HERE", str(here))
    monkeypatch.setattr(fake_cuda, "_digest", lambda cc: "test_%d" % os.getpid())
    monkeypatch.setattr(fake_cuda.tempfile, "gettempdir", lambda: str(tmp_path))
    with pytest.raises(RuntimeError, match=r"(?s)cuNoSuchThing.*Rerun tools/gen/cuda_api.py"):
        fake_cuda.build()
    assert sys.modules["fake_cuda"] is fake_cuda


def test_the_fake_drivers_shared_helpers_are_not_exported():
    """The fake libcuda.so.1 is one file per API area over fake_driver.h: what
    the areas share (state, helpers) is hidden, so that a process that preloads
    the fake (RTLD_GLOBAL) finds no `enqueue` or `sticky` of ours in place of
    its own; the CUDA API and the control functions are exported."""
    out = fake_cuda.build()
    code = ("import ctypes, sys\nlib = ctypes.CDLL(sys.argv[1])\n"
            "print(' '.join(n for n in sys.argv[2:] if hasattr(lib, n)))\n")
    names = ["enqueue", "resolve", "traced", "sticky", "dev_lock", "logret", "now_ms",
             "cuLaunchKernel", "cuStreamSynchronize", "fake_set_kernel", "fakecuda_initialised"]
    p = subprocess.run([sys.executable, "-c", code, os.path.join(out, fake_cuda.LIBCUDA)] + names,
                       capture_output=True, text=True, timeout=60)
    assert p.returncode == 0, p.stderr
    assert p.stdout.split() == ["cuLaunchKernel", "cuStreamSynchronize", "fake_set_kernel",
                                "fakecuda_initialised"], p.stdout
