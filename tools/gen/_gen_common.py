"""What the generators of tools/gen/ share: where the repository is, the one
CUDA header search, the --nvcc/--check arguments, and their one tail (write
the outputs, or check that the committed ones are current).

Each generator puts this folder first on sys.path and imports it, so that it
runs as a script (python3 tools/gen/NAME.py) and loads by path (the tests).
Standard library only; Python 3.9+.
"""
import difflib
import importlib.util
import shutil
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parent.parent.parent
CHECK_HELP = "do not write; exit 1 if an output differs from what would be generated"


def name_of(path):
    """A path as the repository names it (tools/gen/cuda_api.py)."""
    p = Path(path).resolve()
    try:
        return p.relative_to(REPO_ROOT).as_posix()
    except ValueError:
        return str(path)


def header_search():
    """cuda_debug/_cuda_headers.py (the one CUDA header search), loaded by
    path: the package need not be built or importable."""
    spec = importlib.util.spec_from_file_location(
        "_cuda_headers", REPO_ROOT / "cuda_debug" / "_cuda_headers.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def nvcc_arguments(parser):
    """--nvcc PATH and --check, for the generators that compile device code."""
    parser.add_argument("--nvcc", default=shutil.which("nvcc") or "/usr/local/cuda/bin/nvcc")
    parser.add_argument("--check", action="store_true", help=CHECK_HELP)


def c_header(comments, guard, body):
    """A generated C header's text: its comment lines, then `body` (lines)
    inside the include guard `guard`."""
    lines = list(comments) + ["#ifndef " + guard, "#define " + guard, ""]
    return "\n".join(lines + list(body) + ["", "#endif"]) + "\n"


def finish(tool, outputs, check, stamp="", detail=""):
    """The tail of every generator. outputs: [(path, text)]. With check,
    write nothing: 0 when every path holds its text, else 1 with the start of
    a diff on stdout. Else write each (UTF-8, LF) and say so (detail: what
    was written; stamp: the versions it was made from). Returns the exit
    status."""
    tool = name_of(tool)
    if check:
        return max(_check(Path(p), text, tool, stamp) for p, text in outputs)
    for p, text in outputs:
        p = Path(p)
        p.parent.mkdir(parents=True, exist_ok=True)
        with open(p, "w", encoding="utf-8", newline="\n") as f:
            f.write(text)
        print("wrote %s%s" % (p, ": " + detail if detail else " (%s)" % stamp if stamp else ""))
    return 0


def _check(path, text, tool, stamp, max_lines=40):
    old = path.read_text(encoding="utf-8") if path.is_file() else ""
    versions = " (%s)" % stamp if stamp else ""
    if old == text:
        print("%s: up to date%s" % (path, versions))
        return 0
    if not old:
        print("%s: missing; run %s to create it%s" % (path, tool, versions))
        return 1
    diff = list(difflib.unified_diff(old.splitlines(), text.splitlines(), "%s (on disk)" % path,
                                     "generated", lineterm="", n=1))
    changed = sum(1 for d in diff if d[:1] in "+-" and d[:3] not in ("+++", "---"))
    print("%s: out of date (%d lines differ); run %s to regenerate%s"
          % (path, changed, tool, versions))
    for line in diff[:max_lines]:
        print(line)
    if len(diff) > max_lines:
        print("... (%d more diff lines)" % (len(diff) - max_lines))
    return 1
