//! spec: a starting config.json, as `runc spec` writes one.

use std::fs::OpenOptions;
use std::io::Write;
use std::path::Path;

use libcontainer::oci_spec::runtime::{
    LinuxIdMappingBuilder, LinuxNamespace, LinuxNamespaceBuilder, LinuxNamespaceType, Spec,
};
use nix::unistd::{Gid, Uid};

use crate::error::{Result, RuntimeError};

/// The default spec; `rootless` maps the caller to root in a user
/// namespace of its own.
pub fn default_spec(rootless: bool) -> Result<Spec> {
    let mut spec = Spec::default();
    spec.set_hostname(Some("runsbx".to_owned()));
    if !rootless {
        return Ok(spec);
    }
    let invalid = |e: libcontainer::oci_spec::OciSpecError| {
        RuntimeError::invalid("build rootless spec", e.to_string())
    };
    let map = |host: u32| {
        LinuxIdMappingBuilder::default()
            .host_id(host)
            .container_id(0u32)
            .size(1u32)
            .build()
            .map_err(invalid)
    };
    let uid_map = map(Uid::effective().as_raw())?;
    let gid_map = map(Gid::effective().as_raw())?;
    let user_ns = LinuxNamespaceBuilder::default()
        .typ(LinuxNamespaceType::User)
        .build()
        .map_err(invalid)?;
    if let Some(linux) = spec.linux_mut() {
        let mut namespaces: Vec<LinuxNamespace> = linux
            .namespaces()
            .clone()
            .unwrap_or_default()
            .into_iter()
            .filter(|ns| ns.typ() != LinuxNamespaceType::User)
            .collect();
        namespaces.push(user_ns);
        linux
            .set_namespaces(Some(namespaces))
            .set_uid_mappings(Some(vec![uid_map]))
            .set_gid_mappings(Some(vec![gid_map]))
            // Only one uid and gid exist in the container: no device cgroup
            // rules or resources can be applied without root.
            .set_resources(None);
    }
    if let Some(mounts) = spec.mounts_mut() {
        // With a single mapped gid there is no gid 5 for devpts, and cgroup
        // v1 cannot be mounted from a user namespace.
        mounts.retain(|m| m.typ().as_deref() != Some("cgroup"));
        for m in mounts.iter_mut() {
            if let Some(options) = m.options().clone() {
                m.set_options(Some(options.into_iter().filter(|o| o != "gid=5").collect()));
            }
        }
    }
    Ok(spec)
}

/// Writes config.json into `dir`, refusing to overwrite one.
pub fn write(dir: &Path, spec: &Spec) -> Result<()> {
    let path = dir.join("config.json");
    let json = serde_json::to_vec_pretty(spec)
        .map_err(|e| RuntimeError::invalid("encode spec", e.to_string()))?;
    let mut file = OpenOptions::new()
        .write(true)
        .create_new(true)
        .open(&path)
        .map_err(|e| match e.kind() {
            std::io::ErrorKind::AlreadyExists => {
                RuntimeError::invalid(format!("{path:?}"), "exists already; remove it first")
            }
            _ => RuntimeError::io(format!("create {path:?}"), e),
        })?;
    file.write_all(&json)
        .and_then(|()| file.write_all(b"\n"))
        .map_err(|e| RuntimeError::io(format!("write {path:?}"), e))
}
