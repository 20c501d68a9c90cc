//! state, list, ps, events: what runsbx tells about its containers.

use std::collections::HashMap;
use std::path::PathBuf;

use libcgroups::common::{create_cgroup_manager, CgroupConfig, CgroupManager};
use libcontainer::container::{Container, ContainerStatus};
use serde::Serialize;

use crate::error::{Result, RuntimeError};
use crate::state::container::{load, op_err, status_name};
use crate::state::root::StateRoot;
use crate::sys::{privilege, procs};

/// The OCI state of a container, in runc's layout (`runc state`, and the
/// elements of `runc list --format json`).
#[derive(Debug, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct OciState {
    pub oci_version: String,
    pub id: String,
    pub pid: i32,
    pub status: &'static str,
    pub bundle: PathBuf,
    pub rootfs: PathBuf,
    pub created: String,
    pub owner: String,
    #[serde(skip_serializing_if = "HashMap::is_empty")]
    pub annotations: HashMap<String, String>,
}

impl OciState {
    fn of(container: &Container) -> Self {
        let status = container.status();
        // A stopped container has no process: report pid 0, as runc does.
        let pid = match status {
            ContainerStatus::Stopped => 0,
            _ => container.pid().map(|p| p.as_raw()).unwrap_or(0),
        };
        let effective = container.bundle();
        let rootfs = crate::state::bundle::load(effective)
            .map(|b| b.rootfs)
            .unwrap_or_default();
        let bundle = crate::state::bundle::Effective::source_of(effective);
        Self {
            oci_version: libcontainer::oci_spec::runtime::VERSION.to_owned(),
            id: container.id().to_owned(),
            pid,
            status: status_name(status),
            bundle,
            rootfs,
            created: container
                .created()
                .map(|c| c.to_rfc3339_opts(chrono::SecondsFormat::Nanos, true))
                .unwrap_or_default(),
            owner: container
                .creator()
                .map(|c| c.to_string_lossy().into_owned())
                .unwrap_or_default(),
            annotations: {
                let mut a = container.state.annotations.clone().unwrap_or_default();
                // Why it stopped, when runsbx ended it (its deadline).
                if let Some(why) = crate::sandbox::supervisor::ended_in(&container.root) {
                    a.insert(crate::sandbox::supervisor::ENDED_ANNOTATION.to_owned(), why);
                }
                a
            },
        }
    }
}

pub fn state(root: &StateRoot, id: &str) -> Result<OciState> {
    let _lock = root.lock(id)?;
    Ok(OciState::of(&load(root, id)?))
}

pub fn list(root: &StateRoot) -> Result<Vec<OciState>> {
    let mut states = Vec::new();
    for id in root.ids()? {
        // A container deleted while we list is simply not listed.
        if let Ok(container) = load(root, &id) {
            states.push(OciState::of(&container));
        }
    }
    Ok(states)
}

/// The host pids of the container's processes.
pub fn pids(root: &StateRoot, id: &str) -> Result<Vec<i32>> {
    let _lock = root.lock(id)?;
    let container = load(root, id)?;
    if container.status() == ContainerStatus::Stopped {
        return Ok(Vec::new());
    }
    let init = crate::state::container::init_pid(&container)?;
    let pids = if privilege::can_manage_cgroups() {
        cgroup_manager(&container)?.get_all_pids().map_err(|e| {
            RuntimeError::invalid(format!("container `{id}`: list cgroup pids"), e.to_string())
        })?
    } else {
        procs::pids_in_namespace_of(init)?
    };
    Ok(pids.into_iter().map(|p| p.as_raw()).collect())
}

/// One `events --stats` record, in runc's envelope.
#[derive(Debug, Serialize)]
pub struct StatsEvent {
    #[serde(rename = "type")]
    pub kind: &'static str,
    pub id: String,
    pub data: serde_json::Value,
}

pub fn stats(root: &StateRoot, id: &str) -> Result<StatsEvent> {
    let _lock = root.lock(id)?;
    let container = load(root, id)?;
    if container.status() != ContainerStatus::Running {
        return Err(RuntimeError::WrongState {
            id: id.to_owned(),
            status: status_name(container.status()).to_owned(),
            op: "report stats",
        });
    }
    if !privilege::can_manage_cgroups() {
        return Err(RuntimeError::unsupported(
            format!("events --stats `{id}`"),
            "statistics come from the container's cgroup, which runsbx cannot manage here \
             (rootless, or no cgroup hierarchy)",
        ));
    }
    let stats = cgroup_manager(&container)?.stats().map_err(|e| {
        RuntimeError::invalid(
            format!("container `{id}`: read cgroup stats"),
            e.to_string(),
        )
    })?;
    let data = serde_json::to_value(&stats).map_err(|e| {
        RuntimeError::invalid(format!("container `{id}`: encode stats"), e.to_string())
    })?;
    Ok(StatsEvent {
        kind: "stats",
        id: id.to_owned(),
        data,
    })
}

pub(crate) fn cgroup_manager(
    container: &Container,
) -> Result<libcgroups::common::AnyCgroupManager> {
    let id = container.id();
    let config = container
        .spec()
        .map_err(|e| op_err("read config of", id, e))?;
    create_cgroup_manager(CgroupConfig {
        cgroup_path: config.cgroup_path,
        systemd_cgroup: false,
        container_name: id.to_owned(),
    })
    .map_err(|e| RuntimeError::invalid(format!("container `{id}`: open its cgroup"), e.to_string()))
}
