/*
 * report/fault_records.c: the ring of fault records.
 *
 * Every fault the launch callback sees (a wait that returned an error, a
 * launch refused) becomes a record: kernel, configuration, stream, thread,
 * the launching thread's Python frames (capture/frames.c), the text that thread got
 * from the driver during its wait (capture/stderr_tee.c). Records go into a ring of
 * CD_FAULT_RING, numbered from 1, so two threads faulting at once each keep
 * their own, and the first fault is not overwritten by the refusals it causes.
 *
 * A sticky record in a context that already had one is marked a consequence:
 * the context was dead before it (a launch refused, or another thread's wait
 * that found the same fault). Python picks the cause (fault_seq marks, thread,
 * assert text) and builds the exceptions.
 *
 * fault_lock is held for the copy only; the fault path is cold.
 */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE 1
#endif
#include "report/report.h"

#include <string.h>     /* memset, memcpy, strlen, ... */
#include <sys/prctl.h>   /* prctl, PR_GET_NAME */
#include <sys/syscall.h> /* SYS_gettid */
#include <time.h>        /* timespec, clock_gettime, CLOCK_REALTIME */
#include <unistd.h>      /* syscall */

static pthread_mutex_t fault_lock = PTHREAD_MUTEX_INITIALIZER;
static cd_fault ring[CD_FAULT_RING];
static atomic_uint_fast64_t fault_seq;
static uint64_t fork_floor;        /* a forked child: the records up to it are the parent's */

#define MAX_DEAD 64
/* Contexts known dead, by CUPTI's contextUid: a reset hands back the same
 * CUcontext pointer for a new context, which is alive; with the record of
 * each one's cause and the level of its assert text. Under fault_lock. */
static uint32_t dead_contexts[MAX_DEAD];
static uint64_t dead_cause[MAX_DEAD];
static long dead_thread[MAX_DEAD];
static int dead_level[MAX_DEAD];
static int n_dead;

void cd_fault_fill(cd_fault *f, const cd_launch *l)
{
    memset(f, 0, offsetof(cd_fault, device_message));   /* consequence = 0 */
    f->device_message_len = 0;
    f->device_message_cut = 0;
    f->cbid = (int)l->cbid;
    f->device = -1;
    cd_launch_dims d = {{0, 0, 0}, {0, 0, 0}, 0};
    f->stream = (uintptr_t)cd_launch_stream(l->cbid, l->params, &d);
    memcpy(f->grid, d.grid, sizeof f->grid);
    memcpy(f->block, d.block, sizeof f->block);
    f->shared_mem = d.shared_mem;
    if (l->symbol) {
        f->kernel_len = strlen(l->symbol);
        size_t n = f->kernel_len < CD_KERNEL_NAME - 1 ? f->kernel_len : CD_KERNEL_NAME - 1;
        memcpy(f->kernel, l->symbol, n);
        f->kernel[n] = '\0';
    }
    f->context = (uintptr_t)l->context;
    f->context_uid = l->context_uid;
    if (l->context && cd_cupti.cuptiGetDeviceId) {
        uint32_t dev;
        if (cd_cupti.cuptiGetDeviceId(l->context, &dev) == CUPTI_SUCCESS)
            f->device = (int)dev;
    }
    f->thread_id = (long)syscall(SYS_gettid);
    prctl(PR_GET_NAME, f->thread_name, 0, 0, 0);
    f->thread_name[sizeof f->thread_name - 1] = '\0';
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    f->wall_time = (double)ts.tv_sec + ts.tv_nsec * 1e-9;
    f->n_frames = cd_frames_read(f->frames, CD_FAULT_FRAMES, 0, &f->frames_complete);
    if (atomic_load_explicit(&cd_gates.watching, memory_order_relaxed))
        f->launch_seq = cd_watch_thread_last();
    f->log_end = cd_driver_log_count();
}

uint64_t cd_fault_record(cd_fault *f)
{
    pthread_mutex_lock(&fault_lock);
    f->seq = atomic_load(&fault_seq) + 1;
    if (cd_is_sticky(f->code)) {
        int dead = f->at_launch || f->consequence;     /* refused, or named elsewhere */
        int k = -1;
        for (int i = 0; i < n_dead; i++)
            if (dead_contexts[i] == f->context_uid)
                k = i;
        if (k >= 0 && !dead && f->assert_level >= CD_ASSERT_FITS &&
            dead_level[k] < CD_ASSERT_FITS) {
            /* Its text belongs to it, the context's cause so far had none
             * of its own: this is the cause, that one met it first. */
            dead_cause[k] = f->seq;
            dead_thread[k] = f->thread_id;
            dead_level[k] = f->assert_level;
        } else if (k >= 0) {
            dead = 1;
        } else if (!dead && n_dead < MAX_DEAD) {
            k = n_dead++;
            dead_contexts[k] = f->context_uid;
            dead_cause[k] = f->seq;
            dead_thread[k] = f->thread_id;
            dead_level[k] = f->assert_level;
        }
        f->consequence = dead;
        if (dead && k >= 0) {
            f->cause_seq = dead_cause[k];
            f->cause_thread = dead_thread[k];
        }
    }
    if (cd_is_sticky(f->code))
        cd_fault_note_sticky();
    ring[f->seq % CD_FAULT_RING] = *f;
    atomic_store(&fault_seq, f->seq);
    pthread_mutex_unlock(&fault_lock);
    return f->seq;
}

uint64_t cd_fault_seq(void) { return atomic_load(&fault_seq); }

/* A sticky error was seen (recorded here, or found by Python where no record
 * was made: a profiler held CUPTI). Lock-free: read at every raised exception. */
static atomic_int sticky_seen;

void cd_fault_note_sticky(void) { atomic_store_explicit(&sticky_seen, 1, memory_order_relaxed); }

int cd_fault_sticky_seen(void) { return atomic_load_explicit(&sticky_seen, memory_order_relaxed); }

int cd_fault_context_level(uint32_t context_uid)
{
    int level = -1;
    pthread_mutex_lock(&fault_lock);
    for (int i = 0; i < n_dead; i++)
        if (dead_contexts[i] == context_uid)
            level = dead_level[i];
    pthread_mutex_unlock(&fault_lock);
    return level;
}

size_t cd_fault_kernel_of(uint64_t seq, char *out, size_t cap)
{
    size_t n = 0;
    if (!cap)
        return 0;
    pthread_mutex_lock(&fault_lock);
    const cd_fault *r = &ring[seq % CD_FAULT_RING];
    if (seq && r->seq == seq) {
        n = strnlen(r->kernel, sizeof r->kernel);
        if (n >= cap)
            n = cap - 1;
        memcpy(out, r->kernel, n);
    }
    out[n] = '\0';
    pthread_mutex_unlock(&fault_lock);
    return n;
}

int cd_fault_add_ops(cd_fault *f)
{
    /* After the record is in the ring (and its report on fd 2): the walk
     * takes tens of milliseconds (dladdr scans libtorch's symbols, under the
     * loader's lock), and another thread meeting the dead context must find
     * this fault recorded first. Only for the first records, not for every
     * launch a dead context refuses. */
    if (f->seq > 8)
        return 0;
    f->n_ops = cd_native_ops(f->ops, CD_FAULT_OPS);
    pthread_mutex_lock(&fault_lock);
    cd_fault *r = &ring[f->seq % CD_FAULT_RING];
    if (r->seq == f->seq) {
        memcpy(r->ops, f->ops, sizeof r->ops);
        r->n_ops = f->n_ops;
    }
    pthread_mutex_unlock(&fault_lock);
    return f->n_ops;
}

int cd_faults_since(uint64_t since, cd_fault *out, int n)
{
    int k = 0;
    pthread_mutex_lock(&fault_lock);
    uint64_t last = atomic_load(&fault_seq);
    uint64_t first = (since > fork_floor ? since : fork_floor) + 1;
    if (last >= CD_FAULT_RING && first <= last - CD_FAULT_RING)
        first = last - CD_FAULT_RING + 1;
    for (uint64_t s = first; s <= last && k < n; s++)
        if (ring[s % CD_FAULT_RING].seq == s)
            out[k++] = ring[s % CD_FAULT_RING];
    pthread_mutex_unlock(&fault_lock);
    return k;
}

void cd_faults_fork(int op)
{
    cd_fork_lock(&fault_lock, op);
    if (op != CD_FORK_CHILD)
        return;
    fork_floor = atomic_load(&fault_seq);
    n_dead = 0;                    /* the child's contexts are its own */
    atomic_store(&sticky_seen, 0);
}
