//! The seccomp allowlist: every syscall a sandbox may make, grouped, each
//! group with the reason it is allowed. Anything not listed fails with
//! EPERM (a few with ENOSYS, so that programs fall back).
//!
//! With a listener (`HostFacts::seccomp_listener`, set only by the runtime
//! for the sandboxes it serves), each syscall the allowlist denies on
//! purpose ([`DENIED`], and the arguments the conditional rules refuse)
//! is sent to runsbx by the kernel's user notification instead, and runsbx
//! answers it with EPERM, the errno the default gives: the program sees
//! what it saw before, and the caller learns what was blocked.
//!
//! With a listener, [`OBSERVED`] syscalls, which the allowlist allows, are
//! sent to runsbx too, which reads where they go and lets each continue
//! unchanged: that is how a call's result can explain a connect that the
//! sandbox's own network refuses (its `hints`).
//!
//! `bundles/seccomp/default.json` is generated from this file by
//! [`allowlist_json`]: the test `seccomp_json_is_current` (harden/tests.rs)
//! fails when the checked-in copy is stale, and
//! `RUNSBX_BLESS=1 cargo test -p runsbx-policy` rewrites it.

use oci_spec::runtime::{
    Arch, LinuxSeccomp, LinuxSeccompAction, LinuxSeccompArgBuilder, LinuxSeccompBuilder,
    LinuxSeccompOperator, LinuxSyscall, LinuxSyscallBuilder,
};

use std::path::Path;
use std::sync::{Arc, Mutex, PoisonError};

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

/// Every other syscall of x86_64 and aarch64 (Linux 6.18), each denied:
/// with a listener, reported. A syscall this list does not name (newer
/// than it, or unknown to the host's libseccomp, which then skips the
/// rule) still fails with EPERM, without a report.
#[rustfmt::skip]
pub const DENIED: &[&str] = &[
    "_sysctl", "acct", "add_key", "adjtimex", "afs_syscall", "bpf", "cachestat", "chroot",
    "clock_adjtime", "clock_settime", "create_module", "delete_module", "epoll_ctl_old",
    "epoll_wait_old", "fanotify_init", "fanotify_mark", "file_getattr", "file_setattr",
    "finit_module", "fsconfig", "fsmount", "fsopen", "fspick", "get_kernel_syms",
    "get_thread_area", "getpmsg", "getxattrat", "init_module", "io_uring_enter",
    "io_uring_register", "io_uring_setup", "ioperm", "iopl", "ioprio_get", "ioprio_set", "kcmp",
    "kexec_file_load", "kexec_load", "keyctl", "listmount", "listxattrat", "lookup_dcookie",
    "lsm_get_self_attr", "lsm_list_modules", "lsm_set_self_attr", "mbind", "memfd_secret",
    "migrate_pages", "modify_ldt", "mount", "mount_setattr", "move_mount", "move_pages",
    "mq_getsetattr", "mq_notify", "mq_open", "mq_timedreceive", "mq_timedsend", "mq_unlink",
    "mseal", "name_to_handle_at", "nfsservctl", "open_by_handle_at", "open_tree", "open_tree_attr",
    "perf_event_open", "pidfd_getfd", "pivot_root", "process_madvise", "process_mrelease",
    "process_vm_readv", "process_vm_writev", "ptrace", "putpmsg", "query_module", "quotactl",
    "quotactl_fd", "reboot", "remap_file_pages", "removexattrat", "request_key", "sched_setattr",
    "sched_setparam", "sched_setscheduler", "security", "set_mempolicy", "set_mempolicy_home_node",
    "set_thread_area", "setdomainname", "sethostname", "setns", "settimeofday", "setxattrat",
    "statmount", "swapoff", "swapon", "sysfs", "syslog", "tuxcall", "umount2", "unshare", "uselib",
    "userfaultfd", "ustat", "vhangup", "vserver",
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
    rule_if(
        name,
        LinuxSeccompAction::ScmpActAllow,
        index,
        op,
        value,
        value_two,
    )
}

fn rule_if(
    name: &str,
    action: LinuxSeccompAction,
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
        .action(action)
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

/// The allowlist as an OCI `linux.seccomp` section: every denial answered
/// by the filter itself, unreported.
pub fn allowlist() -> Result<LinuxSeccomp, PolicyError> {
    for_listener(None)
}

/// The allowlist whose denials are reported to the listener at `listener`
/// (see the module's comment): the same syscalls are allowed, and those
/// denied are answered by runsbx instead of the filter.
///
/// The default action stays EPERM: libcontainer 0.7 refuses
/// `SCMP_ACT_NOTIFY` as the default (seccomp/mod.rs, `check_seccomp`: the
/// init needs `write` to hand the fd over), so what is reported is what
/// the rules name. If the listener is gone (runsbx killed), the kernel
/// fails a notifying syscall with ENOSYS: still a denial, never a pass.
pub fn reporting(listener: &Path) -> Result<LinuxSeccomp, PolicyError> {
    for_listener(Some(listener))
}

/// The allowlist for `listener`: [`reporting`] to it, or [`allowlist`].
pub(crate) fn for_listener(listener: Option<&Path>) -> Result<LinuxSeccomp, PolicyError> {
    built(listener).map(|f| LinuxSeccomp::clone(&f))
}

/// Whether `seccomp` is exactly the allowlist (`listener`: reporting to
/// that listener), compared without making a copy of it.
pub fn is_allowlist(
    seccomp: Option<&LinuxSeccomp>,
    listener: Option<&Path>,
) -> Result<bool, PolicyError> {
    Ok(seccomp == Some(&*built(listener)?))
}

/// The filter for `listener`, built once for the last listener asked
/// about. A spec is hardened and then verified, each asking for it, and
/// a warm sandbox's request is hardened and verified again while its
/// caller waits: four filters built per pooled call otherwise, each about
/// 20 us (45 us the first time in a process), where a comparison takes 3.
/// One entry: a process serves one sandbox's listener at a time.
fn built(listener: Option<&Path>) -> Result<Arc<LinuxSeccomp>, PolicyError> {
    static LAST: Mutex<Option<Arc<LinuxSeccomp>>> = Mutex::new(None);
    let mut last = LAST.lock().unwrap_or_else(PoisonError::into_inner);
    if let Some(f) = last.as_ref() {
        if f.listener_path().as_deref() == listener {
            return Ok(Arc::clone(f));
        }
    }
    let f = Arc::new(filter(listener)?);
    *last = Some(Arc::clone(&f));
    Ok(f)
}

/// An exec'd process installs the container's filter itself, where no
/// listener would get its notification fd: the same filter, each
/// reported denial answered with EPERM by the filter, and each
/// [`OBSERVED`] syscall allowed by it, as without one.
pub fn unreported(seccomp: &LinuxSeccomp) -> LinuxSeccomp {
    let mut seccomp = seccomp.clone();
    seccomp.set_listener_path(None);
    let mut rules = seccomp.syscalls().clone().unwrap_or_default();
    for rule in &mut rules {
        if rule.action() != LinuxSeccompAction::ScmpActNotify {
            continue;
        }
        if is_observed(rule) {
            rule.set_action(LinuxSeccompAction::ScmpActAllow);
        } else {
            rule.set_action(LinuxSeccompAction::ScmpActErrno);
            rule.set_errno_ret(Some(EPERM));
        }
    }
    seccomp.set_syscalls(Some(rules));
    seccomp
}

const EPERM: u32 = 1;

/// Allowed syscalls that a reporting filter sends to the listener first,
/// which reads their arguments and answers with
/// SECCOMP_USER_NOTIF_FLAG_CONTINUE: the kernel then runs each exactly as
/// the allowing rule would. The listener decides nothing (what it reads
/// may change before the kernel acts, which is why it never decides; it
/// only explains).
///
/// - `connect`: a refused connect (nothing listens on the sandbox's own
///   loopback, no route out of it) is explained in the call's `hints`.
pub const OBSERVED: &[&str] = &["connect"];

/// The rules that report what the allowlist denies: each syscall it never
/// allows, and the arguments its conditional rules refuse, exactly (each
/// complement is disjoint from the allowing rule, so the filter's answer
/// for an allowed call is unchanged).
fn reported() -> Result<Vec<LinuxSyscall>, PolicyError> {
    use LinuxSeccompOperator::{ScmpCmpEq, ScmpCmpGt, ScmpCmpMaskedEq};
    let notify = LinuxSeccompAction::ScmpActNotify;
    let mut rules = vec![syscall(DENIED, notify)?];
    // clone with any namespace flag: one rule per flag.
    for bit in 0..64 {
        let flag = 1u64 << bit;
        if CLONE_NS_FLAGS & flag != 0 {
            rules.push(rule_if(
                "clone",
                notify,
                0,
                ScmpCmpMaskedEq,
                flag,
                Some(flag),
            )?);
        }
    }
    // socket() of a family not allowed: below, between and above them.
    let allowed: Vec<u64> = SOCKET_FAMILIES.iter().map(|(f, _)| *f).collect();
    let top = allowed.iter().copied().max().unwrap_or(0);
    for family in (0..top).filter(|f| !allowed.contains(f)) {
        rules.push(rule_if("socket", notify, 0, ScmpCmpEq, family, None)?);
    }
    rules.push(rule_if("socket", notify, 0, ScmpCmpGt, top, None)?);
    // socketpair() of anything but AF_UNIX.
    rules.push(rule_if("socketpair", notify, 0, ScmpCmpEq, 0, None)?);
    rules.push(rule_if("socketpair", notify, 0, ScmpCmpGt, 1, None)?);
    rules.push(rule_if("ioctl", notify, 1, ScmpCmpEq, TIOCSTI, None)?);
    // personality() to another domain is not reported: its complement
    // (neither 0 nor the query) needs two comparisons of one argument,
    // which libcontainer turns into two rules that would overlap the
    // allowed values. It still fails with EPERM.
    Ok(rules)
}

/// The rule that sends the [`OBSERVED`] syscalls to the listener: no
/// condition, exactly those names.
fn is_observed(rule: &LinuxSyscall) -> bool {
    rule.args().as_ref().is_none_or(Vec::is_empty)
        && !rule.names().is_empty()
        && rule.names().iter().all(|n| OBSERVED.contains(&n.as_str()))
}

fn filter(listener: Option<&Path>) -> Result<LinuxSeccomp, PolicyError> {
    let mut rules = Vec::new();
    for (_, names) in ALLOWED {
        // With a listener, the observed ones get their own rule, below.
        let names: Vec<&str> = names
            .iter()
            .copied()
            .filter(|n| listener.is_none() || !OBSERVED.contains(n))
            .collect();
        rules.push(syscall(&names, LinuxSeccompAction::ScmpActAllow)?);
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
    if listener.is_some() {
        rules.push(syscall(OBSERVED, LinuxSeccompAction::ScmpActNotify)?);
        rules.extend(reported()?);
    }
    let mut seccomp = LinuxSeccompBuilder::default()
        .default_action(LinuxSeccompAction::ScmpActErrno)
        .default_errno_ret(EPERM)
        .architectures(native_arches())
        .syscalls(rules)
        .build()
        .map_err(|e| PolicyError::Internal(format!("seccomp profile: {e}")))?;
    seccomp.set_listener_path(listener.map(Path::to_path_buf));
    Ok(seccomp)
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
    #![allow(clippy::unwrap_used, clippy::panic)]
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
    fn denied_syscalls_are_never_allowed_and_never_listed_twice() {
        let allowed = allowed_names();
        let mut denied = DENIED.to_vec();
        for name in &denied {
            assert!(!allowed.contains(name), "{name} is allowed and denied");
            assert!(
                !ENOSYS.iter().any(|(_, n)| n.contains(name)),
                "{name} answers ENOSYS on purpose, it is not reported"
            );
        }
        for name in NEVER.iter().filter(|n| **n != "clone3") {
            assert!(denied.contains(name), "{name} is not reported");
        }
        let count = denied.len();
        denied.sort();
        denied.dedup();
        assert_eq!(denied.len(), count);
    }

    fn arg(rule: &LinuxSyscall) -> Option<(usize, LinuxSeccompOperator, u64, Option<u64>)> {
        let args = rule.args().as_ref()?;
        assert_eq!(args.len(), 1);
        Some((
            args[0].index(),
            args[0].op(),
            args[0].value(),
            args[0].value_two(),
        ))
    }

    /// What the filter answers for `name` with first (or, for ioctl,
    /// second) argument `value`, as libseccomp evaluates the rules: the
    /// action of the rule that matches, the default otherwise.
    fn decide(seccomp: &LinuxSeccomp, name: &str, value: u64) -> LinuxSeccompAction {
        let mut matched = Vec::new();
        for rule in seccomp.syscalls().iter().flatten() {
            if !rule.names().iter().any(|n| n == name) {
                continue;
            }
            let hit = match arg(rule) {
                None => true,
                Some((_, op, v, v2)) => match op {
                    LinuxSeccompOperator::ScmpCmpEq => value == v,
                    LinuxSeccompOperator::ScmpCmpNe => value != v,
                    LinuxSeccompOperator::ScmpCmpGt => value > v,
                    LinuxSeccompOperator::ScmpCmpMaskedEq => value & v == v2.unwrap_or(0),
                    other => panic!("operator {other:?} not modelled"),
                },
            };
            if hit {
                matched.push(rule.action());
            }
        }
        matched.dedup();
        assert!(
            matched.len() <= 1,
            "{name}({value:#x}): rules overlap: {matched:?}"
        );
        matched.pop().unwrap_or(seccomp.default_action())
    }

    #[test]
    fn reporting_allows_exactly_what_the_allowlist_allows() -> Result<(), PolicyError> {
        let plain = allowlist()?;
        let listener = Path::new("/run/runsbx/@calls/c1/seccomp.sock");
        let reporting = reporting(listener)?;
        assert_eq!(reporting.listener_path().as_deref(), Some(listener));
        assert_eq!(plain.listener_path(), &None);
        // Only the unlisted-by-default: the same default, the same rules
        // first (ENOSYS fallbacks among them), notify rules added.
        assert_eq!(reporting.default_action(), LinuxSeccompAction::ScmpActErrno);
        assert_eq!(reporting.default_errno_ret(), Some(1));
        assert_eq!(reporting.architectures(), plain.architectures());
        let (rules, plain_rules) = (
            reporting.syscalls().clone().unwrap_or_default(),
            plain.syscalls().clone().unwrap_or_default(),
        );
        // The same rules first, but for the observed syscalls, which get
        // their own notifying rule.
        let without_observed: Vec<LinuxSyscall> = plain_rules
            .iter()
            .map(|rule| {
                let mut rule = rule.clone();
                let names = rule.names().clone();
                rule.set_names(
                    names
                        .into_iter()
                        .filter(|n| !OBSERVED.contains(&n.as_str()))
                        .collect(),
                );
                rule
            })
            .collect();
        assert_eq!(rules[..plain_rules.len()], without_observed[..]);
        assert!(is_observed(&rules[plain_rules.len()]));
        for rule in &rules[plain_rules.len()..] {
            assert_eq!(rule.action(), LinuxSeccompAction::ScmpActNotify);
            assert!(
                !rule.names().iter().any(|n| n == "write"),
                "libcontainer refuses it"
            );
        }
        let notify = LinuxSeccompAction::ScmpActNotify;
        let allow = LinuxSeccompAction::ScmpActAllow;
        let probes: &[(&str, &[u64])] = &[
            ("socket", &[0, 1, 2, 3, 9, 10, 11, 16, 17, 40, 1 << 32 | 1]),
            ("socketpair", &[0, 1, 2, 1 << 32 | 1]),
            ("ioctl", &[TIOCSTI, 0x5401, 0]),
            (
                "clone",
                &[0, 0x11, 0x1000_0000, 0x0002_0011, CLONE_NS_FLAGS, 0x80],
            ),
            ("mount", &[0]),
            ("ptrace", &[0]),
            ("read", &[0]),
            ("clone3", &[0]),
            ("connect", &[0, 3]),
        ];
        for (name, values) in probes {
            for value in *values {
                let before = decide(&plain, name, *value);
                let after = decide(&reporting, name, *value);
                // An allowed call stays allowed (an observed one is seen
                // first, and continues), a fallback stays one, and each
                // denial is reported.
                match before {
                    LinuxSeccompAction::ScmpActAllow if OBSERVED.contains(name) => {
                        assert_eq!(after, notify, "{name}({value:#x})")
                    }
                    LinuxSeccompAction::ScmpActAllow => {
                        assert_eq!(after, allow, "{name}({value:#x})")
                    }
                    LinuxSeccompAction::ScmpActErrno if *name == "clone3" => {
                        assert_eq!(after, before)
                    }
                    _ => assert_eq!(after, notify, "{name}({value:#x})"),
                }
            }
        }
        Ok(())
    }

    #[test]
    fn an_unreported_copy_answers_eperm_itself() -> Result<(), PolicyError> {
        let copy = unreported(&reporting(Path::new("/x/seccomp.sock"))?);
        assert_eq!(copy.listener_path(), &None);
        for rule in copy.syscalls().iter().flatten() {
            assert_ne!(rule.action(), LinuxSeccompAction::ScmpActNotify);
        }
        assert_eq!(decide(&copy, "mount", 0), LinuxSeccompAction::ScmpActErrno);
        assert_eq!(decide(&copy, "read", 0), LinuxSeccompAction::ScmpActAllow);
        // What the listener would let continue, the copy allows.
        for name in OBSERVED {
            assert_eq!(decide(&copy, name, 0), LinuxSeccompAction::ScmpActAllow);
        }
        Ok(())
    }

    /// The filter is built once per listener and kept: whichever was
    /// asked for last, each answer is the filter for the listener asked
    /// about, and a filter is the allowlist only for its own listener.
    #[test]
    fn the_kept_filter_is_the_one_asked_for() -> Result<(), PolicyError> {
        let (a, b) = (Path::new("/run/a.sock"), Path::new("/run/b.sock"));
        let fresh = |listener: Option<&Path>| filter(listener);
        for _ in 0..2 {
            let plain = allowlist()?;
            assert_eq!(plain, fresh(None)?);
            let to_a = reporting(a)?;
            assert_eq!(to_a, fresh(Some(a))?);
            assert!(is_allowlist(Some(&to_a), Some(a))?);
            assert!(!is_allowlist(Some(&to_a), Some(b))?);
            assert!(!is_allowlist(Some(&to_a), None)?);
            assert!(is_allowlist(Some(&plain), None)?);
            assert!(!is_allowlist(Some(&plain), Some(a))?);
            assert!(!is_allowlist(None, None)?);
            assert_eq!(reporting(b)?.listener_path().as_deref(), Some(b));
        }
        Ok(())
    }

    #[test]
    fn harden_reports_only_to_the_runtimes_listener() {
        use crate::harden::tests::as_root;
        let profile = crate::Profile::builtin().unwrap();
        let spec = oci_spec::runtime::Spec::default();
        let sock = std::path::PathBuf::from("/run/runsbx/@calls/c1/seccomp.sock");
        let host = crate::HostFacts {
            seccomp_listener: Some(sock.clone()),
            ..as_root()
        };
        let out = crate::harden(spec.clone(), &profile, &host).unwrap();
        let seccomp = out
            .spec
            .linux()
            .as_ref()
            .unwrap()
            .seccomp()
            .clone()
            .unwrap();
        assert_eq!(seccomp, reporting(&sock).unwrap());
        crate::verify(&out.spec, &profile, &host).unwrap();
        // Without the listener, that filter is refused, and the plain one
        // is what harden gives.
        assert!(crate::verify(&out.spec, &profile, &as_root()).is_err());
        let plain = crate::harden(spec.clone(), &profile, &as_root()).unwrap();
        assert!(crate::verify(&plain.spec, &profile, &host).is_err());
        // Another listener, or a looser default, is refused.
        let other = crate::HostFacts {
            seccomp_listener: Some("/tmp/elsewhere.sock".into()),
            ..as_root()
        };
        assert!(crate::verify(&out.spec, &profile, &other).is_err());
        let mut loose = out.spec.clone();
        let mut filter = seccomp.clone();
        filter.set_default_action(LinuxSeccompAction::ScmpActNotify);
        loose
            .linux_mut()
            .as_mut()
            .unwrap()
            .set_seccomp(Some(filter));
        assert!(crate::verify(&loose, &profile, &host).is_err());
        // A spec cannot ask for it: harden replaces the spec's listener.
        let again = crate::harden(loose, &profile, &as_root()).unwrap();
        assert_eq!(
            again.spec.linux().as_ref().unwrap().seccomp().as_ref(),
            Some(&allowlist().unwrap())
        );
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
