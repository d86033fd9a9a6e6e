/*
 * hooks/dump_server.c: `cuda-debug dump PID` answers in the caller's terminal.
 *
 * A thread of ours listens on the abstract Unix socket "@cuda_debug-dump-<pid>"
 * (Linux's abstract namespace: no file, nothing to clean up, nothing a symlink
 * can redirect; the name disappears with the process). A caller connects and
 * sends one line ("cuda_debug dump 1 recent=N"); the thread answers with one
 * line saying the answer's length ("cuda_debug dump answer <bytes>"), then the
 * in-flight document (report/inflight_doc.c: JSON, the text block inside), and
 * shuts the connection down. No signal is sent, so nothing can reach a process
 * that is not cuda_debug's (a process without the listener refuses the
 * connection), and no program thread is interrupted: the scan runs on this
 * thread, reading host memory only (the watch ring and the completion slots,
 * as the hang watcher does), while the program's threads are stuck in a CUDA
 * call, with or without the GIL.
 *
 * Trust, both ways: this side answers only a peer of its own user (or root),
 * by SO_PEERCRED; the caller (cuda_debug/_dump.py) checks that the listener is
 * the process it asked for (SO_PEERCRED's pid), so another process that took
 * the name cannot answer for it. A name taken before the listener starts
 * (another user squatting "@cuda_debug-dump-<pid>") does not make the process
 * undumpable: the listener takes "@cuda_debug-dump-<pid>-<random>" instead,
 * which nobody can guess beforehand; the caller finds it among the target's
 * own sockets (/proc/PID/fd, /proc/net/unix) and checks its pid the same way.
 *
 * Each caller is bounded and none waits behind another: up to CONN_MAX at once
 * in one poll() loop on non-blocking sockets, each with one deadline for its
 * request (REQUEST_S from its connection, however it dribbles) and one for its
 * answer (ANSWER_S), MSG_NOSIGNAL (a caller that went away costs an EPIPE, not
 * a SIGPIPE). The answer's end is its length, and the connection is shut down
 * (not only closed) when it is sent: a child forked meanwhile, which holds a
 * copy of the socket until its handler closes it, cannot keep the caller
 * waiting for an end of file.
 *
 * Started by the first watch() (cd_dump_server_start), once per process. A
 * forked child has no such thread: its copies of the sockets are closed
 * (cd_dump_server_fork, from hooks/after_fork.c) and its next watch() starts
 * its own, under its own pid.
 */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE 1
#endif
#include "hooks/hooks.h"

#include <errno.h>      /* errno, EINTR, EAGAIN, ... */
#include <fcntl.h>       /* open, O_RDONLY, O_CLOEXEC */
#include <limits.h>      /* INT_MAX */
#include <poll.h>        /* pollfd, POLLOUT, POLLIN, ... */
#include <signal.h>      /* sigset_t, sigfillset, pthread_sigmask */
#include <stddef.h>      /* size_t, offsetof */
#include <stdio.h>       /* snprintf */
#include <stdlib.h>      /* strtol */
#include <string.h>      /* strncmp, strstr, memset, ... */
#include <sys/prctl.h>   /* prctl, PR_SET_NAME */
#include <sys/socket.h>  /* shutdown, recv, send, ... */
#include <sys/un.h>      /* sockaddr_un */
#include <time.h>        /* timespec, clock_gettime, CLOCK_MONOTONIC, ... */
#include <unistd.h>      /* close, geteuid, getpid, ... */

static pthread_mutex_t mu = PTHREAD_MUTEX_INITIALIZER;
/* Held from accept4() until the caller's fd is listed in conns[] (or closed),
 * and by fork (cd_dump_server_fork_prepare): a child never holds a copy of a
 * caller's socket that its fork handler cannot see to close. */
static pthread_mutex_t accept_mu = PTHREAD_MUTEX_INITIALIZER;
static atomic_int state;           /* 1 listening, 0 not started, -errno failed */
static int listen_fd = -1;         /* under mu */
static atomic_int srv_rank = -1, srv_world;

#define REQUEST_MAX 256
#define RECENT_MAX 65536
#define CONN_MAX 8                 /* callers served at once */
#define REQUEST_S 2                /* a caller's time to send its request, from its connection */
#define ANSWER_S 5                 /* and to take the answer */
#define NAME_TRIES 8               /* random fallback names tried when ours is taken */

/* One caller. Only the listener thread touches a connection, except fd,
 * which the forked child reads (and closes): set -1 before each close. */
typedef struct {
    atomic_int fd;                 /* -1: free */
    int answering;                 /* 0: reading its request, 1: sending the answer */
    long long deadline_ns;         /* CLOCK_MONOTONIC */
    size_t n;                      /* request bytes read; then answer bytes sent */
    char req[REQUEST_MAX];
    char head[48];                 /* "cuda_debug dump answer <bytes>\n" */
    size_t head_n;
    const char *body;              /* the answer: doc.p, or a static error */
    size_t body_n;
    cd_buf doc;
} conn_t;
static conn_t conns[CONN_MAX] = {[0 ... CONN_MAX - 1] = {.fd = -1}};
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

static long long now_ns(void)
{
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (long long)t.tv_sec * 1000000000ll + t.tv_nsec;
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

static void drop(conn_t *c)
{
    int fd = atomic_exchange(&c->fd, -1);   /* before the close: see conn_t */
    if (fd >= 0) {
        shutdown(fd, SHUT_RDWR);   /* the end, also for a forked child's copy */
        close(fd);
    }
    cd_buf_free(&c->doc);
    c->body = NULL;
}

/* A caller's request is in (or all it will send): its answer, ready to send. */
static void start_answer(conn_t *c)
{
    static const char no[] = "{\"error\": \"not a cuda_debug dump request\"}\n";
    static const char oom[] = "{\"error\": \"the document did not fit in memory\"}\n";
    c->req[c->n] = '\0';
    int recent = parse_request(c->req);
    memset(&c->doc, 0, sizeof c->doc);
    if (recent < 0) {
        c->body = no, c->body_n = sizeof no - 1;
    } else if (cd_dump_document(&c->doc, recent) != 0) {
        cd_buf_free(&c->doc);
        c->body = oom, c->body_n = sizeof oom - 1;
    } else {
        c->body = c->doc.p ? c->doc.p : "", c->body_n = c->doc.n;
    }
    int k = snprintf(c->head, sizeof c->head, "cuda_debug dump answer %zu\n", c->body_n);
    c->head_n = k > 0 && (size_t)k < sizeof c->head ? (size_t)k : 0;
    c->answering = 1;
    c->n = 0;
    c->deadline_ns = now_ns() + ANSWER_S * 1000000000ll;
}

/* The caller's socket is ready: read its request, or send it more answer. */
static void step(conn_t *c)
{
    const int fd = atomic_load(&c->fd);
    if (!c->answering) {
        ssize_t k = recv(fd, c->req + c->n, sizeof c->req - 1 - c->n, MSG_DONTWAIT);
        if (k < 0 && (errno == EINTR || errno == EAGAIN || errno == EWOULDBLOCK))
            return;
        if (k < 0) {
            drop(c);
            return;
        }
        c->n += (size_t)k;
        const int line = k > 0 && memchr(c->req + c->n - (size_t)k, '\n', (size_t)k);
        if (k > 0 && !line && c->n < sizeof c->req - 1)
            return;                /* more to come */
        start_answer(c);           /* a line, full, or its end: what it sent is the request */
    }
    while (c->n < c->head_n + c->body_n) {
        const char *p = c->n < c->head_n ? c->head + c->n : c->body + (c->n - c->head_n);
        size_t left = c->n < c->head_n ? c->head_n - c->n : c->body_n - (c->n - c->head_n);
        ssize_t w = send(fd, p, left, MSG_NOSIGNAL | MSG_DONTWAIT);
        if (w < 0 && errno == EINTR)
            continue;
        if (w < 0 && (errno == EAGAIN || errno == EWOULDBLOCK))
            return;                /* its buffer is full: when it reads */
        if (w <= 0)
            break;                 /* gone */
        c->n += (size_t)w;
    }
    drop(c);
}

/* Take every caller waiting (at most a free slot each); another user's is
 * closed unanswered. -1: the socket is gone (closed under us). */
static int take_callers(int lfd)
{
    for (;;) {
        conn_t *c = NULL;
        for (int i = 0; i < CONN_MAX && !c; i++)
            if (atomic_load(&conns[i].fd) < 0)
                c = &conns[i];
        if (!c)
            return 0;
        pthread_mutex_lock(&accept_mu);
        int fd = accept4(lfd, NULL, NULL, SOCK_CLOEXEC | SOCK_NONBLOCK);
        if (fd < 0) {
            pthread_mutex_unlock(&accept_mu);
            if (errno == EINTR || errno == ECONNABORTED)
                continue;
            if (errno == EBADF || errno == EINVAL || errno == ENOTSOCK)
                return -1;
            if (errno != EAGAIN && errno != EWOULDBLOCK) {
                struct timespec ts = {0, 10000000};
                nanosleep(&ts, NULL);   /* EMFILE and the like: later */
            }
            return 0;
        }
        struct ucred cr;
        socklen_t len = sizeof cr;
        if (getsockopt(fd, SOL_SOCKET, SO_PEERCRED, &cr, &len) != 0 ||
            (cr.uid != geteuid() && cr.uid != 0)) {
            close(fd);             /* another user's process: no answer */
            pthread_mutex_unlock(&accept_mu);
            continue;
        }
        c->answering = 0;
        c->n = 0;
        c->body = NULL;
        memset(&c->doc, 0, sizeof c->doc);   /* a forked child's stale one is not ours */
        c->deadline_ns = now_ns() + REQUEST_S * 1000000000ll;
        atomic_store(&c->fd, fd);
        pthread_mutex_unlock(&accept_mu);
    }
}

/* pthread_atfork's prepare (before 1) and parent (0) handlers: no fork
 * between an accept4() and the listing of its fd (accept_mu). */
void cd_dump_server_fork_prepare(int before)
{
    if (before)
        pthread_mutex_lock(&accept_mu);
    else
        pthread_mutex_unlock(&accept_mu);
}

static void *server_main(void *arg)
{
    int lfd = (int)(intptr_t)arg;
    prctl(PR_SET_NAME, "cuda_debug-dump", 0, 0, 0);
    for (;;) {
        struct pollfd pf[CONN_MAX + 1];
        conn_t *of[CONN_MAX + 1];
        int np = 0, room = 0;
        long long now = now_ns(), wait_ns = -1;
        for (int i = 0; i < CONN_MAX; i++) {
            conn_t *c = &conns[i];
            int fd = atomic_load(&c->fd);
            if (fd >= 0 && now >= c->deadline_ns)
                drop(c), fd = -1;  /* its time is up, however far it got */
            if (fd < 0) {
                room = 1;
                continue;
            }
            if (wait_ns < 0 || c->deadline_ns - now < wait_ns)
                wait_ns = c->deadline_ns - now;
            pf[np] = (struct pollfd){.fd = fd, .events = c->answering ? POLLOUT : POLLIN};
            of[np++] = c;
        }
        if (room) {
            pf[np] = (struct pollfd){.fd = lfd, .events = POLLIN};
            of[np++] = NULL;
        }
        long long ms = wait_ns < 0 ? -1 : (wait_ns + 999999) / 1000000;
        int k = poll(pf, (nfds_t)np, ms > INT_MAX ? INT_MAX : (int)ms);
        if (k < 0) {
            if (errno != EINTR) {
                struct timespec ts = {0, 10000000};
                nanosleep(&ts, NULL);
            }
            continue;
        }
        for (int j = 0; j < np && k > 0; j++) {
            if (!pf[j].revents)
                continue;
            if (of[j])
                step(of[j]);
            else if ((pf[j].revents & POLLNVAL) || take_callers(lfd) < 0)
                return NULL;       /* closed under us */
        }
    }
    return NULL;
}

void cd_dump_server_fork(int op)
{
    switch (op) {
    case CD_FORK_CHILD:
        pthread_mutex_init(&mu, NULL);
        pthread_mutex_init(&accept_mu, NULL);   /* taken by the prepare handler */
        if (listen_fd >= 0)
            close(listen_fd);      /* the parent's name: the parent answers for it */
        listen_fd = -1;
        /* the parent's callers: its copies closed here (the parent answers
         * them); an fd still listed was open at the fork (see conn_t) */
        for (int i = 0; i < CONN_MAX; i++) {
            int fd = atomic_exchange(&conns[i].fd, -1);
            if (fd >= 0)
                close(fd);
        }
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

/* 64 bits nobody can guess: /dev/urandom's (else the clock's and the pid's). */
static unsigned long long random_bits(void)
{
    unsigned long long r = (unsigned long long)now_ns() * 0x9E3779B97F4A7C15ull;
    r ^= (unsigned)getpid();
    int fd = open("/dev/urandom", O_RDONLY | O_CLOEXEC);
    if (fd >= 0) {
        unsigned long long u;
        if (read(fd, &u, sizeof u) == (ssize_t)sizeof u)
            r = u;
        close(fd);
    }
    return r;
}

/* Bind fd to "@cuda_debug-dump-<pid>"; where another process holds that name
 * (squatted before we started), to "@cuda_debug-dump-<pid>-<random hex>".
 * 0, or an errno. */
static int bind_name(int fd)
{
    for (int t = 0; t <= NAME_TRIES; t++) {
        struct sockaddr_un a;
        memset(&a, 0, sizeof a);
        a.sun_family = AF_UNIX;
        const size_t cap = sizeof a.sun_path - 1;
        size_t k = (size_t)cd_dump_server_name((int)getpid(), a.sun_path + 1, cap);
        if (t > 0 && k < cap)
            k += (size_t)snprintf(a.sun_path + 1 + k, cap - k, "-%016llx", random_bits());
        if (k > cap)
            return ENAMETOOLONG;
        socklen_t alen = (socklen_t)(offsetof(struct sockaddr_un, sun_path) + 1 + k);
        if (bind(fd, (struct sockaddr *)&a, alen) == 0)
            return 0;
        if (errno != EADDRINUSE)
            return errno;
    }
    return EADDRINUSE;
}

int cd_dump_server_start(int rank, int world_size)
{
    atomic_store(&srv_rank, rank);
    atomic_store(&srv_world, world_size);
    pthread_mutex_lock(&mu);
    int rc = 0;
    if (atomic_load(&state) == 1)
        goto out;
    int fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
    if (fd < 0) {
        rc = errno;
        goto failed;
    }
    rc = bind_name(fd);
    if (rc || listen(fd, 16) != 0) {
        rc = rc ? rc : errno;
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
