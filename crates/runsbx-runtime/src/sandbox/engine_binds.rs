//! Bind mounts that are an engine's own rather than a host path a user
//! picked: its init binary (`--init`) and its named volumes. The policy
//! allows them by profile (`engine_init`, `engine_volumes`) only where
//! this module vouched for the source; any other bind stays refused.
//!
//! An init is a single regular file owned by root (rootless: by the
//! caller, or by host root, which a rootless engine's user namespace shows
//! as the overflow id) that no one else may write and anyone may run. A named volume is a
//! directory `<storage>/volumes/<name>/_data` where `<storage>` is the
//! engine storage that also holds the container's rootfs (podman's and
//! docker's layout) and no other user may enter.

use std::fs;
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};

use libcontainer::oci_spec::runtime::Spec;
use runsbx_policy::{EngineBind, EngineBindKind};

use crate::sys::layers;

/// The spec's bind mounts whose sources are an engine's own.
pub(crate) fn of(spec: &Spec) -> Vec<EngineBind> {
    let rootfs = spec
        .root()
        .as_ref()
        .and_then(|r| fs::canonicalize(r.path()).ok());
    spec.mounts()
        .iter()
        .flatten()
        .filter(|m| runsbx_policy::is_bind_mount(m))
        .filter_map(|m| {
            let given = m.source().clone()?;
            let source = fs::canonicalize(&given).ok()?;
            let kind = if is_system_file(&source) {
                EngineBindKind::SystemFile
            } else if rootfs.as_deref().is_some_and(|r| is_volume(&source, r)) {
                EngineBindKind::Volume
            } else {
                return None;
            };
            Some(EngineBind {
                destination: m.destination().clone(),
                source: given,
                kind,
            })
        })
        .collect()
}

/// The id the kernel shows for a host id the current user namespace does
/// not map.
const OVERFLOW_UID: u32 = 65_534;

fn is_system_file(source: &Path) -> bool {
    let Ok(md) = fs::metadata(source) else {
        return false;
    };
    let me = nix::unistd::Uid::effective().as_raw();
    let owner_ok = md.uid() == 0
        || md.uid() == me
        || (crate::sys::privilege::in_user_namespace() && md.uid() == OVERFLOW_UID);
    // Writable by its owner alone; anyone may read and run it (its
    // content is no secret, unlike a 0600 file's).
    md.is_file() && owner_ok && md.mode() & 0o022 == 0 && md.mode() & 0o005 == 0o005
}

/// `source` (canonical) is `<storage>/volumes/<name>/_data`, a directory,
/// and the canonical `rootfs` lies in the same `<storage>`, which no
/// other user may enter.
fn is_volume(source: &Path, rootfs: &Path) -> bool {
    let storage = || -> Option<PathBuf> {
        if source.file_name()? != "_data" {
            return None;
        }
        let volumes = source.parent()?.parent()?;
        if volumes.file_name()? != "volumes" {
            return None;
        }
        Some(volumes.parent()?.to_path_buf())
    };
    let Some(storage) = storage() else {
        return false;
    };
    rootfs.starts_with(&storage)
        && rootfs != storage
        && !rootfs.starts_with(storage.join("volumes"))
        && fs::metadata(source).is_ok_and(|md| md.is_dir())
        && layers::closed_to_others(&storage)
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    #[test]
    fn a_volume_is_data_of_a_named_volume_in_the_rootfs_storage() {
        // Under /tmp (1777) and / (0755): nothing above is closed.
        let dir = tempfile::tempdir_in("/tmp").unwrap();
        let storage = dir.path().join("storage");
        let data = storage.join("volumes/v/_data");
        let rootfs = storage.join("overlay/abc/merged");
        for d in [&data, &rootfs] {
            fs::create_dir_all(d).unwrap();
        }
        let close = |p: &Path, mode| {
            use std::os::unix::fs::PermissionsExt;
            fs::set_permissions(p, fs::Permissions::from_mode(mode)).unwrap();
        };
        close(&storage, 0o700);
        assert!(is_volume(&data, &rootfs));
        // Not the rootfs's storage, not a volume's data, or a volume's data
        // as the "rootfs".
        assert!(!is_volume(
            &data,
            Path::new("/var/lib/other/overlay/x/merged")
        ));
        assert!(!is_volume(&storage.join("volumes/v"), &rootfs));
        assert!(!is_volume(&data, &storage.join("volumes/w/_data")));
        // Storage others may enter (and no closed directory above it).
        close(&storage, 0o755);
        close(dir.path(), 0o755);
        assert!(!is_volume(&data, &rootfs));
    }
}
