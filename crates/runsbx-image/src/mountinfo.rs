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
    Ok(entries_of(types)?
        .into_iter()
        .map(|m| m.mount_point)
        .collect())
}

/// This mount namespace's mounts of filesystems of the given types.
pub fn entries_of(types: &[&str]) -> Result<Vec<MountEntry>> {
    let info = fs::read_to_string("/proc/self/mountinfo")
        .map_err(|e| ImageError::io("read /proc/self/mountinfo", e))?;
    Ok(info
        .lines()
        .filter_map(parse_line)
        .filter(|m| types.contains(&m.fstype.as_str()))
        .collect())
}

/// The fields of one mountinfo line that runsbx reads.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MountEntry {
    /// The path, within its filesystem, of the mount's root.
    pub root: PathBuf,
    pub mount_point: PathBuf,
    pub fstype: String,
    pub source: String,
    /// The filesystem's own options (overlayfs's layers among them), as
    /// the kernel shows them.
    pub super_options: String,
}

/// The mount on top at `path` (the last one mounted there), if any.
pub fn mount_at(path: &Path) -> Result<Option<MountEntry>> {
    let info = fs::read_to_string("/proc/self/mountinfo")
        .map_err(|e| ImageError::io("read /proc/self/mountinfo", e))?;
    Ok(info
        .lines()
        .rev()
        .filter_map(parse_line)
        .find(|m| m.mount_point == path))
}

fn parse_line(line: &str) -> Option<MountEntry> {
    let (left, right) = line.split_once(" - ")?;
    let mut left = left.split_whitespace();
    let root = left.nth(3)?;
    let mount_point = left.next()?;
    let mut right = right.split_whitespace();
    Some(MountEntry {
        root: unescape_mountinfo(root),
        mount_point: unescape_mountinfo(mount_point),
        fstype: right.next()?.to_owned(),
        source: right.next()?.to_owned(),
        super_options: right.next().unwrap_or_default().to_owned(),
    })
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
    #![allow(clippy::unwrap_used)]
    use super::*;

    #[test]
    fn a_line_gives_its_fields() {
        let line = "48 44 0:41 / /var/lib/containers/storage/overlay/52e1/merged rw,relatime - overlay overlay rw,lowerdir=/s/l/6M2D,upperdir=/s/52e1/diff,workdir=/s/52e1/work";
        let m = parse_line(line).unwrap();
        assert_eq!(m.root, PathBuf::from("/"));
        assert_eq!(
            m.mount_point,
            PathBuf::from("/var/lib/containers/storage/overlay/52e1/merged")
        );
        assert_eq!(m.fstype, "overlay");
        assert_eq!(m.source, "overlay");
        assert_eq!(
            m.super_options,
            "rw,lowerdir=/s/l/6M2D,upperdir=/s/52e1/diff,workdir=/s/52e1/work"
        );
        assert_eq!(parse_line("garbage"), None);
    }

    #[test]
    fn mountinfo_escapes() {
        assert_eq!(
            unescape_mountinfo(r"/a\040b\134c"),
            PathBuf::from("/a b\\c")
        );
        assert_eq!(unescape_mountinfo(r"/x\0"), PathBuf::from(r"/x\0"));
    }
}
