/*
 * demangle.c: C++ kernel names for reports, through __cxa_demangle of the
 * libstdc++ that PyTorch/CuPy already loaded (or the system's). Report time
 * only, never on the launch path.
 */
#define _GNU_SOURCE
#include "cuda_debug.h"

#include <dlfcn.h>
#include <stdlib.h>
#include <string.h>

typedef char *(*cxa_demangle_fn)(const char *, char *, size_t *, int *);

static cxa_demangle_fn find_demangler(void)
{
    static cxa_demangle_fn fn;
    static int looked;
    if (looked)
        return fn;
    looked = 1;
    fn = (cxa_demangle_fn)dlsym(RTLD_DEFAULT, "__cxa_demangle");
    if (!fn) {
        void *h = dlopen("libstdc++.so.6", RTLD_NOW | RTLD_NOLOAD);
        if (!h)
            h = dlopen("libstdc++.so.6", RTLD_NOW | RTLD_LOCAL);
        if (h)
            fn = (cxa_demangle_fn)dlsym(h, "__cxa_demangle");
    }
    return fn;
}

PyObject *cd_demangle(const char *mangled)
{
    if (!mangled || strncmp(mangled, "_Z", 2) != 0)
        Py_RETURN_NONE;
    cxa_demangle_fn fn = find_demangler();
    if (!fn)
        Py_RETURN_NONE;
    int status = 0;
    char *out = fn(mangled, NULL, NULL, &status);
    if (status != 0 || !out) {
        free(out);
        Py_RETURN_NONE;
    }
    PyObject *r = PyUnicode_DecodeUTF8(out, (Py_ssize_t)strlen(out), "replace");
    free(out);
    return r;
}
