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

use libcontainer::container::{Container, ContainerStatus};

use crate::error::{Result, RuntimeError};
use crate::state::container::{self, op_err, owner, stage_key};
use crate::state::ids;
use crate::state::root::StateRoot;
use crate::state::{bundle, cgroup_claim};
use crate::sys::{privilege, procs, stage};

/// The cgroup container `id` claimed, if the claim is still its own: the
/// only cgroup reclaiming may empty and remove (see cgroup_claim.rs).
fn claimed_cgroup(root: &StateRoot, id: &str) -> Option<PathBuf> {
    if !privilege::can_manage_cgroups() {
        return None;
    }
    bundle::Effective::cgroup(root, id)
        .filter(|c| cgroup_claim::is_ours(c, &container::owner(root, id)))
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
    if let Ok(mut c) = container::load(root, id) {
        if let Err(e) = destroy(root, &mut c) {
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
        if let Err(e) = remove_cgroup(&cgroup) {
            tracing::warn!(id, "remove the interrupted sandbox's cgroup: {e}");
        }
    }
    let _ = fs::remove_dir_all(root.container_dir(id));
    release_orphan_slot(root, id);
    if let Err(e) = release_host_side(root, id) {
        tracing::warn!(id, "release the interrupted sandbox's host resources: {e}");
    }
}

/// Kills what a create that failed may have left running: libcontainer's
/// intermediate and init. When libcontainer fails after forking them (a
/// hook, its state, or runsbx's own steps around it), its cleanup removes
/// the state directory by which [`kill_all`] would find a waiting init,
/// and a call's command line does not name its sandbox. Both are children
/// of this process (libcontainer clones the init with CLONE_PARENT) and
/// named `youki:`; a runsbx process builds one sandbox at a time, so every
/// such child is this create's. Each is reaped.
pub(crate) fn kill_failed_create() {
    let killed: Vec<Pid> = procs::children()
        .into_iter()
        .filter(|(_, name)| name.starts_with("youki:"))
        .filter(|(pid, _)| {
            tracing::debug!(%pid, "killing a process of the failed create");
            kill(*pid, Signal::SIGKILL).is_ok()
        })
        .map(|(pid, _)| pid)
        .collect();
    for pid in killed {
        let _ = nix::sys::wait::waitpid(pid, None);
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
            match crate::sys::userns::parent_ns(&ns) {
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
    let default_root = root.path() == crate::state::root::default_root();
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
    pids.extend(bundle::Effective::init(root, id));
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
    procs_in(&cgroup_dirs(path))
}

/// The processes in cgroup directories `dirs`, each once.
fn procs_in(dirs: &[PathBuf]) -> Vec<Pid> {
    let mut pids: Vec<Pid> = dirs
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

/// Removes the container's cgroup directories, SIGKILLing whatever each
/// still holds. The kernel refuses to remove a cgroup that holds a process
/// (EBUSY), so the directories are removed first and their processes read
/// only when one is refused: a sandbox whose init is reaped has none left
/// (its pid namespace ended with it), and reading every hierarchy's
/// `cgroup.procs` first cost a call's teardown about thirty syscalls on
/// cgroupfs. Each refusal kills what the refused directory holds then
/// (one forked since the last look too). Killed processes leave a cgroup
/// only once they are fully gone (EBUSY until then): retried for a second.
fn remove_cgroup(path: &Path) -> Result<()> {
    for d in cgroup_dirs(path) {
        let mut tries = 0;
        loop {
            match fs::remove_dir(&d) {
                Ok(()) => break,
                Err(e) if e.kind() == std::io::ErrorKind::NotFound => break,
                Err(e) if e.raw_os_error() == Some(libc::EBUSY) && tries < 200 => {
                    for pid in procs_in(std::slice::from_ref(&d)) {
                        let _ = kill(pid, Signal::SIGKILL);
                    }
                    tries += 1;
                    std::thread::sleep(std::time::Duration::from_millis(5));
                }
                Err(e) => return Err(RuntimeError::io(format!("remove the cgroup {d:?}"), e)),
            }
        }
    }
    Ok(())
}

/// An id range allocated to `id` whose slot was never recorded (killed
/// between the two steps): found by its owner line in the allocation file.
fn release_orphan_slot(root: &StateRoot, id: &str) {
    if privilege::rootless() {
        return;
    }
    let owner = format!("{}\n{id}", root.path().display());
    for entry in fs::read_dir(ids::ID_DIR).into_iter().flatten().flatten() {
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

/// Kills every process of the container and removes its state.
pub(crate) fn destroy(root: &StateRoot, container: &mut Container) -> Result<()> {
    let id = container.id().to_owned();
    // A create killed while libcontainer's state still said "creating"
    // recorded no process, though its init may wait on the notify socket:
    // found by what it holds.
    if container.pid().is_none() || container.status() == ContainerStatus::Creating {
        crate::sandbox::teardown::kill_all(root, &id, None);
    }
    let config = match container.spec() {
        Ok(config) => config,
        Err(e) => {
            // A create killed while libcontainer wrote its own config of
            // the container: libcontainer cannot delete what it cannot
            // read. runsbx kills by what the container holds and releases
            // by its own records (the claimed cgroup among them).
            tracing::warn!(
                id,
                "its libcontainer config is unreadable ({e}): removing what it holds"
            );
            if let Some(pid) = container.pid() {
                let _ = nix::sys::signal::kill(pid, Signal::SIGKILL);
            }
            crate::sandbox::teardown::kill_all(root, &id, None);
            crate::sandbox::teardown::forget(root, &id);
            return Ok(());
        }
    };
    if privilege::can_manage_cgroups() {
        let cgroup = config.cgroup_path;
        if !cgroup_claim::is_ours(&cgroup, &owner(root, &id)) {
            // libcontainer would kill every process in it and remove it.
            tracing::warn!(
                id,
                ?cgroup,
                "runsbx holds no claim on this cgroup (it did not make it): leaving it alone"
            );
            if let Some(pid) = container.pid() {
                procs::kill_and_wait(pid)?;
            }
            let dir = root.container_dir(&id);
            std::fs::remove_dir_all(&dir)
                .or_else(|e| match e.kind() {
                    std::io::ErrorKind::NotFound => Ok(()),
                    _ => Err(e),
                })
                .map_err(|e| RuntimeError::io(format!("remove {dir:?}"), e))?;
            return release_host_side(root, &id);
        }
    }
    if !privilege::can_manage_cgroups() {
        // libcontainer kills through the cgroup, which does not exist here:
        // kill by pid namespace and wait for the init process to be gone.
        if let Some(pid) = container.pid() {
            procs::kill_and_wait(pid)?;
        }
        container.set_status(ContainerStatus::Stopped);
    }
    // libcgroups cannot remove a cgroup ("could not delete", EBUSY) until
    // the killed processes have left it: retried for up to a second.
    let mut tries = 0;
    loop {
        match container.delete(true) {
            Ok(()) => break,
            Err(_) if tries < 50 && root.container_dir(&id).exists() => {
                tries += 1;
                std::thread::sleep(std::time::Duration::from_millis(20));
            }
            Err(e) => return Err(op_err("delete", &id, e)),
        }
    }
    release_host_side(root, &id)
}

/// Tears down a call's sandbox whose init the call has reaped, so that no
/// process of its pid namespace is left (the kernel ends them all before
/// the init can be reaped): its cgroup, state directory and host side.
///
/// This is what libcontainer's delete does for such a container, which
/// has no hooks (runsbx writes a call's spec) and a stopped init, without
/// the cgroup manager it builds first: on a cgroup v1 host, that looks up
/// every controller's mount point in the mount table, one read (and one
/// new procfs instance) per controller, about 2 ms of CPU per call here.
/// Anything else goes through [`destroy`].
pub(crate) fn destroy_reaped(root: &StateRoot, container: &mut Container) -> Result<()> {
    let id = container.id().to_owned();
    let config = match container.spec() {
        Ok(config) if config.hooks.is_none() => config,
        _ => return destroy(root, container),
    };
    if privilege::can_manage_cgroups() {
        if !cgroup_claim::is_ours(&config.cgroup_path, &owner(root, &id)) {
            return destroy(root, container);
        }
        remove_cgroup(&config.cgroup_path)?;
    }
    // The state directory and the host side (the effective bundle's
    // directory last) are independent, and each ends with a directory's
    // removal, which on a disk mounted with `discard` waits for the device
    // to discard its block (0.3-0.4 ms on these VMs): both at once. Either
    // left half-done by a kill is what the sweep reclaims (`reclaim`).
    let dir = root.container_dir(&id);
    let (state, host) = std::thread::scope(|s| {
        let state = s.spawn(|| {
            fs::remove_dir_all(&dir)
                .or_else(|e| match e.kind() {
                    std::io::ErrorKind::NotFound => Ok(()),
                    _ => Err(e),
                })
                .map_err(|e| RuntimeError::io(format!("remove {dir:?}"), e))
        });
        let host = release_host_side(root, &id);
        let state = state
            .join()
            .unwrap_or_else(|panic| std::panic::resume_unwind(panic));
        (state, host)
    });
    state?;
    host
}

/// Removes what container `id` holds outside its state directory: staged
/// mounts, its id range, the effective bundle.
pub(crate) fn release_host_side(root: &StateRoot, id: &str) -> Result<()> {
    if !privilege::rootless() {
        stage::remove(&stage_key(root, id))?;
    }
    if let Some(slot) = bundle::Effective::slot(root, id) {
        ids::release_id_range(slot);
    }
    if let Some(cgroup) = bundle::Effective::cgroup(root, id) {
        cgroup_claim::release(&cgroup, &owner(root, id));
    }
    bundle::Effective::remove(root, id)
}
