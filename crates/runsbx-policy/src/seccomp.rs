//! The seccomp allowlist: every syscall a sandbox may make, grouped, each
//! group with the reason it is allowed. Anything not listed fails with
//! EPERM (a few with ENOSYS, so that programs fall back).
//!
//! `bundles/seccomp/default.json` is generated from this file by
//! [`allowlist_json`]: the test `seccomp_json_is_current` (harden/tests.rs)
//! fails when the checked-in copy is stale, and
//! `RUNSBX_BLESS=1 cargo test -p runsbx-policy` rewrites it.

use oci_spec::runtime::{
    Arch, LinuxSeccomp, LinuxSeccompAction, LinuxSeccompArgBuilder, LinuxSeccompBuilder,
    LinuxSeccompOperator, LinuxSyscall, LinuxSyscallBuilder,
};

use crate::PolicyError;

/// Allowed without condition, with the reason for each group.
pub const ALLOWED: &[(&str, &[&str])] = &[
    ("file I/O on descriptors the sandbox holds", &[
        "read", "write", "readv", "writev", "pread64", "pwrite64", "preadv", "pwritev",
        "preadv2", "pwritev2", "lseek", "close", "close_range", "dup", "dup2", "dup3",
        "fcntl", "flock", "fsync", "fdatasync", "syncfs", "sync", "sync_file_range",
        "fallocate", "ftruncate", "fadvise64", "readahead", "sendfile", "splice", "tee",
        "vmsplice", "copy_file_range", "pipe", "pipe2",
    ]),
    ("paths: the sandbox sees only its own image, tmpfs and procfs", &[
        "open", "openat", "openat2", "creat", "stat", "fstat", "lstat", "newfstatat",
        "statx", "statfs", "fstatfs", "access", "faccessat", "faccessat2", "getdents",
        "getdents64", "getcwd", "chdir", "fchdir", "rename", "renameat", "renameat2",
        "mkdir", "mkdirat", "rmdir", "link", "linkat", "unlink", "unlinkat", "symlink",
        "symlinkat", "readlink", "readlinkat", "chmod", "fchmod", "fchmodat", "fchmodat2",
        "chown", "fchown", "lchown", "fchownat", "umask", "truncate", "utime", "utimes",
        "utimensat", "futimesat", "mknod", "mknodat",
    ]),
    ("extended attributes, confined to the sandbox's own files", &[
        "getxattr", "lgetxattr", "fgetxattr", "listxattr", "llistxattr", "flistxattr",
        "setxattr", "lsetxattr", "fsetxattr", "removexattr", "lremovexattr", "fremovexattr",
    ]),
    ("memory management of the sandbox's own address space", &[
        "brk", "mmap", "munmap", "mremap", "mprotect", "msync", "mincore", "madvise",
        "mlock", "mlock2", "munlock", "mlockall", "munlockall", "memfd_create", "membarrier",
        "get_mempolicy", "pkey_alloc", "pkey_free", "pkey_mprotect", "map_shadow_stack",
    ]),
    ("processes and threads inside the sandbox's pid namespace (clone is allowed below without namespace flags)", &[
        "fork", "vfork", "execve", "execveat", "exit", "exit_group", "wait4", "waitid",
        "getpid", "getppid", "gettid", "set_tid_address", "set_robust_list",
        "get_robust_list", "rseq", "arch_prctl", "prctl", "getpgrp", "getpgid", "setpgid",
        "getsid", "setsid", "sched_yield", "sched_getaffinity", "sched_setaffinity",
        "sched_getparam", "sched_getscheduler", "sched_get_priority_max",
        "sched_get_priority_min", "sched_rr_get_interval", "sched_getattr", "getpriority",
        "setpriority", "getcpu", "pidfd_open", "pidfd_send_signal",
    ]),
    ("ids: changing them within the sandbox's user namespace grants nothing on the host", &[
        "getuid", "geteuid", "getgid", "getegid", "getresuid", "getresgid", "getgroups",
        "setuid", "setgid", "setreuid", "setregid", "setresuid", "setresgid", "setfsuid",
        "setfsgid", "setgroups", "capget", "capset",
    ]),
    ("signals, to processes the sandbox can see", &[
        "kill", "tkill", "tgkill", "rt_sigaction", "rt_sigprocmask", "rt_sigreturn",
        "rt_sigpending", "rt_sigtimedwait", "rt_sigqueueinfo", "rt_tgsigqueueinfo",
        "rt_sigsuspend", "sigaltstack", "pause", "restart_syscall", "signalfd", "signalfd4",
    ]),
    ("time and timers (reading the clock; setting it is denied)", &[
        "time", "gettimeofday", "clock_gettime", "clock_getres", "clock_nanosleep",
        "nanosleep", "alarm", "getitimer", "setitimer", "timer_create", "timer_settime",
        "timer_gettime", "timer_getoverrun", "timer_delete", "timerfd_create",
        "timerfd_settime", "timerfd_gettime", "times",
    ]),
    ("waiting and event loops", &[
        "poll", "ppoll", "select", "pselect6", "epoll_create", "epoll_create1",
        "epoll_ctl", "epoll_wait", "epoll_pwait", "epoll_pwait2", "eventfd", "eventfd2",
        "futex", "futex_waitv", "futex_wake", "futex_wait", "futex_requeue",
        "inotify_init", "inotify_init1", "inotify_add_watch", "inotify_rm_watch",
    ]),
    ("sockets: only AF_UNIX, AF_INET and AF_INET6 can be made (see the rules below), and the only network is the sandbox's own loopback", &[
        "connect", "accept", "accept4", "bind", "listen", "sendto", "recvfrom", "sendmsg",
        "recvmsg", "sendmmsg", "recvmmsg", "shutdown", "getsockname", "getpeername",
        "setsockopt", "getsockopt",
    ]),
    ("System V IPC in the sandbox's own ipc namespace", &[
        "shmget", "shmat", "shmdt", "shmctl", "semget", "semop", "semtimedop", "semctl",
        "msgget", "msgsnd", "msgrcv", "msgctl",
    ]),
    ("POSIX asynchronous I/O on the sandbox's own descriptors (io_uring is not this)", &[
        "io_setup", "io_destroy", "io_submit", "io_cancel", "io_getevents", "io_pgetevents",
    ]),
    ("information about the sandbox's own limits and the kernel's name", &[
        "uname", "getrlimit", "setrlimit", "prlimit64", "getrusage", "sysinfo", "getrandom",
    ]),
    ("sandboxing itself further is harmless", &[
        "landlock_create_ruleset", "landlock_add_rule", "landlock_restrict_self", "seccomp",
    ]),
];

/// Answered with ENOSYS rather than EPERM, so that callers fall back to an
/// allowed path instead of failing.
pub const ENOSYS: &[(&str, &[&str])] = &[
    ("clone3 passes its flags through memory seccomp cannot read; glibc falls back to clone, whose flags are checked", &["clone3"]),
];

/// Namespace-creating flags `clone` may not carry: a new user namespace
/// would hand the sandbox every capability inside it.
const CLONE_NS_FLAGS: u64 = 0x0200_0000 // CLONE_NEWCGROUP
    | 0x0002_0000 // CLONE_NEWNS
    | 0x0400_0000 // CLONE_NEWUTS
    | 0x0800_0000 // CLONE_NEWIPC
    | 0x1000_0000 // CLONE_NEWUSER
    | 0x2000_0000 // CLONE_NEWPID
    | 0x4000_0000 // CLONE_NEWNET
    | 0x0000_0080; // CLONE_NEWTIME

/// Socket families a sandbox may create.
pub const SOCKET_FAMILIES: &[(u64, &str)] = &[
    (1, "AF_UNIX: pipes between the sandbox's own processes"),
    (
        2,
        "AF_INET: the sandbox's loopback, and the egress proxy on it",
    ),
    (10, "AF_INET6: the same over IPv6"),
];

const TIOCSTI: u64 = 0x5412;
const PERSONALITY_QUERY: u64 = 0xffff_ffff;

fn syscall(names: &[&str], action: LinuxSeccompAction) -> Result<LinuxSyscall, PolicyError> {
    LinuxSyscallBuilder::default()
        .names(names.iter().map(|n| (*n).to_owned()).collect::<Vec<_>>())
        .action(action)
        .build()
        .map_err(|e| PolicyError::Internal(format!("seccomp rule: {e}")))
}

fn arg_rule(
    name: &str,
    index: usize,
    op: LinuxSeccompOperator,
    value: u64,
    value_two: Option<u64>,
) -> Result<LinuxSyscall, PolicyError> {
    let mut arg = LinuxSeccompArgBuilder::default()
        .index(index)
        .value(value)
        .op(op);
    if let Some(v2) = value_two {
        arg = arg.value_two(v2);
    }
    let arg = arg
        .build()
        .map_err(|e| PolicyError::Internal(format!("seccomp arg: {e}")))?;
    LinuxSyscallBuilder::default()
        .names(vec![name.to_owned()])
        .action(LinuxSeccompAction::ScmpActAllow)
        .args(vec![arg])
        .build()
        .map_err(|e| PolicyError::Internal(format!("seccomp rule: {e}")))
}

/// The native architectures the filter is checked against. A syscall made
/// through another ABI (x86 int 0x80, x32) takes the default action.
fn native_arches() -> Vec<Arch> {
    if cfg!(target_arch = "aarch64") {
        vec![Arch::ScmpArchAarch64]
    } else {
        vec![Arch::ScmpArchX86_64]
    }
}

/// The allowlist as an OCI `linux.seccomp` section.
pub fn allowlist() -> Result<LinuxSeccomp, PolicyError> {
    let mut rules = Vec::new();
    for (_, names) in ALLOWED {
        rules.push(syscall(names, LinuxSeccompAction::ScmpActAllow)?);
    }
    for (_, names) in ENOSYS {
        let mut rule = syscall(names, LinuxSeccompAction::ScmpActErrno)?;
        rule.set_errno_ret(Some(38)); // ENOSYS
        rules.push(rule);
    }
    // clone without any namespace flag: threads and processes, no new
    // namespaces (unshare and setns are not allowed at all).
    rules.push(arg_rule(
        "clone",
        0,
        LinuxSeccompOperator::ScmpCmpMaskedEq,
        CLONE_NS_FLAGS,
        Some(0),
    )?);
    // socket() and socketpair() by family only.
    for (family, _) in SOCKET_FAMILIES {
        rules.push(arg_rule(
            "socket",
            0,
            LinuxSeccompOperator::ScmpCmpEq,
            *family,
            None,
        )?);
    }
    rules.push(arg_rule(
        "socketpair",
        0,
        LinuxSeccompOperator::ScmpCmpEq,
        1,
        None,
    )?);
    // ioctl, except TIOCSTI, which pushes input into a terminal another
    // process reads (CVE-2017-5226 class).
    rules.push(arg_rule(
        "ioctl",
        1,
        LinuxSeccompOperator::ScmpCmpNe,
        TIOCSTI,
        None,
    )?);
    // personality: only the default domain, or a query of the current one
    // (other domains have hidden historical kernel paths).
    rules.push(arg_rule(
        "personality",
        0,
        LinuxSeccompOperator::ScmpCmpEq,
        0,
        None,
    )?);
    rules.push(arg_rule(
        "personality",
        0,
        LinuxSeccompOperator::ScmpCmpEq,
        PERSONALITY_QUERY,
        None,
    )?);
    LinuxSeccompBuilder::default()
        .default_action(LinuxSeccompAction::ScmpActErrno)
        .default_errno_ret(1u32) // EPERM
        .architectures(native_arches())
        .syscalls(rules)
        .build()
        .map_err(|e| PolicyError::Internal(format!("seccomp profile: {e}")))
}

/// The allowlist as the JSON checked in at `bundles/seccomp/default.json`.
pub fn allowlist_json() -> Result<String, PolicyError> {
    let seccomp = allowlist()?;
    serde_json::to_string_pretty(&seccomp)
        .map(|s| s + "\n")
        .map_err(|e| PolicyError::Internal(format!("encode seccomp profile: {e}")))
}

/// Every syscall name the allowlist lets through, with or without conditions.
pub fn allowed_names() -> Vec<&'static str> {
    let mut names: Vec<&str> = ALLOWED
        .iter()
        .flat_map(|(_, n)| n.iter().copied())
        .collect();
    names.extend(["clone", "socket", "socketpair", "ioctl", "personality"]);
    names
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Never allowed: each mounts, changes namespaces, reads or writes
    /// another process, reaches a kernel subsystem with a history of
    /// escapes (bpf, io_uring, perf, userfaultfd, keyrings, modules), or
    /// changes host-wide state (docs/security.md, "Seccomp").
    const NEVER: &[&str] = &[
        "mount",
        "umount2",
        "pivot_root",
        "chroot",
        "unshare",
        "setns",
        "ptrace",
        "process_vm_readv",
        "process_vm_writev",
        "bpf",
        "perf_event_open",
        "userfaultfd",
        "keyctl",
        "add_key",
        "request_key",
        "kexec_load",
        "kexec_file_load",
        "init_module",
        "finit_module",
        "delete_module",
        "open_by_handle_at",
        "name_to_handle_at",
        "fsopen",
        "fsmount",
        "fspick",
        "open_tree",
        "move_mount",
        "mount_setattr",
        "io_uring_setup",
        "io_uring_enter",
        "io_uring_register",
        "clone3",
        "reboot",
        "swapon",
        "swapoff",
        "settimeofday",
        "clock_settime",
        "adjtimex",
        "clock_adjtime",
        "syslog",
        "acct",
        "quotactl",
        "iopl",
        "ioperm",
        "modify_ldt",
        "kcmp",
        "pidfd_getfd",
        "process_madvise",
        "sethostname",
        "setdomainname",
        "uselib",
        "lookup_dcookie",
        "fanotify_init",
        "vhangup",
        "move_pages",
        "migrate_pages",
        "mbind",
        "set_mempolicy",
    ];

    #[test]
    fn dangerous_syscalls_are_not_allowed() {
        let allowed = allowed_names();
        for name in NEVER {
            assert!(!allowed.contains(name), "{name} is allowed");
        }
    }

    #[test]
    fn no_syscall_is_listed_twice() {
        let mut names = allowed_names();
        names.extend(ENOSYS.iter().flat_map(|(_, n)| n.iter().copied()));
        let count = names.len();
        names.sort();
        names.dedup();
        assert_eq!(names.len(), count);
    }

    #[test]
    fn default_is_eperm_and_arch_checked() -> Result<(), PolicyError> {
        let s = allowlist()?;
        assert_eq!(s.default_action(), LinuxSeccompAction::ScmpActErrno);
        assert_eq!(s.default_errno_ret(), Some(1));
        assert_eq!(s.architectures().as_ref().map(Vec::len), Some(1));
        Ok(())
    }
}
