#!/usr/bin/env bash
# Cross syntax check of csrc/**/*.c for aarch64 (GH200 hosts): clang with
# --target=aarch64-linux-gnu against a real aarch64 glibc (Debian's
# libc6-dev-arm64-cross, /usr/aarch64-linux-gnu/include; the host's
# /usr/include is NOT searched), the CUDA headers (arch-independent), NumPy's
# headers and the host's Python headers (pyconfig.h is the host's: both are
# LP64 Linux, the differences do not reach this code). Same -std and warnings as
# setup.py, plus -Werror=implicit-function-declaration: an x86-only builtin
# (__builtin_ia32_pause) or intrinsic is an error, as it would be on the host.
#
# usage: .ci/check_aarch64.sh PYTHON     (the Python whose headers and NumPy to use)
# Files listed in .ci/aarch64_known_errors must fail with exactly the listed
# error, and nothing else (a known, owned defect); a listed file that passes
# fails the check too, so that the list is kept honest.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${1:-python3}
SYSROOT=/usr/aarch64-linux-gnu
KNOWN=.ci/aarch64_known_errors

if [ ! -f "$SYSROOT/include/stdio.h" ]; then
    if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null; then
        apt-get install -y -q libc6-dev-arm64-cross >/dev/null 2>&1 ||
            { apt-get update -q >/dev/null && apt-get install -y -q libc6-dev-arm64-cross >/dev/null; }
    fi
fi
[ -f "$SYSROOT/include/stdio.h" ] || { echo "aarch64 check: no aarch64 C library headers in $SYSROOT (apt-get install libc6-dev-arm64-cross)"; exit 1; }
command -v clang >/dev/null || { echo "aarch64 check: clang not found"; exit 1; }

CUDA_INC=""
for d in "${CUDA_HOME:-}" "${CUDA_PATH:-}" /usr/local/cuda; do
    if [ -n "$d" ] && [ -f "$d/include/cuda.h" ] && [ -f "$d/include/cupti.h" ]; then CUDA_INC="$d/include"; break; fi
done
[ -n "$CUDA_INC" ] || { echo "aarch64 check: CUDA headers (cuda.h, cupti.h) not found"; exit 1; }
PY_INC=$("$PY" -c 'import sysconfig; print(sysconfig.get_paths()["include"])')
NP_INC=$("$PY" -c 'import numpy; print(numpy.get_include())')

FLAGS=(--target=aarch64-linux-gnu --sysroot="$SYSROOT" -isystem "$SYSROOT/include"
       -fsyntax-only -std=gnu11 -Wall -Wextra -Wno-unused-parameter
       -Wno-missing-field-initializers -Werror=implicit-function-declaration
       -DNPY_NO_DEPRECATED_API=NPY_1_7_API_VERSION
       -Icsrc -I"$CUDA_INC" -I"$PY_INC" -I"$NP_INC")

# The check itself: the target really is aarch64 with its own libc, and it
# rejects an x86 builtin.
probe=$(mktemp -d)
trap 'rm -rf "$probe"' EXIT
printf '#include <stdio.h>\n#include <bits/wordsize.h>\n#if !defined(__aarch64__) || defined(__x86_64__) || __WORDSIZE != 64\n#error not aarch64\n#endif\n' > "$probe/ok.c"
printf 'void f(void) { __builtin_ia32_pause(); }\n' > "$probe/x86.c"
clang "${FLAGS[@]}" "$probe/ok.c" || { echo "aarch64 check: the probe does not compile as aarch64"; exit 1; }
if clang "${FLAGS[@]}" "$probe/x86.c" 2>/dev/null; then
    echo "aarch64 check: an x86 builtin passed: this check checks nothing"; exit 1
fi

status=0
for f in csrc/*.c csrc/*/*.c; do
    errors=$(clang "${FLAGS[@]}" "$f" 2>&1 | grep -E '(error|warning):' || true)
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
exit $status
