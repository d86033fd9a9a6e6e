/*
 * replay/replay.h: cuda-debug replay. Re-run a program with NVIDIA's Sanitizer
 * API (libsanitizer-public.so, opened at run time) subscribed before CUDA
 * starts, count its launches, and instrument only the culprit's: at that
 * launch's LAUNCH_BEGIN its module is patched (replay/patches.cu: every global
 * access and cp.async source checked against the valid ranges, replay/check.h),
 * at its LAUNCH_END the stream is waited for, the bad accesses read back and
 * the module unpatched. A bad access never happens (its warp exits), so the
 * context stays usable; the launch call itself is made to fail with 700 (as a
 * real illegal address would make the next call fail), and so is every later
 * launch and wait, so that the program stops at the launching line. (The
 * driver-API callbacks that do that are enabled then: subscribed from the
 * start they cost a training step ~15%.)
 *
 *   sanitizer.c   loading, the subscription, the callback, the allocation table,
 *                 the instrumented launch (patch, state, records)
 *
 * The valid ranges come from a hook that python/py_replay.c registers (it
 * asks Python, under the GIL, for PyTorch's live blocks); without it, or when
 * it gives none, from every allocation the Sanitizer API reported.
 */
#ifndef CD_REPLAY_H
#define CD_REPLAY_H

#include "base/base.h"
#include "replay/check.h"        /* the device check, shared with patches.cu */

/* The Sanitizer headers replay/sanitizer_api.h was written from. */
#define CD_SANITIZER_HEADERS_TEXT "CUDA 13.0 (Compute Sanitizer 2025.3)"

#define CD_REPLAY_RESULTS 16       /* instrumented launches kept */
#define CD_REPLAY_NAME 1024        /* bytes of a kernel name kept */
#define CD_REPLAY_MAX_ALLOCS (1 << 22)
/* Module images (cubins) kept from the Sanitizer's module-load callback, for
 * the faulting access's source line: the modules that hold the target's
 * kernel name (any module when only launch numbers are known), the newest
 * CD_REPLAY_IMAGES of them, none over CD_REPLAY_IMAGE_MAX bytes, at most
 * CD_REPLAY_IMAGE_BYTES in all (the oldest dropped first). */
#define CD_REPLAY_IMAGES 8
#define CD_REPLAY_IMAGE_MAX (32u << 20)
#define CD_REPLAY_IMAGE_ANY_MAX (8u << 20)
#define CD_REPLAY_IMAGE_BYTES (64u << 20)

/* Which launches to instrument (Python arms it before the program starts). */
enum cd_replay_match { CD_MATCH_ANY = 0, CD_MATCH_MANGLED_PREFIX = 1, CD_MATCH_SUBSTRING = 2 };
#define CD_REPLAY_LAUNCHES 64      /* candidate launch numbers at most */
typedef struct {
    uint64_t launch;               /* the culprit's launch number (1-based), 0: unknown */
    uint64_t set[CD_REPLAY_LAUNCHES];   /* or several candidates: each is instrumented, */
    int n_set;                          /* whatever its kernel (n_set 0: none) */
    uint64_t from;                 /* with a kernel: instrument its launches from this number */
    char kernel[CD_REPLAY_NAME];   /* "" any kernel */
    int match;                     /* cd_replay_match for `kernel` */
    int max_launches;              /* instrumented launches at most */
    int exit_warp;                 /* 1: a bad access's warp exits (no fault happens) */
    int fail_launches;             /* 1: the launch that had one, and every later, fails */
    int while_watching;            /* 1: count only while the script's watch() is open */
    int check_shared;              /* 1: shared accesses too (against the launch's size) */
    int driver_always;             /* 1: the driver-API callbacks from the start (they cost
                                    * ~15% of a training step); 0: enabled when a bad access
                                    * is found, from that launch's end */
} cd_replay_target;

/* What the launch at the culprit's number was (whether it matched or not). */
typedef struct {
    uint64_t launch;
    char kernel[CD_REPLAY_NAME];
    uint32_t grid[3], block[3];
    int seen;
} cd_replay_at;

/* One instrumented launch. */
typedef struct {
    uint64_t launch;
    char kernel[CD_REPLAY_NAME];
    uint32_t grid[3], block[3];
    uintptr_t context, stream;
    int device;
    uint64_t function_pc, function_size;
    uintptr_t module;              /* the kernel's module (cd_replay_module_image) */
    int failed_step;               /* 0 instrumented; else which step the Sanitizer refused */
    int rc;                        /* its SanitizerResult */
    uint32_t n_ranges;
    unsigned long long n_bad, n_checked;
    int n_records;
    cd_replay_access records[CD_REPLAY_RECORDS];
    double seconds_prepare, seconds_ranges, seconds_wait;
} cd_replay_launch;

/* The steps of instrumenting a launch, for cd_replay_launch.failed_step
 * (Python names them from _core.REPLAY_STEPS): X(name, number, what). */
#define CD_REPLAY_STEPS(X)                                                      \
    X(ADD_PATCHES, 1, "loading the patch functions (sanitizerAddPatches)")      \
    X(PATCH_INSTRUCTIONS, 2, "choosing the accesses to patch (sanitizerPatchInstructions)") \
    X(PATCH_MODULE, 3, "patching the kernel's module (sanitizerPatchModule)")   \
    X(ALLOC, 4, "allocating the check's state (sanitizerAlloc)")                \
    X(UPLOAD, 5, "copying the valid ranges to the device (sanitizerMemcpyHostToDeviceAsync)") \
    X(SET_DATA, 6, "giving the launch its state (sanitizerSetLaunchCallbackData)") \
    X(WAIT, 7, "waiting for the instrumented launch (sanitizerStreamSynchronize)") \
    X(READ, 8, "reading the bad accesses back (sanitizerMemcpyDeviceToHost)")
#define CD_STEP_ENUM(name, number, what) CD_STEP_##name = number,
enum cd_replay_step { CD_STEP_NONE = 0, CD_REPLAY_STEPS(CD_STEP_ENUM) };
#undef CD_STEP_ENUM

/* hooks/after_fork.c's op for this layer (CD_FORK_CHILD: its locks free). */
void cd_replay_fork(int op);

/* Ranges for the launch being instrumented: fills *out (malloc'd, sorted,
 * disjoint) and *n, returns 0; nonzero: use the allocation table. Called on
 * the launching thread inside the Sanitizer's callback (python/py_replay.c
 * takes the GIL). */
typedef int (*cd_replay_ranges_fn)(const cd_replay_launch *launch, cd_replay_range **out,
                                   size_t *n);

/* Open libsanitizer-public.so at `path` and bind its entry points: 0, or -1
 * with `error` filled. Once per process (Python serialises). */
int cd_replay_load(const char *path, char *error, size_t error_len);
/* Subscribe (before CUDA initialises) and enable the launch, memory and
 * driver-API launch callbacks: 0 or the SanitizerResult (+1000 for which step,
 * see sanitizer.c). */
int cd_replay_subscribe(const cd_replay_target *target, cd_replay_ranges_fn ranges);
int cd_replay_unsubscribe(void);
/* The script entered (+1) or left (-1) a watch(), which does nothing in a
 * replay (the Sanitizer API holds the tools interface CUPTI would need). */
void cd_replay_watching(int delta);
const char *cd_replay_result_string(int rc);

/* Counters and what was found so far (copies; any thread). */
typedef struct {
    uint64_t launches;             /* launches counted */
    uint64_t launches_seen;        /* every LAUNCH_BEGIN, counted or not */
    int n_results;                 /* launches instrumented (cd_replay_launch_result) */
    int violated;                  /* a bad access was found */
    uint64_t failed_launches;      /* launch calls made to fail */
    uint64_t n_allocs, n_frees;
    size_t live_allocs;
    int patches_contexts;          /* contexts the patches were added to */
    int driver_rc;                 /* enabling the driver-API callbacks: 0, or the failure */
    uint64_t first_instrumented;   /* the first launch instrumented, 0 none */
} cd_replay_status;
void cd_replay_get_status(cd_replay_status *out);
void cd_replay_get_at(cd_replay_at *out);
/* Instrumented launch i (0-based, in order; the last CD_REPLAY_RESULTS are
 * kept): 0, or -1 when it is not (or no longer) there. */
int cd_replay_launch_result(int i, cd_replay_launch *out);

/* The allocation table: (address, size, flags, resource cbid) quadruples, up
 * to max; returns how many were written (the table's size may be larger). */
size_t cd_replay_allocations(uint64_t *out, size_t max);
size_t cd_replay_allocation_count(void);

/* The image (cubin) of the module of instrumented launch `launch`, as the
 * module-load callback handed it over: copies up to `max` bytes into `out`
 * (NULL: none) and returns its whole size; 0 when it was not kept. */
size_t cd_replay_module_image(uint64_t launch, void *out, size_t max);
/* Images kept now, and their bytes (tests: the bound holds). */
void cd_replay_image_stats(size_t *count, size_t *bytes);

#endif
