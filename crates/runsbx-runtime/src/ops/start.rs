//! `start`: releases a created container's process.

use crate::error::Result;
use crate::sandbox::network::recheck_network;
use crate::state::container::{load, op_err, wrong_state};
use crate::state::root::StateRoot;

/// Starts a created container.
pub fn start(root: &StateRoot, id: &str) -> Result<()> {
    let _lock = root.lock(id)?;
    let mut container = load(root, id)?;
    if !container.can_start() {
        return Err(wrong_state(&container, "start"));
    }
    recheck_network(&container, "start")?;
    container.start().map_err(|e| op_err("start", id, e))
}
