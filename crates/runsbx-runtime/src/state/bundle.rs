//! Reading an OCI bundle: checked up front, so that a bad bundle is refused
//! before anything is created on the host.

use std::fs;
use std::path::{Path, PathBuf};

use libcontainer::oci_spec::runtime::{LinuxSeccomp, Spec};

use crate::error::{Result, RuntimeError};

/// A bundle whose config.json parsed and whose rootfs is a directory.
#[derive(Debug)]
pub struct Bundle {
    pub dir: PathBuf,
    pub spec: Spec,
    pub rootfs: PathBuf,
}

pub fn load(dir: &Path) -> Result<Bundle> {
    let bad = |reason: String| RuntimeError::Bundle {
        bundle: dir.to_path_buf(),
        reason,
    };
    let dir = fs::canonicalize(dir)
        .map_err(|e| bad(format!("{e} (pass an existing directory with --bundle)")))?;
    let config = dir.join("config.json");
    let limit = runsbx_policy::bounds::MAX_CONFIG_BYTES;
    if fs::metadata(&config).is_ok_and(|m| m.len() > limit) {
        return Err(bad(format!(
            "config.json is larger than runsbx reads ({limit} bytes); see README's limits"
        )));
    }
    let text = match fs::read_to_string(&config) {
        Ok(text) => text,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
            return Err(bad(
                "config.json is missing (`runsbx spec` writes a default one)".to_owned(),
            ))
        }
        Err(e) => return Err(bad(format!("read config.json: {e}"))),
    };
    let spec: Spec = serde_json::from_str(&text).map_err(|e| {
        bad(format!(
            "config.json is not a valid OCI runtime spec: {e} (line {}, column {})",
            e.line(),
            e.column()
        ))
    })?;
    if !spec.version().starts_with("1.") {
        return Err(bad(format!(
            "config.json has ociVersion {:?}; runsbx supports 1.x",
            spec.version()
        )));
    }
    let root = spec
        .root()
        .as_ref()
        .ok_or_else(|| bad("config.json has no `root`".to_owned()))?;
    let rootfs = dir.join(root.path());
    match fs::metadata(&rootfs) {
        Ok(meta) if meta.is_dir() => {}
        Ok(_) => return Err(bad(format!("root.path {rootfs:?} is not a directory"))),
        Err(e) => {
            return Err(bad(format!(
                "root.path {rootfs:?}: {e} (the root filesystem must exist before create)"
            )))
        }
    }
    let Some(process) = spec.process() else {
        return Err(bad("config.json has no `process`".to_owned()));
    };
    // The runtime spec requires an absolute cwd; libcontainer would fail
    // later, inside the container, with only "failed to unix syscall".
    if !process.cwd().is_absolute() {
        return Err(bad(format!(
            "process.cwd {:?} is not an absolute path",
            process.cwd()
        )));
    }
    Ok(Bundle { dir, spec, rootfs })
}

/// Refuses a `process.cwd` (of `spec`, the hardened spec of `bundle`) that
/// the container could not chdir into: not a directory in the root
/// filesystem (resolved inside it, symlinks too) and not a mount point (or
/// one's parent) the runtime makes. libcontainer
/// would fail inside the container with only "failed to unix syscall".
pub fn check_cwd(bundle: &Bundle, spec: &Spec) -> Result<()> {
    let Some(cwd) = spec.process().as_ref().map(|p| p.cwd().clone()) else {
        return Ok(());
    };
    let mounted = spec
        .mounts()
        .as_deref()
        .unwrap_or_default()
        .iter()
        .any(|m| m.destination().starts_with(&cwd));
    if mounted {
        return Ok(());
    }
    let found = pathrs::Root::open(&bundle.rootfs)
        .and_then(|root| root.resolve(&cwd))
        .is_ok();
    if found {
        return Ok(());
    }
    Err(RuntimeError::Bundle {
        bundle: bundle.dir.clone(),
        reason: format!(
            "process.cwd {cwd:?} does not exist in the root filesystem nor as a mount point \
             (chdir would fail with ENOENT): create it in the image, or choose another"
        ),
    })
}

/// Checks that `command` exists in the image at `rootfs` and can be
/// executed, resolving it inside the rootfs (symlinks included) as the
/// kernel would inside the sandbox: through `PATH` from `env`, or from
/// `cwd` when it holds a `/`. A command under one of `mounted` (a mount
/// destination: not the image's) is left to the kernel at exec time.
/// Engines read the error's words as runc's: "executable file not found
/// in $PATH" is 127 for docker and podman, "permission denied" 126.
pub fn check_command(
    rootfs: &Path,
    command: &str,
    env: &[String],
    cwd: &Path,
    mounted: &[&Path],
) -> Result<()> {
    let root = pathrs::Root::open(rootfs)
        .map_err(|e| RuntimeError::invalid(format!("the rootfs {rootfs:?}"), e.to_string()))?;
    check_command_in(&root, command, env, cwd, mounted)
}

/// `path` resolved in `root` as pathrs resolves it (openat2 with
/// `RESOLVE_IN_ROOT | RESOLVE_NO_MAGICLINKS`, `O_PATH`), or `None` if it
/// is not there. A path that is not there is known from the one
/// openat2: pathrs answers it with an error that names the root, read
/// back through /proc, six more system calls for each directory of PATH
/// before the command's (a warm sandbox's request for `sh` is looked for
/// in three). Anything else openat2 says (no openat2, a rename race's
/// EAGAIN, ...) is left to pathrs, which retries or falls back.
fn resolve_in(root: &pathrs::Root, path: &Path) -> Option<std::os::fd::OwnedFd> {
    use std::os::fd::AsFd;
    let resolve = libc::RESOLVE_IN_ROOT | libc::RESOLVE_NO_MAGICLINKS;
    match crate::sys::beneath::openat2(root.as_fd(), path, libc::O_PATH, resolve) {
        Ok(fd) => Some(fd),
        Err(e) if matches!(e.raw_os_error(), Some(libc::ENOENT | libc::ENOTDIR)) => None,
        Err(_) => root.resolve(path).ok().map(Into::into),
    }
}

/// [`check_command`] in a root already open: a running container's own
/// view, for exec.
pub fn check_command_in(
    root: &pathrs::Root,
    command: &str,
    env: &[String],
    cwd: &Path,
    mounted: &[&Path],
) -> Result<()> {
    use std::os::fd::{AsFd, AsRawFd};
    if command.is_empty() {
        // Else it would be looked for as each directory of PATH itself.
        return Err(RuntimeError::invalid(
            "the command",
            "is an empty string: give a program's name or path",
        ));
    }
    let path = env
        .iter()
        .find_map(|kv| kv.strip_prefix("PATH="))
        .unwrap_or("/usr/bin:/bin");
    let candidates: Vec<PathBuf> = if command.contains('/') {
        vec![cwd.join(command)]
    } else {
        path.split(':')
            .filter(|d| d.starts_with('/'))
            .map(|d| Path::new(d).join(command))
            .collect()
    };
    let mut not_executable = None;
    for candidate in &candidates {
        if mounted.iter().any(|m| candidate.starts_with(m)) {
            return Ok(());
        }
        let Some(handle) = resolve_in(root, candidate) else {
            continue;
        };
        let Ok(stat) = nix::sys::stat::fstat(handle.as_fd().as_raw_fd()) else {
            continue;
        };
        let is_file = stat.st_mode & libc::S_IFMT == libc::S_IFREG;
        if is_file && stat.st_mode & 0o111 != 0 {
            return Ok(());
        }
        not_executable.get_or_insert_with(|| candidate.clone());
    }
    match not_executable {
        Some(p) => Err(RuntimeError::CommandNotExecutable {
            command: command.to_owned(),
            path: p,
        }),
        None => Err(RuntimeError::CommandNotFound {
            command: command.to_owned(),
            searched: if command.contains('/') {
                candidates
                    .iter()
                    .map(|c| c.display().to_string())
                    .collect::<Vec<_>>()
                    .join(":")
            } else {
                path.to_owned()
            },
        }),
    }
}

/// The process of `spec` checked as [`check_command`] does, for a create.
pub fn check_process(bundle: &Bundle, spec: &Spec) -> Result<()> {
    let Some(process) = spec.process().as_ref() else {
        return Ok(());
    };
    let Some(command) = process.args().as_ref().and_then(|a| a.first()) else {
        return Ok(());
    };
    let env = process.env().clone().unwrap_or_default();
    let mounted: Vec<&Path> = spec
        .mounts()
        .iter()
        .flatten()
        .map(|m| m.destination().as_path())
        .collect();
    check_command(&bundle.rootfs, command, &env, process.cwd(), &mounted)
}

/// Refuses a root filesystem that is not a directory of its own: the
/// host's `/`, or a directory that holds runsbx's own state, stage, claims
/// or data, or the caller's home (a sandbox would see them, and runsbx
/// would create its mount points in them). `rootfs` is resolved first, so
/// a symlink to `/` is refused too. `what` names the input (`root.path`,
/// `--rootfs`).
pub fn check_rootfs(what: &str, rootfs: &Path, state_root: &Path) -> Result<()> {
    let resolved = fs::canonicalize(rootfs)
        .map_err(|e| RuntimeError::invalid(format!("{what} {rootfs:?}"), e.to_string()))?;
    let refuse = |reason: String| {
        RuntimeError::invalid(
            format!("{what} {rootfs:?}"),
            format!("{reason}; give a directory that holds only the image's root filesystem"),
        )
    };
    if resolved == Path::new("/") {
        return Err(refuse("is the host's root directory".to_owned()));
    }
    // The caller's home first: it may hold runsbx's own directories too,
    // and is the clearer reason.
    let mut protected: Vec<(PathBuf, &str)> = Vec::new();
    let caller = nix::unistd::Uid::from_raw(crate::sys::userns::caller_uid());
    if let Ok(Some(user)) = nix::unistd::User::from_uid(caller) {
        protected.push((user.dir, "the caller's home"));
    }
    protected.extend([
        (state_root.to_path_buf(), "runsbx's state"),
        (crate::state::root::default_root(), "runsbx's state"),
        (
            PathBuf::from(crate::state::ids::ID_DIR),
            "runsbx's id ranges",
        ),
        (
            PathBuf::from(crate::state::cgroup_claim::CLAIM_DIR),
            "runsbx's cgroup claims",
        ),
        (
            PathBuf::from(crate::sys::stage::STAGE_ROOT),
            "runsbx's staged root filesystems",
        ),
        (
            PathBuf::from(runsbx_image::SYSTEM_DATA_DIR),
            "runsbx's images",
        ),
    ]);
    if let Ok(dir) = runsbx_image::default_data_dir(crate::sys::privilege::rootless()) {
        protected.push((dir, "runsbx's images"));
    }
    for (dir, whose) in protected {
        // Resolved like the rootfs, so that a symlinked path compares.
        let dir = fs::canonicalize(&dir).unwrap_or(dir);
        if dir.starts_with(&resolved) {
            return Err(refuse(format!("holds {dir:?} ({whose})")));
        }
    }
    Ok(())
}

/// Where the config.json that libcontainer actually reads is kept, for the
/// life of the container: `<state root>/@bundles/<id>/`. runsbx never hands
/// libcontainer the caller's bundle; it writes the spec it decided on here
/// (rootfs made absolute, relative bind sources resolved against the
/// caller's bundle, a cgroup path of its own when none was given). `exec`
/// reads the container's process settings from this copy too.
#[derive(Debug, Clone)]
pub struct Effective {
    pub dir: PathBuf,
}

/// The hardening report: what was changed and which layers are in force.
const REPORT_FILE: &str = "hardening.json";
/// The container's records, appended as it is made (state/record.rs),
/// each under a key below.
const RECORDS_FILE: &str = "records";

/// A record of the effective bundle: its key in [`RECORDS_FILE`], and the
/// file of its own that runsbx wrote it to before there was one, read
/// where the records have none (a container made by an earlier runsbx).
struct Record {
    key: &'static str,
    legacy: &'static str,
}

impl Record {
    /// One whose file had its key for a name.
    const fn named(key: &'static str) -> Self {
        Self { key, legacy: key }
    }
}

/// The caller's bundle.
const SOURCE: Record = Record::named("source-bundle");
/// The id-range slot held, as root.
const SLOT: Record = Record::named("id-slot");
/// The cgroup path claimed, as root (see cgroup_claim.rs).
const CGROUP: Record = Record::named("cgroup");
/// The container's init process: its pid and start time.
const INIT: Record = Record::named("init");
/// The seccomp filter runsbx installs itself, which config.json leaves out
/// (see sandbox/seal.rs), as JSON.
const SECCOMP: Record = Record {
    key: "seccomp",
    legacy: "seccomp.json",
};

/// Record `record` of the effective bundle `dir`, if it has one.
fn recorded(dir: &Path, record: &Record) -> std::io::Result<Option<Vec<u8>>> {
    if let Some(value) = crate::state::record::find(&dir.join(RECORDS_FILE), record.key)? {
        return Ok(Some(value));
    }
    match fs::read(dir.join(record.legacy)) {
        Ok(value) => Ok(Some(value)),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(None),
        Err(e) => Err(e),
    }
}

/// The bundle's spec with every path made absolute: the rootfs, and bind
/// sources given relative to the bundle (as the runtime spec allows).
pub fn absolutize(source: &Bundle) -> Spec {
    let mut spec = source.spec.clone();
    if let Some(r) = spec.root_mut() {
        r.set_path(source.rootfs.clone());
    }
    if let Some(mounts) = spec.mounts_mut() {
        for m in mounts.iter_mut() {
            let is_bind = runsbx_policy::is_bind_mount(m);
            if let Some(src) = m.source().clone() {
                if is_bind && src.is_relative() {
                    m.set_source(Some(source.dir.join(src)));
                }
            }
        }
    }
    spec
}

impl Effective {
    pub fn path(root: &crate::state::root::StateRoot, id: &str) -> PathBuf {
        root.path().join("@bundles").join(id)
    }

    /// Writes `spec` as the effective bundle of container `id`, with the
    /// hardening report and the id-range slot it holds (as root).
    pub fn write(
        root: &crate::state::root::StateRoot,
        id: &str,
        source_dir: &Path,
        spec: &Spec,
        report: &serde_json::Value,
    ) -> Result<Self> {
        use std::os::unix::fs::DirBuilderExt;
        let dir = Self::path(root, id);
        let ctx = |what: &str| format!("write the effective bundle {dir:?}: {what}");
        fs::DirBuilder::new()
            .recursive(true)
            .mode(0o700)
            .create(&dir)
            .map_err(|e| RuntimeError::io(ctx("create"), e))?;
        let json = serde_json::to_vec(spec)
            .map_err(|e| RuntimeError::invalid(ctx("encode"), e.to_string()))?;
        fs::write(dir.join("config.json"), json)
            .map_err(|e| RuntimeError::io(ctx("config.json"), e))?;
        fs::write(dir.join(REPORT_FILE), report.to_string())
            .map_err(|e| RuntimeError::io(ctx(REPORT_FILE), e))?;
        crate::state::record::append(
            &dir.join(RECORDS_FILE),
            SOURCE.key,
            source_dir.as_os_str().as_encoded_bytes(),
        )
        .map_err(|e| RuntimeError::io(ctx(RECORDS_FILE), e))?;
        Ok(Self { dir })
    }

    /// Records the id-range slot container `id` holds (as root), before
    /// anything else is written, so that a failed create can release it.
    pub fn record_slot(root: &crate::state::root::StateRoot, id: &str, slot: u32) -> Result<()> {
        Self::record(root, id, &SLOT, slot.to_string().as_bytes(), "id range")
    }

    /// Records the cgroup path container `id` is about to claim (as root),
    /// so that whatever stops the create can release the claim.
    pub fn record_cgroup(
        root: &crate::state::root::StateRoot,
        id: &str,
        cgroup: &Path,
    ) -> Result<()> {
        Self::record(
            root,
            id,
            &CGROUP,
            cgroup.as_os_str().as_encoded_bytes(),
            "cgroup",
        )
    }

    /// Records container `id`'s init process, by its pid and start time
    /// (together they name one process), before it can be started.
    ///
    /// libcontainer rewrites the state file in place, so a runsbx killed
    /// while `start` saves it leaves a started init and no readable
    /// state. As root, the init is in the claimed cgroup; rootless it is in
    /// no cgroup of runsbx's and, once it has exec'd, no longer looks like
    /// libcontainer's: this record is how `delete --force` finds it.
    pub fn record_init(
        root: &crate::state::root::StateRoot,
        id: &str,
        init: nix::unistd::Pid,
    ) -> Result<()> {
        let start = crate::sys::procs::start_time(init).ok_or_else(|| {
            RuntimeError::invalid(format!("the init process {init} of `{id}`"), "it is gone")
        })?;
        Self::record(
            root,
            id,
            &INIT,
            format!("{init} {start}").as_bytes(),
            "init process",
        )
    }

    /// Container `id`'s recorded init, if that very process still runs
    /// (a zombie has nothing left to kill).
    pub fn init(root: &crate::state::root::StateRoot, id: &str) -> Option<nix::unistd::Pid> {
        use crate::sys::procs;
        let bytes = recorded(&Self::path(root, id), &INIT).ok()??;
        let text = String::from_utf8(bytes).ok()?;
        let (pid, start) = text.trim().split_once(' ')?;
        let pid = nix::unistd::Pid::from_raw(pid.parse().ok()?);
        let start: u64 = start.parse().ok()?;
        (procs::start_time(pid) == Some(start) && procs::alive(pid)).then_some(pid)
    }

    /// The cgroup path container `id` claimed, if any.
    pub fn cgroup(root: &crate::state::root::StateRoot, id: &str) -> Option<PathBuf> {
        let bytes = recorded(&Self::path(root, id), &CGROUP).ok()??;
        Some(PathBuf::from(
            <std::ffi::OsString as std::os::unix::ffi::OsStringExt>::from_vec(bytes),
        ))
    }

    fn record(
        root: &crate::state::root::StateRoot,
        id: &str,
        record: &Record,
        content: &[u8],
        what: &str,
    ) -> Result<()> {
        use std::os::unix::fs::DirBuilderExt;
        let dir = Self::path(root, id);
        fs::DirBuilder::new()
            .recursive(true)
            .mode(0o700)
            .create(&dir)
            .and_then(|()| {
                crate::state::record::append(&dir.join(RECORDS_FILE), record.key, content)
            })
            .map_err(|e| RuntimeError::io(format!("record the {what} of `{id}` in {dir:?}"), e))
    }

    /// The id-range slot container `id` holds, if any.
    pub fn slot(root: &crate::state::root::StateRoot, id: &str) -> Option<u32> {
        let bytes = recorded(&Self::path(root, id), &SLOT).ok()??;
        std::str::from_utf8(&bytes).ok()?.trim().parse().ok()
    }

    /// Records the seccomp filter runsbx installs in the init itself, left
    /// out of config.json so that libcontainer does not compile it too.
    pub fn record_seccomp(
        root: &crate::state::root::StateRoot,
        id: &str,
        seccomp: &LinuxSeccomp,
    ) -> Result<()> {
        let json = serde_json::to_vec(seccomp).map_err(|e| {
            RuntimeError::invalid(format!("the seccomp filter of `{id}`"), e.to_string())
        })?;
        Self::record(root, id, &SECCOMP, &json, "seccomp filter")
    }

    /// The seccomp filter of the sandbox whose effective bundle is `dir`
    /// and `spec`: the one recorded beside config.json (config.json has
    /// none, or has it in the form libcontainer compiles), or else
    /// config.json's. A hardened sandbox always has one: none is an
    /// error, never a process without a filter.
    pub fn seccomp(dir: &Path, spec: &Spec) -> Result<LinuxSeccomp> {
        let what = || format!("the seccomp filter of the sandbox bundle {dir:?}");
        let text = match recorded(dir, &SECCOMP) {
            Ok(Some(text)) => text,
            Ok(None) => {
                return spec
                    .linux()
                    .as_ref()
                    .and_then(|l| l.seccomp().clone())
                    .ok_or_else(|| {
                        RuntimeError::invalid(
                            what(),
                            format!(
                                "neither its {RECORDS_FILE} nor its config.json has one; delete \
                                 the sandbox and create it again"
                            ),
                        )
                    })
            }
            Err(e) => {
                return Err(RuntimeError::io(
                    format!(
                        "read {} from its {RECORDS_FILE} (delete the sandbox and create it again)",
                        what()
                    ),
                    e,
                ))
            }
        };
        serde_json::from_slice(&text).map_err(|e| RuntimeError::invalid(what(), e.to_string()))
    }

    /// The hardening report (changes, attestation) of container `id`.
    pub fn report(dir: &Path) -> Option<serde_json::Value> {
        serde_json::from_str(&fs::read_to_string(dir.join(REPORT_FILE)).ok()?).ok()
    }

    /// Once the container's init exists (with its supplementary groups),
    /// leaves them out of the effective config.json, which is the spec
    /// libcontainer 0.7's exec reads. Its exec validates that spec as if it
    /// were creating the container and, since runsbx's exec runs in the
    /// sandbox's user namespace, refuses supplementary groups there (its
    /// guard against CVE-2014-8989 for unprivileged callers). An exec'd
    /// process takes its groups from its own process, never from the
    /// init's, so nothing else changes.
    pub fn without_init_groups(&self, spec: &Spec) -> Result<()> {
        let has_groups = spec
            .process()
            .as_ref()
            .and_then(|p| p.user().additional_gids().as_ref())
            .is_some_and(|g| !g.is_empty());
        if !has_groups {
            return Ok(());
        }
        let mut spec = spec.clone();
        if let Some(process) = spec.process_mut() {
            let mut user = process.user().clone();
            user.set_additional_gids(None);
            process.set_user(user);
        }
        let path = self.dir.join("config.json");
        let ctx = |what: &str| format!("rewrite {path:?} for exec: {what}");
        let json = serde_json::to_vec(&spec)
            .map_err(|e| RuntimeError::invalid(ctx("encode"), e.to_string()))?;
        let tmp = self
            .dir
            .join(format!(".config.json.{}", std::process::id()));
        fs::write(&tmp, json)
            .and_then(|()| fs::rename(&tmp, &path))
            .map_err(|e| {
                let _ = fs::remove_file(&tmp);
                RuntimeError::io(ctx("write"), e)
            })
    }

    /// Adds `layer` to the attestation of the container whose effective
    /// bundle is `dir`, in place of an earlier layer of the same name.
    pub fn attest(dir: &Path, layer: &runsbx_policy::Layer) -> Result<()> {
        let path = dir.join(REPORT_FILE);
        let ctx = |what: &str| format!("record `{}` in {path:?}: {what}", layer.layer);
        let mut report = Self::report(dir).unwrap_or_else(|| serde_json::json!({}));
        let entry = serde_json::to_value(layer)
            .map_err(|e| RuntimeError::invalid(ctx("encode"), e.to_string()))?;
        match report["attestation"].as_array_mut() {
            Some(layers) => {
                layers.retain(|l| l["layer"] != entry["layer"]);
                layers.push(entry);
            }
            None => report["attestation"] = serde_json::Value::Array(vec![entry]),
        }
        // Written aside and put in place in one step: a reader never sees
        // half a report.
        let tmp = dir.join(format!(".{REPORT_FILE}.{}", std::process::id()));
        fs::write(&tmp, report.to_string())
            .and_then(|()| replace(&tmp, &path))
            .map_err(|e| {
                let _ = fs::remove_file(&tmp);
                RuntimeError::io(ctx("write"), e)
            })
    }

    /// The caller's bundle of the container whose effective bundle is `dir`.
    pub fn source_of(dir: &Path) -> PathBuf {
        match recorded(dir, &SOURCE) {
            Ok(Some(b)) => {
                PathBuf::from(<std::ffi::OsString as std::os::unix::ffi::OsStringExt>::from_vec(b))
            }
            _ => dir.to_path_buf(),
        }
    }

    /// Removes the effective bundle of container `id`, if any.
    pub fn remove(root: &crate::state::root::StateRoot, id: &str) -> Result<()> {
        let dir = Self::path(root, id);
        match fs::remove_dir_all(&dir) {
            Ok(()) => Ok(()),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(()),
            Err(e) => Err(RuntimeError::io(format!("remove {dir:?}"), e)),
        }
    }
}

/// Puts `new` in place of `path` in one step, and removes what `path`
/// held. An existing file is exchanged with `new` (RENAME_EXCHANGE) rather
/// than renamed over: ext4 writes out a file renamed over another at once
/// (its `auto_da_alloc`), and then deleting the sandbox frees its blocks,
/// each a synchronous discard where the filesystem is mounted with
/// `discard`. Exchanged, the report stays in the page cache until the
/// sandbox is deleted. (About 0.3 ms of a cold `run` whose state root is on
/// such a disk.)
fn replace(new: &Path, path: &Path) -> std::io::Result<()> {
    use nix::fcntl::{renameat2, RenameFlags};
    match renameat2(None, new, None, path, RenameFlags::RENAME_EXCHANGE) {
        // `new` now holds the old report.
        Ok(()) => fs::remove_file(new),
        // No report yet, or a filesystem without RENAME_EXCHANGE.
        Err(nix::Error::ENOENT | nix::Error::EINVAL) => fs::rename(new, path),
        Err(e) => Err(e.into()),
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    /// The command is looked for in the rootfs, links resolved inside it
    /// (an absolute link is the rootfs's path, never the host's), each
    /// PATH directory in turn, and told apart: not there, not executable.
    #[test]
    fn a_command_is_found_in_the_rootfs_only() {
        use std::os::unix::fs::{symlink, PermissionsExt};
        let tmp = tempfile::tempdir().unwrap();
        let rootfs = tmp.path();
        std::fs::create_dir_all(rootfs.join("usr/bin")).unwrap();
        let tool = rootfs.join("usr/bin/tool");
        std::fs::write(&tool, "#!/bin/sh\n").unwrap();
        std::fs::set_permissions(&tool, std::fs::Permissions::from_mode(0o755)).unwrap();
        std::fs::write(rootfs.join("usr/bin/data"), "").unwrap();
        symlink("usr/bin", rootfs.join("bin")).unwrap();
        // The host's own executables, named by absolute links: the
        // escape is tried only if the host has the first.
        assert!(Path::new("/usr/bin/env").is_file());
        symlink("/usr/bin/env", rootfs.join("usr/bin/env")).unwrap();
        symlink("/usr/bin/tool", rootfs.join("usr/bin/alias")).unwrap();
        let env = ["PATH=/nope:/sbin:/bin".to_owned()];
        let check = |command: &str| check_command(rootfs, command, &env, Path::new("/"), &[]);
        check("tool").unwrap();
        check("alias").unwrap();
        check("/bin/tool").unwrap();
        assert!(
            matches!(check("env"), Err(RuntimeError::CommandNotFound { .. })),
            "{:?}",
            check("env")
        );
        assert!(matches!(
            check("missing"),
            Err(RuntimeError::CommandNotFound { .. })
        ));
        assert!(matches!(
            check("data"),
            Err(RuntimeError::CommandNotExecutable { .. })
        ));
    }

    #[test]
    fn an_exec_finds_the_filter_where_create_put_it_or_fails() {
        let tmp = tempfile::tempdir().unwrap();
        let root = crate::state::root::StateRoot::open(&tmp.path().join("root")).unwrap();
        let dir = Effective::path(&root, "c1");
        let mut spec = Spec::default();
        if let Some(linux) = spec.linux_mut() {
            linux.set_seccomp(None);
        }
        // Neither in config.json nor beside it: no exec without a filter.
        let err = Effective::seccomp(&dir, &spec).unwrap_err();
        assert!(
            err.to_string()
                .contains("neither its records nor its config.json"),
            "{err}"
        );
        let filter = runsbx_policy::seccomp::allowlist().unwrap();
        Effective::record_seccomp(&root, "c1", &filter).unwrap();
        assert_eq!(Effective::seccomp(&dir, &spec).unwrap(), filter);
        // config.json's own, where it has one.
        let unreported = runsbx_policy::seccomp::unreported(&filter);
        if let Some(linux) = spec.linux_mut() {
            linux.set_seccomp(Some(unreported.clone()));
        }
        assert_eq!(Effective::seccomp(&dir, &spec).unwrap(), unreported);
    }

    /// Each record goes to the one records file; a container made by a
    /// runsbx that wrote each to a file of its own is read as before.
    #[test]
    fn records_are_one_file_and_older_ones_are_still_read() {
        let tmp = tempfile::tempdir().unwrap();
        let root = crate::state::root::StateRoot::open(&tmp.path().join("root")).unwrap();
        let dir = Effective::path(&root, "c1");
        Effective::record_slot(&root, "c1", 7).unwrap();
        Effective::record_cgroup(&root, "c1", Path::new("/runsbx/c1")).unwrap();
        let filter = runsbx_policy::seccomp::allowlist().unwrap();
        Effective::record_seccomp(&root, "c1", &filter).unwrap();
        let names: Vec<_> = fs::read_dir(&dir)
            .unwrap()
            .map(|e| e.unwrap().file_name())
            .collect();
        assert_eq!(names, [RECORDS_FILE]);
        assert_eq!(Effective::slot(&root, "c1"), Some(7));
        assert_eq!(
            Effective::cgroup(&root, "c1"),
            Some(PathBuf::from("/runsbx/c1"))
        );
        assert_eq!(Effective::seccomp(&dir, &Spec::default()).unwrap(), filter);
        // Not recorded: the caller's bundle is the effective one.
        assert_eq!(Effective::source_of(&dir), dir);

        let old = Effective::path(&root, "c2");
        fs::create_dir_all(&old).unwrap();
        fs::write(old.join(SLOT.legacy), "9").unwrap();
        fs::write(old.join(CGROUP.legacy), "/runsbx/c2").unwrap();
        fs::write(old.join(SOURCE.legacy), "/srv/bundle").unwrap();
        fs::write(
            old.join(SECCOMP.legacy),
            serde_json::to_vec(&filter).unwrap(),
        )
        .unwrap();
        assert_eq!(Effective::slot(&root, "c2"), Some(9));
        assert_eq!(
            Effective::cgroup(&root, "c2"),
            Some(PathBuf::from("/runsbx/c2"))
        );
        assert_eq!(Effective::source_of(&old), PathBuf::from("/srv/bundle"));
        assert_eq!(Effective::seccomp(&old, &Spec::default()).unwrap(), filter);
        // The init process of the test: a record of it names it.
        let me = nix::unistd::Pid::this();
        Effective::record_init(&root, "c2", me).unwrap();
        assert_eq!(Effective::init(&root, "c2"), Some(me));
        assert_eq!(Effective::init(&root, "c1"), None);
    }

    #[test]
    fn attesting_replaces_a_layer_and_leaves_only_the_report() {
        let tmp = tempfile::tempdir().unwrap();
        let dir = tmp.path();
        let layer = |detail: &str| runsbx_policy::Layer {
            layer: "network_rechecked",
            in_force: true,
            detail: detail.to_owned(),
        };
        // No report yet: made.
        Effective::attest(dir, &layer("checked at start: only lo")).unwrap();
        fs::write(
            dir.join(REPORT_FILE),
            r#"{"attestation":[{"layer":"seccomp","in_force":true,"detail":"x"},
                {"layer":"network_rechecked","in_force":true,"detail":"old"}]}"#,
        )
        .unwrap();
        // An existing report: the layer of the same name replaced, the
        // others kept.
        Effective::attest(dir, &layer("checked at start: only lo")).unwrap();
        let report = Effective::report(dir).unwrap();
        let layers: Vec<(&str, &str)> = report["attestation"]
            .as_array()
            .unwrap()
            .iter()
            .map(|l| (l["layer"].as_str().unwrap(), l["detail"].as_str().unwrap()))
            .collect();
        assert_eq!(
            layers,
            [
                ("seccomp", "x"),
                ("network_rechecked", "checked at start: only lo")
            ]
        );
        let names: Vec<_> = fs::read_dir(dir)
            .unwrap()
            .map(|e| e.unwrap().file_name())
            .collect();
        assert_eq!(names, [REPORT_FILE], "the old report is gone");
    }
}
