/*
 * base/demangle.c: C++ kernel names for reports, through __cxa_demangle of the
 * libstdc++ that PyTorch/CuPy already loaded (or the system's), and the short
 * names reports lead with. Cold paths only: reports, and the first launch of
 * each kernel while watching.
 */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE 1
#endif
#include "base/base.h"

#include <dlfcn.h>      /* dlsym, RTLD_DEFAULT, dlopen, ... */
#include <stdlib.h>      /* free */
#include <string.h>      /* strncmp, memchr, strlen, ... */

typedef char *(*cxa_demangle_fn)(const char *, char *, size_t *, int *);

static cxa_demangle_fn demangler;

static void look_for_demangler(void)
{
    cxa_demangle_fn fn = (cxa_demangle_fn)dlsym(RTLD_DEFAULT, "__cxa_demangle");
    if (!fn) {
        void *h = dlopen("libstdc++.so.6", RTLD_NOW | RTLD_NOLOAD);
        if (!h)
            h = dlopen("libstdc++.so.6", RTLD_NOW | RTLD_LOCAL);
        if (h)
            fn = (cxa_demangle_fn)dlsym(h, "__cxa_demangle");
    }
    demangler = fn;
}

/* Looked up once; two threads seeing their first kernels at once both wait
 * for it (a flag set before the pointer let one go on without it: ThreadSanitizer). */
static cxa_demangle_fn find_demangler(void)
{
    static pthread_once_t once = PTHREAD_ONCE_INIT;
    pthread_once(&once, look_for_demangler);
    return demangler;
}

char *cd_demangle(const char *mangled)
{
    if (!mangled || strncmp(mangled, "_Z", 2) != 0)
        return NULL;
    cxa_demangle_fn fn = find_demangler();
    if (!fn)
        return NULL;
    int status = 0;
    char *out = fn(mangled, NULL, NULL, &status);
    if (status != 0 || !out) {
        free(out);
        return NULL;
    }
    return out;
}

/* ------------------------------------------------------ short names -- */

static void append(char *out, size_t cap, size_t *o, const char *s, size_t n)
{
    for (size_t i = 0; i < n && *o + 1 < cap; i++)
        out[(*o)++] = s[i];
    out[*o < cap ? *o : cap - 1] = '\0';
}

/* `void at::native::(anonymous namespace)::k<128, 4, lambda ...>(float*, long)`
 * -> `k<128, 4, …>`: no return type, namespaces or parameter list; template
 * arguments kept while they are short and plain, then "…". */
static size_t shorten(const char *s, size_t len, char *out, size_t cap)
{
    /* Drop the parameter list: the last top-level "(...)" ending the name. */
    size_t end = len;
    if (end && s[end - 1] == ')') {
        int depth = 0;
        for (size_t i = end; i-- > 0;) {
            if (s[i] == ')')
                depth++;
            else if (s[i] == '(' && --depth == 0) {
                end = i;
                break;
            }
        }
    }
    /* The last top-level component (after "::" or a space: return type). */
    size_t start = 0;
    int depth = 0;
    for (size_t i = 0; i < end; i++) {
        char c = s[i];
        if (c == '<' || c == '(')
            depth++;
        else if (c == '>' || c == ')')
            depth--;
        else if (depth == 0 && c == ':' && i + 1 < end && s[i + 1] == ':') {
            start = i + 2;
            i++;
        } else if (depth == 0 && c == ' ')
            start = i + 1;
    }
    if (start >= end)
        start = 0;
    size_t o = 0;
    out[0] = '\0';
    const char *lt = memchr(s + start, '<', end - start);
    if (!lt) {
        append(out, cap, &o, s + start, end - start);
        return o;
    }
    append(out, cap, &o, s + start, (size_t)(lt - (s + start)) + 1);
    /* Template arguments at depth 1. */
    size_t i = (size_t)(lt - s) + 1, arg = i, kept = 0;
    depth = 1;
    int first = 1;
    for (; i < end && depth > 0; i++) {
        char c = s[i];
        if (c == '<' || c == '(')
            depth++;
        else if (c == '>' || c == ')')
            depth--;
        if ((depth == 1 && c == ',') || depth == 0) {
            const char *a = s + arg;
            size_t n = i - arg;
            while (n && *a == ' ')
                a++, n--;
            int plain = n <= 24 && !memchr(a, '<', n) && !memchr(a, '(', n);
            if (!plain || kept + n > 48) {
                append(out, cap, &o, first ? "\xe2\x80\xa6" : ", \xe2\x80\xa6", first ? 3 : 5);
                first = 0;
                break;
            }
            if (!first)
                append(out, cap, &o, ", ", 2);
            append(out, cap, &o, a, n);
            kept += n;
            first = 0;
            arg = i + 1;
        }
    }
    append(out, cap, &o, ">", 1);
    return o;
}

size_t cd_short_kernel_name(const char *name, char *out, size_t cap)
{
    if (cap == 0)
        return 0;
    out[0] = '\0';
    if (!name || !name[0])
        return 0;
    char *dem = NULL;
    if (!strncmp(name, "_Z", 2)) {
        cxa_demangle_fn fn = find_demangler();
        int status = 0;
        if (fn)
            dem = fn(name, NULL, NULL, &status);
        if (status != 0) {
            free(dem);
            dem = NULL;
        }
    }
    const char *s = dem ? dem : name;
    size_t n = shorten(s, strlen(s), out, cap);
    free(dem);
    return n;
}

/* --------------------------------------------------------- origins -- */

static int has_prefix(const char *s, const char *p) { return strncmp(s, p, strlen(p)) == 0; }

/* The vendor libraries' C++ kernels, by the words their mangled names hold
 * (cuBLAS and cuBLASLt, cuDNN, CUTLASS, CUB/Thrust, cuFFT, cuSPARSE, cuRAND,
 * cuSOLVER, NCCL, the flash-attention kernels PyTorch ships). Matched
 * case-sensitively anywhere in the mangled name. */
static const char *const vendor_words[] = {
    "cublas", "cudnn", "cutlass", "xmma", "nvjet", "gemv", "gemm", "Gemm", "splitK",
    "dot_kernel", "axpy_kernel", "scal_kernel", "nrm2_kernel", "asum_kernel", "ger_kernel",
    "reduce_1Block", "trsv", "trsm", "symv", "syrk", "cub6detail", "3cub", "6thrust", "CUB_",
    "fft", "FFT", "cusparse", "curand", "cusolver", "nccl", "flash", "fmha", "cudss",
    "implicit_convolve", "convolve_", "nchwToNhwc", "nhwcToNchw", "precomputed_convolve",
};

/* Plain (extern "C") names the vendor libraries use: sm90_xmma_..., ampere_sgemm_... */
static int vendor_plain_prefix(const char *k)
{
    static const char *const arch[] = {"maxwell_", "pascal_", "volta_", "turing_", "ampere_",
                                       "ada_", "hopper_", "blackwell_"};
    if (k[0] == 's' && k[1] == 'm' && k[2] >= '0' && k[2] <= '9' && k[3] >= '0' && k[3] <= '9')
        return 1;
    for (size_t i = 0; i < sizeof arch / sizeof arch[0]; i++)
        if (has_prefix(k, arch[i]))
            return 1;
    return 0;
}

/* Inductor's generated Triton kernels (triton_poi_fused_..., triton_red_...,
 * triton_per_..., triton_tem_..., triton_for_...) and CuPy's own elementwise
 * and reduction kernels (cupy_...): compiled for the program, not written by
 * its author. */
static int generated_name(const char *k)
{
    if (has_prefix(k, "cupy_"))
        return 1;
    if (!has_prefix(k, "triton_"))
        return 0;
    k += 7;
    for (int i = 0; i < 3; i++)
        if (k[i] < 'a' || k[i] > 'z')
            return 0;
    return k[3] == '_';
}

int cd_kernel_origin_of_name(const char *k)
{
    if (!k || !k[0])
        return CD_ORIGIN_UNKNOWN;
    if (cd_nccl_kernel(k))
        return CD_ORIGIN_VENDOR;
    if (k[0] == '_' && k[1] == 'Z') {
        for (size_t i = 0; i < sizeof vendor_words / sizeof vendor_words[0]; i++)
            if (strstr(k, vendor_words[i]))
                return CD_ORIGIN_VENDOR;
        /* PyTorch's own: in namespaces at:: or c10:: (N2at, N3c10), or its
         * anonymous-namespace kernels of at::native (2at6native). Any other C++
         * kernel: unknown by its name alone (an extension's, or a library's). */
        if (strstr(k, "N2at") || strstr(k, "N3c10") || strstr(k, "2at6native") ||
            strstr(k, "2at4cuda"))
            return CD_ORIGIN_FRAMEWORK;
        return CD_ORIGIN_UNKNOWN;
    }
    /* A plain name: a vendor's by its prefix or library word; else the
     * program's (a user's Triton kernel may well be called matmul_kernel). */
    if (vendor_plain_prefix(k) || strstr(k, "cublas") || strstr(k, "cudnn") ||
        strstr(k, "cutlass") || strstr(k, "xmma") || has_prefix(k, "nvjet"))
        return CD_ORIGIN_VENDOR;
    return generated_name(k) ? CD_ORIGIN_GENERATED : CD_ORIGIN_USER;
}

int cd_origin_rank(int origin)
{
    switch (origin) {
    case CD_ORIGIN_USER: return 0;
    case CD_ORIGIN_GENERATED: return 1;
    default: return 2;
    }
}
