//! Reading an OCI bundle: checked up front, so that a bad bundle is refused
//! before anything is created on the host.

use std::fs;
use std::path::{Path, PathBuf};

use libcontainer::oci_spec::runtime::Spec;

use crate::error::{Result, RuntimeError};

/// A bundle whose config.json parsed and whose rootfs is a directory.
#[derive(Debug)]
pub struct Bundle {
    pub dir: PathBuf,
    pub spec: Spec,
    pub rootfs: PathBuf,
}

pub fn load(dir: &Path) -> Result<Bundle> {
    let bad = |reason: String| RuntimeError::Bundle {
        bundle: dir.to_path_buf(),
        reason,
    };
    let dir = fs::canonicalize(dir)
        .map_err(|e| bad(format!("{e} (pass an existing directory with --bundle)")))?;
    let config = dir.join("config.json");
    let text = match fs::read_to_string(&config) {
        Ok(text) => text,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
            return Err(bad(
                "config.json is missing (`runsbx spec` writes a default one)".to_owned(),
            ))
        }
        Err(e) => return Err(bad(format!("read config.json: {e}"))),
    };
    let spec: Spec = serde_json::from_str(&text).map_err(|e| {
        bad(format!(
            "config.json is not a valid OCI runtime spec: {e} (line {}, column {})",
            e.line(),
            e.column()
        ))
    })?;
    if !spec.version().starts_with("1.") {
        return Err(bad(format!(
            "config.json has ociVersion {:?}; runsbx supports 1.x",
            spec.version()
        )));
    }
    let root = spec
        .root()
        .as_ref()
        .ok_or_else(|| bad("config.json has no `root`".to_owned()))?;
    let rootfs = dir.join(root.path());
    match fs::metadata(&rootfs) {
        Ok(meta) if meta.is_dir() => {}
        Ok(_) => return Err(bad(format!("root.path {rootfs:?} is not a directory"))),
        Err(e) => {
            return Err(bad(format!(
                "root.path {rootfs:?}: {e} (the root filesystem must exist before create)"
            )))
        }
    }
    if spec.process().is_none() {
        return Err(bad("config.json has no `process`".to_owned()));
    }
    Ok(Bundle { dir, spec, rootfs })
}
