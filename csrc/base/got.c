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
 * needs one original to call, the entry's own (its runtime's error state,
 * its kernel handles' registration). Which definition, the first time: the
 * one the caller's preferred objects lead to, else the first found. An entry
 * the loader has not bound yet (lazy binding: it points into the object's
 * own PLT) is bound here first, by
 * asking the loader for the symbol in that object's scope. A pointer store is
 * atomic on the architectures built for, so a thread calling through an
 * entry while it is swapped calls the old or the new function, never
 * anything else.
 *
 * The promise to the objects written (SPEC section 16), as the PLT-hook
 * libraries keep it:
 *   - the page keeps its protection: what /proc/self/maps says it has when
 *     the entry is found (xHook's xh_util_get_mem_protect), else what the
 *     program headers say the loader gave it (RELRO's last page, which it
 *     only partly covers, stays writable: the loader rounds RELRO's end down);
 *     a writable page is written as it is, another made writable for the
 *     store and given back exactly that;
 *   - nothing is written into an object that is gone: every write, the
 *     restore at watch() exit included, happens inside dl_iterate_phdr (as
 *     ByteHook refreshes its ELF list through it before touching one), under
 *     the loader's lock, which dlclose holds while it unmaps, into an object
 *     that is still the one the entry was found in (load address, program
 *     headers, name), and, for a restore, only where the entry still holds
 *     what we wrote: an object unloaded mid-watch, or loaded again at its
 *     address, or another mapping there, is not touched; its patch is dropped.
 * Cold: called from Python (watch() entry and exit), never from a callback.
 */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE 1
#endif
#include "base/base.h"

#include <dlfcn.h>      /* dlsym, RTLD_DEFAULT, dlopen, ... */
#include <elf.h>         /* R_X86_64_JUMP_SLOT, R_X86_64_GLOB_DAT, R_AARCH64_JUMP_SLOT, ... */
#include <errno.h>       /* errno, EINTR */
#include <fcntl.h>       /* open, O_RDONLY, O_CLOEXEC */
#include <link.h>        /* dl_phdr_info, ElfW, dl_iterate_phdr */
#include <string.h>      /* strcmp, memset */
#include <sys/mman.h>    /* PROT_READ, PROT_WRITE, PROT_EXEC, ... */
#include <unistd.h>      /* sysconf, _SC_PAGESIZE, read, ... */

#if defined(__x86_64__)
#define CD_R_JUMP_SLOT R_X86_64_JUMP_SLOT
#define CD_R_GLOB_DAT R_X86_64_GLOB_DAT
#elif defined(__aarch64__)
#define CD_R_JUMP_SLOT R_AARCH64_JUMP_SLOT
#define CD_R_GLOB_DAT R_AARCH64_GLOB_DAT
#endif

#define CD_GOT_FOUND 256
#define CD_GOT_NAME 512            /* an object's name, copied during the walk */
typedef struct {
    void **slot;
    void *now;                   /* what the entry holds */
    /* the object's name (its dlpi_name), copied inside the walk: the
     * loader's string is freed when another thread dlcloses the object, so
     * it is never kept past dl_iterate_phdr. "" when it did not fit (never
     * bound by name, never preferred). */
    char object[CD_GOT_NAME];
    cd_got_patch id;             /* the object's identity, the page's protection */
    int unbound;
    int main_program;            /* the program itself (no name) */
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

/* The program header of this type holding address a, or NULL. */
static const ElfW(Phdr) *segment_of(const struct dl_phdr_info *info, uintptr_t a, ElfW(Word) type)
{
    for (int i = 0; i < info->dlpi_phnum; i++) {
        const ElfW(Phdr) *ph = &info->dlpi_phdr[i];
        uintptr_t lo = info->dlpi_addr + ph->p_vaddr;
        if (ph->p_type == type && a >= lo && a < lo + ph->p_memsz)
            return ph;
    }
    return NULL;
}

static uintptr_t page_size(void)
{
    static uintptr_t page;
    if (!page)
        page = (uintptr_t)sysconf(_SC_PAGESIZE);
    return page;
}

static uintptr_t page_of(const void *a) { return (uintptr_t)a & ~(page_size() - 1); }

/* FNV-1a of an object's name: part of its identity (the name's memory may
 * be freed with the object, so it is not kept). */
static uint32_t name_hash(const char *s)
{
    uint32_t h = 2166136261u;
    for (; s && *s; s++)
        h = (h ^ (unsigned char)*s) * 16777619u;
    return h;
}

/* The protection the loader gave the page holding a: its PT_LOAD's flags,
 * without PROT_WRITE where PT_GNU_RELRO covers the whole page (the loader
 * rounds RELRO's end down to a page: a last page it only partly covers stays
 * writable). Used where /proc/self/maps cannot be read. */
static int phdr_prot(const struct dl_phdr_info *info, uintptr_t a)
{
    const ElfW(Phdr) *load = segment_of(info, a, PT_LOAD);
    if (!load)
        return -1;
    int prot = (load->p_flags & PF_R ? PROT_READ : 0) | (load->p_flags & PF_W ? PROT_WRITE : 0) |
               (load->p_flags & PF_X ? PROT_EXEC : 0);
    for (int i = 0; i < info->dlpi_phnum; i++) {
        const ElfW(Phdr) *ph = &info->dlpi_phdr[i];
        if (ph->p_type != PT_GNU_RELRO)
            continue;
        uintptr_t lo = page_of((void *)(info->dlpi_addr + ph->p_vaddr));
        uintptr_t hi = page_of((void *)(info->dlpi_addr + ph->p_vaddr + ph->p_memsz));
        if (page_of((void *)a) >= lo && page_of((void *)a) < hi)
            prot &= ~PROT_WRITE;
    }
    return prot;
}

/* The protections of the pages holding p[i].slot, as /proc/self/maps says
 * (what xHook's xh_util_get_mem_protect reads): into p[i].prot; a slot in no
 * mapping gets -1. One pass over the file, a fixed buffer, no allocation.
 * 0, or -1 (the file cannot be read: p[] keeps what it had). */
static int maps_prot(cd_got_patch *p, int n)
{
    int fd = open("/proc/self/maps", O_RDONLY | O_CLOEXEC);
    if (fd < 0)
        return -1;
    for (int i = 0; i < n; i++)
        p[i].prot = -1;
    static char buf[4096];             /* callers serialise (sub_lock) */
    /* each line: "lo-hi rwxp ...": field 0 lo, 1 hi, 2 the permissions, 3 the rest */
    uintptr_t lo = 0, hi = 0;
    int field = 0, perm = 0, prot = 0;
    for (;;) {
        ssize_t k = read(fd, buf, sizeof buf);
        if (k < 0 && errno == EINTR)
            continue;
        if (k <= 0)
            break;
        for (ssize_t j = 0; j < k; j++) {
            char c = buf[j];
            if (c == '\n') {
                for (int i = 0; i < n; i++)
                    if ((uintptr_t)p[i].slot >= lo && (uintptr_t)p[i].slot < hi)
                        p[i].prot = prot;
                lo = hi = 0;
                field = perm = prot = 0;
            } else if (field < 2) {
                int d = c >= '0' && c <= '9' ? c - '0' : c >= 'a' && c <= 'f' ? c - 'a' + 10 : -1;
                if (d >= 0 && field == 0)
                    lo = lo << 4 | (uintptr_t)d;
                else if (d >= 0)
                    hi = hi << 4 | (uintptr_t)d;
                else
                    field++;           /* '-', then ' ' */
            } else if (field == 2) {
                if (c == ' ')
                    field = 3;
                else if (perm < 3 && c != '-')
                    prot |= perm == 0 ? PROT_READ : perm == 1 ? PROT_WRITE : PROT_EXEC;
                perm++;
            }
        }
    }
    close(fd);
    return 0;
}

/* Store v at slot, the page left with the protection it had (prot, PROT_*):
 * a writable page is written as it is; another is made writable for the
 * store, then given back exactly prot. 0 on success. */
static int write_slot(void **slot, void *v, int prot)
{
    if (prot < 0)
        return -1;
    if (prot & PROT_WRITE) {
        __atomic_store_n(slot, v, __ATOMIC_SEQ_CST);
        return 0;
    }
    void *p = (void *)page_of(slot);
    if (mprotect(p, page_size(), prot | PROT_READ | PROT_WRITE))
        return -1;
    __atomic_store_n(slot, v, __ATOMIC_SEQ_CST);
    mprotect(p, page_size(), prot);
    return 0;
}

/* The definition an unbound entry of this object would be bound to. */
static void *bind_now(const char *object, const char *symbol, int main_program)
{
    if (main_program)
        return dlsym(RTLD_DEFAULT, symbol);
    if (!object[0])
        return NULL;                   /* a name too long to copy: left alone */
    void *h = dlopen(object, RTLD_LAZY | RTLD_NOLOAD);
    if (!h)
        return NULL;
    void *f = dlsym(h, symbol);
    dlclose(h);
    return f;
}

static void identify(cd_got_patch *id, const struct dl_phdr_info *info, void **slot)
{
    id->slot = slot;
    id->base = info->dlpi_addr;
    id->phdr = info->dlpi_phdr;
    id->phnum = info->dlpi_phnum;
    id->name_hash = name_hash(info->dlpi_name);
    id->prot = phdr_prot(info, (uintptr_t)slot);
}

/* Is the object dl_iterate_phdr shows the one p was found in, still there:
 * the same load address, program headers and name, p's slot inside one of
 * its segments? (Checked under the loader's lock, which dlclose holds while
 * it unmaps: an object that passes cannot go away before the write.) */
static int same_object(const struct dl_phdr_info *info, const cd_got_patch *p, uint32_t hash)
{
    return info->dlpi_addr == p->base && (const void *)info->dlpi_phdr == p->phdr &&
           info->dlpi_phnum == p->phnum && hash == p->name_hash &&
           segment_of(info, (uintptr_t)p->slot, PT_LOAD) != NULL;
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
        f->unbound = segment_of(info, (uintptr_t)now, PT_LOAD) != NULL;   /* its own PLT */
        const char *name = info->dlpi_name ? info->dlpi_name : "";
        f->main_program = !name[0];
        size_t len = strnlen(name, sizeof f->object);
        if (len < sizeof f->object)
            memcpy(f->object, name, len + 1);
        else
            f->object[0] = '\0';              /* too long: not usable by name */
        identify(&f->id, info, slot);
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

/* Every write into another object's GOT happens inside dl_iterate_phdr,
 * object by object (as ByteHook refreshes its list of ELFs through it before
 * touching one): only into an object that is still the one the entry was
 * found in, under the loader's lock, so that a dlclose cannot unmap it
 * meanwhile. A patch whose object is gone is dropped (slot NULL). */
enum { PASS_HOOK, PASS_REAPPLY, PASS_RESTORE };
typedef struct {
    cd_got_patch *p;
    int n, op;
    void *replacement;
} pass_t;

static void write_checked(pass_t *w, cd_got_patch *p)
{
    void *now = __atomic_load_n(p->slot, __ATOMIC_SEQ_CST);
    switch (w->op) {
    case PASS_RESTORE:
        /* only what we wrote is written back: another hooker's value since,
         * or the loader's (the same file loaded again), is theirs */
        if (now == p->wrote && write_slot(p->slot, p->old, p->prot) == 0)
            p->done = 1;
        break;
    default:
        /* what it held when found, or the definition (bound since): else
         * someone else's now, left alone */
        if (now == w->replacement && w->op == PASS_REAPPLY) {
            p->wrote = now;            /* ours still */
            p->done = 1;
        } else if ((now == p->old || now == p->target) &&
                   write_slot(p->slot, w->replacement, p->prot) == 0) {
            p->old = now;
            p->wrote = w->replacement;
            p->done = 1;
        }
        break;
    }
}

static int pass_visit(struct dl_phdr_info *info, size_t size, void *data)
{
    (void)size;
    pass_t *w = data;
    uint32_t hash = 0;
    int hashed = 0;
    for (int i = w->n - 1; i >= 0; i--) {
        cd_got_patch *p = &w->p[i];
        if (!p->slot || p->done || p->base != info->dlpi_addr)
            continue;
        if (!hashed)
            hash = name_hash(info->dlpi_name), hashed = 1;
        if (same_object(info, p, hash))
            write_checked(w, p);
    }
    return 0;
}

/* One pass over the loaded objects; the patches not written get slot NULL
 * (their object is gone, or the entry holds someone else's value). */
static void pass(cd_got_patch *p, int n, int op, void *replacement)
{
    pass_t w = {p, n, op, replacement};
    for (int i = 0; i < n; i++)
        p[i].done = 0;
    dl_iterate_phdr(pass_visit, &w);
    for (int i = 0; i < n; i++)
        if (!p[i].done)
            p[i].slot = NULL;
}
#endif

int cd_got_hook(const char *symbol, void *replacement, void **original,
                int (*prefer)(const char *object), cd_got_patch *out, int max, int *other_targets,
                void **other_target)
{
    *other_targets = 0;
    *other_target = NULL;
#ifdef CD_R_JUMP_SLOT
    static walk_t w;                   /* callers serialise (sub_lock); 150 KiB off the stack */
    Dl_info self;
    memset(&w, 0, sizeof w);
    w.symbol = symbol;
    w.replacement = replacement;
    if (dladdr((void *)cd_got_hook, &self))
        w.skip_base = self.dli_fbase;  /* a library's load bias: dl_iterate_phdr's dlpi_addr */
    dl_iterate_phdr(visit, &w);
    /* Outside the walk (the loader's lock is not held here): an unbound
     * entry is bound to what the loader would give its object. */
    static void *targets[CD_GOT_FOUND];
    for (int i = 0; i < w.n_found; i++)
        targets[i] = w.found[i].unbound ? bind_now(w.found[i].object, symbol, w.found[i].main_program) : w.found[i].now;
    /* The first time, the definition a preferred object's entry leads to
     * (PyTorch's own libraries: most launches), else the first one found;
     * not the load order's pick of whichever library came first. */
    for (int i = 0; prefer && !*original && i < w.n_found; i++)
        if (targets[i] && w.found[i].object[0] && prefer(w.found[i].object))
            *original = targets[i];
    int n = 0;
    for (int i = 0; i < w.n_found; i++) {
        found_t *f = &w.found[i];
        void *target = targets[i];
        if (!target)
            continue;
        if (!*original)
            *original = target;
        if (target != *original) {
            if (!*other_target)
                *other_target = target;
            (*other_targets)++;
            continue;
        }
        if (n >= max)
            continue;
        out[n] = f->id;
        out[n].old = f->now;
        out[n].target = target;
        n++;
    }
    if (!n)
        return 0;
    maps_prot(out, n);                 /* what each page has now (else its headers' word) */
    pass(out, n, PASS_HOOK, replacement);
    int k = 0;                         /* the written ones, in order */
    for (int i = 0; i < n; i++)
        if (out[i].slot)
            out[k++] = out[i];
    return k;
#else
    (void)symbol, (void)replacement, (void)original, (void)prefer, (void)out, (void)max;
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
    pass(p, n, PASS_REAPPLY, replacement);
#else
    (void)p, (void)n, (void)replacement;
#endif
}

void cd_got_restore(cd_got_patch *p, int n)
{
#ifdef CD_R_JUMP_SLOT
    pass(p, n, PASS_RESTORE, NULL);
#else
    (void)p, (void)n;
#endif
}
