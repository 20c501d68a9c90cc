//! runsbx removes a container's cgroup with the container, and libcgroups
//! 0.7 kills every process listed in a cgroup before it removes it (its v1
//! `remove()`). Handed the hierarchy's root, a host service's cgroup or
//! another container's, that kills processes runsbx never made. So, as
//! root, runsbx only lets libcontainer use a cgroup it can prove it made:
//!
//! - before the container is built, the cgroup must not exist in any
//!   mounted hierarchy (the policy has already refused `/`, `..` and `.`);
//! - runsbx claims the path with a file that appears whole or not at all
//!   under [`CLAIM_DIR`] (see record.rs), naming the container that owns
//!   it, before libcontainer
//!   creates the cgroup: two containers, of any state root, can never get
//!   the same one;
//! - `delete` lets libcontainer remove a cgroup only while that claim names
//!   the container; otherwise the cgroup is left alone, with a message.

use std::fs;
use std::os::unix::fs::DirBuilderExt;
use std::path::{Path, PathBuf};

use crate::error::{Result, RuntimeError};

/// Where claims live: one file per cgroup path in use, across every state
/// root.
pub(crate) const CLAIM_DIR: &str = "/run/runsbx-cgroups";

/// The claim file of `cgroup`: named by a hash of the path (the file holds
/// the path itself, so a collision is a refusal, never a shared cgroup).
fn claim_file(cgroup: &Path) -> PathBuf {
    let hash = cgroup
        .as_os_str()
        .as_encoded_bytes()
        .iter()
        .fold(0xcbf2_9ce4_8422_2325_u64, |h, b| {
            (h ^ u64::from(*b)).wrapping_mul(0x0100_0000_01b3)
        });
    Path::new(CLAIM_DIR).join(format!("{hash:016x}"))
}

fn record(cgroup: &Path, owner: &str) -> String {
    format!("{owner}\n{}", cgroup.display())
}

/// Claims `cgroup` (the spec's `linux.cgroupsPath`) for `owner` (the state
/// root and the container id), refusing a cgroup that exists already.
pub(crate) fn claim(cgroup: &Path, owner: &str) -> Result<()> {
    let refuse =
        |reason: String| RuntimeError::invalid(format!("linux.cgroupsPath {cgroup:?}"), reason);
    let relative = cgroup.strip_prefix("/").unwrap_or(cgroup);
    for mount in runsbx_image::mountinfo::mount_points_of(&["cgroup", "cgroup2"])? {
        let dir = mount.join(relative);
        if fs::symlink_metadata(&dir).is_ok() {
            return Err(refuse(format!(
                "the cgroup exists already ({dir:?}); runsbx only uses a cgroup it makes, \
                 since removing a cgroup kills every process in it: give a new path, or leave \
                 cgroupsPath out"
            )));
        }
    }
    fs::DirBuilder::new()
        .recursive(true)
        .mode(0o700)
        .create(CLAIM_DIR)
        .map_err(|e| RuntimeError::io(format!("create {CLAIM_DIR}"), e))?;
    let path = claim_file(cgroup);
    match crate::state::record::create_whole(&path, record(cgroup, owner).as_bytes()) {
        Ok(true) => Ok(()),
        Ok(false) => Err(refuse(format!(
            "another runsbx container uses this cgroup (claimed in {path:?}): give a new path"
        ))),
        Err(e) => Err(RuntimeError::io(format!("claim the cgroup in {path:?}"), e)),
    }
}

/// Whether `owner` holds the claim on `cgroup`.
pub(crate) fn is_ours(cgroup: &Path, owner: &str) -> bool {
    fs::read_to_string(claim_file(cgroup)).is_ok_and(|text| text == record(cgroup, owner))
}

/// Gives up `owner`'s claim on `cgroup`, if it holds it.
pub(crate) fn release(cgroup: &Path, owner: &str) {
    if is_ours(cgroup, owner) {
        let _ = fs::remove_file(claim_file(cgroup));
    }
}
