//! Bad input: each gets a clear message, a documented exit code, and
//! leaves nothing behind (state, lock files, mounts, processes).
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::fs;

use runsbx_testkit::{self as kit, as_root_and_rootless, skip, Fixture};

/// The runsbx under test.
const RUNSBX: &str = env!("CARGO_BIN_EXE_runsbx");

/// Exit codes from README.md.
const INVALID_INPUT: i32 = 3;
const NOT_FOUND: i32 = 4;
const CONFLICT: i32 = 5;
const UNSUPPORTED: i32 = 6;

fn assert_refused(out: &kit::Out, code: i32, needle: &str) {
    assert_eq!(out.code, code, "{out:?}");
    assert!(
        out.stderr.contains(needle),
        "stderr lacks {needle:?}: {out:?}"
    );
    assert!(out.stderr.starts_with("runsbx: error: "), "{out:?}");
}

fn invalid_ids(fx: Fixture) {
    let b = fx.bundle("b", &["true"], |_| {});
    let long = "x".repeat(129);
    for id in ["", "..", ".", "a/b", "../escape", "has space", &long] {
        for args in [
            vec!["create", "--bundle", b.to_str().unwrap(), id],
            vec!["run", "--bundle", b.to_str().unwrap(), id],
            vec!["state", id],
            vec!["delete", "--force", id],
        ] {
            let out = fx.run(&args);
            // clap refuses an empty id itself, with its usage code.
            if id.is_empty() {
                assert_eq!(out.code, 2, "{args:?}: {out:?}");
                continue;
            }
            assert_refused(&out, INVALID_INPUT, "invalid container id");
        }
    }
    assert!(!fx.dir.path().join("escape").exists());
    fx.assert_clean();
}
as_root_and_rootless!(RUNSBX, invalid_ids: invalid_ids_as_root, invalid_ids_rootless);

fn duplicate_id(fx: Fixture) {
    let b = fx.bundle("b", &["sleep", "1000"], |_| {});
    fx.run(["create", "--bundle", b.to_str().unwrap(), "dup"])
        .ok();
    let pid = fx.run(["state", "dup"]).ok().json()["pid"].clone();
    for cmd in ["create", "run"] {
        let out = fx.run([cmd, "--bundle", b.to_str().unwrap(), "dup"]);
        assert_refused(&out, CONFLICT, "container `dup` already exists");
    }
    // The first container is untouched.
    let state = fx.run(["state", "dup"]).ok().json();
    assert_eq!(state["status"], "created");
    assert_eq!(state["pid"], pid);
    fx.run(["delete", "dup"]).ok();
    fx.assert_clean();
}
as_root_and_rootless!(RUNSBX, duplicate_id: duplicate_id_as_root, duplicate_id_rootless);

fn bad_bundles(fx: Fixture) {
    let good = fx.bundle("good", &["true"], |_| {});
    let make = |name: &str, config: Option<&str>| {
        let dir = fx.dir.path().join(name);
        fs::create_dir_all(&dir).unwrap();
        if let Some(text) = config {
            fs::write(dir.join("config.json"), text).unwrap();
        }
        dir
    };
    let good_config = fs::read_to_string(good.join("config.json")).unwrap();
    let missing_rootfs =
        good_config.replace(kit::rootfs().to_str().unwrap(), "/nonexistent/rootfs");
    let cases = [
        (make("noconfig", None), "config.json is missing"),
        (
            make(
                "malformed",
                Some("{\"ociVersion\": \"1.0.2\", \"process\": "),
            ),
            "config.json is not a valid OCI runtime spec",
        ),
        (
            make("notjson", Some("hello")),
            "config.json is not a valid OCI runtime spec",
        ),
        (
            make("norootfs", Some(&missing_rootfs)),
            "/nonexistent/rootfs",
        ),
        (
            fx.dir.path().join("no-such-bundle"),
            "pass an existing directory",
        ),
    ];
    for (dir, needle) in &cases {
        for cmd in ["create", "run"] {
            let out = fx.run([cmd, "--bundle", dir.to_str().unwrap(), "c1"]);
            assert_refused(&out, INVALID_INPUT, needle);
        }
    }
    fx.assert_clean();
}
as_root_and_rootless!(RUNSBX, bad_bundles: bad_bundles_as_root, bad_bundles_rootless);

fn unknown_container(fx: Fixture) {
    for args in [
        &["state", "ghost"][..],
        &["start", "ghost"],
        &["kill", "ghost", "TERM"],
        &["delete", "ghost"],
        &["exec", "ghost", "true"],
        &["ps", "ghost"],
        &["pause", "ghost"],
        &["events", "--stats", "ghost"],
    ] {
        let out = fx.run(args);
        if fx.rootless() && matches!(args[0], "pause") {
            // Refused before the lookup: rootless has no freezer here.
            assert_eq!(out.code, 6, "{out:?}");
            continue;
        }
        assert_refused(&out, NOT_FOUND, "container `ghost` does not exist");
    }
    // `delete --force` of an unknown id succeeds, as engines expect.
    fx.run(["delete", "--force", "ghost"]).ok();
    fx.assert_clean();
}
as_root_and_rootless!(RUNSBX, unknown_container: unknown_container_as_root, unknown_container_rootless);

/// runc's `checkpoint` is refused as unsupported under its own name (and
/// liboci-cli's `checkpointt`), whatever its options, before any state is
/// looked at; `--help` lists runc's spelling only.
fn checkpoint_is_unsupported(fx: Fixture) {
    let b = fx.bundle("b", &["sleep", "1000"], |_| {});
    fx.run(["run", "--detach", "--bundle", b.to_str().unwrap(), "c1"])
        .ok();
    for args in [
        &["checkpoint", "c1"][..],
        &[
            "checkpoint",
            "--image-path",
            "/nonexistent",
            "--leave-running",
            "c1",
        ],
        &["checkpoint", "ghost"],
        &["checkpointt", "c1"],
    ] {
        let out = fx.run(args);
        assert_refused(
            &out,
            UNSUPPORTED,
            "runsbx does not checkpoint or restore a sandbox",
        );
        assert_eq!(out.stderr.lines().count(), 1, "the cause, once: {out:?}");
    }
    // The container was not touched.
    let state = fx.run(["state", "c1"]).ok();
    assert!(state.stdout.contains("\"running\""), "{state:?}");
    let help = fx.run(["--help"]).ok();
    assert!(help.stdout.contains("\n  checkpoint "), "{help:?}");
    assert!(!help.stdout.contains("checkpointt"), "{help:?}");
    fx.run(["delete", "--force", "c1"]).ok();
    fx.assert_clean();
}
as_root_and_rootless!(RUNSBX, checkpoint_is_unsupported: checkpoint_unsupported_as_root, checkpoint_unsupported_rootless);

fn bad_signal(fx: Fixture) {
    let b = fx.bundle("b", &["sleep", "1000"], |_| {});
    fx.run(["run", "--detach", "--bundle", b.to_str().unwrap(), "c1"])
        .ok();
    for sig in ["NOPE", "0", "999"] {
        let out = fx.run(["kill", "c1", sig]);
        assert_refused(&out, INVALID_INPUT, "not a signal");
    }
    fx.run(["delete", "--force", "c1"]).ok();
    fx.assert_clean();
}
as_root_and_rootless!(RUNSBX, bad_signal: bad_signal_as_root, bad_signal_rootless);

/// A failure inside the container's own setup reaches the user with its
/// cause, and the half-made container is gone.
fn setup_failure_has_its_cause(fx: Fixture) {
    let b = fx.bundle("nobin", &["/no/such/program"], |_| {});
    let out = fx.run(["run", "--bundle", b.to_str().unwrap(), "c1"]);
    assert_ne!(out.code, 0, "{out:?}");
    assert!(
        out.stderr.contains("/no/such/program"),
        "cause missing: {out:?}"
    );
    fx.assert_clean();

    let b = fx.bundle("relcwd", &["true"], |c| {
        c["process"]["cwd"] = "relative/cwd".into()
    });
    let out = fx.run(["create", "--bundle", b.to_str().unwrap(), "c2"]);
    assert_refused(
        &out,
        INVALID_INPUT,
        "process.cwd \"relative/cwd\" is not an absolute path",
    );
    fx.assert_clean();

    let b = fx.bundle("nocwd", &["true"], |c| {
        c["process"]["cwd"] = "/no/such/cwd".into()
    });
    let out = fx.run(["create", "--bundle", b.to_str().unwrap(), "c2"]);
    assert_ne!(out.code, 0, "{out:?}");
    assert!(
        out.stderr.contains("chdir") && out.stderr.contains("ENOENT"),
        "cause missing: {out:?}"
    );
    fx.assert_clean();
}
as_root_and_rootless!(RUNSBX, setup_failure_has_its_cause: setup_failure_as_root, setup_failure_rootless);

/// A state root that someone else could write to is refused.
#[test]
fn state_root_writable_by_others_is_refused() {
    if !kit::is_root() {
        skip!("needs root to make the directory");
    }
    let fx = Fixture::new(RUNSBX, kit::Who::Root);
    fs::create_dir(&fx.state).unwrap();
    use std::os::unix::fs::PermissionsExt;
    fs::set_permissions(&fx.state, fs::Permissions::from_mode(0o777)).unwrap();
    let out = fx.run(["list"]);
    assert_refused(&out, INVALID_INPUT, "writable by others");
}
