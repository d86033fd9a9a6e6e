/*
 * tests/fake_cuda/phdr_shim.c: dl_iterate_phdr as it looks to a caller whose
 * walk raced a dlclose() of another thread (LD_PRELOAD). Each object's
 * dlpi_name is handed to the callback in a buffer of the shim's, valid during
 * the walk only; once the walk returns, the buffers are overwritten, as the
 * loader's free() of a closed object's name may leave them. A caller that
 * keeps a name past the walk reads the scribble (plain build), or is stopped
 * by ASan's poison for the real race (tests/hooks/test_launch_hooks_host_safety.py).
 */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE 1
#endif
#include <dlfcn.h>
#include <link.h>
#include <string.h>

#define NAMES 256
static char names[NAMES][1024];
static __thread int n_names;

typedef int (*visit_fn)(struct dl_phdr_info *, size_t, void *);
typedef struct {
    visit_fn visit;
    void *data;
} wrap_t;

static int inner(struct dl_phdr_info *info, size_t size, void *data)
{
    wrap_t *w = data;
    struct dl_phdr_info copy;
    size_t n = size < sizeof copy ? size : sizeof copy;
    memcpy(&copy, info, n);
    if (info->dlpi_name && n_names < NAMES) {
        strncpy(names[n_names], info->dlpi_name, sizeof names[0] - 1);
        copy.dlpi_name = names[n_names++];
    }
    return w->visit(&copy, n, w->data);
}

int dl_iterate_phdr(visit_fn visit, void *data)
{
    static int (*real)(visit_fn, void *);
    if (!real)
        real = (int (*)(visit_fn, void *))dlsym(RTLD_NEXT, "dl_iterate_phdr");
    wrap_t w = {visit, data};
    n_names = 0;
    int rc = real(inner, &w);
    for (int i = 0; i < n_names; i++)
        memset(names[i], 'X', 16);     /* no longer the name: "XXXX...XXXX<rest>" */
    return rc;
}
