#!/usr/bin/env bash
# The extension built for aarch64 (GH200 hosts), on this x86_64 machine:
#   1. every csrc/*.c and csrc/*/*.c compiled by Debian's cross GCC
#      (aarch64-linux-gnu-gcc, against its own aarch64 glibc), with setup.py's
#      -std and warnings plus -Werror=implicit-function-declaration (an x86-only
#      builtin such as __builtin_ia32_pause is an error), against the aarch64
#      headers of Debian's CPython (libpython3.X-dev:arm64, fetched with
#      `apt-get download`, unpacked, not installed) and of NumPy's manylinux
#      aarch64 wheel (`pip download`); no CUDA header (csrc/base/cuda_api.h);
#   2. LINKED into an aarch64 _core*.so, which `readelf -h` must call AArch64,
#      whose NEEDED must be only libc/libdl/libpthread, and whose undefined
#      symbols must all be the interpreter's (Py*) or aarch64 glibc's;
#   3. where real CUDA headers are found (cuda_debug/_cuda_headers.py) and
#      qemu-aarch64-static runs: the ABI probe of tests/house/test_cuda_api.py, built
#      for aarch64 against the real headers and against csrc/base/cuda_api.h,
#      run under qemu: the outputs must be equal (the header is generated on
#      x86_64; this shows it holds on aarch64 too);
#   4. the fake-driver tests run on aarch64, under qemu-user
#      (.ci/test_aarch64_qemu.sh; CD_AARCH64_QEMU_TESTS=0 leaves them out).
#
# usage: .ci/check_aarch64.sh [PYTHON] [OUT_DIR]
#   PYTHON runs pip download and the generator (default python3); the linked
#   .so is left in OUT_DIR when given. Downloads are cached in
#   ${CD_AARCH64_CACHE:-~/.cache/cuda_debug/aarch64}. Installs, as root with apt:
#   gcc-aarch64-linux-gnu, qemu-user-static (and adds the arm64 architecture
#   to apt for `apt-get download`).
# Files listed in .ci/aarch64_known_errors must fail with exactly the listed
# error, and nothing else (a known, owned defect); a listed file that passes
# fails the check too, so that the list is kept honest.
set -euo pipefail
cd "$(dirname "$0")/.."
SRC=$PWD
PY=${1:-python3}
KEEP=${2:-}
CC=aarch64-linux-gnu-gcc
SYSROOT=/usr/aarch64-linux-gnu
KNOWN=.ci/aarch64_known_errors
CACHE=${CD_AARCH64_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/cuda_debug/aarch64}
fail() { echo "aarch64 check: $*"; exit 1; }

apt_install() {     # apt_install PACKAGE...: as root only; says what is missing otherwise
    [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null || fail "missing $*: apt-get install $* (as root)"
    DEBIAN_FRONTEND=noninteractive apt-get install -y -q "$@" >/dev/null 2>&1 ||
        { apt-get update -q >/dev/null && DEBIAN_FRONTEND=noninteractive apt-get install -y -q "$@" >/dev/null; } ||
        fail "apt-get install $* failed"
}
command -v "$CC" >/dev/null || apt_install gcc-aarch64-linux-gnu
[ -f "$SYSROOT/include/stdio.h" ] || apt_install libc6-dev-arm64-cross
command -v qemu-aarch64-static >/dev/null || (apt_install qemu-user-static) || true   # optional: step 3

# -- aarch64 CPython headers: Debian's libpython3.X-dev:arm64, unpacked --------
mkdir -p "$CACHE"
PYROOT="$CACHE/python"
if ! ls "$PYROOT"/usr/include/aarch64-linux-gnu/python3.*/pyconfig.h >/dev/null 2>&1; then
    if ! dpkg --print-foreign-architectures | grep -qx arm64; then
        [ "$(id -u)" = 0 ] || fail "no aarch64 Python headers in $PYROOT, and apt has no arm64 architecture (as root: dpkg --add-architecture arm64)"
        dpkg --add-architecture arm64
        apt-get update -q >/dev/null
    fi
    dev=$(apt-cache depends libpython3-dev:arm64 2>/dev/null | sed -n 's/.*Depends: \(libpython3\.[0-9]*-dev\):arm64.*/\1/p' | head -1)
    [ -n "$dev" ] || { apt-get update -q >/dev/null; dev=$(apt-cache depends libpython3-dev:arm64 | sed -n 's/.*Depends: \(libpython3\.[0-9]*-dev\):arm64.*/\1/p' | head -1); }
    [ -n "$dev" ] || fail "apt knows no libpython3-dev:arm64"
    rm -rf "$CACHE/debs" "$PYROOT" && mkdir -p "$CACHE/debs" "$PYROOT"
    (cd "$CACHE/debs" && apt-get download -q "$dev:arm64" >/dev/null 2>&1) || fail "apt-get download $dev:arm64 failed"
    dpkg-deb -x "$CACHE"/debs/"$dev"_*_arm64.deb "$PYROOT"
fi
PYCONFIG=$(ls "$PYROOT"/usr/include/aarch64-linux-gnu/python3.*/pyconfig.h | head -1)
PYVER=$(basename "$(dirname "$PYCONFIG")")                      # python3.11
PY_INC="$PYROOT/usr/include/$PYVER"
[ -f "$PY_INC/Python.h" ] || fail "no Python.h in $PY_INC"
grep -q '#define SIZEOF_VOID_P 8' "$PYCONFIG" || fail "$PYCONFIG is not a 64-bit pyconfig.h"

# -- aarch64 NumPy headers: the manylinux aarch64 wheel, unpacked --------------
NPROOT="$CACHE/numpy-${PYVER#python}"
if ! ls "$NPROOT"/numpy/*/include/numpy/arrayobject.h >/dev/null 2>&1 &&
   ! ls "$NPROOT"/numpy/core/include/numpy/arrayobject.h >/dev/null 2>&1; then
    rm -rf "$NPROOT" "$CACHE/wheels" && mkdir -p "$NPROOT" "$CACHE/wheels"
    "$PY" -m pip download -q --no-deps --only-binary=:all: --implementation cp \
        --python-version "${PYVER#python}" --platform manylinux_2_28_aarch64 \
        --platform manylinux_2_17_aarch64 --platform manylinux2014_aarch64 \
        -d "$CACHE/wheels" "numpy>=1.23" || fail "pip download of NumPy's aarch64 wheel failed"
    "$PY" - "$CACHE"/wheels/numpy-*.whl "$NPROOT" <<'EOF'
import sys, zipfile
with zipfile.ZipFile(sys.argv[1]) as z:
    z.extractall(sys.argv[2], [n for n in z.namelist() if "/include/numpy/" in n])
EOF
fi
NP_INC=$(dirname "$(ls -d "$NPROOT"/numpy/*/include/numpy | head -1)")
grep -rq 'NPY_SIZEOF_LONG 8' "$NP_INC/numpy/_numpyconfig.h" || fail "$NP_INC is not an LP64 NumPy"
echo "aarch64: $("$CC" --version | head -1); headers of $PYVER ($PY_INC) and NumPy ($NP_INC)"

FLAGS=(-std=gnu11 -O2 -fPIC -Wall -Wextra -Wno-unused-parameter -Wno-missing-field-initializers
       -Werror=implicit-function-declaration -DNPY_NO_DEPRECATED_API=NPY_1_7_API_VERSION
       -Icsrc -I"$PY_INC" -I"$PYROOT/usr/include" -I"$NP_INC")

WORK=$(mktemp -d /tmp/cuda_debug_aarch64.XXXXXX)
trap 'rm -rf "$WORK"' EXIT

# The check itself: the target really is aarch64 with its own libc, and it
# rejects an x86 builtin.
printf '#include <stdio.h>\n#include <bits/wordsize.h>\n#if !defined(__aarch64__) || defined(__x86_64__) || __WORDSIZE != 64\n#error not aarch64\n#endif\n' > "$WORK/ok.c"
printf 'void f(void) { __builtin_ia32_pause(); }\n' > "$WORK/x86.c"
"$CC" "${FLAGS[@]}" -c "$WORK/ok.c" -o "$WORK/ok.o" || fail "the probe does not compile as aarch64"
if "$CC" "${FLAGS[@]}" -c "$WORK/x86.c" -o "$WORK/x86.o" 2>/dev/null; then
    fail "an x86 builtin passed: this check checks nothing"
fi

# -- 1. compile ------------------------------------------------------------------
status=0
objs=()
for f in csrc/*.c csrc/*/*.c; do
    obj="$WORK/$(echo "$f" | tr / _).o"
    errors=$("$CC" "${FLAGS[@]}" -c "$f" -o "$obj" 2>&1 | grep -E '(error|warning):' || true)
    [ -f "$obj" ] && objs+=("$obj")
    expected=$(grep -E "^$f: " "$KNOWN" 2>/dev/null | sed "s|^$f: ||" || true)
    if [ -z "$expected" ]; then
        if [ -n "$errors" ]; then echo "FAIL $f"; echo "$errors"; status=1; else echo "ok   $f"; fi
        continue
    fi
    if [ -z "$errors" ]; then
        echo "FAIL $f compiles for aarch64 now: delete its line from $KNOWN"; status=1; continue
    fi
    unexpected=$(echo "$errors" | grep -v -F -e "$expected" || true)
    if [ -n "$unexpected" ]; then echo "FAIL $f"; echo "$unexpected"; status=1
    else echo "known $f: $expected"; fi
done
[ $status = 0 ] || exit $status

# -- 2. link, and what the .so is --------------------------------------------------
SO="$WORK/_core.cpython-${PYVER#python}-aarch64-linux-gnu.so"
SO="${SO/3./3}"
"$CC" -shared -o "$SO" "${objs[@]}" -ldl -lpthread || fail "the link failed"
readelf -h "$SO" | grep -E 'Class|Type|Machine' | sed 's/^ */  /'
readelf -h "$SO" | grep -qE 'Machine:[[:space:]]+AArch64' || fail "$SO is not AArch64"
readelf -h "$SO" | grep -qE 'Class:[[:space:]]+ELF64' || fail "$SO is not ELF64"
needed=$(readelf -d "$SO" | sed -n 's/.*(NEEDED).*\[\(.*\)\]/\1/p')
echo "  NEEDED: $(echo $needed)"
for lib in $needed; do
    case $lib in
        libc.so.6|libdl.so.2|libpthread.so.0|ld-linux-aarch64.so.1) ;;
        *) fail "the extension links $lib (only libc/libdl/libpthread)" ;;
    esac
done
libc_syms=$(for l in libc.so.6 libdl.so.2 libpthread.so.0 libm.so.6; do
                nm -D --defined-only "$SYSROOT/lib/$l" | awk '{print $3}' | sed 's/@.*//'; done | sort -u)
unknown=$(nm -D --undefined-only "$SO" | awk '{print $2}' | sed 's/@.*//' | grep -vE '^_?Py|^__gmon_start__$|^_ITM_|^__cxa_finalize$' |
          sort -u | comm -23 - <(echo "$libc_syms") || true)
[ -z "$unknown" ] || fail "undefined symbols neither Python's nor aarch64 glibc's: $(echo $unknown)"
echo "  undefined symbols: $(nm -D --undefined-only "$SO" | grep -c ' U ') (Python's and glibc's only)"
if [ -n "$KEEP" ]; then mkdir -p "$KEEP" && cp "$SO" "$KEEP/" && echo "  kept: $KEEP/$(basename "$SO")"; fi

# -- 3. the ABI of csrc/base/cuda_api.h on aarch64, under qemu ----------------------
abi_probe() {
    if ! command -v qemu-aarch64-static >/dev/null; then
        echo "aarch64 ABI probe: skipped (no qemu-aarch64-static: apt-get install qemu-user-static)"
        return
    fi
    if ! "$PY" tools/gen/cuda_api.py --probe "$WORK/probe" >"$WORK/probe.log" 2>&1; then
        echo "aarch64 ABI probe: skipped ($(tail -1 "$WORK/probe.log"))"; return
    fi
    local version real_inc n
    version=$(sed -n 's/^wrote .*(\(.*\))$/\1/p' "$WORK/probe.log")
    if ! head -1 csrc/base/cuda_api.h | grep -qF "($version)"; then
        echo "aarch64 ABI probe: skipped (the CUDA headers found are $version; cuda_api.h was generated from others)"
        return
    fi
    real_inc=$("$PY" - "$SRC" <<'EOF'
import importlib.util, sys
spec = importlib.util.spec_from_file_location("_cuda_headers", sys.argv[1] + "/cuda_debug/_cuda_headers.py")
h = importlib.util.module_from_spec(spec); spec.loader.exec_module(h)
print(" ".join("-I" + d for d in h.find(("cuda.h", "cupti.h", "cublas_api.h", "cublasLt.h"))[0]))
EOF
)
    "$CC" -std=gnu11 -Wall -Werror -static -o "$WORK/probe_real" "$WORK/probe/abi_probe.c" -DCD_PROBE_REAL $real_inc
    "$CC" -std=gnu11 -Wall -Werror -static -o "$WORK/probe_ours" "$WORK/probe/abi_probe.c" -Icsrc
    qemu-aarch64-static "$WORK/probe_real" > "$WORK/real.txt"
    qemu-aarch64-static "$WORK/probe_ours" > "$WORK/ours.txt"
    n=$(wc -l < "$WORK/ours.txt")
    [ "$n" -gt 300 ] || fail "the ABI probe printed $n lines only"
    diff "$WORK/real.txt" "$WORK/ours.txt" || fail "csrc/base/cuda_api.h differs from the real headers on aarch64 (above)"
    echo "aarch64 ABI probe: $n sizes, offsets, enumerators and macros equal to the real headers' (qemu-aarch64-static)"
}
abi_probe

# -- 4. the fake-driver tests, in aarch64 code under qemu (CD_AARCH64_QEMU_TESTS=0: not) --
if [ "${CD_AARCH64_QEMU_TESTS:-1}" = 1 ]; then
    bash .ci/test_aarch64_qemu.sh "$SO" "$PY"
fi
