/*
 * report/report.h: what happened, kept and told. Reads what capture/ keeps;
 * never calls up into hooks/ (the callback and scopes call it).
 *
 *   fault_records.c  the ring of fault records (the first fault wins; echoes of
 *                    a dead context are marked consequences)
 *   fault_report.c   the compact block written to fd 2 at the moment of the
 *                    fault; watch mode's culprit block; torchrun's error file;
 *                    the SIGABRT/SIGTERM handlers
 */
#ifndef CD_REPORT_H
#define CD_REPORT_H

#include "capture/capture.h"

/* --------------------------------------------------- fault_records.c -- */

#define CD_FAULT_RING 32
#define CD_KERNEL_NAME 1024
#define CD_DEVICE_MESSAGE 8192
#define CD_FAULT_OPS 8             /* ATen operators kept with a fault record */

typedef struct {
    uint64_t seq;              /* 1, 2, ...; 0 = empty */
    int code;                  /* CUresult */
    int at_launch;             /* 1: the launch call itself failed; 0: the wait found it */
    int consequence;           /* a sticky fault was recorded before: this is its echo */
    int cbid;                  /* CUPTI driver callback id of the launch */
    char kernel[CD_KERNEL_NAME];   /* mangled symbol name (cut), "" for graph launches */
    size_t kernel_len;         /* its full length */
    unsigned grid[3], block[3];
    unsigned shared_mem;
    uintptr_t stream;
    uintptr_t context;
    int device;                /* ordinal, -1 unknown */
    long thread_id;            /* gettid() of the launching thread */
    char thread_name[16];      /* raw bytes: may be cut inside a UTF-8 character */
    double wall_time;          /* CLOCK_REALTIME seconds */
    uint64_t launch_seq;       /* watch-ring seq of this launch, 0 none */
    uint32_t frames[CD_FAULT_FRAMES];  /* location ids, innermost first */
    int n_frames, frames_complete;
    char ops[CD_FAULT_OPS][CD_OP_NAME];   /* at::_ops::<name> on the native stack, innermost first */
    int n_ops;
    char device_message[CD_DEVICE_MESSAGE]; /* the text this thread got during the wait */
    size_t device_message_len;
    size_t device_message_cut; /* bytes that did not fit */
    uint64_t log_end;          /* driver-log lines [.., log_end) precede this fault */
} cd_fault;

/* Fill the identity fields of `f` from a launch callback (kernel, dims,
 * stream, device, thread, time, frames). Cold path. */
void cd_fault_fill(cd_fault *f, const CUpti_CallbackData *cb, CUpti_CallbackId cbid);
/* Copy into the ring, assign seq and `consequence`; returns the seq. */
uint64_t cd_fault_record(cd_fault *f);
uint64_t cd_fault_seq(void);
/* Then, for the first records, the PyTorch ops of the native stack (slow,
 * and the walk can meet stale frames: after recording, so other threads see
 * the fault at once, and after the report). Returns how many. */
int cd_fault_add_ops(cd_fault *f);
/* Copy the records with seq > since, oldest first, into out (at most n). */
int cd_faults_since(uint64_t since, cd_fault *out, int n);

/* ---------------------------------------------------- fault_report.c -- */

/* The compact block written to fd 2 at the moment a fault is found, before
 * control returns to the framework (CUDA_DEBUG_REPORT=0 turns it off). Uses
 * write(2) and fixed buffers only. */
void cd_report_fault(const cd_fault *f);
/* The line that follows it once the PyTorch ops are known ("cuda_debug: op
 * aten::embedding > aten::index_select (the fault above, thread tid 42)"). */
void cd_report_fault_ops(const cd_fault *f);
/* Watch mode: the culprit launch, from the ring, when a fault is found outside
 * any wait of ours (a launch refused, the driver log, a signal). Async-signal-
 * safe when `from_signal`. Writes at most once per process. */
void cd_report_watch_culprit(int code, const char *found_at, int from_signal);
/* The texts and switches Python owns, handed down once: the block on or off,
 * the line prefix ("[rank k] "), torchrun's error file (NULL: none), the
 * restart sentence (NULL: keep the default). */
void cd_report_configure(int enabled, const char *prefix, const char *error_file,
                         const char *restart);
/* One error's name and what it means ("CUDA_ERROR_ASSERT", "device-side assert"). */
void cd_report_name_error(int code, const char *name, const char *what);
/* SIGABRT/SIGTERM: write the watch culprit, then the previous handler. */
int cd_install_signal_handlers(void);
extern atomic_int cd_report_written;

#endif
