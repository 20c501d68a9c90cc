//! A memory limit bounds swap too. On a host with swap, a sandbox whose
//! memory cgroup limited memory alone paged out past its limit: a call
//! with `--memory 64M` kept 200 MiB. As root (rootless on a cgroup v1 host
//! has no cgroups). A host without swap gets a swap file for the life of
//! this test, which is the only one in its binary: no other test runs
//! while the host swaps.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::path::{Path, PathBuf};
use std::process::Command;

use runsbx_testkit::{self as kit, skip, Fixture, Who};

/// The runsbx under test.
const RUNSBX: &str = env!("CARGO_BIN_EXE_runsbx");

/// A swap file made and enabled for the test, disabled and removed when
/// dropped.
struct SwapFile(PathBuf);

impl SwapFile {
    fn enable(path: &Path) -> Result<Self, String> {
        let run = |cmd: &mut Command| {
            let out = cmd.output().map_err(|e| format!("{cmd:?}: {e}"))?;
            if out.status.success() {
                Ok(())
            } else {
                Err(format!("{cmd:?}: {}", String::from_utf8_lossy(&out.stderr)))
            }
        };
        run(Command::new("fallocate").args(["-l", "256M"]).arg(path))?;
        // Dropped from here on: whatever fails, the file goes.
        let swap = Self(path.to_owned());
        std::fs::set_permissions(path, std::os::unix::fs::PermissionsExt::from_mode(0o600))
            .map_err(|e| format!("chmod {path:?}: {e}"))?;
        run(Command::new("mkswap").arg(path))?;
        run(Command::new("swapon").arg(path))?;
        Ok(swap)
    }
}

impl Drop for SwapFile {
    fn drop(&mut self) {
        let _ = Command::new("swapoff").arg(&self.0).status();
        let _ = std::fs::remove_file(&self.0);
    }
}

fn host_swaps() -> bool {
    std::fs::read_to_string("/proc/swaps").is_ok_and(|s| s.lines().count() > 1)
}

#[test]
fn a_memory_balloon_cannot_page_out_past_its_limit() {
    if !kit::is_root() {
        skip!("a_memory_balloon_cannot_page_out_past_its_limit: needs root");
    }
    if !kit::have_python_image() {
        skip!("no `python` image: run `sudo runsbx image build python`");
    }
    if !Path::new("/sys/fs/cgroup/memory/memory.memsw.limit_in_bytes").exists()
        && !Path::new("/sys/fs/cgroup/cgroup.controllers").exists()
    {
        skip!(
            "a_memory_balloon_cannot_page_out_past_its_limit: this kernel keeps no swap accounts"
        );
    }
    let fx = Fixture::new(RUNSBX, Who::Root);
    // On the disk, not in a tmpfs: the kernel swaps to neither tmpfs nor
    // overlayfs files.
    let _swap = if host_swaps() {
        None
    } else {
        let path = Path::new("/var/tmp").join(format!("runsbx-test-swap-{}", std::process::id()));
        match SwapFile::enable(&path) {
            Ok(swap) => Some(swap),
            Err(e) => skip!("a_memory_balloon_cannot_page_out_past_its_limit: no swap: {e}"),
        }
    };
    assert!(host_swaps(), "{:?}", std::fs::read_to_string("/proc/swaps"));
    let r = kit::assert_balloon_stopped(&fx);
    let limits = r["attestation"]
        .as_array()
        .unwrap()
        .iter()
        .find(|l| l["layer"] == "cgroup_limits")
        .unwrap();
    assert!(
        limits["detail"].as_str().unwrap().contains("swap included"),
        "{limits}"
    );
    fx.assert_clean();
}
