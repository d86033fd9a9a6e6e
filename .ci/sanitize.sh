#!/usr/bin/env bash
# The sanitizer job of .ci/run: the C core built with the sanitizers, against
# the fake CUDA driver (CPU only), in copies of the checkout under a temp dir.
#   1. AddressSanitizer + UndefinedBehaviorSanitizer (-fsanitize=address,undefined,
#      the fakes too): the tests that run the C core, the fake-driver suite
#      (tests/core/test_fake_driver.py tests/core/test_robust.py tests/core/test_stress.py tests/house/test_fake_driver_build.py tests/report/test_reports_you_can_trust.py, graphs/test_graph_markers.py, hangs_dump_jobs/test_hangs.py,
#      watch/test_context_reset.py, report/test_signal_reports.py, core/test_frame_readers.py,
#      core/test_fork.py, hooks/test_runtime_launch_hooks.py, _safety_cpu.py and _host_safety_cpu.py:
#      the GOT entries written and the runtime's launches recorded past CUPTI, and the
#      stress of threads entering and leaving watch() while another dlopens/dlcloses a
#      hooked library and another forks, for CD_TEST_STRESS_S=15 seconds;
#      watch/test_watch.py; the dump's trust tests and the store fuzz,
#      tests/hangs_dump_jobs/test_dump_foreign_data.py tests/hangs_dump_jobs/test_dump_store_fuzz.py tests/hangs_dump_jobs/test_dump_trust.py),
#      tests/core/test_core.py and those of
#      tests/house/test_architecture.py that run it. The ASan runtime is preloaded into every
#      process (Python is not built with it); leaks are not looked for
#      (CPython keeps memory by design); Python allocates with malloc, so that
#      a freed Python object is poisoned too.
#   2. ThreadSanitizer (-fsanitize=thread, a build of its own): the stress test
#      of tests/core/test_stress.py (threads launching from user and
#      library frames, scopes opening and closing, a fault), the launch hooks'
#      tests, tests/hooks/test_cupti_detach.py (4 threads entering and leaving
#      watches while launches detach CUPTI), and watches opening and closing while
#      the profiler hand-over runs.
# Any report fails the job: the sanitizers stop the process at the first
# (halt_on_error), and tests/conftest.py fails a test whose child printed one
# ("ERROR: AddressSanitizer", "runtime error:", "WARNING: ThreadSanitizer"),
# whatever its exit status.
#
# usage: .ci/sanitize.sh [PYTHON]
#   PYTHON runs the tests (it needs the [test] extra: a venv after the README's
#   install); the extension is built by an interpreter with the build
#   requirements (tests/build_env.py: PYTHON itself if its setuptools is >= 77,
#   else a venv made for them), as pip builds it.
set -euo pipefail
cd "$(dirname "$0")/.."
# the interpreter itself, not a wrapper script (pyenv's shims are bash: bash
# does not run with the ThreadSanitizer runtime preloaded)
PY=$("${1:-python3}" -c 'import sys; print(sys.executable)')
SRC=$PWD
BUILD_PY=$("$PY" tests/build_env.py "$SRC")
CC=${CC:-gcc}
WORK=$(mktemp -d /tmp/cuda_debug_sanitize.XXXXXX)
trap 'rm -rf "$WORK"' EXIT

# A copy of the checkout's files (tracked, and new ones git does not ignore).
copy() {
    mkdir -p "$1"
    git -C "$SRC" ls-files -z -co --exclude-standard | (cd "$SRC" && tar --null -T - -cf -) |
        tar -xf - -C "$1"
}

build() {        # build DIR FLAGS: the extension, in place, with FLAGS
    (cd "$1" && CC=$CC CFLAGS="$2 -fno-omit-frame-pointer" LDFLAGS="$2" \
        "$BUILD_PY" setup.py build_ext --inplace -q) > "$1.build.log" 2>&1 ||
        { cat "$1.build.log"; echo "FAIL: the sanitizer build failed"; exit 1; }
}

runtime() {      # the shared runtime of a sanitizer, to preload
    local so
    so=$($CC -print-file-name="$1")
    [ -f "$so" ] || { echo "FAIL: $CC has no $1 (install its sanitizer runtimes)"; exit 1; }
    echo "$so"
}

ASAN=$(runtime libasan.so)
TSAN=$(runtime libtsan.so)
copy "$WORK/asan"
copy "$WORK/tsan"
build "$WORK/asan" "-fsanitize=address,undefined" & asan_build=$!
build "$WORK/tsan" "-fsanitize=thread" & tsan_build=$!
wait $asan_build
wait $tsan_build

# The fakes, built before anything runs with a runtime preloaded (the compiler
# is not meant to run under one).
fakes() { (cd "$1" && CD_TEST_FAKE_CFLAGS="$2" "$PY" -c \
    'import sys; sys.path.insert(0, "tests"); import fake_cuda; fake_cuda.build()'); }
ASAN_FLAGS="-fsanitize=address,undefined -fno-omit-frame-pointer"
fakes "$WORK/asan" "$ASAN_FLAGS"
fakes "$WORK/tsan" ""

# test_a_fork_while_another_thread_holds_every_lock is left out here (it runs in the
# plain suite): under ASan its forked child hung in 2 of 3 CI runs and in none of 14
# runs by hand, with our own locks all reset; ASan's runtime is the suspect (a fork
# while other threads of the parent run in it), not proven. The other fork tests run.
echo "--- AddressSanitizer + UndefinedBehaviorSanitizer"
# test_fault_kernels_header_is_up_to_date runs nvcc (which dies with the ASan
# runtime preloaded) and no C core; resident memory is not compared (ASan holds
# freed memory back, to catch its use).
(cd "$WORK/asan" &&
    env PYTHONPATH="$WORK/asan" LD_PRELOAD="$ASAN" PYTHONMALLOC=malloc CD_TEST_SANITIZER=asan \
        ASAN_OPTIONS=detect_leaks=0:halt_on_error=1:abort_on_error=1 CD_TEST_STRESS_S=15 \
        UBSAN_OPTIONS=halt_on_error=1:print_stacktrace=1 CD_TEST_FAKE_CFLAGS="$ASAN_FLAGS" \
        "$PY" -m pytest -q -n 2 -p no:cacheprovider -m "not gpu" tests/core/test_fake_driver.py tests/core/test_robust.py tests/core/test_stress.py tests/house/test_fake_driver_build.py tests/report/test_reports_you_can_trust.py \
        tests/graphs/test_graph_markers.py tests/hangs_dump_jobs/test_hangs.py tests/hangs_dump_jobs/test_dump.py tests/hangs_dump_jobs/test_dump_trust.py \
        tests/watch/test_context_reset.py \
        tests/report/test_signal_reports.py tests/core/test_frame_readers.py tests/core/test_fork.py \
        tests/hooks/test_runtime_launch_hooks.py tests/hooks/test_launch_hooks_safety.py tests/watch/test_watch.py \
        tests/hooks/test_launch_hooks_host_safety.py tests/hangs_dump_jobs/test_dump_foreign_data.py \
        tests/hangs_dump_jobs/test_dump_store_fuzz.py \
        tests/watch/test_watch_real_runs.py tests/hooks/test_cupti_detach.py \
        tests/core/test_core.py --deselect tests/core/test_core.py::test_fault_kernels_header_is_up_to_date \
        --deselect tests/core/test_fork.py::test_a_fork_while_another_thread_holds_every_lock \
        tests/house/test_architecture.py::test_user_frame_rule_is_one_rule \
        tests/house/test_architecture.py::test_sticky_set_is_one_table)

echo "--- ThreadSanitizer"
(cd "$WORK/tsan" &&
    env PYTHONPATH="$WORK/tsan" LD_PRELOAD="$TSAN" CD_TEST_SANITIZER=tsan \
        TSAN_OPTIONS=halt_on_error=1:second_deadlock_stack=1 \
        "$PY" -m pytest -q -p no:cacheprovider -p no:xdist -m "not gpu" \
        "tests/core/test_stress.py::test_threads_launch_while_scopes_open_and_close_then_a_fault" \
        tests/hooks/test_runtime_launch_hooks.py tests/hooks/test_cupti_detach.py \
        "tests/hooks/test_launch_hooks_host_safety.py::test_watches_open_and_close_while_the_profiler_hand_over_runs")
echo "sanitizers: no report"
