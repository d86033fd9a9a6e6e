/*
 * fake_device.c: The device: stream queues, worker threads (async mode),
 * running operations, assert text at discovery.
 * Part of the fake libcuda.so.1: fake_driver.h says what it emulates.
 */
#include "fake_driver.h"

/* ------------------------------------------------------ the device ----- */

static void push_pending(const kcfg *c)   /* dev_lock held */
{
    pending_print *p = calloc(1, sizeof *p);
    p->cfg = c;
    *pending_tail = p;
    pending_tail = &p->next;
}

static void exec_kernel(const op *o)      /* dev_lock NOT held */
{
    const kcfg *c = o->cfg;
    sleep_ns(c->duration_us * 1000 + o->extra_ns);
    atomic_fetch_add(&st_kernels_run, 1);
    if (o->addr)                          /* cd_graph_marker(p, v): *p = v */
        atomic_store((_Atomic uint32_t *)o->addr, o->value);
    if (!c->code)
        return;
    pthread_mutex_lock(&dev_lock);
    if (!sticky)
        sticky = c->code;
    if (c->lines > 0)
        push_pending(c);
    pthread_mutex_unlock(&dev_lock);
}

static void exec_op(const op *o)          /* dev_lock NOT held; the context was alive */
{
    switch (o->kind) {
    case OP_KERNEL:
        exec_kernel(o);
        break;
    case OP_WRITE32:
        atomic_store((_Atomic uint32_t *)o->addr, o->value);
        atomic_fetch_add(&st_writes, 1);
        break;
    case OP_MEMSET32:
        for (size_t i = 0; i < o->count; i++)
            o->addr[i] = o->value;
        break;
    case OP_EVENT:
        pthread_mutex_lock(&dev_lock);
        o->ev->done = 1;
        o->ev->t_ms = now_ms();
        pthread_mutex_unlock(&dev_lock);
        break;
    case OP_GRAPH:
        for (const op *k = o->graph->ops; k; k = k->next) {
            if (current_sticky()) {
                atomic_fetch_add(&st_dropped, 1);
                continue;
            }
            if (k->kind == OP_KERNEL) {
                /* the behaviour now: the data may have changed since the
                 * capture (a bad index copied into the static input) */
                op now = *k;
                pthread_mutex_lock(&dev_lock);
                now.cfg = lookup_cfg(k->fn->name);
                pthread_mutex_unlock(&dev_lock);
                exec_op(&now);
                continue;
            }
            exec_op(k);
        }
        break;
    }
}

/* Run the head op of `s`. dev_lock held on entry and exit; released while
 * the op executes. An op whose context is dead when it starts is dropped. */
static void run_head(fake_stream *s)
{
    op *o = s->head;
    s->head = o->next;
    if (!s->head)
        s->tail = NULL;
    s->running = 1;
    int dead = sticky;
    pthread_mutex_unlock(&dev_lock);
    if (dead)
        atomic_fetch_add(&st_dropped, 1);
    else
        exec_op(o);
    pthread_mutex_lock(&dev_lock);
    s->running = 0;
    free(o);
    pthread_cond_broadcast(&dev_cv);
}

static void *stream_worker(void *arg)
{
    fake_stream *s = arg;
    char name[16];
    snprintf(name, sizeof name, "fake-dev-s%d", s->id);
    prctl(PR_SET_NAME, name, 0, 0, 0);
    pthread_mutex_lock(&dev_lock);
    for (;;) {
        while (!(async_on && s->head && !s->running))
            pthread_cond_wait(&dev_cv, &dev_lock);
        run_head(s);
    }
    return NULL;
}

void ensure_worker(fake_stream *s)   /* dev_lock held */
{
    if (async_on && !s->has_worker) {
        pthread_attr_t a;
        pthread_attr_init(&a);
        pthread_attr_setdetachstate(&a, PTHREAD_CREATE_DETACHED);
        if (pthread_create(&s->worker, &a, stream_worker, s) == 0)
            s->has_worker = 1;
        pthread_attr_destroy(&a);
    }
}

void enqueue(fake_stream *s, op *o)  /* dev_lock held */
{
    o->next = NULL;
    if (s->tail)
        s->tail->next = o;
    else
        s->head = o;
    s->tail = o;
    ensure_worker(s);
    pthread_cond_broadcast(&dev_cv);
}

/* An operation enqueued on a capturing stream goes into its capture (the
 * origin stream's list: a joined stream's operations too), in capture order.
 * 1: captured; -1: the capture was invalidated (o is freed); 0: not capturing.
 * dev_lock held. */
int capture_append(fake_stream *s, op *o)
{
    if (s->capture == CU_STREAM_CAPTURE_STATUS_INVALIDATED) {
        free(o);
        return -1;
    }
    if (s->capture != CU_STREAM_CAPTURE_STATUS_ACTIVE)
        return 0;
    fake_stream *origin = s->cap_origin ? s->cap_origin : s;
    o->next = NULL;
    o->serial = ++next_op_serial;
    o->graph_serial = origin->cap_graph ? origin->cap_graph->serial : 0;
    s->cap_last = o;
    if (origin->cap_tail)
        origin->cap_tail->next = o;
    else
        origin->cap_head = o;
    origin->cap_tail = o;
    return 1;
}

/* Wait until `s` has nothing queued or running (executing its ops on this
 * thread unless the device threads do). dev_lock held. */
void drain_locked(fake_stream *s)
{
    for (;;) {
        if (s->head && !s->running && !async_on) {
            run_head(s);
            continue;
        }
        if (!s->head && !s->running)
            return;
        if (sticky && !s->running) {        /* dead: the rest never runs */
            while (s->head) {
                op *o = s->head;
                s->head = o->next;
                free(o);
                atomic_fetch_add(&st_dropped, 1);
            }
            s->tail = NULL;
            return;
        }
        pthread_cond_wait(&dev_cv, &dev_lock);
    }
}

/* fake_set_print_thread(1): printed by a thread of the driver's own, in pieces. */
static int print_from_thread;

/* The synchronising call discovers the fault: the driver prints the device's
 * assert text, through stdio, to whatever libc's `stderr` is now. */
static void print_pending(void)
{
    pthread_mutex_lock(&print_lock);
    pthread_mutex_lock(&dev_lock);
    pending_print *p = pending_head;
    pending_head = NULL;
    pending_tail = &pending_head;
    pthread_mutex_unlock(&dev_lock);
    while (p) {
        const kcfg *c = p->cfg;
        for (int i = 0; i < c->lines; i++) {
            int t = 3 + i;
            if (print_from_thread) {        /* in pieces, as the real driver writes */
                fprintf(stderr, "%s:%d: ", c->file ? c->file : "fake_kernels.cu", c->line);
                fprintf(stderr, "%s: block: [%d,%d,%d], thread: [%d,%d,%d] ",
                        c->func ? c->func : c->name, t / 1024, 0, 0, t % 1024, 0, 0);
                fprintf(stderr, "Assertion `%s` failed.\n", c->cond ? c->cond : "false");
            } else {
                fprintf(stderr,
                        "%s:%d: %s: block: [%d,%d,%d], thread: [%d,%d,%d] Assertion `%s` failed.\n",
                        c->file ? c->file : "fake_kernels.cu", c->line,
                        c->func ? c->func : c->name, t / 1024, 0, 0, t % 1024, 0, 0,
                        c->cond ? c->cond : "false");
            }
            atomic_fetch_add(&st_lines_printed, 1);
        }
        pending_print *n = p->next;
        free(p);
        p = n;
    }
    pthread_mutex_unlock(&print_lock);
}

/* fake_set_print_thread(1): the text is printed by a thread of the driver's
 * own, not by the synchronising one (what the real driver was seen doing on
 * an H200); the synchronising call waits for it, as the real one does. */
static void *print_thread_main(void *arg)
{
    (void)arg;
    print_pending();
    return NULL;
}

FAKE_EXPORT void fake_set_print_thread(int on) { print_from_thread = on; }

/* After a drain: the call's result; prints pending text when dead. */
CUresult sync_result(void)
{
    int s = current_sticky();
    if (s) {
        pthread_t t;
        if (print_from_thread && pthread_create(&t, NULL, print_thread_main, NULL) == 0)
            pthread_join(t, NULL);
        else
            print_pending();
    }
    return (CUresult)s;
}
