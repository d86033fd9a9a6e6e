/*
 * hooks/dump_server.c: `cuda-debug dump PID` answers in the caller's terminal.
 *
 * A thread of ours listens on the abstract Unix socket "@cuda_debug-dump-<pid>"
 * (Linux's abstract namespace: no file, nothing to clean up, nothing a symlink
 * can redirect; the name disappears with the process). A caller connects and
 * sends one line ("cuda_debug dump 1 recent=N"); the thread answers with the
 * in-flight document (report/inflight_doc.c: JSON, the text block inside) and
 * closes. No signal is sent, so nothing can reach a process that is not
 * cuda_debug's (a process without the listener refuses the connection), and no
 * program thread is interrupted: the scan runs on this thread, reading host
 * memory only (the watch ring and the completion slots, as the hang watcher
 * does), while the program's threads are stuck in a CUDA call, with or without
 * the GIL.
 *
 * Trust, both ways: this side answers only a peer of its own user (or root),
 * by SO_PEERCRED; the caller (cuda_debug/_dump.py) checks that the listener is
 * the process it asked for (SO_PEERCRED's pid), so another process that took
 * the name cannot answer for it. Each answer is bounded: a 2 s receive and a
 * 5 s send timeout, one caller at a time, MSG_NOSIGNAL (a caller that went
 * away costs an EPIPE, not a SIGPIPE).
 *
 * Started by the first watch() (cd_dump_server_start), once per process. A
 * forked child has no such thread: its copy of the socket is closed
 * (cd_dump_server_fork, from hooks/after_fork.c) and its next watch() starts
 * its own, under its own pid.
 */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE 1
#endif
#include "hooks/hooks.h"

#include <errno.h>
#include <signal.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/time.h>
#include <sys/un.h>
#include <unistd.h>

static pthread_mutex_t mu = PTHREAD_MUTEX_INITIALIZER;
static atomic_int state;           /* 1 listening, 0 not started, -errno failed */
static int listen_fd = -1;         /* under mu */
static atomic_int srv_rank = -1, srv_world;

#define REQUEST_MAX 256
#define RECENT_MAX 65536

int cd_dump_server_name(int pid, char *out, size_t cap)
{
    return snprintf(out, cap, "cuda_debug-dump-%d", pid);
}

int cd_dump_server_state(void) { return atomic_load(&state); }

int cd_dump_document(cd_buf *b, int recent)
{
    cd_dump_params p = {.rank = atomic_load(&srv_rank), .world_size = atomic_load(&srv_world),
                        .hang_after_ns = cd_hang_watch_get(), .recent = recent};
    return cd_report_dump_doc(b, &p);
}

static void send_all(int fd, const char *p, size_t n)
{
    while (n > 0) {
        ssize_t w = send(fd, p, n, MSG_NOSIGNAL);
        if (w < 0 && errno == EINTR)
            continue;
        if (w <= 0)
            return;
        p += w;
        n -= (size_t)w;
    }
}

/* "cuda_debug dump 1 recent=N": the launches to list (0 none), -1 not a request. */
static int parse_request(const char *req)
{
    static const char head[] = "cuda_debug dump ";
    if (strncmp(req, head, sizeof head - 1) != 0)
        return -1;
    const char *r = strstr(req, " recent=");
    if (!r)
        return 0;
    long v = strtol(r + 8, NULL, 10);
    return v < 0 ? 0 : v > RECENT_MAX ? RECENT_MAX : (int)v;
}

static void serve(int c)
{
    struct ucred cr;
    socklen_t len = sizeof cr;
    if (getsockopt(c, SOL_SOCKET, SO_PEERCRED, &cr, &len) != 0 ||
        (cr.uid != geteuid() && cr.uid != 0))
        return;                    /* another user's process: no answer */
    struct timeval rt = {2, 0}, st = {5, 0};
    setsockopt(c, SOL_SOCKET, SO_RCVTIMEO, &rt, sizeof rt);
    setsockopt(c, SOL_SOCKET, SO_SNDTIMEO, &st, sizeof st);
    char req[REQUEST_MAX];
    size_t n = 0;
    while (n < sizeof req - 1) {
        ssize_t k = recv(c, req + n, sizeof req - 1 - n, 0);
        if (k < 0 && errno == EINTR)
            continue;
        if (k <= 0)
            break;
        n += (size_t)k;
        if (memchr(req, '\n', n))
            break;
    }
    req[n] = '\0';
    int recent = parse_request(req);
    if (recent < 0) {
        static const char no[] = "{\"error\": \"not a cuda_debug dump request\"}\n";
        send_all(c, no, sizeof no - 1);
        return;
    }
    cd_buf b = {0};
    if (cd_dump_document(&b, recent) != 0) {
        static const char oom[] = "{\"error\": \"the document did not fit in memory\"}\n";
        send_all(c, oom, sizeof oom - 1);
    } else {
        send_all(c, b.p, b.n);
    }
    cd_buf_free(&b);
}

static void *server_main(void *arg)
{
    int fd = (int)(intptr_t)arg;
    prctl(PR_SET_NAME, "cuda_debug-dump", 0, 0, 0);
    for (;;) {
        int c = accept4(fd, NULL, NULL, SOCK_CLOEXEC);
        if (c < 0) {
            if (errno == EINTR || errno == ECONNABORTED)
                continue;
            if (errno == EBADF || errno == EINVAL || errno == ENOTSOCK)
                return NULL;       /* closed under us */
            struct timespec ts = {0, 10000000};
            nanosleep(&ts, NULL);  /* EMFILE and the like: later */
            continue;
        }
        serve(c);
        close(c);
    }
    return NULL;
}

void cd_dump_server_fork(int op)
{
    switch (op) {
    case CD_FORK_CHILD:
        pthread_mutex_init(&mu, NULL);
        if (listen_fd >= 0)
            close(listen_fd);      /* the parent's name: the parent answers for it */
        listen_fd = -1;
        atomic_store(&state, 0);
        break;
    case CD_FORK_TEST_TAKE:
        pthread_mutex_lock(&mu);
        break;
    case CD_FORK_TEST_GIVE:
        pthread_mutex_unlock(&mu);
        break;
    }
}

int cd_dump_server_start(int rank, int world_size)
{
    atomic_store(&srv_rank, rank);
    atomic_store(&srv_world, world_size);
    pthread_mutex_lock(&mu);
    int rc = 0;
    if (atomic_load(&state) == 1)
        goto out;
    int fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
    if (fd < 0) {
        rc = errno;
        goto failed;
    }
    struct sockaddr_un a;
    memset(&a, 0, sizeof a);
    a.sun_family = AF_UNIX;
    int k = cd_dump_server_name((int)getpid(), a.sun_path + 1, sizeof a.sun_path - 1);
    socklen_t alen = (socklen_t)(offsetof(struct sockaddr_un, sun_path) + 1 + (size_t)k);
    if (bind(fd, (struct sockaddr *)&a, alen) != 0 || listen(fd, 16) != 0) {
        rc = errno;
        close(fd);
        goto failed;
    }
    sigset_t all, old;
    sigfillset(&all);
    pthread_sigmask(SIG_SETMASK, &all, &old);  /* the thread inherits it */
    pthread_attr_t attr;
    pthread_attr_init(&attr);
    pthread_attr_setdetachstate(&attr, PTHREAD_CREATE_DETACHED);
    pthread_t t;
    rc = pthread_create(&t, &attr, server_main, (void *)(intptr_t)fd);
    pthread_attr_destroy(&attr);
    pthread_sigmask(SIG_SETMASK, &old, NULL);
    if (rc) {
        close(fd);
        goto failed;
    }
    listen_fd = fd;
    atomic_store(&state, 1);
    cd_report_dump_listening(1);
    goto out;
failed:
    atomic_store(&state, -rc);
out:
    pthread_mutex_unlock(&mu);
    return rc;
}
