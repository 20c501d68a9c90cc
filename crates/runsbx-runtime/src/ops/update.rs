//! update: change the cgroup resources of a running container, within the
//! limits it was created with.

use libcgroups::common::{CgroupManager, ControllerOpt};
use libcontainer::oci_spec::runtime::{LinuxResources, Spec};
use runsbx_policy::Overrides;

use crate::error::{Result, RuntimeError};
use crate::ops::query::cgroup_manager;
use crate::policy::Policy;
use crate::state::bundle;
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
    let resources = within_policy(root, id, resources)?;
    cgroup_manager(&container)?
        .apply(&ControllerOpt {
            resources: &resources,
            disable_oom_killer: false,
            oom_score_adj: None,
            freezer_state: None,
        })
        .map_err(|e| {
            RuntimeError::invalid(format!("update `{id}`: apply resources"), e.to_string())
        })
}

/// `resources` held to the limits container `id` was created with: the
/// operator's profile, or the stricter one its `runsbx.profile`
/// annotation chose, lowered by its `runsbx.limits.*` annotations (its
/// effective config.json keeps them). A limit past those is refused, as a
/// create would have cut it; engines run `update` for `docker update` and
/// the like, which must not undo the policy.
fn within_policy(root: &StateRoot, id: &str, resources: &LinuxResources) -> Result<LinuxResources> {
    let config = bundle::Effective::path(root, id).join("config.json");
    let spec = Spec::load(&config).map_err(|e| {
        RuntimeError::invalid(format!("update `{id}`: read {config:?}"), e.to_string())
    })?;
    let policy = Policy::load(None)?;
    let profile = policy.profile_for(&spec)?;
    let ceiling =
        Overrides::from_annotations(spec.annotations().as_ref())?.limits(profile.limits)?;
    let host = crate::policy::host_facts(None);
    Ok(runsbx_policy::bound_update(
        resources.clone(),
        &ceiling,
        &profile.name,
        &host,
    )?)
}
