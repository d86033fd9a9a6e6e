#!/bin/bash
# Which loaded libraries import the runtime's / driver's launch entry points
# through their GOT (the launch hooks' premise), and whether they bind now.
set -u
TL=$(python3 -c 'import torch,os;print(os.path.join(os.path.dirname(torch.__file__),"lib"))')
for f in "$TL"/libtorch_cuda.so "$TL"/libc10_cuda.so; do
  echo "== $f"; readelf -d "$f" | grep -E 'NEEDED.*(cudart|cuda\.so)|FLAGS|BIND_NOW' ;
  readelf -rW "$f" | grep -E ' (cudaLaunchKernel|cudaLaunchKernelExC|cudaLaunchCooperativeKernel|cudaGraphLaunch|cuLaunchKernel|cudaGetFuncBySymbol|cudaFuncGetName)[@_ ]' | awk '{print $3, $5}' | sort | uniq -c
done
python3 - <<'PY'
import torch, ctypes, os
x = torch.zeros(1, device="cuda"); x.add_(1); torch.cuda.synchronize()
maps = open("/proc/self/maps").read().split("\n")
libs = sorted({l.split()[-1] for l in maps if ".so" in l and ("cuda" in l or "cublas" in l or "cudnn" in l or "nccl" in l or "nvrtc" in l)})
print("\n".join(libs))
PY
python3 -c 'import cupy,os;print(os.path.dirname(cupy.__file__))' 2>/dev/null | while read d; do
  for f in $(find "$d" ../cupy_backends -name '*.so' 2>/dev/null | head -400); do
    r=$(readelf -rW "$f" 2>/dev/null | grep -cE ' (cuLaunchKernel|cudaLaunchKernel)[@_ ]'); [ "$r" != 0 ] && echo "cupy $f $r"
  done
done
D=$(python3 -c 'import cupy_backends,os;print(os.path.dirname(cupy_backends.__file__))' 2>/dev/null)
[ -n "$D" ] && for f in $(find "$D" -name '*.so'); do readelf -rW "$f" | grep -E ' (cuLaunchKernel|cudaLaunchKernel)' | awk -v f="$f" '{print f, $3, $5}'; readelf -d "$f" | grep NEEDED | grep -i cuda | sed "s|^|$f |"; done | head -20
