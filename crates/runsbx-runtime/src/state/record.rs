//! Records that appear whole or not at all. A claim (an id range's slot, a
//! cgroup's claim) is a file that must not exist twice and must name its
//! owner from the instant it exists: made with O_EXCL and then written, a
//! runsbx killed in between would leave an empty claim that nobody owns.
//! Instead the content is written to an anonymous file (O_TMPFILE) in the
//! same directory, which is then linked to its name; linking fails if the
//! name exists, and an anonymous file vanishes with a killed writer.

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
