#!/usr/bin/env bash
# Build cuda_debug on the GPU machine, run the GPU tests and the benchmarks.
# Usage (from the repo root, on a machine with a GPU and no package registry):
#   OUT=/tmp/out CUDA_DEBUG_COMMIT=$(git rev-parse --short HEAD) \
#     bash benchmarks/run_on_gpu.sh [probe] [demo] [tests] [overhead] [ab] [watch] [alwayson] [graphs] [replay] [guard] [seed] [ddp] [ddpgloo] [gemm]
# tests: NPROC workers (default 4), TESTS (default tests), TEST_ARGS; CUDA 12's CUPTI
# wheel in .whl12/ (kept apart: on the path it would be found first) runs tests/house/test_cupti12.py.
# ab: the launch path of this tree against an older one built from .carry/base (git
# archive of AB_BASE), interleaved, AB_ROUNDS rounds.
# The notebook tests need ipykernel, nbclient and nbformat: where the machine has
# no registry, bring them as wheels in .whl/ (pip download ... -d .whl) and they
# are installed into /tmp/site first. Logs go under $OUT; a summary is printed last.
set -u
OUT=${OUT:-/tmp/cuda_debug_out}
mkdir -p "$OUT"
export PYTHONUNBUFFERED=1
what=${*:-tests overhead}
summary=()

if compgen -G ".whl/*.whl" >/dev/null; then
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
    --target /tmp/site .whl/*.whl >"$OUT/wheels.log" 2>&1 && export PYTHONPATH=/tmp/site
fi
python3 -m pip install -q --no-build-isolation --no-deps -e . >"$OUT/build.log" 2>&1 \
  || { tail -30 "$OUT/build.log"; echo "BUILD FAILED"; exit 1; }
summary+=("build: ok")

if [[ " $what " == *" probe "* ]]; then
  {
    nvidia-smi -L; nvidia-smi --query-gpu=driver_version --format=csv,noheader
    python3 -c "import torch; print('torch', torch.__version__, torch.version.cuda)"
    lc=$(python3 -c "import ctypes, ctypes.util; print(ctypes.util.find_library('cuda'))")
    echo "libcuda: $lc"
    for f in /usr/lib/x86_64-linux-gnu/libcuda.so.1 /usr/local/nvidia/lib64/libcuda.so.1; do
      [ -e "$f" ] && { echo "$f"; nm -D "$f" 2>/dev/null | grep -E " (stderr|fprintf|fputs|fwrite|vfprintf|write|__fprintf_chk|__vfprintf_chk)(@|$)"; }
    done
  } >"$OUT/probe.log" 2>&1
  summary+=("probe: $(grep -cE 'stderr|fprintf|write' "$OUT/probe.log") stdio/write symbols (see probe.log)")
fi

if [[ " $what " == *" demo "* ]]; then
  python3 -c "import cuda_debug, cuda_debug.testing as t
with cuda_debug.launch_blocking():
    t.device_assert()" >"$OUT/demo.log" 2>&1
  tail -8 "$OUT/demo.log"
fi

if [[ " $what " == *" tests "* ]]; then
  if compgen -G ".whl12/*.whl" >/dev/null; then export CD_TEST_CUPTI12_WHEEL=$PWD/.whl12; fi
  timeout ${TESTS_TIMEOUT:-1500} python3 -m pytest ${TESTS:-tests} -n ${NPROC:-4} -q -rs -p no:cacheprovider \
     ${TEST_ARGS:-} >"$OUT/tests.log" 2>&1
  summary+=("tests: $(tail -1 "$OUT/tests.log")")
fi

if [[ " $what " == *" overhead "* ]]; then
  python3 benchmarks/launch_overhead.py --reps ${REPS:-3} --workloads ${WORKLOADS:-tiny,transformer,resnet50} \
     ${VARIANTS:+--variants} --json "$OUT/launch_overhead.json" >"$OUT/overhead.log" 2>&1
  summary+=("overhead: see overhead.log")
  grep -A30 "^GPU" "$OUT/overhead.log" | tail -22
fi

if [[ " $what " == *" ab "* ]]; then      # this tree's launch path against .carry/base's
  (cd .carry/base && python3 setup.py build_ext --inplace -q >"$OUT/ab_build.log" 2>&1) \
    || { tail -20 "$OUT/ab_build.log"; echo "AB BASE BUILD FAILED"; }
  for r in $(seq ${AB_ROUNDS:-3}); do
    CUDA_DEBUG_COMMIT=${CUDA_DEBUG_COMMIT:-new} python3 benchmarks/launch_overhead.py --reps 1 \
      --workloads tiny,transformer --configs never,scope,watch,watch_hang --json "$OUT/ab_new_$r.json" >>"$OUT/ab.log" 2>&1
    PYTHONPATH=$PWD/.carry/base${PYTHONPATH:+:$PYTHONPATH} CUDA_DEBUG_COMMIT=${AB_BASE:-base} \
      python3 benchmarks/launch_overhead.py --reps 1 --workloads tiny,transformer --configs scope,watch \
      --json "$OUT/ab_base_$r.json" >>"$OUT/ab.log" 2>&1
  done
  python3 benchmarks/ab_builds.py "$OUT" | tee "$OUT/ab_summary.txt"
  summary+=("ab: see ab_summary.txt")
fi

if [[ " $what " == *" guard "* ]]; then
  python3 benchmarks/guard_cost.py --reps ${REPS:-3} --json "$OUT/guard_cost.json" >"$OUT/guard_cost.log" 2>&1
  summary+=("guard: see guard_cost.log")
  tail -16 "$OUT/guard_cost.log"
fi

if [[ " $what " == *" watch "* ]]; then
  python3 benchmarks/watch_ab.py --rounds ${ROUNDS:-8} --json "$OUT/watch_ab.json" >"$OUT/watch_ab.log" 2>&1
  summary+=("watch: $(head -1 "$OUT/watch_ab.log")")
fi

if [[ " $what " == *" graphs "* ]]; then
  python3 benchmarks/graph_watch.py --reps ${REPS:-3} --json "$OUT/graph_watch.json" >"$OUT/graph_watch.log" 2>&1
  summary+=("graphs: see graph_watch.log")
  tail -14 "$OUT/graph_watch.log"
fi

if [[ " $what " == *" alwayson "* ]]; then   # issue 26: the always-on watch's targets and split
  python3 benchmarks/always_on.py --rounds ${ROUNDS:-3} --split-rounds ${SPLIT_ROUNDS:-12} \
     --json "$OUT/always_on.json" >"$OUT/always_on.log" 2>&1
  summary+=("alwayson: see always_on.log")
  grep -v "^round" "$OUT/always_on.log" | tail -24
fi

if [[ " $what " == *" replay "* ]]; then     # issue 29: what reaching a fault costs under replay
  python3 benchmarks/replay_cost.py --rounds ${REPLAY_ROUNDS:-2} --json "$OUT/replay_cost.json" \
     >"$OUT/replay_cost.log" 2>&1
  summary+=("replay: see replay_cost.log")
  tail -12 "$OUT/replay_cost.log"
fi

if [[ " $what " == *" seed "* ]]; then
  python3 benchmarks/seed_question.py --out "$OUT/seed.md" --plot "$OUT/seed.png" \
     --json "$OUT/seed.json" >"$OUT/seed.log" 2>&1
  summary+=("seed: $(tail -1 "$OUT/seed.log")")
fi

if [[ " $what " == *" ddp "* ]]; then     # needs 2 GPUs (the nvidia-h200-x2 kind)
  python3 benchmarks/ddp_step.py --compare --gpus 2 >"$OUT/ddp.log" 2>&1
  summary+=("ddp: see ddp.log")
  tail -7 "$OUT/ddp.log"
fi

if [[ " $what " == *" ddpgloo "* ]]; then # one GPU: two ranks share it, DDP over gloo
  python3 benchmarks/ddp_step.py --gloo-shared ${DDP_ARGS:-} --json "$OUT/ddp_gloo.json" \
    >"$OUT/ddp_gloo.log" 2>&1
  summary+=("ddpgloo: $(tail -1 "$OUT/ddp_gloo.log")")
  tail -7 "$OUT/ddp_gloo.log"
fi

if [[ " $what " == *" gemm "* ]]; then
  python3 benchmarks/gemm_launch_blocking.py ${GEMM_ARGS:-} >"$OUT/gemm.log" 2>&1
  python3 benchmarks/gemm_vs_torch.py ${GEMM_ARGS:-} >"$OUT/gemm_vs_torch.log" 2>&1
  summary+=("gemm: see gemm.log, gemm_vs_torch.log")
  tail -25 "$OUT/gemm.log"; tail -15 "$OUT/gemm_vs_torch.log"
fi

echo "==== summary"
printf '%s\n' "${summary[@]}"
