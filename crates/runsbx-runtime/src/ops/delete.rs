//! `delete`: a stopped (or, forced, any) container and all it holds.

use libcontainer::container::ContainerStatus;

use crate::error::{Result, RuntimeError};
use crate::sandbox::teardown::destroy;
use crate::state::container::{load, wrong_state};
use crate::state::root::StateRoot;

/// Deletes a stopped (or, with `force`, any) container and all its state.
pub fn delete(root: &StateRoot, id: &str, force: bool) -> Result<()> {
    let _lock = root.lock(id)?;
    let mut container = match load(root, id) {
        Ok(c) => c,
        // A create killed before its state file existed, or while writing
        // it: what it made is found by what it holds, not by its state.
        Err(RuntimeError::NotFound { .. }) if force => {
            crate::sandbox::teardown::reclaim(root, id, None);
            return Ok(());
        }
        Err(e) if force => {
            tracing::warn!(id, "its state is unreadable ({e}): removing what it holds");
            crate::sandbox::teardown::reclaim(root, id, None);
            return Ok(());
        }
        Err(e) => return Err(e),
    };
    match container.status() {
        ContainerStatus::Stopped | ContainerStatus::Created => {}
        _ if force => {}
        _ => return Err(wrong_state(&container, "delete (use --force)")),
    }
    destroy(root, &mut container)
}
