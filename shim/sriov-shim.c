/*
 * sriov-shim: the CNI executables `sriov` and `sriov-ipam` on a node.
 *
 * The plugins run in the sriov-cni daemon (`sriov-cni daemon`), in a pod or
 * a systemd unit; the node itself needs no Python. This program forwards one
 * CNI call to the daemon's Unix socket: its version, its name (which plugin
 * to run), its working directory and environment, and its stdin, stdout and
 * stderr as descriptors (SCM_RIGHTS). The daemon runs the plugin on those
 * descriptors and answers with its exit status, which becomes ours. The
 * frame is defined in sriov_cni/wire.py, which the Python executable
 * and the daemon share; tests/daemon/test_wire.py checks these constants
 * and this program's behaviour against it:
 *
 *   request: 4-byte big-endian length N, with the three descriptors attached,
 *            then N bytes "version NUL program NUL cwd NUL KEY=VALUE NUL ..."
 *   answer:  TAG_EXITED and one byte, the plugin's exit status; or
 *            TAG_REFUSED and a CNI error object the daemon wrote, when it
 *            ran nothing.
 *
 * The only CNI this program knows is how to say that the daemon could not be
 * reached or did not answer: an error object on stdout, non-zero exit.
 */
#define _GNU_SOURCE
#include <arpa/inet.h>
#include <errno.h>
#include <limits.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/time.h>
#include <sys/un.h>
#include <unistd.h>

#ifndef SHIM_VERSION
#error "build with -DSHIM_VERSION=\"<package version>\" (see shim/Makefile)"
#endif

#define DEFAULT_SOCKET "/run/sriov-cni/plugin.sock"
/* The daemon's limit on the request body (wire.MAX_REQUEST). */
#define MAX_REQUEST (1u << 20)
#define TAG_EXITED 'X'
#define TAG_REFUSED 'R'
#define CONNECT_TIMEOUT 5
#define CODE_INVALID_ENV 4
#define CODE_TRY_AGAIN 11

extern char **environ;

static const char *socket_path;

/* Print a CNI error object on stdout (msg JSON-escaped); return the exit status. */
static int cni_error(int code, const char *fmt, ...)
{
    char msg[2048];
    va_list ap;

    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    printf("{\"cniVersion\": \"1.0.0\", \"code\": %d, \"msg\": \"", code);
    for (const unsigned char *p = (const unsigned char *)msg; *p; p++) {
        if (*p == '"' || *p == '\\')
            printf("\\%c", *p);
        else if (*p < 0x20)
            printf("\\u%04x", *p);
        else
            putchar(*p);
    }
    printf("\"}\n");
    fflush(stdout);
    return 1;
}

static int not_running(const char *why)
{
    return cni_error(CODE_TRY_AGAIN,
                     "the sriov-cni daemon is not reachable at %s (%s): start it with "
                     "`sriov-cni daemon` (the sriov-cni DaemonSet or the sriov-cni-daemon "
                     "systemd unit run it), or point SRIOV_CNI_SOCKET at its socket",
                     socket_path, why);
}

/* The request body; NULL with *len > MAX_REQUEST when it would be too large. */
static char *build_request(const char *program, size_t *len)
{
    char cwd[PATH_MAX];
    const char *fields[3] = {SHIM_VERSION, program, cwd};
    size_t size = 0, off = 0;
    char *body;

    if (!getcwd(cwd, sizeof cwd))
        strcpy(cwd, "/");
    for (int i = 0; i < 3; i++)
        size += strlen(fields[i]) + 1;
    for (char **e = environ; *e; e++)
        size += strlen(*e) + 1;
    *len = size - 1; /* separators, not terminators */
    if (*len > MAX_REQUEST || !(body = malloc(size)))
        return NULL;
    for (int i = 0; i < 3; i++) {
        memcpy(body + off, fields[i], strlen(fields[i]) + 1);
        off += strlen(fields[i]) + 1;
    }
    for (char **e = environ; *e; e++) {
        memcpy(body + off, *e, strlen(*e) + 1);
        off += strlen(*e) + 1;
    }
    return body;
}

static int connect_daemon(void)
{
    struct sockaddr_un addr = {.sun_family = AF_UNIX};
    /* Linux applies the send timeout to a Unix stream connect: it bounds the
     * wait when the daemon's listen queue is full or the daemon is stopped. */
    struct timeval timeout = {.tv_sec = CONNECT_TIMEOUT};
    struct timeval none = {0};
    int fd;

    if (strlen(socket_path) >= sizeof addr.sun_path) {
        errno = ENAMETOOLONG;
        return -1;
    }
    strcpy(addr.sun_path, socket_path);
    fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
    if (fd < 0)
        return -1;
    if (setsockopt(fd, SOL_SOCKET, SO_SNDTIMEO, &timeout, sizeof timeout) < 0 ||
        connect(fd, (struct sockaddr *)&addr, sizeof addr) < 0 ||
        /* Connected: a call waits for the daemon like any running call. */
        setsockopt(fd, SOL_SOCKET, SO_SNDTIMEO, &none, sizeof none) < 0) {
        int saved = errno;
        close(fd);
        errno = saved;
        return -1;
    }
    return fd;
}

static int send_request(int fd, const char *body, size_t len)
{
    uint32_t netlen = htonl((uint32_t)len);
    int fds[3] = {0, 1, 2};
    char control[CMSG_SPACE(sizeof fds)] = {0};
    struct iovec iov = {.iov_base = &netlen, .iov_len = sizeof netlen};
    struct msghdr msg = {.msg_iov = &iov, .msg_iovlen = 1,
                         .msg_control = control, .msg_controllen = sizeof control};
    struct cmsghdr *cmsg = CMSG_FIRSTHDR(&msg);

    cmsg->cmsg_level = SOL_SOCKET;
    cmsg->cmsg_type = SCM_RIGHTS;
    cmsg->cmsg_len = CMSG_LEN(sizeof fds);
    memcpy(CMSG_DATA(cmsg), fds, sizeof fds);
    if (sendmsg(fd, &msg, MSG_NOSIGNAL) != sizeof netlen)
        return -1;
    while (len > 0) {
        ssize_t n = send(fd, body, len, MSG_NOSIGNAL);
        if (n < 0 && errno == EINTR)
            continue;
        if (n <= 0)
            return -1;
        body += n;
        len -= (size_t)n;
    }
    return 0;
}

static ssize_t recv_byte(int fd, unsigned char *byte)
{
    ssize_t n;

    do
        n = recv(fd, byte, 1, 0);
    while (n < 0 && errno == EINTR);
    return n;
}

int main(int argc, char **argv)
{
    const char *program = argc > 0 ? strrchr(argv[0], '/') : NULL;
    unsigned char tag, status;
    size_t len;
    char *body;
    ssize_t n;
    int fd;

    program = program ? program + 1 : (argc > 0 ? argv[0] : "sriov");
    socket_path = getenv("SRIOV_CNI_SOCKET");
    if (!socket_path || !*socket_path)
        socket_path = DEFAULT_SOCKET;

    body = build_request(program, &len);
    if (!body && len > MAX_REQUEST)
        return cni_error(CODE_INVALID_ENV,
                         "the environment and working directory take %zu bytes, more than "
                         "the %u the sriov-cni daemon accepts", len, MAX_REQUEST);
    if (!body)
        return cni_error(CODE_TRY_AGAIN, "sriov shim: out of memory");

    fd = connect_daemon();
    if (fd < 0) {
        if (errno == EAGAIN || errno == EINPROGRESS) {
            char why[64];

            snprintf(why, sizeof why, "it did not accept within %d s", CONNECT_TIMEOUT);
            return not_running(why);
        }
        return not_running(strerror(errno));
    }
    if (send_request(fd, body, len) < 0)
        return cni_error(CODE_TRY_AGAIN,
                         "the sriov-cni daemon at %s closed the connection before taking "
                         "the call (%s); nothing ran", socket_path, strerror(errno));

    if (recv_byte(fd, &tag) != 1 || (tag == TAG_EXITED && recv_byte(fd, &status) != 1))
        /* Not retried: the plugin may have done part of the call (an ADD
         * moves a VF), and the runtime follows a failed ADD with a DEL. */
        return cni_error(CODE_TRY_AGAIN,
                         "the sriov-cni daemon at %s ended without an answer (did it die "
                         "or restart?); the call may have partly run and was not retried",
                         socket_path);
    if (tag == TAG_EXITED)
        return status;
    if (tag != TAG_REFUSED)
        /* A daemon of another version, which refuses the call for that. */
        return cni_error(CODE_TRY_AGAIN,
                         "the sriov-cni daemon at %s answered in a form this shim (version %s) "
                         "does not know (first byte 0x%02x): is it of another version? Install "
                         "the executables of the daemon's version (sriov-cni install-cni)",
                         socket_path, SHIM_VERSION, tag);

    /* The daemon ran nothing and says why in an error object: pass it on. */
    char reason[4096];
    size_t got = 0;
    while (got < sizeof reason && (n = recv(fd, reason + got, sizeof reason - got, 0)) != 0) {
        if (n < 0 && errno == EINTR)
            continue;
        if (n < 0)
            break;
        got += (size_t)n;
    }
    if (got == 0)
        return cni_error(CODE_TRY_AGAIN, "the sriov-cni daemon at %s refused the call "
                         "without a reason (shim version %s)", socket_path, SHIM_VERSION);
    fwrite(reason, 1, got, stdout);
    fflush(stdout);
    return 1;
}
