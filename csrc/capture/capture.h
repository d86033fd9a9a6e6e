/*
 * capture/capture.h: what is captured at a launch or a fault, cheaply, with
 * no GIL: the recorders. They call only base/; nothing here reports, and
 * nothing here knows about scopes.
 *
 *   frames.c      the launching thread's Python frames, read without the GIL;
 *                 code locations interned once; the user-frame rule
 *   watch_ring.c  watch mode: the launch ring, completion markers, the
 *                 search for unfinished launches (host memory only)
 *   stderr_tee.c  the pass-through stderr that catches the device's assert text
 *   native_ops.c  the PyTorch operators on the launching thread's native stack
 *   driver_log.c  the driver's error log (cuLogsRegisterCallback, CUDA >= 12.9)
 */
#ifndef CD_CAPTURE_H
#define CD_CAPTURE_H

#include "base/base.h"

/* ---------------------------------------------------------- frames.c -- */

#define CD_FAULT_FRAMES 24     /* frames kept with a fault record */
#define CD_RING_FRAMES 4       /* frames kept with a watch ring record */

/* Kinds of code locations: the user-frame rule (cuda_debug/_locations.py
 * documents it; Python asks cd_file_kind, it never re-implements it). */
enum { CD_LOC_LIBRARY = 0, CD_LOC_USER = 1, CD_LOC_PSEUDO = 2 /* <string> */ };

/* The calling thread's Python frames, innermost first, as location ids, read
 * without the GIL (the thread is blocked in a C call made from Python, so its
 * frames cannot change). `max` ids at most; with `to_user`, stop at the first
 * user frame (the last id is then that frame even when deeper than max-1;
 * the frames between are only classified, not interned).
 * *complete = 1 when the walk reached the outermost frame, -1 when frames
 * were left out before the last id (the user frame). Returns the count
 * (0: the thread runs no Python, this Python version has no reader, or the
 * interpreter is shutting down: cd_frames_stop). */
int cd_frames_capture(uint32_t *ids, int max, int to_user, int *complete);
typedef struct {
    uint32_t file, func;   /* interned */
    int lineno;
    int kind;              /* CD_LOC_* */
} cd_location;
int cd_location_get(uint32_t id, cd_location *out);
/* The library folders and user pseudo-file prefixes (the first call wins;
 * callers serialise). */
void cd_frames_configure(const char *const *library_prefixes, int n_prefixes,
                         const char *const *user_pseudo, int n_pseudo);
/* CD_LOC_* of a file name of n bytes (UTF-8): the one user-frame rule. */
int cd_file_kind(const char *file, size_t n);
extern const int cd_frames_supported;
/* With the GIL, at module init: retire the cached entries of code objects as
 * they are freed (a code watcher on Python 3.12+, the code type's deallocator
 * wrapped before): 0, or -1 when no watcher could be added (freed code
 * objects are then told apart by their contents). */
int cd_frames_watch_code(void);
int cd_frames_code_watched(void);
/* Frames are read no more (the interpreter's atexit hooks run, before it
 * frees thread states); waits, briefly, for the reads under way. */
void cd_frames_stop(void);

/* ------------------------------------------------------ stderr_tee.c -- */

/* While installed, libcuda's `stderr` (its own GOT slot; libc's `stderr` is
 * left alone) is a pass-through stream: every write goes straight to fd 2,
 * and a thread with an open window also keeps a copy of its own text (the
 * device's assert lines, printed by the thread that syncs). */
typedef struct {
    char *buf;
    size_t cap, len;
    size_t cut;            /* bytes that did not fit */
} cd_window;
int cd_tee_install(void);              /* once; 0 ok, -1 nothing can be captured */
/* 1 installed, 0 not yet, -1 not possible (libcuda has no `stderr` slot). */
int cd_tee_installed(void);
/* How many slots of the loaded object `handle` (a dlopen handle) hold the
 * address of libc's `stderr`; -1 when it cannot be read. */
int cd_tee_stderr_references(void *handle);
void cd_tee_open(cd_window *w, char *buf, size_t cap);    /* this thread */
void cd_tee_close(void);
/* The most recent device-assert lines written by any thread (watch mode,
 * where the text comes out at whichever call finds the fault). */
size_t cd_tee_recent_asserts(char *out, size_t cap);
/* The ring's byte count now; then the assert lines kept since that naming
 * `kernel` (any when kernel is NULL or ""), up to cap, the rest counted in *cut. */
uint64_t cd_tee_assert_mark(void);
size_t cd_tee_asserts_since(uint64_t mark, const char *kernel, char *out, size_t cap,
                            size_t *cut);

/* ------------------------------------------------------ watch_ring.c -- */

#define CD_WATCH_RING 65536        /* launch records kept (a power of two) */
#define CD_WATCH_SLOTS 65536       /* completion slots per context */

typedef struct {
    _Atomic uint64_t seq;      /* written last (release); 0 while being written */
    uintptr_t stream;
    uint32_t kernel, kernel_short; /* interned */
    uint32_t frames[CD_RING_FRAMES];
    uint32_t grid[3], block[3];
    uint32_t shared_mem;
    int32_t thread_id;
    uint16_t ctx;              /* index into the context table */
    uint8_t n_frames;
    uint8_t flags;             /* CD_WATCH_* */
    uint16_t cbid;
    uint32_t op;               /* the thread's current PyTorch op token (watch(ops=True)), 0 none */
} cd_watch_record;

enum { CD_WATCH_MARKED = 1, CD_WATCH_GRAPH = 2, CD_WATCH_USER_LAST = 4 };

/* Completion slots for the contexts that exist now (watch entry, no GIL). */
void cd_watch_prepare(void);
/* Hot path, at a launch's API exit, while watching. */
void cd_watch_launch(const CUpti_CallbackData *cb, CUpti_CallbackId cbid, CUstream s);
uint64_t cd_watch_seq(void);
/* The watch-ring seq of this thread's last launch (to tie a fault to it). */
uint64_t cd_watch_thread_last(void);
/* 1 when the record's completion slot holds its seq, 0 when not, -1 unknown. */
int cd_watch_done(const cd_watch_record *r, uint64_t seq);
/* Copy record `seq` if it is still in the ring; 0 on success. */
int cd_watch_get(uint64_t seq, cd_watch_record *out);
/* Per stream, the first launch after `since` whose marker never came back:
 * out[] sorted by seq; returns the count (-1: one guess in out[0]). */
int cd_watch_incomplete(uint64_t since, uint64_t *out, int max);
int cd_watch_context_device(int ctx_index);
/* watch(ops=True): the op the calling thread is in (a token Python hands out
 * per op call, 0 when none), copied into each watch record. */
extern _Thread_local uint32_t cd_tls_op;

/* ------------------------------------------------------ native_ops.c -- */

#define CD_OP_NAME 64
/* The at::_ops::<name>::call|redispatch frames of the calling thread's
 * native stack, innermost first (cold: the fault path). Walked only on the
 * thread's own stack, and only up to the Python interpreter (native_ops.c
 * says why). */
int cd_native_ops(char ops[][CD_OP_NAME], int max);
void cd_native_ops_warm(void);
/* The operator name of one such symbol into out; 0 if it is not one. */
size_t cd_aten_op_of_symbol(const char *sym, char *out, size_t cap);

/* ------------------------------------------------------ driver_log.c -- */

/* Called with the code when the driver logs a sticky error (the earliest
 * moment watch mode hears of a fault found by somebody else's call). */
typedef void (*cd_sticky_logged_fn)(int code);
void cd_driver_log_init(cd_sticky_logged_fn on_sticky);
uint64_t cd_driver_log_count(void);
/* Line i (0-based, of all ever logged) into out: its length, or -1 when it
 * is gone from the ring (or not logged yet). */
long cd_driver_log_line(uint64_t i, char *out, size_t cap);

#endif
