//! runsbx's own user namespace, for an unprivileged caller on a host where
//! it cannot make cgroups (see cgroupless.rs), with the caller's
//! subordinate ids where the system's newuidmap/newgidmap give them; a
//! sandbox's user namespace when its maps have more than one line; and the
//! user-namespace lookups joining one needs.

use std::cell::RefCell;
use std::fs;
use std::io::Read;
use std::os::fd::{AsFd, AsRawFd, FromRawFd, OwnedFd};
use std::path::{Path, PathBuf};

use libcontainer::oci_spec::runtime::{LinuxIdMapping, LinuxNamespaceType, Spec};
use nix::sched::{unshare, CloneFlags};
use nix::unistd::{Gid, Pid, Uid};

use crate::error::{Result, RuntimeError};
use crate::sys::{fork, privilege, vm_child};

/// Set on the re-executed runsbx: the uid and gid it ran as before it made
/// its own user namespace, so that the spec's id mappings can be rewritten.
const USERNS_FROM_ENV: &str = "_RUNSBX_USERNS_FROM";

/// For `create`/`run` by an unprivileged user on a host where runsbx cannot
/// make cgroups: re-executes runsbx in a user namespace of its own (mapping
/// the caller to 0), as rootless podman runs its runtime. Returns only when
/// that is not needed.
///
/// An exec is needed, not just unshare: a process's memory belongs to the
/// user namespace it exec'd in, and libcontainer makes itself and the
/// container's init non-dumpable, so only a runsbx exec'd inside the new
/// namespace may then open the init's namespaces (to bring `lo` up).
pub fn reexec_in_own_userns() -> Result<()> {
    use std::os::unix::ffi::OsStringExt;
    if privilege::can_manage_cgroups() || privilege::in_user_namespace() {
        return Ok(());
    }
    let (uid, gid) = (Uid::effective().as_raw(), Gid::effective().as_raw());
    enter_own_user_namespace(uid, gid)?;
    let argv = std::env::args_os()
        .map(|a| std::ffi::CString::new(a.into_vec()))
        .collect::<std::result::Result<Vec<_>, _>>()
        .map_err(|e| RuntimeError::invalid("command line", e.to_string()))?;
    std::env::set_var(USERNS_FROM_ENV, format!("{uid}:{gid}"));
    let err = nix::unistd::execv(c"/proc/self/exe", &argv).err();
    Err(RuntimeError::sys(
        "re-execute runsbx in its own user namespace",
        err.unwrap_or(nix::Error::UnknownErrno),
    ))
}

/// The caller's uid and gid when this runsbx runs in a user namespace it
/// made itself.
pub(crate) fn userns_from() -> Option<(u32, u32)> {
    if !privilege::in_user_namespace() {
        return None;
    }
    let from = std::env::var(USERNS_FROM_ENV).ok()?;
    let (uid, gid) = from.split_once(':')?;
    Some((uid.parse().ok()?, gid.parse().ok()?))
}

fn enter_own_user_namespace(uid: u32, gid: u32) -> Result<()> {
    let ctx = |step: &str| format!("enter a user namespace of our own: {step}");
    let unshare_user = || {
        unshare(CloneFlags::CLONE_NEWUSER).map_err(|e| {
            RuntimeError::sys(
                ctx("unshare(CLONE_NEWUSER) (are unprivileged user namespaces enabled? check sysctl user.max_user_namespaces and kernel.unprivileged_userns_clone)"),
                e,
            )
        })?;
        privilege::moved();
        Ok(())
    };
    if let Ok(ids) = Subordinate::of(uid, gid) {
        return ids.map_after(unshare_user);
    }
    unshare_user()?;
    let write = |file: &str, text: String| {
        fs::write(format!("/proc/self/{file}"), text)
            .map_err(|e| RuntimeError::io(ctx(&format!("write /proc/self/{file}")), e))
    };
    write("setgroups", "deny".to_owned())?;
    write("uid_map", format!("0 {uid} 1"))?;
    write("gid_map", format!("0 {gid} 1"))
}

/// The caller's subordinate ids (`/etc/subuid`, `/etc/subgid`) and the
/// system's set-user-id helpers that may map them, as podman and crun use.
pub(crate) struct Subordinate {
    newuidmap: PathBuf,
    newgidmap: PathBuf,
    /// newuidmap's and newgidmap's mapping arguments: the caller as 0,
    /// then each subordinate range from 1 on.
    uid_args: Vec<String>,
    gid_args: Vec<String>,
}

impl Subordinate {
    /// The caller's ids and helpers, or why there are none (for `check`).
    pub(crate) fn of(uid: u32, gid: u32) -> std::result::Result<Self, String> {
        let name = nix::unistd::User::from_uid(Uid::from_raw(uid))
            .ok()
            .flatten()
            .map(|u| u.name)
            .ok_or_else(|| format!("uid {uid} has no name in the user database"))?;
        let ranges = |file: &str| {
            let found =
                subordinate_ranges(&fs::read_to_string(file).unwrap_or_default(), &name, uid);
            if found.is_empty() {
                Err(format!(
                    "{file} gives user `{name}` no subordinate ids (usermod --add-subuids 100000-165535 \
                     --add-subgids 100000-165535 {name})"
                ))
            } else {
                Ok(found)
            }
        };
        let (uids, gids) = (ranges("/etc/subuid")?, ranges("/etc/subgid")?);
        let helper = |name: &str| {
            find_helper(name)
                .ok_or_else(|| format!("{name} is not installed (apt-get install uidmap)"))
        };
        Ok(Self {
            newuidmap: helper("newuidmap")?,
            newgidmap: helper("newgidmap")?,
            uid_args: mapping_args(uid, &uids),
            gid_args: mapping_args(gid, &gids),
        })
    }

    /// The ranges, as newuidmap gets them.
    pub(crate) fn describe(&self) -> String {
        let ranges = |args: &[String]| {
            args.chunks(3)
                .skip(1)
                .map(|c| format!("{}+{}", c[1], c[2]))
                .collect::<Vec<_>>()
                .join(", ")
        };
        format!(
            "container ids 1 on are uids {} and gids {}",
            ranges(&self.uid_args),
            ranges(&self.gid_args)
        )
    }

    /// Runs `enter` (which unshares this process's user namespace), while a
    /// helper forked first, still outside, has newuidmap and newgidmap
    /// write the new namespace's maps; returns once they have.
    fn map_after(self, enter: impl FnOnce() -> Result<()>) -> Result<()> {
        let ctx = "map the caller's subordinate ids with newuidmap/newgidmap";
        let target = nix::unistd::getpid().to_string();
        let pipe = || nix::unistd::pipe().map_err(|e| RuntimeError::sys(ctx, e));
        let (go_r, go_w) = pipe()?;
        let (err_r, err_w) = pipe()?;
        let child = fork::child(ctx, &[go_w.as_fd(), err_r.as_fd()], || {
            let mut b = [0u8; 1];
            if nix::unistd::read(go_r.as_raw_fd(), &mut b) != Ok(1) {
                return 1;
            }
            for (helper, args) in [
                (&self.newuidmap, &self.uid_args),
                (&self.newgidmap, &self.gid_args),
            ] {
                let failed = match std::process::Command::new(helper)
                    .arg(&target)
                    .args(args)
                    .output()
                {
                    Ok(out) if out.status.success() => None,
                    Ok(out) => Some(format!(
                        "{} {}: {}",
                        helper.display(),
                        args.join(" "),
                        String::from_utf8_lossy(&out.stderr).trim()
                    )),
                    Err(e) => Some(format!("{}: {e}", helper.display())),
                };
                if let Some(msg) = failed {
                    let _ = nix::unistd::write(&err_w, msg.as_bytes());
                    return 1;
                }
            }
            0
        })?;
        drop(go_r);
        drop(err_w);
        let entered = enter();
        // The helper maps only a namespace that exists; otherwise it sees
        // EOF and leaves.
        if entered.is_ok() {
            let _ = nix::unistd::write(&go_w, b"g");
        }
        drop(go_w);
        let mut msg = String::new();
        let _ = fs::File::from(err_r).read_to_string(&mut msg);
        let status = nix::sys::wait::waitpid(child, None);
        entered?;
        match status {
            Ok(nix::sys::wait::WaitStatus::Exited(_, 0)) => Ok(()),
            _ => Err(RuntimeError::Unsupported {
                what: ctx.to_owned(),
                reason: if msg.is_empty() {
                    "the helper failed".to_owned()
                } else {
                    msg
                },
            }),
        }
    }
}

/// The ranges (start, count) `/etc/subuid`-style `text` gives the user
/// `name` (or its numeric `uid`), in file order.
fn subordinate_ranges(text: &str, name: &str, uid: u32) -> Vec<(u32, u32)> {
    text.lines()
        .filter_map(|line| {
            let mut f = line.trim().split(':');
            let (who, start, count) = (f.next()?, f.next()?, f.next()?);
            if who != name && who.parse() != Ok(uid) {
                return None;
            }
            let (start, count) = (start.parse().ok()?, count.parse::<u32>().ok()?);
            (count > 0).then_some((start, count))
        })
        .collect()
}

/// newuidmap's arguments: `0 own 1`, then the ranges from container id 1.
fn mapping_args(own: u32, ranges: &[(u32, u32)]) -> Vec<String> {
    let mut args = vec!["0".to_owned(), own.to_string(), "1".to_owned()];
    let mut next: u64 = 1;
    for &(start, count) in ranges {
        if next + u64::from(count) > u64::from(u32::MAX) {
            break;
        }
        args.extend([next.to_string(), start.to_string(), count.to_string()]);
        next += u64::from(count);
    }
    args
}

/// The set-user-id helper `name`, where the system installs it.
fn find_helper(name: &str) -> Option<PathBuf> {
    ["/usr/bin", "/bin", "/usr/sbin", "/usr/local/bin"]
        .iter()
        .map(|dir| Path::new(dir).join(name))
        .find(|p| p.is_file())
}

/// Rootless, inside a user namespace: the ranges of ids it maps (as this
/// process sees them), which a sandbox may map too.
pub(crate) fn rootless_ids() -> Option<runsbx_policy::RootlessIds> {
    if !privilege::in_user_namespace() {
        return None;
    }
    let ranges = |file: &str| -> Option<Vec<runsbx_policy::IdRange>> {
        fs::read_to_string(format!("/proc/self/{file}"))
            .ok()?
            .lines()
            .map(|line| {
                let mut f = line.split_whitespace().map(str::parse::<u32>);
                let (inside, _outside, count) = (f.next()?.ok()?, f.next()?.ok()?, f.next()?.ok()?);
                Some(runsbx_policy::IdRange {
                    base: inside,
                    size: count,
                })
            })
            .collect()
    };
    Some(runsbx_policy::RootlessIds {
        uids: ranges("uid_map")?,
        gids: ranges("gid_map")?,
        engines: userns_from().is_none(),
    })
}

/// The sandbox's own user namespace, made by runsbx when its mappings
/// have more than one line (a rootless sandbox that maps the caller's
/// subordinate ids). libcontainer 0.7 writes such maps only by running a
/// `newuidmap` it finds on PATH, which cannot work inside a user
/// namespace (the helper's set-user-id owner is unmapped there) and whose
/// failure it ignores. Here a child is cloned into a new namespace and
/// runsbx, with CAP_SETUID and CAP_SETGID over its own namespace, writes
/// its maps whole; the spec then joins it at the path it is held open at
/// (`/proc/self/fd/N`, valid in libcontainer's cloned children), as a
/// pod's containers join their sandbox's. Keep the returned file until
/// the container is built.
pub(crate) fn made_for(spec: &mut Spec) -> Result<Option<fs::File>> {
    let Some(linux) = spec.linux_mut() else {
        return Ok(None);
    };
    let lines = |maps: &Option<Vec<LinuxIdMapping>>| maps.as_ref().map_or(0, Vec::len);
    let creates_userns = linux
        .namespaces()
        .iter()
        .flatten()
        .any(|ns| ns.typ() == LinuxNamespaceType::User && ns.path().is_none());
    if !privilege::rootless()
        || !creates_userns
        || (lines(linux.uid_mappings()) <= 1 && lines(linux.gid_mappings()) <= 1)
    {
        return Ok(None);
    }
    let text = |maps: &Option<Vec<LinuxIdMapping>>| {
        maps.iter()
            .flatten()
            .map(|m| format!("{} {} {}\n", m.container_id(), m.host_id(), m.size()))
            .collect::<String>()
    };
    let held = with_maps(
        "the sandbox's user namespace",
        &text(linux.uid_mappings()),
        &text(linux.gid_mappings()),
        // Supplementary groups are set by the container's init, which needs
        // setgroups; without any, nobody in the sandbox ever may.
        !has_additional_gids(spec),
    )?;
    // The sandbox starts with no supplementary group of its caller's
    // (the init sets the spec's own): they would be container ids in it.
    // Where the caller's namespace denies setgroups there are none to drop
    // but the caller's own gid, which is container root's group anyway.
    let _ = nix::unistd::setgroups(&[]);
    let path = PathBuf::from(format!("/proc/self/fd/{}", held.as_raw_fd()));
    if let Some(namespaces) = spec
        .linux_mut()
        .as_mut()
        .and_then(|l| l.namespaces_mut().as_mut())
    {
        for ns in namespaces
            .iter_mut()
            .filter(|ns| ns.typ() == LinuxNamespaceType::User)
        {
            ns.set_path(Some(path.clone()));
        }
    }
    Ok(Some(held))
}

fn has_additional_gids(spec: &Spec) -> bool {
    spec.process()
        .as_ref()
        .and_then(|p| p.user().additional_gids().as_ref())
        .is_some_and(|g| !g.is_empty())
}

/// A new user namespace with these maps (whole, in one write each): a
/// child cloned into it waits while runsbx writes its maps and opens it
/// ([`Holder`]), then is let go.
pub(crate) fn with_maps(
    ctx: &str,
    uid_map: &str,
    gid_map: &str,
    deny_setgroups: bool,
) -> Result<fs::File> {
    let holder = Holder::clone()
        .map_err(|e| RuntimeError::sys(format!("{ctx}: clone a process into it"), e))?;
    let child = holder.pid;
    let result = (|| {
        let write = |file: &str, text: &str| {
            fs::write(format!("/proc/{child}/{file}"), text)
                .map_err(|e| (format!("write {file} {text:?}"), io_errno(e)))
        };
        if deny_setgroups {
            write("setgroups", "deny")?;
        }
        write("uid_map", uid_map)?;
        write("gid_map", gid_map)?;
        fs::File::open(format!("/proc/{child}/ns/user"))
            .map_err(|e| ("open its ns/user".to_owned(), io_errno(e)))
    })();
    holder.let_go();
    result.map_err(|(step, e)| RuntimeError::sys(format!("{ctx}: {step}"), e))
}

thread_local! {
    /// Holders this thread let go that are not reaped yet
    /// ([`reap_released`]).
    static RELEASED: RefCell<Vec<Holder>> = const { RefCell::new(Vec::new()) };
}

/// Reaps the holders of the namespaces this thread made ([`with_maps`]),
/// which were let go without being waited for: a create calls it once its
/// container is built, when each has long exited. Waiting for each as it
/// was let go (its wake-up, its exit and ours) took 0.26-0.33 ms of a cold
/// call, for each namespace, and reaping it then 0.03-0.08 ms (`strace
/// -T`). A holder not reaped by then is reaped when the thread ends.
pub(crate) fn reap_released() {
    drop(RELEASED.with(|r| std::mem::take(&mut *r.borrow_mut())));
}

/// A process born in a new user namespace that only waits until it is
/// let go, so that the namespace's maps can be written and an fd to it
/// opened. It shares runsbx's memory (sys/vm_child.rs): a forked holder
/// cost 0.4-0.5 ms of every cold run or call (`perf trace`: the fork 0.31
/// ms, the wait for its exit 0.17 ms, and the faults after).
struct Holder {
    pid: Pid,
    /// Closing it lets the child go.
    release: Option<OwnedFd>,
    /// What the child reads; both outlive it (dropped after the wait).
    _fds: Box<[libc::c_int; 2]>,
    _stack: vm_child::Stack,
}

impl Holder {
    fn clone() -> nix::Result<Self> {
        let (wait_r, wait_w) = nix::unistd::pipe()?;
        let mut fds = Box::new([wait_r.as_raw_fd(), wait_w.as_raw_fd()]);
        let stack = vm_child::Stack::new()?;
        // SAFETY: `hold` makes only raw system calls and reads `fds`, which
        // lives with `stack` until the child is reaped (Drop). Without
        // CLONE_FILES the child has its own copy of the fd table.
        let pid =
            unsafe { vm_child::spawn(libc::CLONE_NEWUSER, hold, fds.as_mut_ptr().cast(), &stack) }?;
        drop(wait_r);
        Ok(Holder {
            pid,
            release: Some(wait_w),
            _fds: fds,
            _stack: stack,
        })
    }

    /// Lets the child go (it exits on its own) and keeps what it runs on
    /// until [`reap_released`] reaps it.
    fn let_go(mut self) {
        drop(self.release.take());
        RELEASED.with(|r| r.borrow_mut().push(self));
    }
}

impl Drop for Holder {
    fn drop(&mut self) {
        drop(self.release.take());
        let _ = nix::sys::wait::waitpid(self.pid, None);
    }
}

/// The holder's body: closes its copy of the pipe's write end, then waits
/// for runsbx to close its own.
extern "C" fn hold(fds: *mut libc::c_void) -> libc::c_int {
    // SAFETY: `fds` is the holder's pair, alive until this child is
    // reaped; raw system calls only (sys/vm_child.rs).
    unsafe {
        let [wait_r, wait_w] = *fds.cast::<[libc::c_int; 2]>();
        vm_child::syscall(libc::SYS_close, [wait_w as usize, 0, 0, 0, 0, 0]);
        let mut byte = 0u8;
        // Every signal is blocked: nothing interrupts the read.
        vm_child::syscall(
            libc::SYS_read,
            [
                wait_r as usize,
                std::ptr::addr_of_mut!(byte) as usize,
                1,
                0,
                0,
                0,
            ],
        );
    }
    0
}

fn io_errno(e: std::io::Error) -> nix::Error {
    nix::Error::from_raw(e.raw_os_error().unwrap_or(libc::EIO))
}

/// The uid runsbx was invoked as: before it re-executed itself in a user
/// namespace of its own (see [`reexec_in_own_userns`]), or its effective uid.
pub fn caller_uid() -> u32 {
    userns_from()
        .map(|(uid, _)| uid)
        .unwrap_or_else(|| Uid::effective().as_raw())
}

pub(crate) fn open_ns(pid: Pid, kind: &str) -> std::io::Result<fs::File> {
    fs::File::open(format!("/proc/{pid}/ns/{kind}"))
}

pub(crate) fn same_file(a: &fs::File, b: &fs::File) -> Result<bool> {
    use std::os::unix::fs::MetadataExt;
    let (a, b) = (
        a.metadata()
            .map_err(|e| RuntimeError::io("fstat namespace", e))?,
        b.metadata()
            .map_err(|e| RuntimeError::io("fstat namespace", e))?,
    );
    Ok(a.dev() == b.dev() && a.ino() == b.ino())
}

/// ioctl(NS_GET_PARENT): the parent of a user namespace.
pub(crate) fn parent_ns(ns: &fs::File) -> nix::Result<OwnedFd> {
    // _IO(0xb7, 0x2) from <linux/nsfs.h>.
    const NS_GET_PARENT: libc::c_ulong = 0xb702;
    // SAFETY: the ioctl takes no argument and returns a new fd or -1.
    let fd = unsafe { libc::ioctl(ns.as_raw_fd(), NS_GET_PARENT) };
    if fd < 0 {
        return Err(nix::Error::last());
    }
    // SAFETY: the kernel just returned this fd to us.
    Ok(unsafe { OwnedFd::from_raw_fd(fd) })
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    #[test]
    fn subordinate_ranges_are_the_users_by_name_or_uid_in_file_order() {
        let text = "other:100000:65536\nalice:200000:65536\n# comment\n1001:300000:1000\nalice:400000:0\nalice:bad:1\n";
        assert_eq!(
            subordinate_ranges(text, "alice", 1001),
            [(200_000, 65_536), (300_000, 1000)]
        );
        assert!(subordinate_ranges(text, "bob", 1002).is_empty());
    }

    #[test]
    fn mapping_args_put_the_caller_at_0_and_the_ranges_from_1() {
        assert_eq!(
            mapping_args(1001, &[(200_000, 65_536), (300_000, 1000)]).join(" "),
            "0 1001 1 1 200000 65536 65537 300000 1000"
        );
        // Container ids never wrap past the last valid id.
        assert_eq!(
            mapping_args(5, &[(1, u32::MAX - 1), (9, 9)]).join(" "),
            "0 5 1 1 1 4294967294"
        );
    }

    /// A holder let go is still runsbx's child until [`reap_released`],
    /// and gone, not a zombie, after it; the namespace it held stays open.
    #[test]
    fn let_go_holders_are_reaped_and_their_namespace_kept() {
        if !Uid::effective().is_root() {
            assert!(
                std::env::var("CI").as_deref() != Ok("true"),
                "SKIP is not allowed under CI: mapping host ids needs root"
            );
            eprintln!("SKIP let_go_holders_are_reaped_and_their_namespace_kept: needs root");
            return;
        }
        let ns = with_maps(
            "a test namespace",
            "0 3000000 10\n",
            "0 3000000 10\n",
            false,
        )
        .unwrap();
        let pids: Vec<Pid> = RELEASED.with(|r| r.borrow().iter().map(|h| h.pid).collect());
        assert_eq!(pids.len(), 1, "the holder is kept until it is reaped");
        reap_released();
        assert!(RELEASED.with(|r| r.borrow().is_empty()));
        let proc_dir = format!("/proc/{}", pids[0]);
        assert!(
            !Path::new(&proc_dir).exists(),
            "the holder {} is still there after reap_released",
            pids[0]
        );
        let mine = fs::File::open("/proc/self/ns/user").unwrap();
        assert!(
            !same_file(&ns, &mine).unwrap(),
            "the namespace is a new one"
        );
        let parent = fs::File::from(parent_ns(&ns).unwrap());
        assert!(
            same_file(&parent, &mine).unwrap(),
            "and a child of this one"
        );
    }
}
