#!/usr/bin/env bash
# The sdist, built and installed where no CUDA toolkit can be seen, as a
# PyTorch user has it (NVIDIA's runtime wheels at most, no /usr/local/cuda):
#   - a private mount namespace (`unshare -rm`: a user namespace, no root
#     needed where the kernel allows unprivileged ones; `unshare -m` as root)
#     bind-mounts an empty folder over every /usr/local/cuda* folder;
#   - a fresh venv (no NVIDIA wheel in it), CUDA_HOME, CUDA_PATH, CPATH and
#     C_INCLUDE_PATH unset;
#   - cuda_debug's own header search (cuda_debug/_cuda_headers.py) must then
#     find nothing, or the step fails: it would prove nothing;
#   - the sdist, unpacked, is installed as the README says (pip install -e
#     '.[test]' in it: pip builds it with PyPI's setuptools and NumPy alone),
#     then the package is imported, `cuda-debug doctor` runs, and the sdist's
#     own whole suite runs there: the fake CUDA driver is built from
#     csrc/base/cuda_api.h, so its tests run here too. With REFERENCE_LOG (the output of the same suite run
#     where the toolkit is seen, with -ra: its SKIPPED lines), every test file
#     must skip no more here than there, but those that test the toolkit itself
#     (TOOLKIT_TESTS: its headers compared with csrc/base/cuda_api.h and the error
#     table, nvcc rebuilding the PTX, cuda.pathfinder finding CUPTI and cuBLAS, the
#     toolkit's CUPTI reading a cubin's line table offline, the fake Sanitizer built
#     against its header),
#     and the skips of the others must be within 5% of the reference's.
#
# usage: .ci/install_without_toolkit.sh SDIST [PYTHON [REFERENCE_LOG]]
set -euo pipefail
SDIST=$(readlink -f "$1")
PY=${2:-python3}
REF_LOG=${3:+$(readlink -f "$3")}
TOOLKIT_TESTS="tests/house/test_cuda_api.py tests/house/test_error_table.py tests/core/test_core.py tests/house/test_packaging.py tests/replay/test_kernel_lines.py"
SRC=$(cd "$(dirname "$0")/.." && pwd)

if [ "${CD_IN_NAMESPACE:-}" != 1 ]; then
    if unshare -rm true 2>/dev/null; then ns=(unshare -rm)
    elif [ "$(id -u)" = 0 ] && unshare -m true 2>/dev/null; then ns=(unshare -m)
    else
        echo "FAIL: cannot make a private mount namespace (unshare -rm: user namespaces are off;"
        echo "      sysctl kernel.unprivileged_userns_clone=1, or run as root)"; exit 1
    fi
    exec env CD_IN_NAMESPACE=1 "${ns[@]}" bash "$0" "$@"
fi

WORK=$(mktemp -d /tmp/cuda_debug_notoolkit.XXXXXX)
trap 'rm -rf "$WORK"' EXIT
mkdir "$WORK/empty"
hidden=()
for d in /usr/local/cuda*; do
    [ -e "$d" ] || continue
    real=$(readlink -f "$d")
    [ -d "$real" ] || continue
    case " ${hidden[*]:-} " in *" $real "*) continue ;; esac
    mount --bind "$WORK/empty" "$real"
    hidden+=("$real")
done
echo "hidden: ${hidden[*]:-(no /usr/local/cuda* here)}"
unset CUDA_HOME CUDA_PATH CPATH C_INCLUDE_PATH
if [ -e /usr/local/cuda/include/cuda.h ]; then echo "FAIL: /usr/local/cuda/include/cuda.h is still visible"; exit 1; fi

"$PY" -m venv "$WORK/venv"
V="$WORK/venv/bin"
"$V/python" -m pip install -q --upgrade pip
# The header search of the package under test, by path (nothing is installed
# yet): it must find no CUDA header at all.
"$V/python" - "$SRC/cuda_debug/_cuda_headers.py" <<'EOF'
import importlib.util, sys
spec = importlib.util.spec_from_file_location("_cuda_headers", sys.argv[1])
h = importlib.util.module_from_spec(spec); spec.loader.exec_module(h)
for wanted in (("cuda.h",), ("cupti.h",), ("cublas_api.h",)):
    dirs, tried = h.find(wanted)
    if dirs:
        sys.exit("FAIL: %s is still found, in %s: the toolkit is not hidden" % (wanted[0], dirs))
print("no CUDA header found; looked in: %s" % ", ".join(tried))
EOF
# The sdist, unpacked, installed as the README says (`pip install -e '.[test]'` in
# it: the extension is built there, in place, without a toolkit), then its own suite
# run there (the unpacked sources are the installed package).
mkdir "$WORK/sd"
tar -xzf "$SDIST" -C "$WORK/sd"
SD=$(ls -d "$WORK"/sd/cuda_debug-*/)
cd "$SD"
"$V/python" -m pip install -q --no-cache-dir -e '.[test]'
where=$(cd / && "$V/python" -c 'import cuda_debug._core as c; print(c.__file__)')
case $where in "$SD"*) echo "built without a toolkit: $where" ;;
    *) echo "FAIL: cuda_debug._core was not imported from the unpacked sdist ($where)"; exit 1 ;; esac
"$V/python" -c 'from cuda_debug import _core; print("CUDA_HEADER_VERSION", _core.CUDA_HEADER_VERSION, "CUPTI_HEADER_VERSION", _core.CUPTI_HEADER_VERSION)'
# doctor exits 1 where watch() and launch_blocking() cannot work (no GPU here); a
# crash (a signal, an exception) is a failure
doctor_rc=0; "$V/cuda-debug" doctor || doctor_rc=$?
[ "$doctor_rc" -le 1 ] || { echo "FAIL: cuda-debug doctor exited $doctor_rc"; exit 1; }
# (the venv first on PATH, as after `activate`: the tests look for the cuda-debug script)
rc=0; PATH="$V:$PATH" "$V/python" -m pytest -p no:cacheprovider -q -n 2 -ra 2>&1 | tee "$WORK/pytest.log" || rc=$?
summary=$(tail -1 "$WORK/pytest.log")
[ "$rc" = 0 ] || { echo "FAIL: the suite without a toolkit: $summary"; exit 1; }
echo "without a toolkit: $summary"
if [ -n "$REF_LOG" ]; then
    "$V/python" - "$REF_LOG" "$WORK/pytest.log" $TOOLKIT_TESTS <<'EOF'
import collections, re, sys

def skips(path):
    """{test file: tests skipped}, from pytest's -ra summary (SKIPPED [n] file:line: why);
    not the tests that need a second user, which the user namespace hiding the toolkit
    cannot give (it maps root alone): the namespace's doing, not the toolkit's."""
    out = collections.Counter()
    for line in open(path, errors="replace"):
        m = re.match(r"SKIPPED \[(\d+)\] ([^:\s]+)", line)
        if m and "user namespace" not in line:
            out[m.group(2)] += int(m.group(1))
    return out

ref, here, toolkit = skips(sys.argv[1]), skips(sys.argv[2]), set(sys.argv[3:])
more = {f: here[f] - ref[f] for f in here if here[f] > ref[f]}
bad = {f: n for f, n in more.items() if f not in toolkit}
rest_ref = sum(n for f, n in ref.items() if f not in toolkit)
rest = sum(n for f, n in here.items() if f not in toolkit)
print("skipped: %d without a toolkit, %d with one; more here: %s" % (
    sum(here.values()), sum(ref.values()),
    ", ".join("%s +%d" % kv for kv in sorted(more.items())) or "none"))
if bad:
    sys.exit("FAIL: without a toolkit these skip more, and they do not test the toolkit: %s" % bad)
if rest > rest_ref * 1.05:
    sys.exit("FAIL: the tests that do not test the toolkit skip %d without one, %d with one "
             "(more than 5%% more)" % (rest, rest_ref))
EOF
fi
echo "installed and tested without a CUDA toolkit"
