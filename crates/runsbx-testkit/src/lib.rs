//! What every integration test of runsbx shares (those of
//! `crates/runsbx/tests/` and the engine tests in
//! `crates/runsbx/tests/engines/`): the runsbx under test, a busybox root
//! filesystem with the in-sandbox probe, fixtures that run runsbx as root
//! or as the unprivileged test user and check that nothing is left behind,
//! loud skips, waiting with a deadline, the checks every way into a
//! sandbox is held to, and engine daemons (containerd, dockerd) started in
//! namespaces of their own.
//!
//! The runsbx under test is named by the caller: the test targets of the
//! `runsbx` package pass `env!("CARGO_BIN_EXE_runsbx")` to
//! [`Fixture::new`], [`as_root_and_rootless!`] and [`Daemon::prepare`].
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

mod command;
mod daemon;
mod entered;
mod fixture;
mod poll;
mod rootfs;

use std::process::{Command, Stdio};

pub use command::{output_via_files, output_within, run_ok, spawn, Lines, Out};
pub use daemon::Daemon;
pub use entered::{
    assert_entered, assert_entered_output, host_view, host_view_uid, pid_of_sleep, unique_mark,
    Canary, ENTERED_INIT, ENTERED_PROBE,
};
pub use fixture::{assert_hardened, host_uid_of, subordinate_uids, test_user, Fixture, User, Who};
pub use poll::{settle, wait_until, POLL};
pub use rootfs::{
    docker_archive, have_python_image, pause_rootfs, python_rootfs, rootfs, rootfs_tar, runsbx_copy,
};

/// An operator config in `dir` whose profile is `name`, with `profile`
/// (TOML) as that profile's file; its path, for `runsbx --config`.
pub fn operator_config(dir: &std::path::Path, name: &str, profile: &str) -> std::path::PathBuf {
    let profiles = dir.join(format!("{name}-profiles"));
    std::fs::create_dir_all(&profiles).unwrap();
    std::fs::write(profiles.join(format!("{name}.toml")), profile).unwrap();
    let config = dir.join(format!("{name}-config.toml"));
    std::fs::write(
        &config,
        format!(
            "profile = \"{name}\"\nprofiles_dir = {:?}\n",
            profiles.display().to_string()
        ),
    )
    .unwrap();
    config
}

/// Reports that a test, or the rest of it, cannot run here: a loud
/// `SKIP <reason>` on stderr. Under CI (`CI=true`) a skip is a failure,
/// since CI installs everything the tests need. [`skip!`] calls this and
/// returns.
pub fn skipped(reason: &str) {
    if std::env::var("CI").as_deref() == Ok("true") {
        panic!("SKIP is not allowed under CI: {reason}");
    }
    eprintln!("SKIP {reason}");
}

/// Skips the rest of the enclosing function (a test, or one check of it)
/// with a loud `SKIP <reason>`; under CI (`CI=true`) a skip is a failure.
#[macro_export]
macro_rules! skip {
    ($($arg:tt)*) => {{
        $crate::skipped(&format!($($arg)*));
        return;
    }};
}

/// Two tests of one body: `$root` runs `$body` with a [`Fixture`] as root,
/// `$rootless` as the unprivileged test user; `$bin` is the runsbx under
/// test (`env!("CARGO_BIN_EXE_runsbx")`).
#[macro_export]
macro_rules! as_root_and_rootless {
    ($bin:expr, $body:ident: $root:ident, $rootless:ident) => {
        #[test]
        fn $root() {
            if !$crate::is_root() {
                $crate::skip!("{}: needs root", stringify!($root));
            }
            $body($crate::Fixture::new($bin, $crate::Who::Root));
        }

        #[test]
        fn $rootless() {
            if !$crate::is_root() {
                $crate::skip!(
                    "{}: needs root to switch to the test user",
                    stringify!($rootless)
                );
            }
            let Some(user) = $crate::test_user() else {
                $crate::skip!(
                    "{}: no test user (hack/test.sh creates `runsbx-test`)",
                    stringify!($rootless)
                );
            };
            $body($crate::Fixture::new($bin, $crate::Who::User(user)));
        }
    };
}

/// A memory balloon: Python that touches 200 MiB, then prints `survived`.
const MEMORY_BALLOON: &str =
    "x = bytearray(200 << 20); x[::4096] = b'1' * len(x[::4096]); print('survived')";

/// Runs a 200 MiB memory balloon in a call of `fx` limited to 64M and
/// checks that the limit stopped it: the result says the limit was hit,
/// the command was killed (137) and never printed `survived`. As root (a
/// memory limit is a cgroup's), on the `python` image.
pub fn assert_balloon_stopped(fx: &Fixture) -> serde_json::Value {
    let out = fx.run([
        "call",
        "--json",
        "--memory",
        "64M",
        "--",
        "python3",
        "-c",
        MEMORY_BALLOON,
    ]);
    let r = out.json();
    assert_eq!(r["limits"]["memory_bytes"], 64 << 20, "{out:?}");
    assert_eq!(r["limits"]["memory_hit"], true, "{out:?}");
    assert_eq!(r["exit_code"], 137, "{out:?}");
    let stdout = r["stdout"]["data"]
        .as_str()
        .unwrap_or_else(|| panic!("no stdout in the result: {out:?}"));
    assert!(!stdout.contains("survived"), "{out:?}");
    r
}

pub fn is_root() -> bool {
    nix::unistd::Uid::effective().is_root()
}

/// Whether `cmd` is on the PATH.
pub fn have(cmd: &str) -> bool {
    Command::new("sh")
        .args(["-c", &format!("command -v {cmd}")])
        .stdout(Stdio::null())
        .status()
        .is_ok_and(|s| s.success())
}
