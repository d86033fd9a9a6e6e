#!/usr/bin/env bash
# Builds .cu12rt/ (repo root, git-ignored) for tests/hooks/test_cuda12_runtime.py and
# benchmarks/second_context.py, on a machine with PyPI and nvcc (no GPU needed):
#   libcu12rt.so     cu12_lib.cu, linked against the SHARED libcudart.so.12 (rpath $ORIGIN)
#   libcudart.so.12  from NVIDIA's nvidia-cuda-runtime-cu12 wheel, beside it
#   ctx2.cubin       ctx2_module.cu for sm_90 (a second context's module)
#   build.json       what was used (nvcc, runtime wheel, the imports' symbol versions)
# The GPU machine gets the folder through `carry` (about 2 MiB).
#
# nvcc: $NVCC, else a CUDA 12 nvcc found on this machine, else `nvcc` on PATH. NVIDIA's
# nvidia-cuda-nvcc-cu12 wheels (12.8, 12.9) hold ptxas and the CRT headers but no nvcc
# driver, cicc or cudafe++, so a CUDA 13 nvcc may be what there is: the host code it
# generates calls the same runtime entry points (__cudaRegisterFatBinary,
# __cudaGetKernel, __cudaPopCallConfiguration, __cudaLaunchKernel: crt/host_runtime.h
# of 12.9 and 13.0 expand <<<>>> alike), and the link below binds them to
# libcudart.so.12's (checked: every import versioned libcudart.so.12, none .13).
# Runtime version: $CU12_RUNTIME (a pip requirement), default 12.8 (PyTorch cu128's);
# or $CU12_RUNTIME_WHEEL, a wheel already here.
set -euo pipefail
HERE="$(cd "$(dirname "$0")" && pwd)"
ROOT="$(cd "$HERE/../.." && pwd)"
OUT="${CU12RT_OUT:-$ROOT/.cu12rt}"
PY="${PYTHON:-python3}"
ARCH="${CU12_ARCH:-sm_90}"
WORK="$(mktemp -d)"
trap 'rm -rf "$WORK"' EXIT

pick_nvcc() {
    if [ -n "${NVCC:-}" ]; then echo "$NVCC"; return; fi
    for c in /usr/local/cuda-12*/bin/nvcc; do [ -x "$c" ] && { echo "$c"; return; }; done
    command -v nvcc || { echo "build.sh: no nvcc (set NVCC)" >&2; exit 1; }
}
NVCC_BIN="$(pick_nvcc)"
NVCC_VERSION="$("$NVCC_BIN" --version | sed -n 's/.*release \([0-9.]*\).*/\1/p')"

WHEEL="${CU12_RUNTIME_WHEEL:-}"
if [ -z "$WHEEL" ]; then
    "$PY" -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 \
        --implementation cp --platform manylinux2014_x86_64 -d "$WORK/wheels" \
        "${CU12_RUNTIME:-nvidia-cuda-runtime-cu12==12.8.*}"
    WHEEL="$(ls "$WORK"/wheels/nvidia_cuda_runtime_cu12-*.whl | tail -1)"
fi
"$PY" -m zipfile -e "$WHEEL" "$WORK/rt"
RT_LIB="$WORK/rt/nvidia/cuda_runtime/lib"
test -f "$RT_LIB/libcudart.so.12"

rm -rf "$OUT"
mkdir -p "$OUT"
cp "$RT_LIB/libcudart.so.12" "$OUT/"
# Compile only (nvcc would link its own runtime); link against libcudart.so.12 alone.
"$NVCC_BIN" -c -O2 -arch="$ARCH" --no-compress -Xcompiler -fPIC -cudart shared \
    -o "$WORK/cu12_lib.o" "$HERE/cu12_lib.cu"
g++ -shared -o "$OUT/libcu12rt.so" "$WORK/cu12_lib.o" "$OUT/libcudart.so.12" \
    -Wl,-rpath,'$ORIGIN' -Wl,--no-undefined -Wl,-soname,libcu12rt.so
"$NVCC_BIN" -cubin -O2 -arch="$ARCH" -o "$OUT/ctx2.cubin" "$HERE/ctx2_module.cu"

# Checks: the launches import libcudart.so.12's entry points, nothing of a CUDA 13 runtime.
IMPORTS="$(readelf --dyn-syms -W "$OUT/libcu12rt.so" | awk '$7 == "UND" && $8 ~ /cuda/ {print $8}')"
echo "$IMPORTS" | grep -q '^__cudaLaunchKernel@libcudart.so.12' || {
    echo "build.sh: libcu12rt.so does not import __cudaLaunchKernel@libcudart.so.12:" >&2
    echo "$IMPORTS" >&2; exit 1; }
if echo "$IMPORTS" | grep -v '@libcudart.so.12' | grep -q .; then
    echo "build.sh: imports not bound to libcudart.so.12:" >&2; echo "$IMPORTS" >&2; exit 1
fi
if readelf -d "$OUT/libcu12rt.so" | grep NEEDED | grep -q 'libcudart.so.13'; then
    echo "build.sh: libcu12rt.so needs libcudart.so.13" >&2; exit 1
fi
"$PY" - "$OUT" "$NVCC_BIN" "$NVCC_VERSION" "$(basename "$WHEEL")" "$ARCH" "$IMPORTS" <<'PYEOF'
import json, os, sys
out, nvcc, version, wheel, arch, imports = sys.argv[1:7]
json.dump(dict(nvcc=nvcc, nvcc_version=version, runtime_wheel=wheel, arch=arch,
               imports=imports.split(), files=sorted(os.listdir(out))),
          open(os.path.join(out, "build.json"), "w"), indent=1)
PYEOF
du -sh "$OUT"
echo "built $OUT (nvcc $NVCC_VERSION, $(basename "$WHEEL"))"
