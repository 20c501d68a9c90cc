//! Reading /proc/self/mountinfo, and unmounting what lies under a path:
//! the image store unmounts what a build left before removing a tree, and
//! the runtime uses the same reader (the lowest crate that needs it).

use std::fs;
use std::path::{Path, PathBuf};

use crate::error::{ImageError, Result};

/// Detaches every mount at or below `path`, deepest first.
pub fn unmount_under(path: &Path) -> Result<()> {
    use nix::mount::{umount2, MntFlags};
    let info = fs::read_to_string("/proc/self/mountinfo")
        .map_err(|e| ImageError::io("read /proc/self/mountinfo", e))?;
    let mut points: Vec<PathBuf> = info
        .lines()
        .filter_map(|l| l.split_whitespace().nth(4).map(unescape_mountinfo))
        .filter(|p| p.starts_with(path))
        .collect();
    points.sort_by_key(|p| std::cmp::Reverse(p.components().count()));
    for p in points {
        match umount2(&p, MntFlags::MNT_DETACH) {
            Ok(()) | Err(nix::Error::EINVAL) | Err(nix::Error::ENOENT) => {}
            Err(e) => return Err(ImageError::sys(format!("unmount {p:?}"), e)),
        }
    }
    Ok(())
}

/// The mount points of this mount namespace's filesystems of the given
/// types (`cgroup`, `cgroup2`).
pub fn mount_points_of(types: &[&str]) -> Result<Vec<PathBuf>> {
    let info = fs::read_to_string("/proc/self/mountinfo")
        .map_err(|e| ImageError::io("read /proc/self/mountinfo", e))?;
    Ok(info
        .lines()
        .filter_map(|line| {
            let (left, right) = line.split_once(" - ")?;
            let mount_point = left.split_whitespace().nth(4)?;
            let typ = right.split_whitespace().next()?;
            types
                .contains(&typ)
                .then(|| unescape_mountinfo(mount_point))
        })
        .collect())
}

/// mountinfo escapes space, tab, newline and backslash as `\ooo`.
fn unescape_mountinfo(field: &str) -> PathBuf {
    use std::os::unix::ffi::OsStringExt;
    let b = field.as_bytes();
    let mut out = Vec::with_capacity(b.len());
    let mut i = 0;
    while i < b.len() {
        let octal = b.get(i + 1..i + 4).and_then(|d| {
            std::str::from_utf8(d)
                .ok()
                .and_then(|d| u8::from_str_radix(d, 8).ok())
        });
        match (b[i], octal) {
            (b'\\', Some(c)) => {
                out.push(c);
                i += 4;
            }
            (c, _) => {
                out.push(c);
                i += 1;
            }
        }
    }
    PathBuf::from(std::ffi::OsString::from_vec(out))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn mountinfo_escapes() {
        assert_eq!(
            unescape_mountinfo(r"/a\040b\134c"),
            PathBuf::from("/a b\\c")
        );
        assert_eq!(unescape_mountinfo(r"/x\0"), PathBuf::from(r"/x\0"));
    }
}
