//! Letting libcontainer build a container where runsbx cannot make cgroups.
//!
//! libcontainer 0.7 always moves a new container's first process into a
//! cgroup, and on a cgroup v1 (or hybrid) host its v1 manager ignores the
//! rootless flag: an unprivileged caller fails with EACCES on
//! `/sys/fs/cgroup/<controller>/…`, as does root inside rootless podman's
//! user namespace. runc and crun skip cgroups there instead.
//!
//! runsbx does the same without patching libcontainer: before building the
//! container it moves itself into a private mount namespace (in a user
//! namespace it owns, when it is not in one already) and mounts an empty
//! tmpfs over `/sys/fs/cgroup`, holding only the directories and files the
//! v1 manager touches for this container's cgroup path. The manager then
//! "joins" files in that tmpfs: no cgroup exists and nothing on the host
//! changes. The container's own limits come from rlimits; this is logged,
//! and the policy's attestation says so.
//!
//! The tmpfs is visible only to this runsbx process and the namespaces it
//! creates (the container pivots away from it), and it is unmounted as soon
//! as the container exists.

use std::fs;
use std::path::{Component, Path};

use nix::mount::{mount, umount2, MntFlags, MsFlags};
use nix::sched::{setns, unshare, CloneFlags};
use nix::unistd::Pid;

use crate::error::{Result, RuntimeError};
use crate::sys::userns::{open_ns, parent_ns, same_file};

const CGROUP_ROOT: &str = "/sys/fs/cgroup";

/// The shadow over `/sys/fs/cgroup`; unmount it with [`Shadow::leave`] once
/// libcontainer has made its cgroup calls.
#[derive(Debug)]
pub struct Shadow(());

impl Shadow {
    pub fn leave(self) -> Result<()> {
        umount2(CGROUP_ROOT, MntFlags::MNT_DETACH).map_err(|e| {
            RuntimeError::sys(format!("unmount the cgroup shadow on {CGROUP_ROOT}"), e)
        })
    }
}

/// For `create`/`run`: the shadow. (The spec's id mappings are already in
/// this namespace's terms: the policy reads them from /proc/self/uid_map.)
pub fn enter_for_create(cgroup_path: &Path) -> Result<Shadow> {
    shadow(cgroup_path)
}

/// For `exec`: joins the user namespace the container was created from
/// (the parent of its own), so that joining the container's user
/// namespace is allowed, then the shadow.
pub fn enter_for_exec(init: Pid, cgroup_path: &Path) -> Result<Shadow> {
    let ctx = |step: &str| format!("prepare exec into pid {init} without cgroups: {step}");
    let theirs =
        open_ns(init, "user").map_err(|e| RuntimeError::io(ctx("open its user namespace"), e))?;
    let ours = open_ns(Pid::this(), "user")
        .map_err(|e| RuntimeError::io(ctx("open our user namespace"), e))?;
    if !same_file(&theirs, &ours)? {
        let parent = parent_ns(&theirs)
            .map(fs::File::from)
            .map_err(|e| RuntimeError::sys(ctx("NS_GET_PARENT"), e))?;
        if !same_file(&parent, &ours)? {
            setns(&parent, CloneFlags::CLONE_NEWUSER).map_err(|e| {
                RuntimeError::sys(ctx("join the container's parent user namespace"), e)
            })?;
            crate::sys::privilege::moved();
        }
    }
    shadow(cgroup_path)
}

/// Moves this process into a mount namespace of its own, from which
/// nothing mounted propagates back to the one it came from.
pub(crate) fn private_mount_namespace() -> nix::Result<()> {
    unshare(CloneFlags::CLONE_NEWNS)?;
    slave_mounts()
}

/// Makes every mount of this (new) mount namespace a slave of the one it
/// was copied from: what is mounted here does not propagate back.
pub(crate) fn slave_mounts() -> nix::Result<()> {
    mount(
        None::<&str>,
        "/",
        None::<&str>,
        MsFlags::MS_REC | MsFlags::MS_SLAVE,
        None::<&str>,
    )
}

fn shadow(cgroup_path: &Path) -> Result<Shadow> {
    let ctx = |step: &str| format!("hide cgroups for a rootless container: {step}");
    let v1_mounts = runsbx_image::mountinfo::mount_points_of(&["cgroup"])?;
    let cpuset = read_trimmed("/sys/fs/cgroup/cpuset/cpuset.cpus");
    let mems = read_trimmed("/sys/fs/cgroup/cpuset/cpuset.mems");
    private_mount_namespace()
        .map_err(|e| RuntimeError::sys(ctx("a private mount namespace"), e))?;
    mount(
        Some("runsbx-cgroup-shadow"),
        CGROUP_ROOT,
        Some("tmpfs"),
        MsFlags::MS_NOSUID | MsFlags::MS_NODEV | MsFlags::MS_NOEXEC,
        Some("mode=0755,size=1m"),
    )
    .map_err(|e| RuntimeError::sys(ctx(&format!("mount tmpfs on {CGROUP_ROOT}")), e))?;
    crate::sys::privilege::moved();
    let shadow = Shadow(());
    let relative: Vec<Component> = cgroup_path
        .components()
        .filter(|c| matches!(c, Component::Normal(_)))
        .collect();
    for mount_point in v1_mounts {
        if !mount_point.starts_with(CGROUP_ROOT) {
            continue;
        }
        // The v1 cpuset controller reads cpuset.cpus and cpuset.mems at
        // every level from its mount point down and copies them into the
        // new cgroup; every other controller just writes cgroup.procs.
        let mut dir = mount_point.clone();
        let write_level = |dir: &Path| -> std::io::Result<()> {
            fs::create_dir_all(dir)?;
            fs::write(dir.join("cpuset.cpus"), &cpuset)?;
            fs::write(dir.join("cpuset.mems"), &mems)
        };
        write_level(&dir).map_err(|e| RuntimeError::io(ctx(&format!("populate {dir:?}")), e))?;
        for component in &relative {
            dir.push(component);
            write_level(&dir)
                .map_err(|e| RuntimeError::io(ctx(&format!("populate {dir:?}")), e))?;
        }
        fs::write(dir.join("cgroup.procs"), "")
            .map_err(|e| RuntimeError::io(ctx(&format!("populate {dir:?}")), e))?;
    }
    Ok(shadow)
}

fn read_trimmed(path: &str) -> String {
    fs::read_to_string(path)
        .map(|s| s.trim().to_owned())
        .ok()
        .filter(|s| !s.is_empty())
        .unwrap_or_else(|| "0".to_owned())
}
