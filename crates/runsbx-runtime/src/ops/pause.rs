//! `pause` and `resume`, through the cgroup freezer.

use crate::error::Result;
use crate::state::container::{load, op_err, require_cgroups, wrong_state};
use crate::state::root::StateRoot;

pub fn pause(root: &StateRoot, id: &str) -> Result<()> {
    let _lock = root.lock(id)?;
    require_cgroups("pause")?;
    let mut container = load(root, id)?;
    if !container.can_pause() {
        return Err(wrong_state(&container, "pause"));
    }
    container.pause().map_err(|e| op_err("pause", id, e))
}

pub fn resume(root: &StateRoot, id: &str) -> Result<()> {
    let _lock = root.lock(id)?;
    require_cgroups("resume")?;
    let mut container = load(root, id)?;
    if !container.can_resume() {
        return Err(wrong_state(&container, "resume"));
    }
    container.resume().map_err(|e| op_err("resume", id, e))
}
