#!/usr/bin/env bash
# The fake-driver tests on aarch64, under qemu-user: the cross-built extension
# (.ci/check_aarch64.sh) in Debian's arm64 CPython, with pytest, NumPy and
# cuda-pathfinder from their aarch64 wheels, and the fake libcuda/libcupti of
# tests/fake_cuda built by aarch64-linux-gnu-gcc: the REAL callback runs on
# fake launches, in aarch64 code, as in CI on x86_64.
#   - the sysroot: Debian's arm64 libc6, python3.11-minimal, libpython3.11-stdlib
#     and the libraries they need (`apt-get download`, unpacked, not installed);
#   - every aarch64 program, the interpreter and the child Pythons the tests
#     start, runs through qemu-aarch64-static, registered with binfmt_misc
#     inside a private user+mount namespace (`unshare -rm`; Linux >= 6.7 gives
#     each user namespace its own binfmt_misc): nothing changes outside it.
# Timing tests that emulation makes meaningless are deselected (DESELECT).
#
# usage: .ci/test_aarch64_qemu.sh SO [PYTHON]
#   SO: the aarch64 _core*.so; PYTHON runs pip download (default python3).
#   Downloads are cached in ${CD_AARCH64_CACHE:-~/.cache/cuda_debug/aarch64}.
set -euo pipefail
SO=$(readlink -f "$1")
PY=${2:-python3}
SRC=$(cd "$(dirname "$0")/.." && pwd)
CACHE=${CD_AARCH64_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/cuda_debug/aarch64}
TESTS=(tests/core/test_fake_driver.py tests/report/test_reports_you_can_trust.py)
# A launch outside a scope returns "at once" (< 0.1 s): not under emulation.
DESELECT=(tests/core/test_fake_driver.py::test_launch_blocking_waits_for_the_kernel_with_an_async_device)
fail() { echo "aarch64 tests: $*"; exit 1; }
skip() { echo "aarch64 tests: skipped ($*)"; exit 0; }

if [ "${CD_IN_NAMESPACE:-}" != 1 ]; then
    command -v qemu-aarch64-static >/dev/null || skip "no qemu-aarch64-static: apt-get install qemu-user-static"
    pyver=$(basename "$SO" | sed -n 's/^_core\.cpython-3\([0-9]*\)-aarch64-linux-gnu\.so$/3.\1/p')
    [ -n "$pyver" ] || fail "$SO is not a CPython aarch64 extension"
    SYSROOT="$CACHE/sysroot-$pyver"
    if [ ! -x "$SYSROOT/usr/bin/python$pyver" ]; then
        dpkg --print-foreign-architectures | grep -qx arm64 || fail "apt has no arm64 architecture (.ci/check_aarch64.sh adds it)"
        rm -rf "$CACHE/sysroot-debs" "$SYSROOT" && mkdir -p "$CACHE/sysroot-debs" "$SYSROOT"
        (cd "$CACHE/sysroot-debs" && apt-get download -q \
            libc6:arm64 libgcc-s1:arm64 libstdc++6:arm64 "python$pyver-minimal:arm64" \
            "libpython$pyver-minimal:arm64" "libpython$pyver-stdlib:arm64" libffi8:arm64 zlib1g:arm64 \
            libexpat1:arm64 libssl3:arm64 libbz2-1.0:arm64 liblzma5:arm64 libuuid1:arm64 \
            libsqlite3-0:arm64 libncursesw6:arm64 libtinfo6:arm64 libreadline8:arm64 libcrypt1:arm64 \
            >/dev/null 2>&1) || fail "apt-get download of the arm64 Python $pyver packages failed"
        for deb in "$CACHE"/sysroot-debs/*.deb; do dpkg-deb -x "$deb" "$SYSROOT"; done
    fi
    SITE="$CACHE/site-$pyver"
    if [ ! -d "$SITE/pytest" ]; then
        rm -rf "$SITE" "$CACHE/site-wheels" && mkdir -p "$SITE" "$CACHE/site-wheels"
        "$PY" -m pip download -q --only-binary=:all: --implementation cp --python-version "$pyver" \
            --platform manylinux_2_28_aarch64 --platform manylinux_2_17_aarch64 \
            --platform manylinux2014_aarch64 --platform any -d "$CACHE/site-wheels" \
            "numpy>=1.23" pytest "cuda-pathfinder>=1.5" || fail "pip download of the aarch64 wheels failed"
        for w in "$CACHE"/site-wheels/*.whl; do "$PY" -m zipfile -e "$w" "$SITE"; done
    fi
    WORK=$(mktemp -d /tmp/cuda_debug_aarch64_tests.XXXXXX)
    trap 'rm -rf "$WORK"' EXIT
    mkdir "$WORK/tree"
    (cd "$SRC" && tar cf - --exclude=__pycache__ --exclude='*.so' cuda_debug tests csrc pyproject.toml) |
        tar xf - -C "$WORK/tree"
    cp "$SO" "$WORK/tree/cuda_debug/"
    unshare -rm true 2>/dev/null || skip "no user namespaces here (unshare -rm)"
    CD_IN_NAMESPACE=1 SYSROOT="$SYSROOT" SITE="$SITE" TREE="$WORK/tree" PYVER="$pyver" \
        unshare -rm bash "$0" "$@"
    exit $?
fi

# Inside the namespace: binfmt_misc of our own, qemu for aarch64 ELF programs.
mount -t binfmt_misc binfmt_misc /proc/sys/fs/binfmt_misc 2>/dev/null ||
    skip "no binfmt_misc of a user namespace's own (Linux >= 6.7)"
printf '%s' ':qemu-aarch64:M::\x7fELF\x02\x01\x01\x00\x00\x00\x00\x00\x00\x00\x00\x00\x02\x00\xb7\x00:\xff\xff\xff\xff\xff\xff\xff\x00\xff\xff\xff\xff\xff\xff\xff\xff\xfe\xff\xff\xff:/usr/bin/qemu-aarch64-static:F' \
    > /proc/sys/fs/binfmt_misc/register || fail "cannot register qemu-aarch64-static with binfmt_misc"
export QEMU_LD_PREFIX="$SYSROOT" PYTHONPATH="$SITE:$TREE" CC=aarch64-linux-gnu-gcc
unset CUDA_DEBUG_REPORT CUDA_LAUNCH_BLOCKING
PYA="$SYSROOT/usr/bin/python$PYVER"
cd "$TREE"
where=$("$PYA" -c 'import platform, cuda_debug._core as c; print(platform.machine(), c.__file__)')
echo "  $where"
case $where in "aarch64 $TREE/cuda_debug/_core.cpython-"*"-aarch64-linux-gnu.so") ;;
    *) fail "not the aarch64 extension in an aarch64 Python: $where" ;; esac
args=()
for d in "${DESELECT[@]}"; do args+=(--deselect "$d"); done
"$PYA" -m pytest -p no:cacheprovider -q -rs "${args[@]}" "${TESTS[@]}" 2>&1 | tee "$TREE/pytest.log"
summary=$(tail -1 "$TREE/pytest.log")
passed=$(echo "$summary" | sed -n 's/.*\b\([0-9][0-9]*\) passed.*/\1/p')
case $summary in *failed*|*error*) fail "$summary" ;; esac
[ "${passed:-0}" -ge 30 ] || fail "only ${passed:-0} tests passed (the fakes did not build?): $summary"
echo "aarch64 tests: $summary (the fake-driver tests, aarch64 code under qemu-aarch64-static)"
