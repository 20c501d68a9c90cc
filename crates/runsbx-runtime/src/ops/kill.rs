//! `kill`: a signal to the init, or to every process of the container.

use nix::sys::signal::Signal;

use crate::error::Result;
use crate::state::container;
use crate::state::root::StateRoot;

/// Sends `signal` to the container's init process, or with `all` to every
/// process in it.
pub fn kill(root: &StateRoot, id: &str, signal: Signal, all: bool) -> Result<()> {
    container::signal(root, id, signal, all)
}
