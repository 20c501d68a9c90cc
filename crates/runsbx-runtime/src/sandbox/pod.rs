//! A Kubernetes pod's containers join namespaces of the pod's sandbox
//! (pause) container: containerd's CRI plugin names them by path
//! (`/proc/<sandbox pid>/ns/{net,ipc,uts}`), and CRI-O likewise. The policy
//! refuses any namespace given by path unless the runtime has verified it;
//! this is that verification.
//!
//! A join is verified when the spec's annotations name the pod's sandbox
//! container, that container is live in this state root (so runsbx made
//! it, and made its namespaces), the namespace at the spec's path is the
//! sandbox process's own namespace of that type, and it is not the host's
//! (not init's, not runsbx's own). Each verified namespace is held open
//! while the container is created, and the policy is given the path it is
//! held at (`/proc/self/fd/N`, valid in libcontainer's cloned children), so
//! that a reused pid cannot swap in another namespace after the check.

use std::fs;
use std::os::fd::{AsRawFd, OwnedFd};
use std::path::{Path, PathBuf};

use libcontainer::container::ContainerStatus;
use libcontainer::oci_spec::runtime::{LinuxNamespaceType, Spec};
use nix::sys::stat::{fstat, stat};
use runsbx_policy::{IdRange, PodJoin, PodNamespace};

use crate::error::{Result, RuntimeError};
use crate::state::bundle;
use crate::state::root::StateRoot;

/// A verified pod join, and the namespaces it holds open until dropped.
pub(crate) struct Verified {
    pub join: PodJoin,
    /// As root: the sandbox's host id range, which the container shares.
    pub range: Option<IdRange>,
    _held: Vec<OwnedFd>,
}

/// The sandbox a CRI container belongs to, from the annotations
/// containerd's CRI plugin and CRI-O set.
fn sandbox_of(spec: &Spec) -> Option<&str> {
    let a = spec.annotations().as_ref()?;
    let typ = a
        .get("io.kubernetes.cri.container-type")
        .or_else(|| a.get("io.kubernetes.cri-o.ContainerType"))?;
    if typ != "container" {
        return None;
    }
    a.get("io.kubernetes.cri.sandbox-id")
        .or_else(|| a.get("io.kubernetes.cri-o.SandboxID"))
        .map(String::as_str)
}

fn proc_name(typ: LinuxNamespaceType) -> Option<&'static str> {
    Some(match typ {
        LinuxNamespaceType::Network => "net",
        LinuxNamespaceType::Ipc => "ipc",
        LinuxNamespaceType::Uts => "uts",
        LinuxNamespaceType::Pid => "pid",
        LinuxNamespaceType::User => "user",
        LinuxNamespaceType::Cgroup => "cgroup",
        LinuxNamespaceType::Mount => "mnt",
        _ => return None,
    })
}

/// Verifies the namespaces `spec` joins by path against its pod's sandbox
/// container in `root`. `None` when the spec is not a pod's container or
/// joins nothing; a path that fails a check is left out, and the policy
/// refuses it.
pub(crate) fn verify(root: &StateRoot, spec: &Spec) -> Result<Option<Verified>> {
    let Some(sandbox) = sandbox_of(spec) else {
        return Ok(None);
    };
    let joins: Vec<(LinuxNamespaceType, PathBuf)> = spec
        .linux()
        .as_ref()
        .and_then(|l| l.namespaces().as_ref())
        .map(|nss| {
            nss.iter()
                .filter_map(|ns| Some((ns.typ(), ns.path().clone()?)))
                .collect()
        })
        .unwrap_or_default();
    if joins.is_empty() {
        return Ok(None);
    }
    let what = || format!("pod sandbox `{sandbox}`");
    let container = crate::state::container::load(root, sandbox).map_err(|e| {
        RuntimeError::invalid(
            what(),
            format!("the container's namespaces are joined only from a live runsbx pod sandbox in the same state root: {e}"),
        )
    })?;
    if !matches!(
        container.status(),
        ContainerStatus::Created | ContainerStatus::Running | ContainerStatus::Paused
    ) {
        return Err(RuntimeError::invalid(what(), "is not running"));
    }
    let pid = crate::state::container::init_pid(&container)?;
    let config = bundle::Effective::path(root, sandbox).join("config.json");
    let sandbox_spec = Spec::load(&config)
        .map_err(|e| RuntimeError::invalid(format!("{}: {config:?}", what()), e.to_string()))?;
    let linux = sandbox_spec.linux().clone().unwrap_or_default();
    let uid_mappings = linux.uid_mappings().clone().unwrap_or_default();
    let gid_mappings = linux.gid_mappings().clone().unwrap_or_default();
    let range = match uid_mappings.as_slice() {
        [m] if m.container_id() == 0 && m.host_id() != 0 => Some(IdRange {
            base: m.host_id(),
            size: m.size(),
        }),
        _ => None,
    };

    let mut held = Vec::new();
    let user_path = PathBuf::from(format!("/proc/{pid}/ns/user"));
    let user = open_ns(&user_path)?;
    if is_hosts(&user, "user")? {
        return Err(RuntimeError::invalid(
            what(),
            "is in the host's user namespace",
        ));
    }
    let user_namespace = pinned(&user);
    held.push(user);
    let mut namespaces = Vec::new();
    for (typ, path) in joins {
        let Some(name) = proc_name(typ) else { continue };
        let Ok(fd) = open_ns(&path) else { continue };
        let theirs = stat(format!("/proc/{pid}/ns/{name}").as_str());
        let ours = fstat(fd.as_raw_fd());
        let same = matches!((theirs, ours), (Ok(a), Ok(b)) if (a.st_dev, a.st_ino) == (b.st_dev, b.st_ino));
        if !same || is_hosts(&fd, name)? {
            tracing::warn!(
                sandbox,
                ?path,
                "not a namespace of the pod's sandbox container: not joined"
            );
            continue;
        }
        namespaces.push(PodNamespace {
            typ,
            path,
            pinned: pinned(&fd),
        });
        held.push(fd);
    }
    Ok(Some(Verified {
        join: PodJoin {
            sandbox: sandbox.to_owned(),
            namespaces,
            user_namespace,
            uid_mappings,
            gid_mappings,
        },
        range,
        _held: held,
    }))
}

fn open_ns(path: &Path) -> Result<OwnedFd> {
    fs::File::open(path)
        .map(OwnedFd::from)
        .map_err(|e| RuntimeError::io(format!("open namespace {path:?}"), e))
}

/// Whether `fd` is the host's namespace `name`: init's or runsbx's own.
fn is_hosts(fd: &OwnedFd, name: &str) -> Result<bool> {
    let st = fstat(fd.as_raw_fd())
        .map_err(|e| RuntimeError::sys(format!("fstat a {name} namespace"), e))?;
    for host in [
        format!("/proc/1/ns/{name}"),
        format!("/proc/self/ns/{name}"),
    ] {
        match stat(host.as_str()) {
            Ok(h) if (h.st_dev, h.st_ino) == (st.st_dev, st.st_ino) => return Ok(true),
            Ok(_) => {}
            // Where runsbx may not look at init (no CAP_SYS_PTRACE over it,
            // as in some containers), runsbx's own namespace still is.
            Err(nix::errno::Errno::EACCES | nix::errno::Errno::EPERM)
                if host.starts_with("/proc/1/") => {}
            Err(e) => return Err(RuntimeError::sys(format!("stat {host}"), e)),
        }
    }
    Ok(false)
}

/// The path at which this process, and libcontainer's children cloned from
/// it, reach `fd`.
fn pinned(fd: &OwnedFd) -> PathBuf {
    PathBuf::from(format!("/proc/self/fd/{}", fd.as_raw_fd()))
}
