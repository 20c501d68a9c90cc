//! Mounts: the image read-only, size-capped tmpfs for scratch space, and no
//! host path unless the profile names its destination.

use std::path::{Path, PathBuf};

use oci_spec::runtime::{Mount, MountBuilder, Spec};

use super::{userns, Cx};
use crate::{EngineBindKind, HostFacts, PolicyError, Profile};

/// Files container engines bind into every container. They hold nothing
/// secret (names, resolver, engine marker), and engines break without them;
/// allowed read-only.
pub(crate) const ENGINE_FILES: &[&str] = &[
    "/etc/hosts",
    "/etc/hostname",
    "/etc/resolv.conf",
    "/run/.containerenv",
    "/dev/termination-log",
];

/// Where engines bind their init and run it as the container's process:
/// podman (`--init`, catatonit) and docker (`--init`, tini).
pub(crate) const INIT_PATHS: &[&str] = &["/run/podman-init", "/sbin/docker-init"];

/// Where a tool call's working directory is.
pub(crate) const WORKSPACE: &str = "/workspace";

/// Options of the bind of a call's workspace: writable (it is the call's
/// scratch space), but never a way to gain privilege or reach a device.
pub(crate) const WORKSPACE_OPTIONS: &[&str] = &["bind", "rw", "nosuid", "nodev"];

/// Where Debian's TLS clients (OpenSSL, GnuTLS, curl, git, Python's ssl)
/// read the CAs they trust; with TLS inspection the runtime binds the
/// sandbox's own bundle here (see `HostFacts::trust_bundle`).
pub const TRUST_BUNDLE: &str = "/etc/ssl/certs/ca-certificates.crt";

/// Options of the bind of the trust bundle: a file to read, nothing else.
pub(crate) const TRUST_OPTIONS: &[&str] = &["bind", "ro", "nosuid", "nodev", "noexec"];

/// Options every allowed bind mount gets, and the ones it loses.
const BIND_FORCED: &[&str] = &["ro", "nosuid", "nodev", "noexec"];
const BIND_DROPPED: &[&str] = &["rw", "suid", "dev", "exec", "rbind", "shared", "rshared"];

pub(super) fn apply(cx: &mut Cx) -> Result<(), PolicyError> {
    if cx.spec.root().is_none() {
        // Nothing to make read-only, and no sandbox without a rootfs.
        return Err(PolicyError::Invalid {
            field: "root".to_owned(),
            reason: "the spec has no root: give root.path, the container's rootfs".to_owned(),
        });
    }
    let writable = writable_rootfs(cx);
    if let Some(root) = cx.spec.root_mut() {
        if root.readonly() != Some(true) && writable.is_err() {
            root.set_readonly(Some(true));
            cx.changes.push(crate::Change {
                field: "root.readonly".to_owned(),
                reason: format!(
                    "the image is read-only ({}); write to /tmp or /workspace",
                    writable.as_ref().err().copied().unwrap_or_default()
                ),
            });
        }
    }
    let old = cx.spec.mounts().clone().unwrap_or_default();
    let mut kept = Vec::with_capacity(old.len() + cx.profile.tmpfs.len());
    for m in &old {
        if let Some(m) = keep(cx, m)? {
            kept.push(m);
        }
    }
    for (dest, size) in &cx.profile.tmpfs {
        let m = match &cx.host.call_workspace {
            Some(source) if dest == Path::new(WORKSPACE) => workspace_bind(source)?,
            _ => tmpfs(dest, size.0)?,
        };
        // Before the spec's mounts below it (an engine's `--tmpfs /tmp/x`,
        // a volume at /workspace/data), which it would otherwise cover.
        let at = kept
            .iter()
            .position(|k| k.destination() != dest && k.destination().starts_with(dest))
            .unwrap_or(kept.len());
        kept.insert(at, m);
    }
    if let Some(source) = &cx.host.trust_bundle {
        kept.push(file_bind(TRUST_BUNDLE, source, TRUST_OPTIONS)?);
    }
    cx.tmpcopyup = take_tmpcopyup(&mut kept);
    if kept != old {
        describe_changes(cx, &old, &kept);
        cx.spec.set_mounts(Some(kept));
    }
    let read_only = cx
        .spec
        .root()
        .as_ref()
        .is_none_or(|r| r.readonly() == Some(true));
    if read_only {
        cx.attest("rootfs_readonly", true, "the image is mounted read-only");
    } else {
        cx.attest(
            "rootfs_readonly",
            false,
            writable.unwrap_or("the rootfs is writable"),
        );
    }
    let bind_mounts: Vec<Mount> = cx
        .spec
        .mounts()
        .iter()
        .flatten()
        .filter(|m| is_bind(m))
        .cloned()
        .collect();
    let (mut binds, mut volumes) = (Vec::new(), Vec::new());
    for m in &bind_mounts {
        let dest = m.destination().display().to_string();
        match engine_bind(cx, m) {
            Some(EngineBindKind::Volume) => {
                cx.engine_volumes.push(m.destination().clone());
                volumes.push(dest);
            }
            Some(EngineBindKind::SystemFile) => binds.push(format!("{dest} (the engine's init)")),
            None if is_trust_bundle(cx.host, &dest) => binds.push(format!(
                "{dest} (this sandbox's own TLS trust, made by runsbx)"
            )),
            None => binds.push(dest),
        }
    }
    // A named volume is a host directory containers share: said, and the
    // layer is not claimed in force with one.
    let engine_only = volumes.is_empty()
        && bind_mounts.iter().all(|m| {
            let d = m.destination().display().to_string();
            ENGINE_FILES.contains(&d.as_str())
                || is_call_workspace(cx.host, &d)
                || is_trust_bundle(cx.host, &d)
                || engine_bind(cx, m).is_some()
        });
    let mut detail = match (binds.is_empty(), cx.host.call_workspace.is_some()) {
        (true, _) => "no host path is mounted".to_owned(),
        (false, true) if cx.host.session => format!(
            "binds: {} (/workspace is the session's own workspace, on its own disk)",
            binds.join(", ")
        ),
        (false, true) => format!(
            "binds: {} (/workspace is this call's own fresh tmpfs)",
            binds.join(", ")
        ),
        (false, false) => format!("read-only binds: {}", binds.join(", ")),
    };
    if !volumes.is_empty() {
        detail = format!(
            "{detail}; the engine's named volumes, writable: {}",
            volumes.join(", ")
        );
    }
    cx.attest("no_host_mounts", engine_only, detail);
    Ok(())
}

/// The mount as it may stay, or None when it goes (or is replaced).
/// Removes `tmpcopyup` from the tmpfs mounts that ask for it (mount(2)
/// knows no such option), returning their destinations: the runtime fills
/// each new tmpfs with the image's content at that path before the
/// process starts (runsbx-runtime's sys/copyup.rs).
fn take_tmpcopyup(mounts: &mut [Mount]) -> Vec<PathBuf> {
    let mut dests = Vec::new();
    for m in mounts.iter_mut() {
        if m.typ().as_deref() != Some("tmpfs") {
            continue;
        }
        let Some(options) = m.options().clone() else {
            continue;
        };
        if options.iter().any(|o| o == "tmpcopyup") {
            dests.push(m.destination().clone());
            m.set_options(Some(
                options.into_iter().filter(|o| o != "tmpcopyup").collect(),
            ));
        }
    }
    dests
}

/// Whether the rootfs may stay writable when the spec asks: `Ok(why)`, or
/// `Err(why not)`. Writes must land in the container's own files and
/// create nothing a host user could use: only an engine's container layer,
/// inside the engine's private storage (as root, a setuid-root file the
/// sandbox's root made in a plain directory would be one on the host).
fn writable_rootfs(cx: &Cx) -> Result<&'static str, &'static str> {
    if cx.profile.readonly_rootfs {
        return Err("the profile's readonly_rootfs");
    }
    if cx.host.rootfs_container_layer && cx.host.session {
        return Ok("writable: writes land in the session's own layer over the image");
    }
    if cx.host.rootfs_container_layer {
        return Ok(
            "writable as the spec asks: writes land in the engine's own layer for this container",
        );
    }
    Err("only an engine's container layer is writable")
}

fn keep(cx: &mut Cx, m: &Mount) -> Result<Option<Mount>, PolicyError> {
    let dest = m.destination();
    let typ = m
        .typ()
        .as_deref()
        .unwrap_or(if is_bind(m) { "bind" } else { "" });
    if is_bind(m) {
        if cx.profile.tmpfs.contains_key(dest) {
            return Ok(None); // replaced by the profile's own tmpfs
        }
        if is_trust_bundle(cx.host, &dest.display().to_string()) {
            return Ok(None); // replaced by the runtime's own, below
        }
        // Rootless buildah binds the host's /sys where it cannot mount a
        // sysfs: no /sys, as for a sysfs mount below.
        if dest == Path::new("/sys") && m.source().as_deref() == Some(Path::new("/sys")) {
            return Ok(None);
        }
        if let Some(kind) = engine_bind(cx, m) {
            return Ok(Some(engine_bind_options(m, kind)));
        }
        let engine_file = ENGINE_FILES.iter().any(|f| Path::new(f) == dest);
        if !engine_file && !cx.profile.bind_mounts.iter().any(|b| b == dest) {
            // What the profile would need: its engine key for an engine's
            // own init or volume, else the destination itself.
            let key = match cx.host.engine_binds.iter().find(|b| b.is(m)) {
                Some(b) if b.kind == EngineBindKind::Volume => "engine_volumes = true".to_owned(),
                Some(_) if is_init(&cx.spec, dest) => "engine_init = true".to_owned(),
                _ => format!("bind_mounts = [{dest:?}]"),
            };
            return Err(cx.refused(
                format!(
                    "bind mount of host path {:?} at {dest:?}",
                    m.source().clone().unwrap_or_default()
                ),
                key,
            ));
        }
        let mut m = m.clone();
        let mut options: Vec<String> = m
            .options()
            .clone()
            .unwrap_or_default()
            .into_iter()
            .filter(|o| {
                !BIND_DROPPED.contains(&o.as_str())
                    && !BIND_FORCED.contains(&o.as_str())
                    && o != "bind"
            })
            .collect();
        options.insert(0, "bind".to_owned());
        options.extend(BIND_FORCED.iter().map(|o| (*o).to_owned()));
        m.set_options(Some(options));
        return Ok(Some(m));
    }
    match typ {
        // Left to the proc module, which puts its own procfs in its place.
        "proc" => Ok(Some(m.clone())),
        // No /sys, and no cgroup hierarchy: host topology and knobs.
        "sysfs" | "cgroup" | "cgroup2" => Ok(None),
        "tmpfs" if cx.profile.tmpfs.contains_key(dest) => Ok(None),
        "tmpfs" => {
            let mut m = m.clone();
            let mut options = m.options().clone().unwrap_or_default();
            for o in ["nosuid", "nodev"] {
                if !options.iter().any(|x| x == o) {
                    options.push(o.to_owned());
                }
            }
            options.retain(|o| o != "suid" && o != "dev");
            if !options.iter().any(|o| o.starts_with("size=")) {
                // /dev holds device nodes only; anything else is capped too.
                options.push("size=64m".to_owned());
            }
            m.set_options(Some(options));
            Ok(Some(m))
        }
        "devpts" | "mqueue" => {
            let mut m = m.clone();
            let gid5 = userns::gid_mapped(cx, 5);
            let mut options: Vec<String> = m
                .options()
                .clone()
                .unwrap_or_default()
                .into_iter()
                // gid=5 (tty) cannot be set when that gid is not mapped.
                .filter(|o| gid5 || o != "gid=5")
                .filter(|o| o != "suid" && o != "exec")
                .collect();
            for o in ["nosuid", "noexec"] {
                if !options.iter().any(|x| x == o) {
                    options.push(o.to_owned());
                }
            }
            m.set_options(Some(options));
            Ok(Some(m))
        }
        other => Err(cx.refused(
            format!("a mount of type {other:?} at {dest:?}"),
            "nothing: runsbx mounts only tmpfs, devpts, mqueue, its own proc and allowed binds",
        )),
    }
}

/// The kind of engine bind `m` is, when the runtime found its source to be
/// one and the profile allows that kind: an init is a system file at an
/// engine's init path that the process runs.
pub(crate) fn engine_bind_in(
    spec: &Spec,
    profile: &Profile,
    host: &HostFacts,
    m: &Mount,
) -> Option<EngineBindKind> {
    let dest = m.destination();
    let found = host.engine_binds.iter().find(|b| b.is(m))?;
    match found.kind {
        EngineBindKind::SystemFile if profile.engine_init && is_init(spec, dest) => {
            Some(found.kind)
        }
        EngineBindKind::Volume if profile.engine_volumes => Some(found.kind),
        _ => None,
    }
}

fn engine_bind(cx: &Cx, m: &Mount) -> Option<EngineBindKind> {
    engine_bind_in(&cx.spec, cx.profile, cx.host, m)
}

/// `dest` is where an engine puts its init, and the process runs it.
fn is_init(spec: &Spec, dest: &Path) -> bool {
    INIT_PATHS.iter().any(|p| Path::new(p) == dest)
        && spec
            .process()
            .as_ref()
            .and_then(|p| p.args().as_ref())
            .and_then(|a| a.first())
            .is_some_and(|a| Path::new(a) == dest)
}

/// An init is read-only and executable; a volume is writable when the
/// engine asks. Neither honours set-user-id bits or device files.
fn engine_bind_options(m: &Mount, kind: EngineBindKind) -> Mount {
    let (forced, dropped): (&[&str], &[&str]) = match kind {
        EngineBindKind::SystemFile => (
            &["ro", "nosuid", "nodev"],
            &["rw", "suid", "dev", "rbind", "shared", "rshared"],
        ),
        EngineBindKind::Volume => (
            &["nosuid", "nodev"],
            &["suid", "dev", "rbind", "shared", "rshared"],
        ),
    };
    let mut m = m.clone();
    let mut options: Vec<String> = m
        .options()
        .clone()
        .unwrap_or_default()
        .into_iter()
        .filter(|o| !dropped.contains(&o.as_str()) && !forced.contains(&o.as_str()) && o != "bind")
        .collect();
    options.insert(0, "bind".to_owned());
    options.extend(forced.iter().map(|o| (*o).to_owned()));
    m.set_options(Some(options));
    m
}

fn tmpfs(dest: &Path, size: u64) -> Result<Mount, PolicyError> {
    let mut options = vec!["nosuid".to_owned(), "nodev".to_owned()];
    if dest == Path::new("/dev/shm") {
        options.push("noexec".to_owned());
    }
    options.push("mode=1777".to_owned());
    options.push(format!("size={size}"));
    MountBuilder::default()
        .destination(dest.to_path_buf())
        .typ("tmpfs")
        .source(PathBuf::from("tmpfs"))
        .options(options)
        .build()
        .map_err(|e| PolicyError::Internal(e.to_string()))
}

/// The bind of `runsbx call`'s own workspace tmpfs at /workspace. It takes
/// the place of the profile's /workspace tmpfs and has its size (the
/// runtime mounted it so); see [`crate::HostFacts::call_workspace`].
fn workspace_bind(source: &Path) -> Result<Mount, PolicyError> {
    file_bind(WORKSPACE, source, WORKSPACE_OPTIONS)
}

/// A bind of a path the runtime made, at `dest`.
fn file_bind(dest: &str, source: &Path, options: &[&str]) -> Result<Mount, PolicyError> {
    MountBuilder::default()
        .destination(PathBuf::from(dest))
        .typ("bind")
        .source(source.to_path_buf())
        .options(options.iter().map(|o| (*o).to_owned()).collect::<Vec<_>>())
        .build()
        .map_err(|e| PolicyError::Internal(e.to_string()))
}

fn is_call_workspace(host: &crate::HostFacts, dest: &str) -> bool {
    host.call_workspace.is_some() && dest == WORKSPACE
}

pub(crate) fn is_trust_bundle(host: &crate::HostFacts, dest: &str) -> bool {
    host.trust_bundle.is_some() && dest == TRUST_BUNDLE
}

/// Whether a mount binds a host path (by type or by option).
pub fn is_bind(m: &Mount) -> bool {
    m.typ().as_deref() == Some("bind")
        || m.options()
            .iter()
            .flatten()
            .any(|o| o == "bind" || o == "rbind")
}

fn describe_changes(cx: &mut Cx, old: &[Mount], new: &[Mount]) {
    for m in old {
        if !new.iter().any(|n| n.destination() == m.destination()) {
            let typ = m.typ().clone().unwrap_or_else(|| "bind".to_owned());
            cx.change(
                format!("mounts[{}]", m.destination().display()),
                format!("removed {typ} mount: not part of a sandbox"),
            );
        } else if !new.contains(m) {
            let replaced = new
                .iter()
                .any(|n| n.destination() == m.destination() && n.typ() != m.typ());
            cx.change(
                format!("mounts[{}]", m.destination().display()),
                if replaced {
                    "replaced by a size-capped tmpfs from the profile"
                } else {
                    "options tightened (read-only/nosuid/nodev/noexec where it applies, size-capped tmpfs)"
                },
            );
        }
    }
    for n in new {
        if !old.iter().any(|m| m.destination() == n.destination()) {
            cx.change(
                format!("mounts[{}]", n.destination().display()),
                "added a size-capped tmpfs from the profile",
            );
        }
    }
}
