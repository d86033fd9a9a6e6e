/*
 * base/loader.c: run-time loading of libcuda, CUPTI and cuBLAS.
 *
 * Policy (which names, which folders, in what order) lives in Python
 * (cuda_debug/_libraries.py); this file only opens what it is given:
 *   1. an already-loaded copy of any of the sonames (RTLD_NOLOAD), so that we
 *      share PyTorch's CUPTI/cuBLAS instead of bringing a second copy;
 *   2. each candidate in order: a bare soname goes to the system loader, a
 *      path is opened as is.
 * The first that opens and has every required symbol wins.
 */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE 1
#endif
#include "base/base.h"

#include <dlfcn.h>      /* dlsym, dlclose, dlinfo, ... */
#include <link.h>        /* link_map */
#include <string.h>      /* strlen, strchr */
#include <stdio.h>       /* snprintf */

cd_driver_api cd_drv;
cd_cupti_api cd_cupti;
cd_library cd_libs[CD_LIB_COUNT];
_Thread_local cd_call_record cd_last_call;

static const char *const lib_names[CD_LIB_COUNT] = {"cuda", "cupti", "cublas"};

/* cuInit's result, once. Written by the first caller (Python-facing code,
 * or a scope opening without the GIL): an atomic, so a second caller at the
 * same moment at worst calls cuInit twice, which is allowed. */
static atomic_int driver_init_result = -1;

void *cd_sym(enum cd_lib lib, const char *name)
{
    return cd_libs[lib].handle ? dlsym(cd_libs[lib].handle, name) : NULL;
}

/* Fill the function table of `lib` from `handle`; on a missing required
 * symbol, write its name into err and return -1. */
static int bind_symbols(enum cd_lib lib, void *handle, char *err, size_t errlen)
{
/* CD_STR(name) is the versioned symbol of these headers (cuMemAlloc_v2). Only
 * the CD_DRIVER_FALLBACK names may fall back to the plain symbol (same ABI). */
#define CD_BIND_REQ(name)                                                     \
    if (!(tbl->name = (__typeof__(tbl->name))dlsym(handle, CD_STR(name)))) {  \
        snprintf(err, errlen, "symbol %s not found", CD_STR(name));          \
        return -1;                                                            \
    }
#define CD_BIND_FALLBACK(name)                                                \
    if (!(tbl->name = (__typeof__(tbl->name))dlsym(handle, CD_STR(name))) &&  \
        !(tbl->name = (__typeof__(tbl->name))dlsym(handle, #name))) {        \
        snprintf(err, errlen, "symbol %s not found", CD_STR(name));          \
        return -1;                                                            \
    }
#define CD_BIND_OPT(name) tbl->name = (__typeof__(tbl->name))dlsym(handle, CD_STR(name));
    if (lib == CD_LIB_CUDA) {
        cd_driver_api *tbl = &cd_drv;
        CD_DRIVER_REQUIRED(CD_BIND_REQ)
        CD_DRIVER_FALLBACK(CD_BIND_FALLBACK)
        CD_DRIVER_OPTIONAL(CD_BIND_OPT)
    } else if (lib == CD_LIB_CUPTI) {
        cd_cupti_api *tbl = &cd_cupti;
        CD_CUPTI_FUNCS(CD_BIND_REQ)
        CD_CUPTI_OPTIONAL(CD_BIND_OPT)
    }
    /* cuBLAS symbols are bound by gemm_loops.c through cd_sym(). */
    return 0;
#undef CD_BIND_REQ
#undef CD_BIND_FALLBACK
#undef CD_BIND_OPT
}

static int try_handle(enum cd_lib lib, void *handle, const char *how)
{
    cd_library *L = &cd_libs[lib];
    char err[256];
    if (bind_symbols(lib, handle, err, sizeof err) != 0) {
        snprintf(L->error, sizeof L->error, "%s", err);
        dlclose(handle);
        return -1;
    }
    struct link_map *lm = NULL;
    if (dlinfo(handle, RTLD_DI_LINKMAP, &lm) == 0 && lm && lm->l_name)
        snprintf(L->path, sizeof L->path, "%s", lm->l_name);
    snprintf(L->how, sizeof L->how, "%s", how);
    L->handle = handle;
    L->error[0] = '\0';
    return 0;
}

int cd_load_library(enum cd_lib lib, const char *const *sonames, int n_sonames,
                    const char *const *paths, int n_paths)
{
    cd_library *L = &cd_libs[lib];
    if (L->handle)
        return 0;
    L->error[0] = '\0';
    for (int i = 0; i < n_sonames; i++) {
        void *h = dlopen(sonames[i], RTLD_NOW | RTLD_GLOBAL | RTLD_NOLOAD);
        if (h && try_handle(lib, h, "already loaded") == 0)
            return 0;
    }
    for (int i = 0; i < n_paths; i++) {
        const char *p = paths[i];
        void *h = dlopen(p, RTLD_NOW | RTLD_GLOBAL);
        if (!h) {   /* keep every candidate's reason, first first */
            const char *e = dlerror();
            size_t used = strlen(L->error);
            if (used + 3 < sizeof L->error)
                snprintf(L->error + used, sizeof L->error - used, "%s%s", used ? "; " : "",
                         e ? e : "dlopen failed");
            continue;
        }
        if (try_handle(lib, h, strchr(p, '/') ? "path" : "system loader") == 0)
            return 0;
    }
    if (!L->error[0])
        snprintf(L->error, sizeof L->error, "no candidate for lib%s", lib_names[lib]);
    return -1;
}

int cd_driver_ready(void)
{
    if (!cd_libs[CD_LIB_CUDA].handle)
        return -1;
    int rc = atomic_load(&driver_init_result);
    if (rc < 0) {
        rc = CU_CHECK(cd_drv.cuInit(0));
        atomic_store(&driver_init_result, rc);
    }
    return rc;
}
