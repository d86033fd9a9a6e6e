/*
 * base/got.c: pointing other libraries' imports of one function at ours.
 *
 * A shared library calls a function of another through its global offset
 * table (GOT): a call through the PLT jumps to the address in the entry the
 * dynamic loader filled (JUMP_SLOT), a -fno-plt call loads it (GLOB_DAT).
 * Writing another address into those entries sends the library's calls there
 * (what plthook and most function-interposing profilers do), from then on,
 * without touching the callee. We walk every loaded object
 * (dl_iterate_phdr), find its relocations against `symbol` in its dynamic
 * section, and swap the entries; restoring writes back what was there.
 *
 * Only entries that lead to one and the same definition are taken (two
 * copies of a runtime, CUDA 12's and 13's, keep theirs): the replacement
 * needs one original to call. An entry the loader has not bound yet (lazy
 * binding: it points into the object's own PLT) is bound here first, by
 * asking the loader for the symbol in that object's scope. Entries inside the
 * object's RELRO segment (full RELRO) are written through mprotect. A pointer
 * store is atomic on the architectures built for, so a thread calling
 * through an entry while it is swapped calls the old or the new function,
 * never anything else. Cold: called from Python (watch() entry and exit),
 * never from a callback.
 */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE 1
#endif
#include "base/base.h"

#include <dlfcn.h>
#include <elf.h>
#include <link.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#if defined(__x86_64__)
#define CD_R_JUMP_SLOT R_X86_64_JUMP_SLOT
#define CD_R_GLOB_DAT R_X86_64_GLOB_DAT
#elif defined(__aarch64__)
#define CD_R_JUMP_SLOT R_AARCH64_JUMP_SLOT
#define CD_R_GLOB_DAT R_AARCH64_GLOB_DAT
#endif

#define CD_GOT_FOUND 256
typedef struct {
    void **slot;
    void *now;                   /* what the entry holds */
    const char *object;          /* an unbound entry's object (its l_name), else NULL */
    int relro, unbound;
} found_t;

typedef struct {
    const char *symbol;
    void *replacement;
    const void *skip_base;       /* our own object: never patched */
    found_t found[CD_GOT_FOUND];
    int n_found;
} walk_t;

#ifdef CD_R_JUMP_SLOT
/* The loader relocates most d_ptr values in memory; where it does not (the
 * vdso, some architectures), they are offsets from the load address. */
static uintptr_t dyn_ptr(const struct dl_phdr_info *info, ElfW(Addr) v)
{
    return v < info->dlpi_addr ? info->dlpi_addr + v : v;
}

/* Is address a inside one of the object's segments of this type? */
static int in_segment(const struct dl_phdr_info *info, uintptr_t a, ElfW(Word) type)
{
    for (int i = 0; i < info->dlpi_phnum; i++) {
        const ElfW(Phdr) *ph = &info->dlpi_phdr[i];
        uintptr_t lo = info->dlpi_addr + ph->p_vaddr;
        if (ph->p_type == type && a >= lo && a < lo + ph->p_memsz)
            return 1;
    }
    return 0;
}

/* Store v at slot; 0 on success. */
static int write_slot(void **slot, void *v, int relro)
{
    if (!relro) {
        __atomic_store_n(slot, v, __ATOMIC_SEQ_CST);
        return 0;
    }
    long page = sysconf(_SC_PAGESIZE);
    uintptr_t p = (uintptr_t)slot & ~(uintptr_t)(page - 1);
    size_t len = ((uintptr_t)slot + sizeof(void *) - p + (size_t)page - 1) & ~(size_t)(page - 1);
    if (mprotect((void *)p, len, PROT_READ | PROT_WRITE))
        return -1;
    __atomic_store_n(slot, v, __ATOMIC_SEQ_CST);
    mprotect((void *)p, len, PROT_READ);
    return 0;
}

/* The definition an unbound entry of this object would be bound to. */
static void *bind_now(const char *object, const char *symbol)
{
    if (!object || !object[0])
        return dlsym(RTLD_DEFAULT, symbol);
    void *h = dlopen(object, RTLD_LAZY | RTLD_NOLOAD);
    if (!h)
        return NULL;
    void *f = dlsym(h, symbol);
    dlclose(h);
    return f;
}

static void take(walk_t *w, const struct dl_phdr_info *info, const ElfW(Rela) *rel, size_t n,
                 const ElfW(Sym) *symtab, const char *strtab)
{
    for (size_t i = 0; i < n && w->n_found < CD_GOT_FOUND; i++) {
        unsigned long type = ELF64_R_TYPE(rel[i].r_info);
        if (type != CD_R_JUMP_SLOT && type != CD_R_GLOB_DAT)
            continue;
        const ElfW(Sym) *sym = &symtab[ELF64_R_SYM(rel[i].r_info)];
        if (!sym->st_name || strcmp(strtab + sym->st_name, w->symbol) != 0)
            continue;
        void **slot = (void **)(info->dlpi_addr + rel[i].r_offset);
        void *now = __atomic_load_n(slot, __ATOMIC_SEQ_CST);
        if (now == w->replacement)
            continue;                          /* ours already (a second walk) */
        found_t *f = &w->found[w->n_found++];
        f->slot = slot;
        f->now = now;
        f->unbound = in_segment(info, (uintptr_t)now, PT_LOAD);   /* its own PLT */
        f->object = info->dlpi_name;
        f->relro = in_segment(info, (uintptr_t)slot, PT_GNU_RELRO);
    }
}

static int visit(struct dl_phdr_info *info, size_t size, void *data)
{
    (void)size;
    walk_t *w = data;
    if ((const void *)info->dlpi_addr == w->skip_base)
        return 0;
    const ElfW(Dyn) *dyn = NULL;
    for (int i = 0; i < info->dlpi_phnum; i++)
        if (info->dlpi_phdr[i].p_type == PT_DYNAMIC)
            dyn = (const ElfW(Dyn) *)(info->dlpi_addr + info->dlpi_phdr[i].p_vaddr);
    if (!dyn)
        return 0;
    const ElfW(Sym) *symtab = NULL;
    const char *strtab = NULL;
    const ElfW(Rela) *jmprel = NULL, *rela = NULL;
    size_t jmprel_size = 0, rela_size = 0;
    int pltrel_rela = 1;
    for (const ElfW(Dyn) *d = dyn; d->d_tag != DT_NULL; d++) {
        switch (d->d_tag) {
        case DT_SYMTAB: symtab = (const ElfW(Sym) *)dyn_ptr(info, d->d_un.d_ptr); break;
        case DT_STRTAB: strtab = (const char *)dyn_ptr(info, d->d_un.d_ptr); break;
        case DT_JMPREL: jmprel = (const ElfW(Rela) *)dyn_ptr(info, d->d_un.d_ptr); break;
        case DT_PLTRELSZ: jmprel_size = d->d_un.d_val; break;
        case DT_RELA: rela = (const ElfW(Rela) *)dyn_ptr(info, d->d_un.d_ptr); break;
        case DT_RELASZ: rela_size = d->d_un.d_val; break;
        case DT_PLTREL: pltrel_rela = d->d_un.d_val == DT_RELA; break;
        default: break;
        }
    }
    if (!symtab || !strtab)
        return 0;
    if (jmprel && pltrel_rela)
        take(w, info, jmprel, jmprel_size / sizeof(ElfW(Rela)), symtab, strtab);
    if (rela)
        take(w, info, rela, rela_size / sizeof(ElfW(Rela)), symtab, strtab);
    return 0;
}
#endif

int cd_got_hook(const char *symbol, void *replacement, void **original, cd_got_patch *out,
                int max, int *other_targets)
{
    *other_targets = 0;
#ifdef CD_R_JUMP_SLOT
    static walk_t w;                   /* callers serialise (sub_lock); 6 KiB off the stack */
    Dl_info self;
    memset(&w, 0, sizeof w);
    w.symbol = symbol;
    w.replacement = replacement;
    if (dladdr((void *)cd_got_hook, &self))
        w.skip_base = self.dli_fbase;  /* a library's load bias: dl_iterate_phdr's dlpi_addr */
    dl_iterate_phdr(visit, &w);
    /* Outside the walk (the loader's lock is not held here): an unbound
     * entry is bound to what the loader would give its object. */
    int n = 0;
    for (int i = 0; i < w.n_found; i++) {
        found_t *f = &w.found[i];
        void *target = f->unbound ? bind_now(f->object, symbol) : f->now;
        if (!target)
            continue;
        if (!*original)
            *original = target;
        if (target != *original) {
            (*other_targets)++;
            continue;
        }
        if (n >= max || write_slot(f->slot, replacement, f->relro))
            continue;
        out[n].slot = f->slot;
        out[n].old = f->now;
        out[n].relro = f->relro;
        n++;
    }
    return n;
#else
    (void)symbol, (void)replacement, (void)original, (void)out, (void)max;
    return 0;
#endif
}

#ifdef CD_R_JUMP_SLOT
static int first_only(struct dl_phdr_info *info, size_t size, void *data)
{
    unsigned long long *g = data;
    if (size < offsetof(struct dl_phdr_info, dlpi_subs) + sizeof info->dlpi_subs)
        return 1;                      /* an old loader: no counters (g stays 0) */
    g[0] = info->dlpi_adds;
    g[1] = info->dlpi_subs;
    return 1;                          /* the counters are global: one object is enough */
}
#endif

unsigned long long cd_got_generation(void)
{
    unsigned long long g[2] = {0, 0};
#ifdef CD_R_JUMP_SLOT
    dl_iterate_phdr(first_only, g);
#endif
    return g[0] * 1000003ull + g[1];
}

void cd_got_reapply(cd_got_patch *p, int n, void *replacement)
{
#ifdef CD_R_JUMP_SLOT
    for (int i = 0; i < n; i++)
        write_slot(p[i].slot, replacement, p[i].relro);
#else
    (void)p, (void)n, (void)replacement;
#endif
}

void cd_got_restore(cd_got_patch *p, int n)
{
#ifdef CD_R_JUMP_SLOT
    for (int i = n - 1; i >= 0; i--)
        write_slot(p[i].slot, p[i].old, p[i].relro);
#else
    (void)p, (void)n;
#endif
}
