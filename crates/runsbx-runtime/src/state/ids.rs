//! Host id ranges, as root: one per live sandbox across every state root,
//! each a slot file under [`ID_DIR`] naming its owner, so that no two
//! sandboxes share host ids.

use std::fs;
use std::os::unix::fs::DirBuilderExt;
use std::path::PathBuf;

use runsbx_policy::{IdRange, OperatorConfig};

use crate::error::{Result, RuntimeError};
use crate::state::record;

/// Where id-range allocations live: one file per live sandbox, across every
/// state root, so that no two sandboxes share host ids.
pub const ID_DIR: &str = "/run/runsbx-ids";

/// An id range allocated to one sandbox (as root), released by
/// [`release_id_range`].
pub fn allocate_id_range(config: &OperatorConfig, owner: &str) -> Result<(u32, IdRange)> {
    fs::DirBuilder::new()
        .recursive(true)
        .mode(0o700)
        .create(ID_DIR)
        .map_err(|e| RuntimeError::io(format!("create {ID_DIR}"), e))?;
    // Start from a hash of the owner so that concurrent creates rarely
    // collide; O_EXCL settles it when they do.
    let start = owner
        .bytes()
        .fold(0u32, |h, b| h.wrapping_mul(31).wrapping_add(u32::from(b)));
    for i in 0..config.uid_ranges {
        let slot = (start.wrapping_add(i)) % config.uid_ranges;
        let path = PathBuf::from(ID_DIR).join(slot.to_string());
        match record::create_whole(&path, owner.as_bytes()) {
            Ok(true) => {
                let base = config.uid_base + slot * config.uid_range_size;
                return Ok((
                    slot,
                    IdRange {
                        base,
                        size: config.uid_range_size,
                    },
                ));
            }
            Ok(false) => continue,
            Err(e) => {
                return Err(RuntimeError::io(
                    format!("allocate an id range in {ID_DIR}"),
                    e,
                ))
            }
        }
    }
    Err(RuntimeError::unsupported(
        "allocate an id range",
        format!(
            "all {} ranges in {ID_DIR} are in use (uid_ranges in the operator config)",
            config.uid_ranges
        ),
    ))
}

pub fn release_id_range(slot: u32) {
    let _ = fs::remove_file(PathBuf::from(ID_DIR).join(slot.to_string()));
}
