//! A sandbox's own `/workspace` (a call's): a fresh tmpfs that runsbx mounts in its own
//! private mount namespace, fills with the inputs, binds into the sandbox,
//! and reads the outputs from once the sandbox is gone.
//!
//! Outputs are opened with openat2(RESOLVE_BENEATH | RESOLVE_NO_SYMLINKS):
//! whatever the sandboxed code left in the workspace (a symlink to
//! `/etc/shadow`, to `../../`, a fifo), runsbx reads only regular files
//! that are really inside it.

use std::fs::{self, File};
use std::io::{self, Read, Write};
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::{DirBuilderExt, MetadataExt, OpenOptionsExt};
use std::path::{Component, Path, PathBuf};

use libcontainer::oci_spec::runtime::Spec;
use nix::mount::{mount, umount2, MntFlags, MsFlags};
use serde::Serialize;

use crate::error::{Result, RuntimeError};

/// A file to copy into the workspace: `HOST[:SANDBOX]`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Input {
    pub host: PathBuf,
    /// Relative to /workspace.
    pub dest: PathBuf,
}

impl Input {
    /// Parses `HOST_PATH[:SANDBOX_PATH]`; the sandbox path is relative to
    /// /workspace (or absolute under it) and defaults to the file's name.
    pub fn parse(arg: &str) -> Result<Self> {
        let bad = |reason: &str| RuntimeError::invalid(format!("--input {arg:?}"), reason);
        let (host, dest) = match arg.split_once(':') {
            Some((h, d)) => (h, Some(d)),
            None => (arg, None),
        };
        if host.is_empty() {
            return Err(bad("give a host path: --input HOST_PATH[:SANDBOX_PATH]"));
        }
        let host = PathBuf::from(host);
        let dest = match dest {
            Some(d) => PathBuf::from(d),
            None => PathBuf::from(host.file_name().ok_or_else(|| {
                bad("the host path has no file name; name the sandbox path after `:`")
            })?),
        };
        let dest = workspace_relative(&dest).ok_or_else(|| {
            bad("the sandbox path must stay inside /workspace (no `..`, no other absolute path)")
        })?;
        Ok(Self { host, dest })
    }
}

/// `p` as a path relative to /workspace, if it stays inside it.
pub fn workspace_relative(p: &Path) -> Option<PathBuf> {
    let p = p.strip_prefix("/workspace").unwrap_or(p);
    let mut out = PathBuf::new();
    for c in p.components() {
        match c {
            Component::Normal(n) => out.push(n),
            Component::CurDir => {}
            _ => return None,
        }
    }
    (!out.as_os_str().is_empty()).then_some(out)
}

/// The call's workspace, mounted at `dir` until dropped: a fresh tmpfs,
/// or a session's workspace bound there.
#[derive(Debug)]
pub struct Workspace {
    pub dir: PathBuf,
    mounted: bool,
    kind: Kind,
}

#[derive(Debug, Clone, Copy)]
enum Kind {
    /// A fresh tmpfs, given whole to the sandbox's root once its ids are
    /// known.
    Fresh,
    /// A session's: what earlier calls left keeps its owners; inputs are
    /// given to `owner` (the session's root, `None` when runsbx's own ids
    /// are already its) as they are copied in, and every path is resolved
    /// inside the workspace, since earlier calls may have left links.
    Session { owner: Option<(u32, u32)> },
}

impl Workspace {
    /// Mounts a tmpfs of `size` bytes at `dir` (created, mode 0700). The
    /// caller is in a private mount namespace: nobody else sees it.
    pub fn mount(dir: &Path, size: u64) -> Result<Self> {
        let ctx = |what: &str| format!("make the call's workspace {dir:?}: {what}");
        fs::DirBuilder::new()
            .mode(0o700)
            .create(dir)
            .map_err(|e| RuntimeError::io(ctx("create"), e))?;
        mount(
            Some("runsbx-workspace"),
            dir,
            Some("tmpfs"),
            MsFlags::MS_NOSUID | MsFlags::MS_NODEV,
            Some(format!("mode=0700,size={size}").as_str()),
        )
        .map_err(|e| RuntimeError::sys(ctx("mount tmpfs"), e))?;
        Ok(Self {
            dir: dir.to_path_buf(),
            mounted: true,
            kind: Kind::Fresh,
        })
    }

    /// Attaches `tree`, a detached mount of a session's workspace, at
    /// `dir` (created, mode 0700); inputs are given to `owner`.
    pub fn session(
        tree: std::os::fd::BorrowedFd<'_>,
        dir: &Path,
        owner: Option<(u32, u32)>,
    ) -> Result<Self> {
        let ctx = |what: &str| format!("bind the session's workspace at {dir:?}: {what}");
        fs::DirBuilder::new()
            .mode(0o700)
            .create(dir)
            .map_err(|e| RuntimeError::io(ctx("create"), e))?;
        crate::sys::newmount::attach(tree, dir).map_err(|e| RuntimeError::sys(ctx("mount"), e))?;
        Ok(Self {
            dir: dir.to_path_buf(),
            mounted: true,
            kind: Kind::Session { owner },
        })
    }

    /// Whether it is a session's.
    pub fn is_session(&self) -> bool {
        matches!(self.kind, Kind::Session { .. })
    }

    /// Copies `input` in (a file, or a directory tree; symlinks are copied
    /// as links, never followed).
    pub fn copy_in(&self, input: &Input) -> Result<()> {
        let target = self.dir.join(&input.dest);
        let meta = fs::symlink_metadata(&input.host).map_err(|e| {
            RuntimeError::invalid(
                format!("--input {:?}", input.host),
                format!("{e} (give an existing file or directory)"),
            )
        })?;
        // What the input holds is the caller's to change: a fifo or a
        // device in it, or more than the workspace takes, is bad input.
        let failed = |e: io::Error| {
            let what = format!("--input {:?}", input.host);
            // The copy's own refusal; a kernel's EINVAL is a failure.
            if e.kind() == io::ErrorKind::InvalidInput && e.raw_os_error().is_none() {
                RuntimeError::invalid(what, format!("{e}: give files, directories and links"))
            } else if e.raw_os_error() == Some(libc::ENOSPC) {
                RuntimeError::invalid(
                    what,
                    "the inputs exceed the workspace size of the profile (give less)",
                )
            } else {
                RuntimeError::io(format!("copy {what} into the workspace"), e)
            }
        };
        if let Kind::Session { owner } = self.kind {
            return confined::copy_in(&self.dir, &input.host, &input.dest, &meta, owner)
                .map_err(failed);
        }
        if let Some(parent) = target.parent() {
            fs::create_dir_all(parent)
                .map_err(|e| RuntimeError::io(format!("create {parent:?} in the workspace"), e))?;
        }
        copy_tree(&input.host, &target, &meta).map_err(failed)
    }

    /// Gives the workspace and what was copied in to the root of the
    /// sandbox whose (staged) spec is `spec`.
    pub fn give_to_root_of(&self, spec: &Spec) -> Result<()> {
        if let Kind::Session { .. } = self.kind {
            // Its files keep the owners earlier calls gave them.
            return Ok(());
        }
        let (uid, gid) = root_ids(spec);
        chown_tree(&self.dir, uid, gid)
            .map_err(|e| RuntimeError::io(format!("chown the workspace {:?}", self.dir), e))
    }

    /// Leaves the workspace mounted, to go with the call's private mount
    /// namespace when its processes exit (see stage::leave_to_namespace):
    /// only for a call's own tmpfs, which nothing else sees.
    pub fn leave_to_namespace(mut self) {
        self.mounted = false;
    }

    pub fn unmount(mut self) -> Result<()> {
        self.mounted = false;
        umount2(&self.dir, MntFlags::MNT_DETACH)
            .map_err(|e| RuntimeError::sys(format!("unmount the workspace {:?}", self.dir), e))?;
        fs::remove_dir(&self.dir).map_err(|e| RuntimeError::io(format!("remove {:?}", self.dir), e))
    }
}

impl Drop for Workspace {
    fn drop(&mut self) {
        if self.mounted {
            let _ = umount2(&self.dir, MntFlags::MNT_DETACH);
            let _ = fs::remove_dir(&self.dir);
        }
    }
}

/// Copying into a session's workspace, which earlier calls wrote: every
/// path is resolved inside it (openat2 `RESOLVE_IN_ROOT`, through pathrs),
/// so a link a sandbox left there (`data -> /etc`) leads back inside the
/// workspace, never to the host's files; what an input replaces is
/// removed first, and each new file is given its owner through its fd.
mod confined {
    use std::fs;
    use std::io;
    use std::os::fd::AsFd;
    use std::os::unix::fs::{MetadataExt, PermissionsExt};
    use std::path::{Component, Path};

    use pathrs::flags::OpenFlags;
    use pathrs::{InodeType, Root};

    pub(super) fn copy_in(
        workspace: &Path,
        host: &Path,
        dest: &Path,
        meta: &fs::Metadata,
        owner: Option<(u32, u32)>,
    ) -> io::Result<()> {
        let root = Root::open(workspace).map_err(other)?;
        // The parents, made as needed and given to the owner.
        let mut parent = std::path::PathBuf::from("/");
        if let Some(p) = dest.parent() {
            for c in p.components() {
                let Component::Normal(name) = c else { continue };
                parent.push(name);
                if root.resolve(&parent).is_err() {
                    root.create(
                        &parent,
                        &InodeType::Directory(fs::Permissions::from_mode(0o755)),
                    )
                    .map_err(other)?;
                    chown(&root, &parent, owner)?;
                }
            }
        }
        copy(&root, host, &Path::new("/").join(dest), meta, owner)
    }

    fn copy(
        root: &Root,
        src: &Path,
        dst: &Path,
        meta: &fs::Metadata,
        owner: Option<(u32, u32)>,
    ) -> io::Result<()> {
        if root.resolve_nofollow(dst).is_ok() {
            root.remove_all(dst).map_err(other)?;
        }
        let ft = meta.file_type();
        let mode = fs::Permissions::from_mode(meta.mode() & 0o777);
        if ft.is_symlink() {
            root.create(dst, &InodeType::Symlink(fs::read_link(src)?))
                .map_err(other)?;
            chown(root, dst, owner)
        } else if ft.is_dir() {
            root.create(dst, &InodeType::Directory(mode))
                .map_err(other)?;
            chown(root, dst, owner)?;
            for entry in fs::read_dir(src)? {
                let entry = entry?;
                let m = entry.metadata()?;
                copy(root, &entry.path(), &dst.join(entry.file_name()), &m, owner)?;
            }
            Ok(())
        } else if ft.is_file() {
            let mut from = fs::File::open(src)?;
            let mut to = root
                .create_file(
                    dst,
                    OpenFlags::O_WRONLY | OpenFlags::O_EXCL | OpenFlags::O_NOFOLLOW,
                    &mode,
                )
                .map_err(other)?;
            if let Some((uid, gid)) = owner {
                std::os::unix::fs::fchown(&to, Some(uid), Some(gid))?;
            }
            io::copy(&mut from, &mut to)?;
            Ok(())
        } else {
            Err(io::Error::new(
                io::ErrorKind::InvalidInput,
                format!("{src:?} is not a regular file, directory or symlink"),
            ))
        }
    }

    /// Gives what `path` names itself (a link, not its target) to `owner`.
    fn chown(root: &Root, path: &Path, owner: Option<(u32, u32)>) -> io::Result<()> {
        let Some((uid, gid)) = owner else {
            return Ok(());
        };
        let handle = root.resolve_nofollow(path).map_err(other)?;
        crate::sys::beneath::chown(handle.as_fd(), uid, gid)
    }

    fn other(e: pathrs::error::Error) -> io::Error {
        io::Error::other(e.to_string())
    }
}

/// The host ids (in runsbx's user namespace) of the sandbox's root.
fn root_ids(spec: &Spec) -> (u32, u32) {
    let find = |maps: &Option<Vec<libcontainer::oci_spec::runtime::LinuxIdMapping>>| {
        maps.iter()
            .flatten()
            .find(|m| m.container_id() == 0)
            .map(|m| m.host_id())
    };
    let linux = spec.linux().as_ref();
    let uid = linux.and_then(|l| find(l.uid_mappings())).unwrap_or(0);
    let gid = linux.and_then(|l| find(l.gid_mappings())).unwrap_or(0);
    (uid, gid)
}

fn copy_tree(src: &Path, dst: &Path, meta: &fs::Metadata) -> io::Result<()> {
    let ft = meta.file_type();
    if ft.is_symlink() {
        std::os::unix::fs::symlink(fs::read_link(src)?, dst)
    } else if ft.is_dir() {
        fs::DirBuilder::new()
            .mode(meta.mode() & 0o777)
            .create(dst)?;
        for entry in fs::read_dir(src)? {
            let entry = entry?;
            let m = entry.metadata()?;
            copy_tree(&entry.path(), &dst.join(entry.file_name()), &m)?;
        }
        Ok(())
    } else if ft.is_file() {
        let mut from = File::open(src)?;
        let mut to = fs::OpenOptions::new()
            .write(true)
            .create_new(true)
            .mode(meta.mode() & 0o777)
            .open(dst)?;
        io::copy(&mut from, &mut to)?;
        Ok(())
    } else {
        Err(io::Error::new(
            io::ErrorKind::InvalidInput,
            format!("{src:?} is not a regular file, directory or symlink"),
        ))
    }
}

fn chown_tree(path: &Path, uid: u32, gid: u32) -> io::Result<()> {
    std::os::unix::fs::lchown(path, Some(uid), Some(gid))?;
    if fs::symlink_metadata(path)?.is_dir() {
        for entry in fs::read_dir(path)? {
            chown_tree(&entry?.path(), uid, gid)?;
        }
    }
    Ok(())
}

/// One `--output` as the result reports it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct OutputFile {
    /// Relative to /workspace.
    pub path: String,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub bytes: Option<u64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub saved_to: Option<PathBuf>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
}

/// Copies the workspace files matching `globs` into `out_dir`, each at
/// most `max_bytes`. Never follows a symlink, never leaves the workspace.
pub fn collect_outputs(
    workspace: &Path,
    globs: &[String],
    out_dir: &Path,
    max_bytes: u64,
) -> Vec<OutputFile> {
    let mut found = Vec::new();
    list(workspace, Path::new(""), &mut found);
    let mut outputs = Vec::new();
    for glob in globs {
        let pattern = workspace_relative(Path::new(glob)).unwrap_or_default();
        let matched: Vec<&PathBuf> = found.iter().filter(|p| matches(&pattern, p)).collect();
        if matched.is_empty() {
            outputs.push(OutputFile {
                path: glob.clone(),
                bytes: None,
                saved_to: None,
                error: Some("no such file in /workspace".to_owned()),
            });
        }
        for rel in matched {
            if outputs
                .iter()
                .any(|o: &OutputFile| Path::new(&o.path) == rel)
            {
                continue;
            }
            outputs.push(copy_out(workspace, rel, out_dir, max_bytes));
        }
    }
    outputs
}

/// Every non-directory under `dir`, relative, without following links.
fn list(root: &Path, rel: &Path, out: &mut Vec<PathBuf>) {
    let Ok(entries) = fs::read_dir(root.join(rel)) else {
        return;
    };
    for entry in entries.flatten() {
        let child = rel.join(entry.file_name());
        match entry.file_type() {
            Ok(ft) if ft.is_dir() => list(root, &child, out),
            Ok(_) => out.push(child),
            Err(_) => {}
        }
    }
}

/// Shell-style matching per path component: `*` and `?` within one
/// component, `**` for any number of components.
fn matches(pattern: &Path, path: &Path) -> bool {
    let p: Vec<&[u8]> = pattern.iter().map(|c| c.as_bytes()).collect();
    let s: Vec<&[u8]> = path.iter().map(|c| c.as_bytes()).collect();
    match_components(&p, &s)
}

fn match_components(p: &[&[u8]], s: &[&[u8]]) -> bool {
    match p.split_first() {
        None => s.is_empty(),
        Some((first, rest)) if *first == b"**" => {
            (0..=s.len()).any(|i| match_components(rest, &s[i..]))
        }
        Some((first, rest)) => {
            !s.is_empty() && match_one(first, s[0]) && match_components(rest, &s[1..])
        }
    }
}

fn match_one(p: &[u8], s: &[u8]) -> bool {
    match p.split_first() {
        None => s.is_empty(),
        Some((b'*', rest)) => (0..=s.len()).any(|i| match_one(rest, &s[i..])),
        Some((b'?', rest)) => !s.is_empty() && match_one(rest, &s[1..]),
        Some((c, rest)) => s.first() == Some(c) && match_one(rest, &s[1..]),
    }
}

fn copy_out(workspace: &Path, rel: &Path, out_dir: &Path, max_bytes: u64) -> OutputFile {
    let mut out = OutputFile {
        path: rel.display().to_string(),
        bytes: None,
        saved_to: None,
        error: None,
    };
    let result = (|| -> io::Result<(u64, PathBuf)> {
        let dir = File::open(workspace)?;
        let mut file = open_beneath(&dir, rel)?;
        let meta = file.metadata()?;
        if !meta.is_file() {
            return Err(io::Error::new(
                io::ErrorKind::InvalidInput,
                "not a regular file",
            ));
        }
        if meta.len() > max_bytes {
            return Err(io::Error::new(
                io::ErrorKind::InvalidInput,
                format!(
                    "{} bytes is more than --max-output-file ({max_bytes})",
                    meta.len()
                ),
            ));
        }
        let dest = out_dir.join(rel);
        if let Some(parent) = dest.parent() {
            fs::create_dir_all(parent)?;
        }
        // Never write through a link someone put at the destination.
        let mut to = fs::OpenOptions::new()
            .write(true)
            .create(true)
            .truncate(true)
            .mode(0o644)
            .custom_flags(libc::O_NOFOLLOW)
            .open(&dest)?;
        let n = io::copy(&mut (&mut file).take(max_bytes), &mut to)?;
        to.flush()?;
        Ok((n, dest))
    })();
    match result {
        Ok((n, dest)) => {
            out.bytes = Some(n);
            out.saved_to = Some(dest);
        }
        Err(e) if e.raw_os_error() == Some(libc::ELOOP) => {
            out.error = Some(
                "is a symbolic link: refused (runsbx never follows a link out of the workspace)"
                    .to_owned(),
            );
        }
        Err(e) if e.raw_os_error() == Some(libc::EXDEV) => {
            out.error = Some("leaves the workspace: refused".to_owned());
        }
        Err(e) => out.error = Some(e.to_string()),
    }
    out
}

/// `rel` beneath the workspace, read-only, never through a link.
fn open_beneath(dir: &File, rel: &Path) -> io::Result<File> {
    use std::os::fd::AsFd;
    crate::sys::beneath::open(dir.as_fd(), rel, libc::O_RDONLY | libc::O_NONBLOCK).map(File::from)
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    #[test]
    fn input_paths() {
        let i = Input::parse("/home/a/data.csv").unwrap();
        assert_eq!(i.dest, PathBuf::from("data.csv"));
        let i = Input::parse("x.py:/workspace/src/main.py").unwrap();
        assert_eq!(i.dest, PathBuf::from("src/main.py"));
        let i = Input::parse("x.py:lib/x.py").unwrap();
        assert_eq!(i.dest, PathBuf::from("lib/x.py"));
        for bad in ["x:../up", "x:/etc/passwd", ":y", "x:/workspace/../etc"] {
            assert!(Input::parse(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn globs() {
        let m = |p: &str, s: &str| matches(Path::new(p), Path::new(s));
        assert!(m("out.txt", "out.txt"));
        assert!(m("*.png", "plot.png"));
        assert!(!m("*.png", "dir/plot.png"));
        assert!(m("**/*.png", "dir/sub/plot.png"));
        assert!(m("**/*.png", "plot.png"));
        assert!(m("dir/?.csv", "dir/a.csv"));
        assert!(!m("dir/?.csv", "dir/ab.csv"));
    }

    #[test]
    fn outputs_never_follow_links_or_leave_the_workspace() {
        let tmp = tempfile::tempdir().unwrap();
        let ws = tmp.path().join("ws");
        let out = tmp.path().join("out");
        fs::create_dir_all(ws.join("sub")).unwrap();
        fs::write(tmp.path().join("secret"), "TOKEN").unwrap();
        fs::write(ws.join("ok.txt"), "fine").unwrap();
        std::os::unix::fs::symlink(tmp.path().join("secret"), ws.join("link.txt")).unwrap();
        std::os::unix::fs::symlink("..", ws.join("sub/up")).unwrap();
        fs::write(ws.join("big.bin"), vec![0u8; 100]).unwrap();
        let globs = ["*.txt", "sub/up/secret", "big.bin", "missing"].map(String::from);
        let got = collect_outputs(&ws, &globs, &out, 10);
        let by = |p: &str| got.iter().find(|o| o.path == p).unwrap().clone();
        assert_eq!(by("ok.txt").bytes, Some(4));
        assert_eq!(fs::read_to_string(out.join("ok.txt")).unwrap(), "fine");
        assert!(by("link.txt").error.unwrap().contains("symbolic link"));
        assert!(!out.join("link.txt").exists());
        assert!(by("sub/up/secret").error.is_some());
        assert!(by("big.bin").error.unwrap().contains("max-output-file"));
        assert!(by("missing").error.is_some());
        // Nothing of the secret reached the output directory.
        for entry in fs::read_dir(&out).unwrap() {
            let text = fs::read_to_string(entry.unwrap().path()).unwrap_or_default();
            assert!(!text.contains("TOKEN"));
        }
    }
}
