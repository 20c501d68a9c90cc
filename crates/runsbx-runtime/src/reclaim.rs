//! Reclaiming what a container left when the runsbx that made it, ran
//! it or deleted it was killed with SIGKILL, without trusting its state
//! file, which may be missing, half-written or name only the init: its
//! processes by user namespace (rootless), by the notify socket a waiting
//! init listens on and by the cgroup runsbx claimed for it (as root); then
//! its cgroup, state, staged mounts, id range and claim. Used by
//! `delete --force` and by the sweep of interrupted calls.

use std::fs;
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};

use nix::sys::signal::{kill, Signal};
use nix::unistd::Pid;

use crate::root::StateRoot;
use crate::{bundle, cgroup_claim, host, lifecycle, policy};

/// The cgroup container `id` claimed, if the claim is still its own: the
/// only cgroup reclaiming may empty and remove (see cgroup_claim.rs).
fn claimed_cgroup(root: &StateRoot, id: &str) -> Option<PathBuf> {
    if !host::can_manage_cgroups() {
        return None;
    }
    bundle::Effective::cgroup(root, id)
        .filter(|c| cgroup_claim::is_ours(c, &lifecycle::owner(root, id)))
}

pub(crate) fn reclaim(root: &StateRoot, id: &str, userns: Option<u64>) {
    // Every process first, found without the state file, which may be
    // missing, half-written, or name only the init: by user namespace
    // (rootless), by the notify socket a waiting init listens on, and by
    // cgroup (as root). libcontainer's intermediate process joins the
    // cgroup by itself shortly after it is cloned, so the search goes on
    // until it has come up empty several times in a row.
    kill_all(root, id, userns);
    // Then the state, through libcontainer when it loads.
    if let Ok(mut c) = lifecycle::load(root, id) {
        if let Err(e) = lifecycle::destroy(root, &mut c) {
            tracing::debug!(id, "delete the interrupted sandbox: {e}");
        }
    }
    forget(root, id);
}

/// Everything of container `id` but its processes (killed first): the
/// cgroup it claimed, its state directory, its id range (also one whose
/// record was never written) and the rest of its host side.
pub(crate) fn forget(root: &StateRoot, id: &str) {
    if let Some(cgroup) = claimed_cgroup(root, id) {
        remove_cgroup(&cgroup);
    }
    let _ = fs::remove_dir_all(root.container_dir(id));
    release_orphan_slot(root, id);
    if let Err(e) = lifecycle::release_host_side(root, id) {
        tracing::warn!(id, "release the interrupted sandbox's host resources: {e}");
    }
}

/// Processes whose user namespace is `ino` or a descendant of it.
fn in_user_namespace(ino: u64) -> Vec<Pid> {
    let mut found = Vec::new();
    for proc_entry in fs::read_dir("/proc").into_iter().flatten().flatten() {
        let Ok(pid) = proc_entry.file_name().to_string_lossy().parse::<i32>() else {
            continue;
        };
        let Ok(mut ns) = fs::File::open(proc_entry.path().join("ns/user")) else {
            continue;
        };
        // Walk up to the initial namespace (NS_GET_PARENT fails there).
        for _ in 0..32 {
            if ns.metadata().is_ok_and(|m| m.ino() == ino) {
                found.push(Pid::from_raw(pid));
                break;
            }
            match crate::cgroupless::parent_ns(&ns) {
                Ok(parent) => ns = fs::File::from(parent),
                Err(_) => break,
            }
        }
    }
    found
}

/// Kills every process of container `id` found without its state file,
/// until none has been seen five times in a row (libcontainer's
/// intermediate joins the cgroup by itself shortly after it is cloned).
pub(crate) fn kill_all(root: &StateRoot, id: &str, userns: Option<u64>) {
    let mut quiet = 0;
    for _ in 0..200 {
        if kill_processes(root, id, userns) == 0 {
            quiet += 1;
            if quiet == 5 {
                break;
            }
        } else {
            quiet = 0;
        }
        std::thread::sleep(std::time::Duration::from_millis(5));
    }
}

/// libcontainer's own processes for container `id` of `root` (its
/// intermediate and its init, named `youki:[…]`) that a killed runsbx left:
/// clones of runsbx made before any exec, they still carry the command
/// line of the runsbx that made them, with its state root and the id. The
/// notify socket cannot find them rootless: a waiting init bound it in the
/// sandbox's network namespace, whose sockets /proc/net/unix does not list
/// here, and there is no cgroup. Reclaiming holds the id's lock, so no live
/// runsbx command for this id can match.
fn libcontainer_children(root: &StateRoot, id: &str) -> Vec<Pid> {
    let root_path = root.path().as_os_str().as_encoded_bytes().to_vec();
    let default_root = root.path() == crate::root::default_root();
    let mut found = Vec::new();
    for proc_entry in fs::read_dir("/proc").into_iter().flatten().flatten() {
        let Ok(pid) = proc_entry.file_name().to_string_lossy().parse::<i32>() else {
            continue;
        };
        let comm = fs::read(proc_entry.path().join("comm")).unwrap_or_default();
        if !comm.starts_with(b"youki:") {
            continue;
        }
        let cmdline = fs::read(proc_entry.path().join("cmdline")).unwrap_or_default();
        let args: Vec<&[u8]> = cmdline.split(|b| *b == 0).collect();
        let names_id = args.iter().skip(1).any(|a| *a == id.as_bytes());
        let in_root = args
            .windows(2)
            .any(|w| w[0] == b"--root" && w[1] == root_path.as_slice())
            || args
                .iter()
                .any(|a| a.strip_prefix(b"--root=".as_slice()) == Some(root_path.as_slice()))
            || (default_root && !args.iter().any(|a| a.starts_with(b"--root")));
        if names_id && in_root {
            found.push(Pid::from_raw(pid));
        }
    }
    found
}

/// Processes holding the unix socket bound at `path` (found through
/// /proc/net/unix and every process's fds).
fn socket_holders(path: &Path) -> Vec<Pid> {
    let Ok(table) = fs::read_to_string("/proc/net/unix") else {
        return Vec::new();
    };
    let wanted = path.as_os_str().to_string_lossy();
    let inodes: Vec<String> = table
        .lines()
        .skip(1)
        .filter_map(|line| {
            let fields: Vec<&str> = line.split_whitespace().collect();
            (fields.len() >= 8 && fields[7] == wanted).then(|| format!("socket:[{}]", fields[6]))
        })
        .collect();
    if inodes.is_empty() {
        return Vec::new();
    }
    let mut holders = Vec::new();
    for proc_entry in fs::read_dir("/proc").into_iter().flatten().flatten() {
        let Ok(pid) = proc_entry.file_name().to_string_lossy().parse::<i32>() else {
            continue;
        };
        if pid == std::process::id() as i32 {
            continue;
        }
        let Ok(fds) = fs::read_dir(proc_entry.path().join("fd")) else {
            continue;
        };
        let holds = fds.flatten().any(|fd| {
            fs::read_link(fd.path())
                .is_ok_and(|target| inodes.iter().any(|i| target.as_os_str() == i.as_str()))
        });
        if holds {
            holders.push(Pid::from_raw(pid));
        }
    }
    holders
}

/// SIGKILLs every process of call `id` found right now (and, given a user
/// namespace, every process in it or below it); how many.
fn kill_processes(root: &StateRoot, id: &str, userns: Option<u64>) -> usize {
    let mut pids = Vec::new();
    if let Some(userns) = userns {
        pids.extend(in_user_namespace(userns));
    }
    pids.extend(socket_holders(&root.container_dir(id).join("notify.sock")));
    pids.extend(libcontainer_children(root, id));
    if let Some(cgroup) = claimed_cgroup(root, id) {
        pids.extend(cgroup_procs(&cgroup));
    }
    let me = Pid::this();
    pids.retain(|p| *p != me);
    for pid in &pids {
        tracing::info!(id, %pid, "killing a process of the interrupted call");
        let _ = kill(*pid, Signal::SIGKILL);
    }
    pids.len()
}

/// The container's cgroup directories: in each v1 hierarchy, or the
/// unified one, where it exists.
fn cgroup_dirs(path: &Path) -> Vec<PathBuf> {
    let rel = path.strip_prefix("/").unwrap_or(path);
    let mut dirs: Vec<PathBuf> = vec![Path::new("/sys/fs/cgroup").join(rel)];
    for entry in fs::read_dir("/sys/fs/cgroup")
        .into_iter()
        .flatten()
        .flatten()
    {
        dirs.push(entry.path().join(rel));
    }
    dirs.retain(|d| d.join("cgroup.procs").is_file());
    dirs
}

fn cgroup_procs(path: &Path) -> Vec<Pid> {
    let mut pids: Vec<Pid> = cgroup_dirs(path)
        .iter()
        .flat_map(|d| {
            fs::read_to_string(d.join("cgroup.procs"))
                .unwrap_or_default()
                .lines()
                .filter_map(|l| l.trim().parse::<i32>().ok())
                .map(Pid::from_raw)
                .collect::<Vec<_>>()
        })
        .collect();
    pids.sort();
    pids.dedup();
    pids
}

fn remove_cgroup(path: &Path) {
    for d in cgroup_dirs(path) {
        // Killed processes leave the cgroup once they are fully gone.
        for _ in 0..100 {
            match fs::remove_dir(&d) {
                Err(e) if e.raw_os_error() == Some(libc::EBUSY) => {
                    std::thread::sleep(std::time::Duration::from_millis(5))
                }
                _ => break,
            }
        }
    }
}

/// An id range allocated to `id` whose slot was never recorded (killed
/// between the two steps): found by its owner line in the allocation file.
fn release_orphan_slot(root: &StateRoot, id: &str) {
    if host::rootless() {
        return;
    }
    let owner = format!("{}\n{id}", root.path().display());
    for entry in fs::read_dir(policy::ID_DIR).into_iter().flatten().flatten() {
        // Allocation files are tiny; anything else is not one of ours.
        if entry.metadata().is_ok_and(|m| m.size() > 4096) {
            continue;
        }
        let text = fs::read_to_string(entry.path()).unwrap_or_default();
        // An empty file: its allocator was killed between creating it and
        // writing its owner (one write, right after); after a while it is
        // nobody's.
        let stale_empty = text.is_empty()
            && entry.metadata().and_then(|m| m.modified()).is_ok_and(|t| {
                t.elapsed().unwrap_or_default() > std::time::Duration::from_secs(10)
            });
        if text == owner || stale_empty {
            let _ = fs::remove_file(entry.path());
        }
    }
}
