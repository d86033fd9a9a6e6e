/*
 * capture/native_ops.c: the PyTorch (ATen) operators a faulting launch was made from,
 * read from the launching thread's native stack at the fault.
 *
 * ATen enters every operator through at::_ops::<name>::call (and, past
 * autograd, ::redispatch): exported functions of libtorch. At the fault (cold
 * path, in the launch callback, on the launching thread, before control goes
 * back to the framework) backtrace() walks the native stack and the frames of
 * those functions give the operator names, innermost first. Nothing runs
 * before a fault: no per-op hook, no cost on the hot path.
 *
 * A return address is attributed to a symbol only inside that symbol's size
 * (dladdr1 with RTLD_DL_SYMENT): a static function placed after an exported
 * one is not taken for it. Names are copied into fixed buffers; nothing here
 * allocates (backtrace() loads libgcc's unwinder on its first call, which
 * cd_native_ops_warm() does at subscribe time, outside any fault).
 */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE 1
#endif
#include "capture/capture.h"

#include <dlfcn.h>
#include <execinfo.h>
#include <link.h>
#include <string.h>

#define MAX_PCS 128

void cd_native_ops_warm(void)
{
    static atomic_int warmed;
    if (atomic_exchange(&warmed, 1))
        return;
    void *pcs[4];
    (void)backtrace(pcs, 4);
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
    void *pcs[MAX_PCS];
    int n = backtrace(pcs, MAX_PCS), k = 0;
    for (int i = 1; i < n && k < max; i++) {       /* 0 is this function */
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
