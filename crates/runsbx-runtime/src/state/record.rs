//! Records that appear whole or not at all. A claim (an id range's slot, a
//! cgroup's claim) is a file that must not exist twice and must name its
//! owner from the instant it exists: made with O_EXCL and then written, a
//! runsbx killed in between would leave an empty claim that nobody owns.
//! Instead the content is written to an anonymous file (O_TMPFILE) in the
//! same directory, which is then linked to its name; linking fails if the
//! name exists, and an anonymous file vanishes with a killed writer.
//!
//! A sandbox's own records (the slot and cgroup it holds, its caller's
//! bundle, its seccomp filter, its init) are appended to one file
//! ([`append`], [`find`]): a key, the value's length, the value, each
//! record in one write. A record cut short by a killed writer is not
//! whole, and it and whatever follows are read as never written; since
//! every record is written before the resource it names exists, a record
//! not read names nothing yet. One file for all of them rather than one
//! each: on a disk, every new file costs the filesystem an inode to find
//! (docs/performance.md, "The pool's rate").

use std::fs::{File, OpenOptions};
use std::io::Write;
use std::os::unix::fs::OpenOptionsExt;
use std::path::Path;

/// Creates `path` holding `content`, unless it exists (then `Ok(false)`).
pub(crate) fn create_whole(path: &Path, content: &[u8]) -> std::io::Result<bool> {
    use std::os::fd::AsRawFd;
    let dir = path.parent().unwrap_or(Path::new("."));
    let mut file: File = OpenOptions::new()
        .write(true)
        .custom_flags(libc::O_TMPFILE)
        .mode(0o600)
        .open(dir)?;
    file.write_all(content)?;
    // No fsync: a claim only matters while its owner lives, and no owner
    // outlives a crash of the host, after which /run (a tmpfs) is empty.
    // Where /run is a disk, a crash may leave a claim linked but empty:
    // an id slot's is reclaimed like one whose writer was killed
    // (teardown's `release_orphan_slot`), a cgroup's refuses its path
    // as a whole stale claim would. The fsync cost every cold `run`
    // 0.2-0.5 ms on such a host.
    let from = std::ffi::CString::new(format!("/proc/self/fd/{}", file.as_raw_fd()))?;
    let to = std::ffi::CString::new(path.as_os_str().as_encoded_bytes())?;
    // SAFETY: two valid C strings; linkat follows the /proc fd link to the
    // anonymous file (AT_SYMLINK_FOLLOW), which needs no privilege.
    let r = unsafe {
        libc::linkat(
            libc::AT_FDCWD,
            from.as_ptr(),
            libc::AT_FDCWD,
            to.as_ptr(),
            libc::AT_SYMLINK_FOLLOW,
        )
    };
    if r == 0 {
        return Ok(true);
    }
    match std::io::Error::last_os_error() {
        e if e.kind() == std::io::ErrorKind::AlreadyExists => Ok(false),
        e => Err(e),
    }
}

/// Appends the record `key` = `value` to the log at `path` (made if
/// missing), in one write.
pub(crate) fn append(path: &Path, key: &str, value: &[u8]) -> std::io::Result<()> {
    debug_assert!(!key.is_empty() && !key.contains([' ', '\n']));
    let mut record = format!("{key} {}\n", value.len()).into_bytes();
    record.extend_from_slice(value);
    record.push(b'\n');
    OpenOptions::new()
        .append(true)
        .create(true)
        .mode(0o644)
        .open(path)?
        .write_all(&record)
}

/// The last whole record `key` of the log at `path`: `None` if it has
/// none, or if there is no log.
pub(crate) fn find(path: &Path, key: &str) -> std::io::Result<Option<Vec<u8>>> {
    match std::fs::read(path) {
        Ok(log) => Ok(last_of(&log, key).map(<[u8]>::to_vec)),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(None),
        Err(e) => Err(e),
    }
}

/// The value of the last whole record `key` in `log`; reading stops at the
/// first record that is not whole.
fn last_of<'a>(mut log: &'a [u8], key: &str) -> Option<&'a [u8]> {
    let mut found = None;
    while let Some(end) = log.iter().position(|&b| b == b'\n') {
        let Some((k, len)) = std::str::from_utf8(&log[..end])
            .ok()
            .and_then(|header| header.split_once(' '))
        else {
            break;
        };
        let Ok(len) = len.parse::<usize>() else {
            break;
        };
        let body = &log[end + 1..];
        if body.len() <= len || body[len] != b'\n' {
            break;
        }
        if k == key {
            found = Some(&body[..len]);
        }
        log = &body[len + 1..];
    }
    found
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    #[test]
    fn the_last_whole_record_of_a_key_is_found() {
        let tmp = tempfile::tempdir().unwrap();
        let log = tmp.path().join("records");
        assert_eq!(find(&log, "slot").unwrap(), None, "no log: no record");
        append(&log, "slot", b"17").unwrap();
        // Values are bytes, newlines and all.
        append(&log, "source", b"/a dir\nwith a newline").unwrap();
        append(&log, "empty", b"").unwrap();
        append(&log, "slot", b"18").unwrap();
        assert_eq!(find(&log, "slot").unwrap().unwrap(), b"18");
        assert_eq!(
            find(&log, "source").unwrap().unwrap(),
            b"/a dir\nwith a newline"
        );
        assert_eq!(find(&log, "empty").unwrap().unwrap(), b"");
        assert_eq!(find(&log, "init").unwrap(), None);
    }

    /// A writer killed in the middle of a record leaves it cut short:
    /// that record and anything after it are as if never written.
    #[test]
    fn a_record_cut_short_is_not_read() {
        let whole = b"slot 2\n17\ncgroup 4\n/a/b\n".to_vec();
        for cut in 0..whole.len() {
            let log = &whole[..cut];
            let slot = last_of(log, "slot");
            let cgroup = last_of(log, "cgroup");
            assert_eq!(slot, (cut >= 10).then_some(&b"17"[..]), "cut at {cut}");
            assert_eq!(cgroup, None, "cut at {cut}");
        }
        assert_eq!(last_of(&whole, "cgroup").unwrap(), b"/a/b");
        // A length that runs past the end, or a header that is not one.
        assert_eq!(last_of(b"slot 9\n17\n", "slot"), None);
        assert_eq!(last_of(b"slot x\n17\nslot 2\n18\n", "slot"), None);
        assert_eq!(last_of(b"slot 2\n17Xslot 2\n18\n", "slot"), None);
        assert_eq!(last_of(b"garbage\nslot 2\n18\n", "slot"), None);
    }
}
