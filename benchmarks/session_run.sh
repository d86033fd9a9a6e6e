#!/usr/bin/env bash
# One device call of a session: build, then the whole suite (every test, torch, CuPy and
# Triton installed: CPU tests too), and/or this round's benchmarks; every log tarred into
# $OUT/logs.tgz (the device returns at most 8 files), a summary printed last.
#   OUT=/tmp/out bash benchmarks/session_run.sh suite        # build + whole suite
#   OUT=/tmp/out bash benchmarks/session_run.sh bench        # build + benchmarks
#   OUT=/tmp/out bash benchmarks/session_run.sh suite bench  # both
# SUITE_S (250), NPROC (14): the suite's time limit and workers; KL_S, NW_S, ROUNDS, INPROC
# bound the benchmarks (about 5 minutes in all).
set -u
OUT=${OUT:-/tmp/cuda_debug_out}
L=/tmp/logs
mkdir -p "$OUT" "$L"
export PYTHONUNBUFFERED=1
what=" $* "
summary=()
finish() {
  tar czf "$OUT/logs.tgz" -C /tmp logs 2>/dev/null
  printf '%s\n' "${summary[@]}" | tee "$OUT/summary.txt"
}
trap finish EXIT
{
  nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
  python3 -c "import sys, torch; print('python', sys.version.split()[0], 'torch', torch.__version__, 'cuda', torch.version.cuda)"
  echo "commit ${CUDA_DEBUG_COMMIT:-$(git rev-parse --short HEAD 2>/dev/null || echo '?')}"
} >"$L/machine.txt" 2>&1
summary+=("machine: $(tr '\n' ' ' <"$L/machine.txt")")
python3 -m pip install -q --no-build-isolation --no-deps -e . >"$L/build.log" 2>&1 ||
  { tail -30 "$L/build.log"; summary+=("BUILD FAILED"); exit 1; }

if [[ "$what" == *" suite "* ]]; then
  t0=$SECONDS
  timeout "${SUITE_S:-240}" python3 -m pytest tests -n "${NPROC:-14}" --dist loadgroup -q -rfEs \
    -p no:cacheprovider >"$L/suite.log" 2>&1
  summary+=("suite ($((SECONDS - t0)) s): $(tail -1 "$L/suite.log")")
  grep -E "^(FAILED|ERROR) " "$L/suite.log" | head -40 >"$L/suite_failures.txt"
  summary+=("$(cat "$L/suite_failures.txt")")
fi

if [[ "$what" == *" bench "* ]]; then
  OUT=$L timeout "${KL_S:-80}" bash benchmarks/kernel_lines/measure.sh "$PWD/benchmarks/kernel_lines" \
    >"$L/kernel_lines.log" 2>&1
  summary+=("kernel_lines: $(grep -E '^(plain|replay|dump)' "$L/kernel_lines.log" | tr '\n' ';')")
  timeout "${NW_S:-130}" python3 benchmarks/never_watched.py --rounds "${ROUNDS:-3}" \
    --modes watch,residue,profiler,exact --inproc "${INPROC:-1}" --json "$L/never_watched.json" \
    >"$L/never_watched.log" 2>&1
  summary+=("never_watched: rc=$? (never_watched.log)")
  summary+=("$(tail -30 "$L/never_watched.log")")
  timeout 60 python3 benchmarks/verdict_notes.py --pairs 2 --n 50000 >"$L/notes.log" 2>&1
  summary+=("notes: $(tail -1 "$L/notes.log")")
  timeout 60 python3 benchmarks/adopt_capture.py --pairs 2 >"$L/adopt.log" 2>&1
  summary+=("adopt: $(tail -1 "$L/adopt.log")")
fi
