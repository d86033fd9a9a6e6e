/*
 * capture/contexts.c: watch mode's context table. A context here is one the
 * watch saw launches in: an entry keyed by CUPTI's contextUid, with the
 * context's completion slots. (base/devices.c holds each device's primary
 * context; nothing else in the core is called a context.)
 *
 * A context is known by CUPTI's contextUid (unique in the process), never by
 * its CUcontext pointer: after cuDevicePrimaryCtxReset (cudaDeviceReset) the
 * driver hands back the same pointer for a new context.
 *
 * Each entry has one buffer of slots: CD_WATCH_SLOTS for launches (by seq,
 * watch_ring.c), then CD_GRAPH_NODES for nodes of captured graphs
 * (graph_capture.c); the slot accessors (capture.h: cd_launch_slot,
 * cd_node_slot) are the only ones that know the layout. The buffer
 * is our own memory (mmap), registered with the context (cuMemHostRegister,
 * portable, device-mapped): the driver never frees it, so reading slots never
 * faults - after the context died, after a reset, from a signal handler.
 * A buffer is never unmapped; a retired entry's buffer is reused (zeroed,
 * registered again) by the next context that takes the entry.
 *
 * An entry is retired when its context is destroyed (CUPTI's resource
 * callback CONTEXT_DESTROY_STARTING), or, when that callback was missed (a
 * reset while nothing was subscribed), when watch() opens and finds the
 * context's pointer behind another id. A retired entry's records are never
 * read (cd_watch_done: -2). Records keep the entry's generation: an entry
 * taken by another context is a new generation, the old records stay retired.
 * The table has CD_MAX_CONTEXTS entries: more live contexts than that get no
 * markers (counted in n_unmarked).
 */
#include "capture/capture.h"

#include <string.h>     /* memset */
#include <sys/mman.h>    /* mmap, PROT_READ, PROT_WRITE, ... */

typedef struct {
    _Atomic int state;             /* CTX_FREE, CTX_LIVE, CTX_RETIRED */
    _Atomic uint32_t uid;          /* CUPTI contextUid */
    _Atomic uint32_t gen;          /* moves each time the entry is taken */
    uintptr_t ctx;                 /* its CUcontext (to match destroy callbacks) */
    volatile uint32_t *host;       /* the buffer; NULL: no markers (allocation failed) */
    size_t bytes;
    CUdeviceptr dev;               /* its device address in this context */
    int device;
} ctx_slots;
enum { CTX_FREE = 0, CTX_LIVE = 1, CTX_RETIRED = 2 };
#define SLOTS_BYTES (((size_t)CD_WATCH_SLOTS + CD_GRAPH_NODES) * sizeof(uint32_t))
static ctx_slots ctxs[CD_MAX_CONTEXTS];
static pthread_mutex_t ctx_lock = PTHREAD_MUTEX_INITIALIZER;
static atomic_uint ctx_epoch;      /* moves at every retirement: per-thread caches drop */
static atomic_int ids_agree;       /* cuptiGetContextId == contextUid: 1 yes, -1 no, 0 unknown */
static atomic_int alloc_rc;         /* the last failed map_slots (a statistic) */
static _Thread_local uint32_t tls_uid;
static _Thread_local unsigned tls_epoch;
static _Thread_local int tls_ctx_index = -1;

/* The entry's buffer registered with the current context (ctx_lock held).
 * 0, or the CUresult of the failure (the entry then has no markers). */
int cd_watch_alloc_rc(void) { return atomic_load(&alloc_rc); }

static int map_slots(ctx_slots *e)
{
    int rc = CUDA_ERROR_OUT_OF_MEMORY;
    for (int attempt = 0; attempt < 2; attempt++) {
        if (!e->host) {
            void *p = mmap(NULL, SLOTS_BYTES, PROT_READ | PROT_WRITE,
                           MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
            if (p == MAP_FAILED)
                return CUDA_ERROR_OUT_OF_MEMORY;
            e->host = p;
            e->bytes = SLOTS_BYTES;
        } else {
            memset((void *)e->host, 0, e->bytes);  /* a reused buffer: no old numbers */
        }
        rc = CU_CHECK(cd_drv.cuMemHostRegister((void *)e->host, e->bytes,
                                               CU_MEMHOSTREGISTER_PORTABLE |
                                                   CU_MEMHOSTREGISTER_DEVICEMAP));
        if (rc == 0 && (rc = CU_CHECK(cd_drv.cuMemHostGetDevicePointer(&e->dev,
                                                                      (void *)e->host, 0))) == 0)
            return 0;
        /* Still registered by a context that lives on (an entry retired by
         * mistake), or refused: keep that buffer mapped, take a fresh one. */
        e->host = NULL;
    }
    return rc;
}

/* Cold: a context seen for the first time; it is current on this thread.
 * From the launch callback (its first launch), or from watch entry for the
 * contexts that exist then. Never while the thread's stream is capturing (a
 * registration would invalidate the capture). Returns the entry's index, or
 * -1 when every entry holds a live context. */
static __attribute__((noinline, cold)) int register_context(CUcontext context, uint32_t uid)
{
    pthread_mutex_lock(&ctx_lock);
    int pick = -1;
    for (int i = 0; i < CD_MAX_CONTEXTS; i++) {
        int st = atomic_load(&ctxs[i].state);
        if (st == CTX_LIVE && atomic_load(&ctxs[i].uid) == uid) {
            pthread_mutex_unlock(&ctx_lock);
            return i;
        }
        if (st == CTX_FREE && (pick < 0 || atomic_load(&ctxs[pick].state) != CTX_FREE))
            pick = i;
        else if (st == CTX_RETIRED && pick < 0)
            pick = i;
    }
    if (pick < 0) {
        pthread_mutex_unlock(&ctx_lock);
        return -1;
    }
    ctx_slots *e = &ctxs[pick];
    atomic_store(&e->state, CTX_FREE);            /* readers: not this generation yet */
    atomic_fetch_add(&e->gen, 1);
    int rc = map_slots(e);
    if (rc) {
        atomic_store(&alloc_rc, rc);
        e->host = NULL;
    }
    e->ctx = (uintptr_t)context;
    e->device = -1;
    uint32_t d;
    if (cd_cupti.cuptiGetDeviceId && cd_cupti.cuptiGetDeviceId(context, &d) == CUPTI_SUCCESS)
        e->device = (int)d;
    atomic_store(&e->uid, uid);
    atomic_store(&e->state, CTX_LIVE);
    pthread_mutex_unlock(&ctx_lock);
    return pick;
}

/* ctx_lock held. The entry's records are never read again; every thread's
 * cache of its last context drops. */
static void retire_locked(int i)
{
    atomic_store(&ctxs[i].state, CTX_RETIRED);
    atomic_fetch_add(&ctx_epoch, 1);
}

void cd_watch_context_destroyed(CUcontext context)
{
    pthread_mutex_lock(&ctx_lock);
    for (int i = 0; i < CD_MAX_CONTEXTS; i++)
        if (atomic_load(&ctxs[i].state) == CTX_LIVE && ctxs[i].ctx == (uintptr_t)context)
            retire_locked(i);
    pthread_mutex_unlock(&ctx_lock);
}

/* A context current on this thread, at watch entry: retire an entry that
 * holds its pointer under another id (destroyed while nothing was
 * subscribed), then register it. */
static void prepare_context(CUcontext c)
{
    uint32_t uid;
    if (!cd_cupti.cuptiGetContextId || cd_cupti.cuptiGetContextId(c, &uid) != CUPTI_SUCCESS ||
        atomic_load(&ids_agree) < 0)
        return;
    if (atomic_load(&ids_agree) > 0) {
        pthread_mutex_lock(&ctx_lock);
        for (int i = 0; i < CD_MAX_CONTEXTS; i++)
            if (atomic_load(&ctxs[i].state) == CTX_LIVE && ctxs[i].ctx == (uintptr_t)c &&
                atomic_load(&ctxs[i].uid) != uid)
                retire_locked(i);
        pthread_mutex_unlock(&ctx_lock);
    }
    register_context(c, uid);
}

void cd_watch_prepare(void)
{
    if (cd_driver_ready() != 0)
        return;
    CUcontext ctx = NULL;
    if (cd_drv.cuCtxGetCurrent(&ctx) == CUDA_SUCCESS && ctx)
        prepare_context(ctx);
    int n = 0;
    if (cd_drv.cuDeviceGetCount(&n) != CUDA_SUCCESS)
        return;
    for (int i = 0; i < n && i < CD_MAX_DEVICES; i++) {
        CUdevice dev;
        unsigned flags;
        int active = 0;
        CUcontext c, popped;
        if (cd_drv.cuDeviceGet(&dev, i) ||
            cd_drv.cuDevicePrimaryCtxGetState(dev, &flags, &active) ||
            !active || cd_device_context(i, &c) || cd_drv.cuCtxPushCurrent(c))
            continue;
        prepare_context(c);
        cd_drv.cuCtxPopCurrent(&popped);
    }
}

/* A launch tells whether CUPTI's two ids of a context (the callback's
 * contextUid, cuptiGetContextId) are the same numbers; watch entry relies on
 * the second only when they are. Asked until known (cold: per-thread cache
 * misses only). */
static __attribute__((noinline, cold)) void learn_ids(CUcontext context, uint32_t uid)
{
    uint32_t id;
    if (cd_cupti.cuptiGetContextId && context &&
        cd_cupti.cuptiGetContextId(context, &id) == CUPTI_SUCCESS)
        atomic_store(&ids_agree, id == uid ? 1 : -1);
}

/* The live entry of a context id, or -1 (no registration: safe while capturing). */
int cd_watch_context_find(uint32_t uid)
{
    for (int i = 0; i < CD_MAX_CONTEXTS; i++)
        if (atomic_load_explicit(&ctxs[i].state, memory_order_acquire) == CTX_LIVE &&
            atomic_load_explicit(&ctxs[i].uid, memory_order_relaxed) == uid)
            return i;
    return -1;
}

unsigned cd_watch_context_epoch(void)
{
    return atomic_load_explicit(&ctx_epoch, memory_order_acquire);
}

/* The launch's context entry, registered on first sight (hot: a per-thread
 * cache of the last id, valid until any entry retires). */
int cd_watch_context_index(CUcontext context, uint32_t uid)
{
    unsigned epoch = atomic_load_explicit(&ctx_epoch, memory_order_relaxed);
    if (uid == tls_uid && epoch == tls_epoch && tls_ctx_index >= 0)
        return tls_ctx_index;
    if (!atomic_load_explicit(&ids_agree, memory_order_relaxed))
        learn_ids(context, uid);
    int i = cd_watch_context_find(uid);
    if (i < 0)
        i = register_context(context, uid);
    tls_uid = uid;
    tls_epoch = epoch;
    tls_ctx_index = i;
    return i;
}

int cd_watch_context_slots(int ci, uint32_t gen, cd_slots *out)
{
    if (ci < 0 || ci >= CD_MAX_CONTEXTS)
        return -1;
    const ctx_slots *e = &ctxs[ci];
    if (atomic_load_explicit(&e->state, memory_order_acquire) != CTX_LIVE ||
        ((atomic_load_explicit(&e->gen, memory_order_relaxed) ^ gen) & 0xFFFF) || !e->host)
        return -1;
    out->host = e->host;
    out->dev = e->dev;
    return 0;
}

int cd_watch_context_retired(int ci, uint32_t gen)
{
    return !(ci >= 0 && ci < CD_MAX_CONTEXTS &&
             atomic_load(&ctxs[ci].state) == CTX_LIVE && cd_watch_context_gen(ci) == gen);
}

/* The entry's generation, as records keep it (16 bits). */
uint32_t cd_watch_context_gen(int ci)
{
    return ci >= 0 && ci < CD_MAX_CONTEXTS ? atomic_load(&ctxs[ci].gen) & 0xFFFF : 0;
}

int cd_watch_contexts_live(void)
{
    int n = 0;
    for (int i = 0; i < CD_MAX_CONTEXTS; i++)
        n += atomic_load(&ctxs[i].state) == CTX_LIVE;
    return n;
}

int cd_watch_context_device(int ci)
{
    return ci >= 0 && ci < CD_MAX_CONTEXTS ? ctxs[ci].device : -1;
}

void cd_contexts_fork(int op)
{
    cd_fork_lock(&ctx_lock, op);
    if (op != CD_FORK_CHILD)
        return;
    /* The contexts are the parent's (the child's copies of the slots never get
     * a marker): retired, so that a launch of the child's own (a driver that
     * works after fork) registers its context afresh. */
    for (int i = 0; i < CD_MAX_CONTEXTS; i++)
        if (atomic_load(&ctxs[i].state) == CTX_LIVE)
            atomic_store(&ctxs[i].state, CTX_RETIRED);
    atomic_fetch_add(&ctx_epoch, 1);
}
