//! Specs that would make runsbx harm what is outside the sandbox: a
//! cgroup path that names the hierarchy's root or another container's
//! cgroup (libcgroups kills every process of a cgroup it removes), a
//! rootfs that is the host's `/`.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

mod support;

use std::fs;
use std::process::Command;

use serde_json::Value;
use support::{Fixture, Who};

/// Runs `runsbx run` of `bundle` inside a new pid namespace beside a
/// canary process, so that a runsbx that signalled every pid it could
/// see would kill only the canary. Returns runsbx's exit code, its
/// stderr, and whether the canary was still alive afterwards.
fn run_beside_canary(fx: &Fixture, bundle: &std::path::Path) -> (i32, String, bool) {
    let err = fx.dir.path().join("stderr");
    let script = format!(
        "sleep 1000 & canary=$!; {bin} --root {root} run --bundle {bundle} hostile 2>{err}; \
         echo rc=$?; kill -0 $canary && echo canary-alive; kill $canary",
        bin = support::bin().display(),
        root = fx.state.display(),
        bundle = bundle.display(),
        err = err.display(),
    );
    let out = support::output_via_files(Command::new("unshare").args([
        "--pid",
        "--fork",
        "--mount-proc",
        "sh",
        "-c",
        &script,
    ]));
    assert_eq!(out.code, 0, "{out:?}");
    let code = out
        .stdout
        .lines()
        .find_map(|l| l.strip_prefix("rc="))
        .unwrap_or_else(|| panic!("{out:?}"))
        .parse()
        .unwrap();
    let stderr = fs::read_to_string(&err).unwrap_or_default();
    (code, stderr, out.stdout.contains("canary-alive"))
}

#[test]
fn hostile_cgroup_paths_harm_nothing() {
    if !support::is_root() {
        skip!("hostile_cgroup_paths_harm_nothing: cgroups are root's here");
    }
    if !support::have("unshare") {
        skip!("unshare is not installed (apt-get install util-linux)");
    }
    let fx = Fixture::new(Who::Root);
    // Another live container, whose cgroup (and its parent) must be safe.
    let b0 = fx.bundle("b0", &["sleep", "1000"], |_| {});
    fx.run(["run", "--detach", "--bundle", b0.to_str().unwrap(), "c0"])
        .ok();
    let effective: Value = serde_json::from_str(
        &fs::read_to_string(fx.state.join("@bundles/c0/config.json")).unwrap(),
    )
    .unwrap();
    let theirs = effective["linux"]["cgroupsPath"]
        .as_str()
        .unwrap()
        .to_owned();
    let parent = std::path::Path::new(&theirs)
        .parent()
        .unwrap()
        .to_str()
        .unwrap()
        .to_owned();

    for (path, needle) in [
        ("/", "names the root of the cgroup hierarchy"),
        ("", "names the root of the cgroup hierarchy"),
        ("/..", "has `.` or `..` components"),
        ("/runsbx/../..", "has `.` or `..` components"),
        ("/a/./b", "has `.` or `..` components"),
        (theirs.as_str(), "the cgroup exists already"),
        (parent.as_str(), "the cgroup exists already"),
    ] {
        let b = fx.bundle("hostile", &["true"], |c| {
            c["linux"]["cgroupsPath"] = Value::from(path)
        });
        let (code, stderr, canary) = run_beside_canary(&fx, &b);
        assert!(canary, "{path:?}: the canary was killed ({stderr})");
        assert_eq!(code, 3, "{path:?}: {stderr}");
        assert!(
            stderr.contains("linux.cgroupsPath") && stderr.contains(needle),
            "{path:?}: {stderr}"
        );
        fs::remove_dir_all(&b).unwrap();
    }
    let state = fx.run(["state", "c0"]).ok().json();
    assert_eq!(state["status"], "running", "{state}");
    fx.run(["delete", "--force", "c0"]).ok();
    fx.assert_clean();
}

/// The host's `/` (directly, through a symlink) or a directory holding the
/// caller's home is never a sandbox's root filesystem, and `--output-dir`
/// is never created on the host.
fn host_root_is_no_rootfs(fx: Fixture) {
    let link = fx.dir.path().join("root-link");
    std::os::unix::fs::symlink("/", &link).unwrap();
    let home = match &fx.who {
        Who::Root => std::path::PathBuf::from("/root"),
        Who::User(u) => u.home.clone(),
    };
    for (rootfs, needle) in [
        (
            std::path::PathBuf::from("/"),
            "is the host's root directory",
        ),
        (link.clone(), "is the host's root directory"),
        (home.clone(), "(the caller's home)"),
    ] {
        let b = fx.bundle("b", &["true"], |c| {
            c["root"]["path"] = Value::from(rootfs.to_str().unwrap())
        });
        for cmd in ["create", "run"] {
            let out = fx.run([cmd, "--bundle", b.to_str().unwrap(), "c1"]);
            assert_eq!(out.code, 3, "{rootfs:?}: {out:?}");
            assert!(
                out.stderr.contains("root.path") && out.stderr.contains(needle),
                "{rootfs:?}: {out:?}"
            );
        }
        fs::remove_dir_all(&b).unwrap();
        let out = fx.run(["call", "--rootfs", rootfs.to_str().unwrap(), "--", "true"]);
        assert_eq!(out.code, 125, "{rootfs:?}: {out:?}");
        assert!(out.stderr.contains(needle), "{rootfs:?}: {out:?}");
    }
    assert!(
        !std::path::Path::new("/workspace").exists(),
        "runsbx made /workspace on the host"
    );

    let missing = fx.dir.path().join("no/such/dir");
    let out = fx.run([
        "call",
        "--rootfs",
        support::rootfs().to_str().unwrap(),
        "--output",
        "x",
        "--output-dir",
        missing.to_str().unwrap(),
        "--",
        "true",
    ]);
    assert_eq!(out.code, 125, "{out:?}");
    assert!(
        out.stderr.contains("is not an existing directory"),
        "{out:?}"
    );
    assert!(
        !fx.dir.path().join("no").exists(),
        "runsbx created host directories"
    );
    fx.assert_clean();
}
as_root_and_rootless!(host_root_is_no_rootfs: host_root_as_root, host_root_rootless);
