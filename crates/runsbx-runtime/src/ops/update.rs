//! update: change the cgroup resources of a running container.

use libcgroups::common::{CgroupManager, ControllerOpt};
use libcontainer::oci_spec::runtime::LinuxResources;

use crate::error::{Result, RuntimeError};
use crate::ops::query::cgroup_manager;
use crate::state::container::load;
use crate::state::root::StateRoot;
use crate::sys::privilege;

pub fn update(root: &StateRoot, id: &str, resources: &LinuxResources) -> Result<()> {
    let _lock = root.lock(id)?;
    let container = load(root, id)?;
    if !privilege::can_manage_cgroups() {
        return Err(RuntimeError::unsupported(
            format!("update `{id}`"),
            "resources are applied through the container's cgroup, which runsbx cannot \
             manage here (rootless, or no cgroup hierarchy)",
        ));
    }
    cgroup_manager(&container)?
        .apply(&ControllerOpt {
            resources,
            disable_oom_killer: false,
            oom_score_adj: None,
            freezer_state: None,
        })
        .map_err(|e| {
            RuntimeError::invalid(format!("update `{id}`: apply resources"), e.to_string())
        })
}
