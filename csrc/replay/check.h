/*
 * replay/check.h: what an instrumented launch checks before each memory access,
 * and the memory it reports through. One definition for the three places that
 * need it: the patch functions the Sanitizer API calls on the device
 * (replay/patches.cu, built by nvcc), the host code that fills and reads the
 * state (replay/sanitizer.c), and the fake Sanitizer of the CPU tests
 * (tests/fake_cuda/fake_sanitizer.c), which runs the same check on the host.
 *
 * The state lives in device memory the Sanitizer API allocates for the one
 * instrumented launch: the sorted, disjoint [lo, hi) ranges the kernel may
 * touch (every allocation the Sanitizer saw; inside PyTorch's segments only
 * the live tensors), then room for CD_REPLAY_DEVICE_RECORDS bad accesses.
 * Plain C and CUDA C++ both: no CUDA header, no libc.
 */
#ifndef CD_REPLAY_CHECK_H
#define CD_REPLAY_CHECK_H

#include <stdint.h>     /* uint64_t, uint32_t */

/* patches.cu defines it as a device function first; the host's is inline. */
#ifndef CD_CHECK_FN
#define CD_CHECK_FN static inline
#endif

#define CD_REPLAY_RECORDS 64       /* bad accesses kept per launch (more are counted) */
#define CD_REPLAY_DEVICE_RECORDS 4096  /* room on the device: the kept ones are the lowest
                                        * and highest addresses among these (sanitizer.c) */
#define CD_REPLAY_STATE_VERSION 1

/* Where an access went (cd_replay_access.space, low byte), and why it is bad
 * when it is in a valid range (the bits above). */
enum { CD_SPACE_GLOBAL = 1, CD_SPACE_SHARED = 2, CD_SPACE_ASYNC_COPY = 3, CD_SPACE_LOCAL = 4 };
#define CD_BAD_MISALIGNED 0x100    /* not a multiple of its size (716 without the patch) */

/* Sanitizer_DeviceMemoryFlags (sanitizer_patching.h) the report reads. */
enum { CD_ACCESS_READ = 0x1, CD_ACCESS_WRITE = 0x2, CD_ACCESS_ATOMSYS = 0x4 };

typedef struct {
    uint64_t lo, hi;
} cd_replay_range;

typedef struct {                   /* 56 bytes */
    uint64_t address;              /* global: the address; shared/local: the window offset */
    uint64_t pc;                   /* of the instruction (the function's start: sanitizer.c) */
    uint32_t size, flags, space, order;   /* order: 0, 1, ... as the device saw them */
    uint32_t thread[3], block[3];
} cd_replay_access;

typedef struct {                   /* 64 bytes, then the ranges, then the records */
    uint32_t version, n_ranges, max_records, exit_warp;
    uint64_t shared_limit;         /* bytes of shared memory of the launch; 0: not checked */
    unsigned long long n_bad;      /* bad accesses seen (atomic; may pass max_records) */
    unsigned long long n_checked;  /* accesses checked, when counting (tests, probes) */
    const cd_replay_range *ranges;
    cd_replay_access *records;
    uint32_t count, pad;
} cd_replay_state;

/* 1 when the access is misaligned (sizes are 1, 2, 4, 8 or 16). */
CD_CHECK_FN int cd_replay_misaligned(uint64_t a, uint32_t size)
{
    return size && (a & (uint64_t)(size - 1)) != 0;
}

/* 1 when the `size` bytes at `a` lie inside one of the ranges. */
CD_CHECK_FN int cd_replay_inside(const cd_replay_state *s, uint64_t a, uint32_t size)
{
    uint32_t lo = 0, hi = s->n_ranges;
    while (lo < hi) {              /* the last range starting at or below a */
        uint32_t mid = (lo + hi) >> 1;
        if (s->ranges[mid].lo <= a)
            lo = mid + 1;
        else
            hi = mid;
    }
    return lo > 0 && a + size <= s->ranges[lo - 1].hi && a + size >= a;
}

#endif
