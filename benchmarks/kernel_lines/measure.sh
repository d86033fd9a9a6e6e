# replay cost with the line lookup, against the plain run; dump --warps's time and text
# Usage: OUT=dir bash benchmarks/kernel_lines/measure.sh $PWD/benchmarks/kernel_lines (a GPU, CuPy, Triton, cuda-gdb)
cd /tmp && E=$1
t() { python3 - "$@" <<'PY'
import subprocess, sys, time
t0 = time.perf_counter(); p = subprocess.run(sys.argv[1:], capture_output=True, text=True)
line = [l for l in p.stdout.splitlines() if l.startswith("LINE ")]
print("%.2f s rc=%d %s" % (time.perf_counter() - t0, p.returncode, line[-1] if line else ""))
sys.stderr.write(p.stderr[-3000:])
PY
}
R="import sys, cuda_debug; from cuda_debug import _cli; rc = _cli.main(sys.argv[1:]); e = cuda_debug.last_error(); print('LINE lookup_s=%s' % (e.replay or {}).get('kernel_line_seconds') if e is not None else 'LINE none')"
for i in 1; do
  echo "plain triton_store: $(t python3 $E/triton_store.py 2>/dev/null)"
  echo "replay triton_store: $(t python3 -c "$R" replay --kernel store_past $E/triton_store.py 2>$OUT/replay_triton_$i.txt)"
  echo "plain cupy_li: $(t python3 $E/cupy_li.py 2>/dev/null)"
  echo "replay cupy_li: $(t python3 -c "$R" replay --kernel cupy_past --no-torch $E/cupy_li.py 2>$OUT/replay_cupy_$i.txt)"
  echo "plain torch_fill: $(t python3 $E/torch_fill.py 2>/dev/null)"
  echo "replay torch_fill: $(t python3 -c "$R" replay --kernel FillFunctor $E/torch_fill.py 2>$OUT/replay_torch_$i.txt)"
done
for p in spin_cupy barrier spin_triton; do
  rm -f /tmp/$p.pid; python3 -m cuda_debug run $E/$p.py 6 /tmp/$p.pid > $OUT/dump_$p.prog.txt 2>&1 &
  bg=$!
  for i in $(seq 80); do [ -s /tmp/$p.pid ] && break; sleep 0.25; done
  sleep 1.5; pid=$(cat /tmp/$p.pid)
  t0=$(python3 -c "import time; print(time.time())")
  python3 -m cuda_debug dump --warps $pid > $OUT/dump_$p.txt 2>&1
  echo "dump --warps $p rc=$? $(python3 -c "import time; print('%.2f s' % (time.time() - $t0))")"
  cat $OUT/dump_$p.txt
  wait $bg; echo "$p program rc=$?"; tail -2 $OUT/dump_$p.prog.txt
done
