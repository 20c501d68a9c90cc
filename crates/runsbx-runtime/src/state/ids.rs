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

/// Releases `slot` if it is still `owner`'s (a session's, which keeps its
/// range for its whole life).
pub fn release_id_range_of(slot: u32, owner: &str) {
    let path = PathBuf::from(ID_DIR).join(slot.to_string());
    if fs::read(&path).is_ok_and(|o| o == owner.as_bytes()) {
        let _ = fs::remove_file(path);
    }
}

/// The range of `slot`, which `owner` reserved; refused when the slot file
/// is gone or names another owner (a host reboot empties /run: the
/// session takes its slot again if it is free).
pub fn range_of(config: &OperatorConfig, slot: u32, owner: &str) -> Result<IdRange> {
    let path = PathBuf::from(ID_DIR).join(slot.to_string());
    let range = IdRange {
        base: config.uid_base + slot * config.uid_range_size,
        size: config.uid_range_size,
    };
    if slot >= config.uid_ranges {
        return Err(RuntimeError::invalid(
            format!("id slot {slot} of {owner}"),
            "is outside the operator config's uid_ranges; remove the session",
        ));
    }
    match fs::read(&path) {
        Ok(o) if o == owner.as_bytes() => Ok(range),
        Ok(_) => Err(RuntimeError::Conflict {
            what: format!("the host id range of {owner} ({path:?})"),
            reason: "is held by another sandbox; remove the session and make it again".to_owned(),
        }),
        Err(_) => {
            fs::DirBuilder::new()
                .recursive(true)
                .mode(0o700)
                .create(ID_DIR)
                .map_err(|e| RuntimeError::io(format!("create {ID_DIR}"), e))?;
            match record::create_whole(&path, owner.as_bytes()) {
                Ok(true) => Ok(range),
                Ok(false) => range_of(config, slot, owner),
                Err(e) => Err(RuntimeError::io(format!("reserve {path:?}"), e)),
            }
        }
    }
}
