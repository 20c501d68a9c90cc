//! Limits on the size of what a spec asks for, checked before anything
//! else: a spec past them is refused with the limit it exceeds, instead of
//! costing time out of proportion (libcontainer sets the environment one
//! variable at a time, which glibc makes quadratic) or making runsbx create
//! tens of thousands of nested directories. Each limit is far above what an
//! engine writes and at or below what the kernel would take anyway.

use oci_spec::runtime::{Process, Spec};

use crate::PolicyError;

/// The largest config.json runsbx reads (engines write a few KiB).
pub const MAX_CONFIG_BYTES: u64 = 4 << 20;
/// Environment entries of a process.
pub const MAX_ENV_ENTRIES: usize = 4096;
/// Arguments of a process.
pub const MAX_ARGS: usize = 4096;
/// One argument or environment entry: the kernel's MAX_ARG_STRLEN.
pub const MAX_STRING_BYTES: usize = 128 << 10;
/// All arguments and environment entries together: half the kernel's
/// ARG_MAX with the default 8 MiB stack, so that exec has room left.
pub const MAX_EXEC_BYTES: usize = 1 << 20;
/// A path (root, cwd, a mount's source or destination): PATH_MAX.
pub const MAX_PATH_BYTES: usize = 4096;
/// Components of a mount destination (runsbx creates missing ones).
pub const MAX_PATH_DEPTH: usize = 64;
/// Mounts of a spec.
pub const MAX_MOUNTS: usize = 512;
/// A hostname or domain name: the kernel's HOST_NAME_MAX.
pub const MAX_HOSTNAME_BYTES: usize = 64;
/// Annotations of a spec, and the bytes of each key and value.
pub const MAX_ANNOTATIONS: usize = 1024;
pub const MAX_ANNOTATION_BYTES: usize = 64 << 10;

fn too_big(field: &str, what: String, limit: String) -> PolicyError {
    PolicyError::Invalid {
        field: field.to_owned(),
        reason: format!("{what}, more than runsbx takes ({limit}); see README's limits"),
    }
}

/// Checks every size limit of `spec`.
pub fn check(spec: &Spec) -> Result<(), PolicyError> {
    if let Some(process) = spec.process() {
        check_process(process)?;
    }
    if let Some(root) = spec.root() {
        check_path("root.path", root.path())?;
    }
    for (field, name) in [
        ("hostname", spec.hostname()),
        ("domainname", spec.domainname()),
    ] {
        if let Some(name) = name.as_ref().filter(|n| n.len() > MAX_HOSTNAME_BYTES) {
            return Err(too_big(
                field,
                format!("a name of {} bytes", name.len()),
                format!("{MAX_HOSTNAME_BYTES} bytes"),
            ));
        }
    }
    let mounts = spec.mounts().as_deref().unwrap_or_default();
    if mounts.len() > MAX_MOUNTS {
        return Err(too_big(
            "mounts",
            format!("{} mounts", mounts.len()),
            format!("{MAX_MOUNTS}"),
        ));
    }
    for m in mounts {
        check_path("mounts[].destination", m.destination())?;
        let depth = m.destination().components().count();
        if depth > MAX_PATH_DEPTH {
            return Err(too_big(
                "mounts[].destination",
                format!("a destination {depth} directories deep"),
                format!("{MAX_PATH_DEPTH}"),
            ));
        }
        if let Some(source) = m.source() {
            check_path("mounts[].source", source)?;
        }
    }
    let annotations = spec.annotations().as_ref();
    let count = annotations.map_or(0, |a| a.len());
    if count > MAX_ANNOTATIONS {
        return Err(too_big(
            "annotations",
            format!("{count} annotations"),
            format!("{MAX_ANNOTATIONS}"),
        ));
    }
    for (k, v) in annotations.into_iter().flatten() {
        if k.len() > MAX_ANNOTATION_BYTES || v.len() > MAX_ANNOTATION_BYTES {
            return Err(too_big(
                "annotations",
                format!("an annotation of {} bytes", k.len().max(v.len())),
                format!("{MAX_ANNOTATION_BYTES} bytes"),
            ));
        }
    }
    Ok(())
}

/// Checks the limits of one process (a container's, or an exec's).
pub fn check_process(process: &Process) -> Result<(), PolicyError> {
    let env = process.env().as_deref().unwrap_or_default();
    let args = process.args().as_deref().unwrap_or_default();
    if env.len() > MAX_ENV_ENTRIES {
        return Err(too_big(
            "process.env",
            format!("{} entries", env.len()),
            format!("{MAX_ENV_ENTRIES}"),
        ));
    }
    if args.len() > MAX_ARGS {
        return Err(too_big(
            "process.args",
            format!("{} arguments", args.len()),
            format!("{MAX_ARGS}"),
        ));
    }
    let mut total = 0usize;
    for (field, s) in env
        .iter()
        .map(|e| ("process.env", e))
        .chain(args.iter().map(|a| ("process.args", a)))
    {
        if s.len() > MAX_STRING_BYTES {
            return Err(too_big(
                field,
                format!("an entry of {} bytes", s.len()),
                format!("{MAX_STRING_BYTES} bytes each"),
            ));
        }
        total = total.saturating_add(s.len() + 1);
    }
    if total > MAX_EXEC_BYTES {
        return Err(too_big(
            "process.args, process.env",
            format!("{total} bytes in all"),
            format!("{MAX_EXEC_BYTES} bytes"),
        ));
    }
    check_path("process.cwd", process.cwd())
}

fn check_path(field: &str, path: &std::path::Path) -> Result<(), PolicyError> {
    let len = path.as_os_str().len();
    if len > MAX_PATH_BYTES {
        return Err(too_big(
            field,
            format!("a path of {len} bytes"),
            format!("{MAX_PATH_BYTES} bytes"),
        ));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use oci_spec::runtime::ProcessBuilder;

    fn process(env: Vec<String>, args: Vec<String>) -> Process {
        ProcessBuilder::default()
            .env(env)
            .args(args)
            .cwd("/")
            .build()
            .unwrap_or_default()
    }

    #[test]
    fn limits_refuse_oversized_processes_and_keep_ordinary_ones() {
        let ok = process(
            (0..MAX_ENV_ENTRIES).map(|i| format!("V{i}=x")).collect(),
            vec!["sh".into()],
        );
        assert_eq!(check_process(&ok), Ok(()));
        for (env, args, field) in [
            (
                (0..=MAX_ENV_ENTRIES).map(|i| format!("V{i}=x")).collect(),
                vec!["sh".to_owned()],
                "process.env",
            ),
            (
                vec![],
                (0..=MAX_ARGS).map(|i| i.to_string()).collect(),
                "process.args",
            ),
            (
                vec!["X=".to_owned() + &"y".repeat(MAX_STRING_BYTES)],
                vec![],
                "process.env",
            ),
            (
                (0..16)
                    .map(|i| format!("V{i}={}", "y".repeat(100 << 10)))
                    .collect(),
                vec![],
                "process.args, process.env",
            ),
        ] {
            let result = check_process(&process(env, args));
            assert!(
                matches!(&result, Err(PolicyError::Invalid { field: f, .. }) if f == field),
                "{field}: {result:?}"
            );
        }
    }
}
