/* The in-sandbox probe: reports what the sandbox lets a process do, as
 * plain lines the integration tests assert on. Built static (gcc -static)
 * into the busybox test rootfs by the tests themselves.
 *
 *   probe status            CapEff/CapBnd/NoNewPrivs/Seccomp lines
 *   probe lo                "lo UP" or "lo DOWN" (ioctl, no netlink)
 *   probe syscalls          "<name> <result>" for each forbidden syscall
 *   probe connect IP PORT   "connect ok" or "connect <errno name>"
 *   probe udp IP PORT       "udp ok" or "udp <errno name>"
 *   probe write PATH        "write ok" or "write <errno name>"
 *   probe append PATH       "append ok" or "append <errno name>" (no create)
 *   probe bind PORT         "bind ok" or "bind <errno name>" (TCP, 0.0.0.0)
 *   probe ifaces            "if NAME" for each interface, "addr NAME IP"
 *                           for each IPv4 address (ioctls, no netlink)
 *   probe segv              dies of a real SIGSEGV (exit status checks)
 */
#define _GNU_SOURCE
#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <net/if.h>
#include <netinet/in.h>
#include <sched.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/ioctl.h>
#include <sys/mount.h>
#include <sys/ptrace.h>
#include <sys/socket.h>
#include <sys/syscall.h>
#include <sys/uio.h>
#include <sys/wait.h>
#include <signal.h>
#include <unistd.h>

static const char *ename(int e) {
    switch (e) {
    case EPERM: return "EPERM";
    case EACCES: return "EACCES";
    case ENOSYS: return "ENOSYS";
    case EINVAL: return "EINVAL";
    case EFAULT: return "EFAULT";
    case EBADF: return "EBADF";
    case ESRCH: return "ESRCH";
    case ENOENT: return "ENOENT";
    case EROFS: return "EROFS";
    case ECONNREFUSED: return "ECONNREFUSED";
    case ENETUNREACH: return "ENETUNREACH";
    case EHOSTUNREACH: return "EHOSTUNREACH";
    case ETIMEDOUT: return "ETIMEDOUT";
    case EAFNOSUPPORT: return "EAFNOSUPPORT";
    case EADDRINUSE: return "EADDRINUSE";
    case EOVERFLOW: return "EOVERFLOW";
    default: { static char buf[32]; snprintf(buf, sizeof buf, "errno%d", e); return buf; }
    }
}

static void report(const char *name, long r) {
    if (r < 0) printf("%s %s\n", name, ename(errno));
    else printf("%s ALLOWED\n", name);
}

/* clone(2) itself, as fork() makes it, with namespace flags: a child that
 * was made exits at once. */
static long clone_with(unsigned long flags) {
    long pid = syscall(SYS_clone, flags | SIGCHLD, 0, NULL, NULL, 0);
    if (pid == 0) _exit(0);
    if (pid > 0) waitpid((pid_t)pid, NULL, 0);
    return pid;
}

static int syscalls(void) {
    report("mount", mount("none", "/tmp", "tmpfs", 0, NULL));
    report("unshare_user", unshare(CLONE_NEWUSER));
    report("unshare_net", unshare(CLONE_NEWNET));
    report("clone_user", clone_with(CLONE_NEWUSER));
    report("clone_user_net", clone_with(CLONE_NEWUSER | CLONE_NEWNET));
    report("setns", setns(0, 0));
    report("ptrace_attach", ptrace(PTRACE_ATTACH, 1, NULL, NULL));
    char buf[8];
    struct iovec local = { buf, sizeof buf }, remote = { buf, sizeof buf };
    report("process_vm_readv", syscall(SYS_process_vm_readv, 1, &local, 1, &remote, 1, 0));
    report("bpf", syscall(SYS_bpf, 0, NULL, 0));
    report("io_uring_setup", syscall(SYS_io_uring_setup, 1, NULL));
    report("perf_event_open", syscall(SYS_perf_event_open, NULL, 0, -1, -1, 0));
    report("userfaultfd", syscall(SYS_userfaultfd, 0));
    report("keyctl", syscall(SYS_keyctl, 0, 0, 0, 0, 0));
    report("add_key", syscall(SYS_add_key, "user", "x", "x", 1, 0));
    report("init_module", syscall(SYS_init_module, NULL, 0, ""));
    report("kexec_load", syscall(SYS_kexec_load, 0, 0, NULL, 0));
    report("open_by_handle_at", syscall(SYS_open_by_handle_at, AT_FDCWD, NULL, 0));
    report("socket_packet", socket(AF_PACKET, SOCK_RAW, 0));
    report("socket_netlink", socket(AF_NETLINK, SOCK_RAW, 0));
    report("socket_vsock", socket(40 /* AF_VSOCK */, SOCK_STREAM, 0));
    report("socket_alg", socket(38 /* AF_ALG */, SOCK_SEQPACKET, 0));
    report("socket_raw_inet", socket(AF_INET, SOCK_RAW, IPPROTO_ICMP));
    report("tiocsti", ioctl(0, TIOCSTI, "x"));
    return 0;
}

static int lo(void) {
    int fd = socket(AF_INET, SOCK_DGRAM, 0);
    struct ifreq req;
    memset(&req, 0, sizeof req);
    strcpy(req.ifr_name, "lo");
    if (fd < 0 || ioctl(fd, SIOCGIFFLAGS, &req) < 0) { printf("lo %s\n", ename(errno)); return 1; }
    printf("lo %s\n", (req.ifr_flags & IFF_UP) ? "UP" : "DOWN");
    return 0;
}

static int status(void) {
    FILE *f = fopen("/proc/self/status", "r");
    char line[256];
    if (!f) { printf("status %s\n", ename(errno)); return 1; }
    while (fgets(line, sizeof line, f))
        if (!strncmp(line, "CapEff:", 7) || !strncmp(line, "CapBnd:", 7) || !strncmp(line, "CapPrm:", 7) ||
            !strncmp(line, "NoNewPrivs:", 11) || !strncmp(line, "Seccomp:", 8))
            fputs(line, stdout);
    return 0;
}

static int net(const char *kind, const char *ip, int port) {
    int dgram = !strcmp(kind, "udp");
    int v6 = strchr(ip, ':') != NULL;
    int fd = socket(v6 ? AF_INET6 : AF_INET, dgram ? SOCK_DGRAM : SOCK_STREAM, 0);
    if (fd < 0) { printf("%s %s\n", kind, ename(errno)); return 1; }
    struct sockaddr_storage ss;
    socklen_t len;
    memset(&ss, 0, sizeof ss);
    if (v6) {
        struct sockaddr_in6 *a = (struct sockaddr_in6 *)&ss;
        a->sin6_family = AF_INET6; a->sin6_port = htons(port); inet_pton(AF_INET6, ip, &a->sin6_addr); len = sizeof *a;
    } else {
        struct sockaddr_in *a = (struct sockaddr_in *)&ss;
        a->sin_family = AF_INET; a->sin_port = htons(port); inet_pton(AF_INET, ip, &a->sin_addr); len = sizeof *a;
    }
    if (dgram) {
        if (sendto(fd, "x", 1, 0, (struct sockaddr *)&ss, len) < 0) { printf("udp %s\n", ename(errno)); return 1; }
        printf("udp ok\n");
        return 0;
    }
    if (connect(fd, (struct sockaddr *)&ss, len) < 0) { printf("connect %s\n", ename(errno)); return 1; }
    printf("connect ok\n");
    return 0;
}

static int do_write(const char *path) {
    int fd = open(path, O_WRONLY | O_CREAT, 0644);
    if (fd < 0 || write(fd, "x", 1) != 1) { printf("write %s\n", ename(errno)); return 1; }
    printf("write ok\n");
    return 0;
}

static int append(const char *path) {
    int fd = open(path, O_WRONLY | O_APPEND);
    if (fd < 0 || write(fd, "x", 1) != 1) { printf("append %s\n", ename(errno)); return 1; }
    printf("append ok\n");
    return 0;
}

static int do_bind(int port) {
    int fd = socket(AF_INET, SOCK_STREAM, 0);
    struct sockaddr_in a;
    memset(&a, 0, sizeof a);
    a.sin_family = AF_INET; a.sin_port = htons(port); a.sin_addr.s_addr = htonl(INADDR_ANY);
    if (fd < 0 || bind(fd, (struct sockaddr *)&a, sizeof a) < 0) { printf("bind %s\n", ename(errno)); return 1; }
    printf("bind ok\n");
    return 0;
}

/* Interfaces by index (SIOCGIFNAME) and IPv4 addresses (SIOCGIFCONF):
 * what the sandbox can see without netlink, which seccomp denies. */
static int ifaces(void) {
    int fd = socket(AF_INET, SOCK_DGRAM, 0);
    if (fd < 0) { printf("ifaces %s\n", ename(errno)); return 1; }
    for (int i = 1; i < 4096; i++) {
        struct ifreq req;
        memset(&req, 0, sizeof req);
        req.ifr_ifindex = i;
        if (ioctl(fd, SIOCGIFNAME, &req) == 0) printf("if %s\n", req.ifr_name);
    }
    struct ifreq reqs[64];
    struct ifconf conf = { .ifc_len = sizeof reqs, .ifc_req = reqs };
    if (ioctl(fd, SIOCGIFCONF, &conf) < 0) { printf("ifconf %s\n", ename(errno)); return 1; }
    for (size_t i = 0; i < conf.ifc_len / sizeof reqs[0]; i++) {
        char ip[INET_ADDRSTRLEN];
        inet_ntop(AF_INET, &((struct sockaddr_in *)&reqs[i].ifr_addr)->sin_addr, ip, sizeof ip);
        printf("addr %s %s\n", reqs[i].ifr_name, ip);
    }
    return 0;
}

int main(int argc, char **argv) {
    setvbuf(stdout, NULL, _IONBF, 0);
    if (argc >= 2 && !strcmp(argv[1], "status")) return status();
    if (argc >= 2 && !strcmp(argv[1], "lo")) return lo();
    if (argc >= 2 && !strcmp(argv[1], "syscalls")) return syscalls();
    if (argc >= 4 && (!strcmp(argv[1], "connect") || !strcmp(argv[1], "udp"))) return net(argv[1], argv[2], atoi(argv[3]));
    if (argc >= 3 && !strcmp(argv[1], "write")) return do_write(argv[2]);
    if (argc >= 3 && !strcmp(argv[1], "append")) return append(argv[2]);
    if (argc >= 3 && !strcmp(argv[1], "bind")) return do_bind(atoi(argv[2]));
    if (argc >= 2 && !strcmp(argv[1], "ifaces")) return ifaces();
    /* A real fault: the kernel's SIGSEGV ends even a pid namespace's init. */
    if (argc >= 2 && !strcmp(argv[1], "segv")) return *(volatile int *)0;
    fprintf(stderr, "usage: probe status|lo|syscalls|connect IP PORT|udp IP PORT|write PATH|append PATH|bind PORT|ifaces|segv\n");
    return 2;
}
