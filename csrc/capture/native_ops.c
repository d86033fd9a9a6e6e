/*
 * capture/native_ops.c: the PyTorch (ATen) operators a faulting launch was made from,
 * read from the launching thread's native stack at the fault.
 *
 * ATen enters every operator through at::_ops::<name>::call (and, past
 * autograd, ::redispatch): exported functions of libtorch. At the fault (cold
 * path, in the launch callback, on the launching thread, after the report is
 * written) the unwinder walks the native stack and the frames of those
 * functions give the operator names, innermost first. Nothing runs before a
 * fault: no per-op hook, no cost on the hot path.
 *
 * The walk must not crash the program it reports on. Unwinding reads return
 * addresses and saved registers off the stack; where the frame chain is stale
 * (greenlet runs Python code below frames it has since overwritten; a fiber's
 * stack may end in anything) the unwinder reads garbage addresses and faults
 * before we can look at them. So the walk
 *   - happens only on the thread's own stack (pthread_getattr_np): from a
 *     stack switched to by user code nothing bounds it;
 *   - stops at the Python interpreter: the first frame in the code of the
 *     object that holds _PyEval_EvalFrameDefault (the python executable, or
 *     libpython): the operators of a launch are between it and the launch,
 *     and stack switchers that run Python (greenlet) do so above it. Not the
 *     symbol's own size: in CPython built with LTO and PGO, as distributions
 *     build it, the exported function can be a stub around code the compiler
 *     moved out of it (Debian's 3.14.10: 1184 bytes; the interpreter's frames
 *     return into local, stripped code elsewhere in the executable): the walk
 *     never met it and unwound into the stale frames above (SIGSEGV in the
 *     unwinder);
 *   - stops at a frame outside the stack, or below the one before.
 *
 * A return address is attributed to a symbol only inside that symbol's size
 * (dladdr1 with RTLD_DL_SYMENT): a static function placed after an exported
 * one is not taken for it. Names are copied into fixed buffers; nothing here
 * allocates but pthread_getattr_np, once per thread (the unwinder is looked
 * up, and loads its tables, in cd_native_ops_warm(), at subscribe time,
 * outside any fault).
 */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE 1
#endif
#include "capture/capture.h"

#include <dlfcn.h>      /* dlopen, RTLD_NOW, RTLD_LOCAL, ... */
#include <link.h>        /* dl_phdr_info, ElfW, dl_iterate_phdr */
#include <pthread.h>     /* pthread_self */
#include <string.h>      /* strnlen, strncmp, memcmp, ... */
#include <unwind.h>      /* _Unwind_Reason_Code, _Unwind_Context */

#define MAX_PCS 128

typedef _Unwind_Reason_Code (*unwind_backtrace_fn)(_Unwind_Trace_Fn, void *);
typedef _Unwind_Ptr (*unwind_get_fn)(struct _Unwind_Context *);

/* Set once by cd_native_ops_warm (under the subscription lock), before any
 * fault path can run; `ready` publishes them. */
static unwind_backtrace_fn unwind_backtrace;
static unwind_get_fn unwind_get_ip, unwind_get_cfa;
static uintptr_t interp_lo, interp_hi; /* the executable segment holding
                                           _PyEval_EvalFrameDefault; 0: unknown */
static atomic_int ready;

typedef struct {
    void **pcs;
    int n, max;
    uintptr_t lo, hi, last_cfa;        /* the stack's bounds; the previous frame's CFA */
} walk_t;

static _Unwind_Reason_Code on_frame(struct _Unwind_Context *ctx, void *arg)
{
    walk_t *w = arg;
    uintptr_t pc = (uintptr_t)unwind_get_ip(ctx), cfa = (uintptr_t)unwind_get_cfa(ctx);
    if (!pc || cfa < w->lo || cfa >= w->hi || cfa < w->last_cfa)
        return _URC_END_OF_STACK;      /* off the stack, or going back down it: stale */
    if (pc - 1 >= interp_lo && pc - 1 < interp_hi)
        return _URC_END_OF_STACK;      /* the interpreter: the operators are below it */
    w->last_cfa = cfa;
    w->pcs[w->n++] = (void *)pc;
    return w->n < w->max ? _URC_NO_REASON : _URC_END_OF_STACK;
}

/* dl_iterate_phdr callback: the executable PT_LOAD segment holding *arg. */
static int interp_segment(struct dl_phdr_info *info, size_t size, void *arg)
{
    uintptr_t addr = *(const uintptr_t *)arg;
    for (int i = 0; i < info->dlpi_phnum; i++) {
        const ElfW(Phdr) *ph = &info->dlpi_phdr[i];
        if (ph->p_type != PT_LOAD || !(ph->p_flags & PF_X))
            continue;
        uintptr_t lo = (uintptr_t)info->dlpi_addr + ph->p_vaddr, hi = lo + ph->p_memsz;
        if (addr >= lo && addr < hi) {
            interp_lo = lo;
            interp_hi = hi;
            return 1;
        }
    }
    return 0;
}

void cd_native_ops_warm(void)
{
    static atomic_int warmed;
    if (atomic_exchange(&warmed, 1))
        return;
    void *gcc = dlopen("libgcc_s.so.1", RTLD_NOW | RTLD_LOCAL);    /* what backtrace() uses */
    if (gcc) {
        unwind_backtrace = (unwind_backtrace_fn)dlsym(gcc, "_Unwind_Backtrace");
        unwind_get_ip = (unwind_get_fn)dlsym(gcc, "_Unwind_GetIP");
        unwind_get_cfa = (unwind_get_fn)dlsym(gcc, "_Unwind_GetCFA");
    }
    void *eval = dlsym(RTLD_DEFAULT, "_PyEval_EvalFrameDefault");
    if (eval) {
        uintptr_t addr = (uintptr_t)eval;
        dl_iterate_phdr(interp_segment, &addr);
    }
    if (unwind_backtrace && unwind_get_ip && unwind_get_cfa) {
        void *pcs[4];
        walk_t w = {pcs, 0, 4, 0, UINTPTR_MAX, 0};
        unwind_backtrace(on_frame, &w);   /* the unwinder reads its tables now, not at a fault */
        atomic_store_explicit(&ready, 1, memory_order_release);
    }
}

/* This thread's own stack, [lo, hi): once per thread. 0 when unknown. */
static int thread_stack(uintptr_t *lo, uintptr_t *hi)
{
    static _Thread_local uintptr_t t_lo, t_hi;
    if (!t_hi) {
        pthread_attr_t a;
        void *addr;
        size_t size;
        if (pthread_getattr_np(pthread_self(), &a) != 0)
            return 0;
        int ok = pthread_attr_getstack(&a, &addr, &size) == 0;
        pthread_attr_destroy(&a);
        if (!ok || !size)
            return 0;
        t_lo = (uintptr_t)addr;
        t_hi = t_lo + size;
    }
    *lo = t_lo;
    *hi = t_hi;
    return 1;
}

/* "<len><ident>" at *p: the identifier's start and length, p advanced; 0 if not. */
static int source_name(const char **p, const char **start, size_t *len)
{
    size_t n = 0;
    const char *s = *p;
    if (*s < '0' || *s > '9')
        return 0;
    while (*s >= '0' && *s <= '9') {
        n = n * 10 + (size_t)(*s - '0');
        if (n > 4096)
            return 0;
        s++;
    }
    if (strnlen(s, n) < n)
        return 0;
    *start = s;
    *len = n;
    *p = s + n;
    return 1;
}

size_t cd_aten_op_of_symbol(const char *sym, char *out, size_t cap)
{
    static const char prefix[] = "_ZN2at4_ops";
    if (!sym || !cap || strncmp(sym, prefix, sizeof prefix - 1) != 0)
        return 0;
    const char *p = sym + sizeof prefix - 1, *name, *method;
    size_t n, m;
    if (!source_name(&p, &name, &n) || !source_name(&p, &method, &m) || *p != 'E')
        return 0;
    if (!((m == 4 && memcmp(method, "call", 4) == 0) ||
          (m == 10 && memcmp(method, "redispatch", 10) == 0)))
        return 0;
    if (n >= cap)
        n = cap - 1;
    memcpy(out, name, n);
    out[n] = '\0';
    return n;
}

int cd_native_ops(char ops[][CD_OP_NAME], int max)
{
    uintptr_t lo, hi, sp = (uintptr_t)__builtin_frame_address(0);
    if (!atomic_load_explicit(&ready, memory_order_acquire) || !thread_stack(&lo, &hi) ||
        sp < lo || sp >= hi)
        return 0;                  /* no unwinder, or not on the thread's own stack */
    void *pcs[MAX_PCS];
    walk_t w = {pcs, 0, MAX_PCS, lo, hi, 0};
    unwind_backtrace(on_frame, &w);
    int n = w.n, k = 0;
    for (int i = 0; i < n && k < max; i++) {
        Dl_info info;
        const ElfW(Sym) *sym = NULL;
        if (!dladdr1(pcs[i], &info, (void **)&sym, RTLD_DL_SYMENT) || !info.dli_sname ||
            !sym || !info.dli_saddr)
            continue;
        uintptr_t pc = (uintptr_t)pcs[i] - 1;       /* inside the call instruction */
        uintptr_t lo = (uintptr_t)info.dli_saddr;
        if (pc < lo || pc >= lo + sym->st_size)
            continue;
        char name[CD_OP_NAME];
        if (!cd_aten_op_of_symbol(info.dli_sname, name, sizeof name))
            continue;
        if (k && strcmp(ops[k - 1], name) == 0)     /* call, then redispatch: one op */
            continue;
        memcpy(ops[k++], name, sizeof name);
    }
    return k;
}
