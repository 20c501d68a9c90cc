//! The runsbx under test and the root filesystems the tests run: busybox
//! with the in-sandbox probe (tests/probe.c), the same plus the host's
//! Python, a pause program for pods, and docker-archives of them for the
//! engines (no registry is reachable).

use std::fs;
use std::os::unix::fs::{symlink, PermissionsExt};
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::OnceLock;

use crate::command::{run_ok, Out};

/// The repository's `tests/` directory: the probe, the pause program and
/// the Python rootfs script.
fn sources() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../../tests")
}

/// A directory every user can reach, for what the unprivileged test user
/// must read or run: the checkout may sit under a private home. hack/test.sh
/// removes these after the run.
fn shared_dir() -> &'static Path {
    static DIR: OnceLock<PathBuf> = OnceLock::new();
    DIR.get_or_init(|| {
        let dir = PathBuf::from(format!("/tmp/runsbx-tests/{}", std::process::id()));
        fs::create_dir_all(&dir).unwrap();
        for d in [Path::new("/tmp/runsbx-tests"), &dir] {
            fs::set_permissions(d, fs::Permissions::from_mode(0o755)).unwrap();
        }
        dir
    })
}

/// The runsbx under test: a copy of `built` (the binary cargo built,
/// `env!("CARGO_BIN_EXE_runsbx")`) in the shared directory, made once, so
/// that the unprivileged user can run it too.
pub fn runsbx_copy(built: &Path) -> PathBuf {
    static BIN: OnceLock<(PathBuf, PathBuf)> = OnceLock::new();
    let (from, copy) = BIN.get_or_init(|| {
        let copy = shared_dir().join("runsbx");
        let tmp = shared_dir().join(format!("runsbx.{:?}", std::thread::current().id()));
        fs::copy(built, &tmp).unwrap();
        fs::set_permissions(&tmp, fs::Permissions::from_mode(0o755)).unwrap();
        fs::rename(&tmp, &copy).unwrap();
        (built.to_owned(), copy)
    });
    assert_eq!(from, built, "one runsbx under test per test binary");
    copy.clone()
}

/// The busybox root filesystem shared by every test of this binary
/// (read-only to them), with the probe.
pub fn rootfs() -> &'static Path {
    static ROOTFS: OnceLock<PathBuf> = OnceLock::new();
    ROOTFS.get_or_init(|| {
        let dir = shared_dir().join("rootfs");
        let _ = fs::remove_dir_all(&dir);
        busybox_rootfs(&dir);
        fs::set_permissions(&dir, fs::Permissions::from_mode(0o755)).unwrap();
        dir
    })
}

/// Builds a busybox root filesystem at `root`: busybox-static and its
/// applets in /bin, the in-sandbox probe (tests/probe.c, static so that it
/// runs there) as /bin/probe, root and nobody in /etc/passwd.
fn busybox_rootfs(root: &Path) {
    let bin = root.join("bin");
    fs::create_dir_all(&bin).unwrap();
    let busybox = ["/bin/busybox", "/usr/bin/busybox"]
        .into_iter()
        .find(|p| Path::new(p).exists())
        .expect("busybox-static is installed (apt-get install busybox-static)");
    fs::copy(busybox, bin.join("busybox")).unwrap();
    // The original, not the copy: another test thread forking while the
    // copy's fd is open would make exec of the copy fail with ETXTBSY.
    let list = Command::new(busybox).arg("--list").output().unwrap();
    for applet in String::from_utf8_lossy(&list.stdout).lines() {
        if applet != "busybox" {
            let _ = symlink("busybox", bin.join(applet));
        }
    }
    for d in [
        "proc",
        "sys",
        "dev",
        "tmp",
        "etc",
        "root",
        "workspace",
        "var/log",
    ] {
        fs::create_dir_all(root.join(d)).unwrap();
    }
    gcc_static(&sources().join("probe.c"), &bin.join("probe"));
    fs::write(
        root.join("etc/passwd"),
        "root:x:0:0:root:/root:/bin/sh\nnobody:x:65534:65534:nobody:/:/bin/sh\n",
    )
    .unwrap();
    fs::write(root.join("etc/group"), "root:x:0:\nnobody:x:65534:\n").unwrap();
}

/// The busybox rootfs plus the host's Python 3, pip and two coreutils
/// (tests/python-rootfs.sh), shared by the tests that need real programs.
pub fn python_rootfs() -> &'static Path {
    static ROOTFS: OnceLock<PathBuf> = OnceLock::new();
    ROOTFS.get_or_init(|| {
        let dir = shared_dir().join("python-rootfs");
        let script = sources().join("python-rootfs.sh");
        let out = Out::of(
            Command::new("bash")
                .arg(&script)
                .arg(rootfs())
                .arg(&dir)
                .output()
                .unwrap(),
        );
        assert_eq!(out.code, 0, "{script:?}: {out:?}");
        dir
    })
}

/// Whether the system image `python` is there (hack/test.sh builds it with
/// `runsbx image build python` when it is missing).
pub fn have_python_image() -> bool {
    Path::new("/var/lib/runsbx/images/python/rootfs").is_dir()
}

/// A tar of the busybox rootfs in `dir`, readable by everyone, as
/// `podman import` takes it.
pub fn rootfs_tar(dir: &Path) -> PathBuf {
    let tar = dir.join("busybox.tar");
    let out = Out::of(
        Command::new("tar")
            .arg("-C")
            .arg(rootfs())
            .arg("-cf")
            .arg(&tar)
            .arg(".")
            .output()
            .unwrap(),
    );
    assert_eq!(out.code, 0, "{out:?}");
    fs::set_permissions(&tar, fs::Permissions::from_mode(0o644)).unwrap();
    tar
}

/// A root filesystem holding only `/pause` (tests/pause.c), in `dir`: a
/// pod's sandbox container.
pub fn pause_rootfs(dir: &Path) -> PathBuf {
    let root = dir.join("pause-rootfs");
    fs::create_dir_all(&root).unwrap();
    gcc_static(&sources().join("pause.c"), &root.join("pause"));
    root
}

fn gcc_static(source: &Path, out: &Path) {
    let built = Command::new("gcc")
        .args(["-static", "-O2", "-o"])
        .arg(out)
        .arg(source)
        .status()
        .expect("gcc is installed (apt-get install build-essential)");
    assert!(built.success(), "building {source:?} failed");
}

/// A docker-archive (what `docker save` writes, and what `docker load` and
/// `ctr images import` read) of `rootfs` as one layer, tagged `tag`, whose
/// command is `cmd`.
pub fn docker_archive(rootfs: &Path, tag: &str, cmd: &[&str], out: &Path) {
    let work = tempfile::tempdir().unwrap();
    let layer = work.path().join("layer.tar");
    run_ok(
        Command::new("tar")
            .arg("-C")
            .arg(rootfs)
            .arg("-cf")
            .arg(&layer)
            .arg("."),
    );
    let sum = run_ok(Command::new("sha256sum").arg(&layer));
    let digest = sum.split_whitespace().next().unwrap().to_owned();
    let config = serde_json::json!({
        "architecture": "amd64",
        "os": "linux",
        "config": {
            "Cmd": cmd,
            "Env": ["PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"],
        },
        "rootfs": { "type": "layers", "diff_ids": [format!("sha256:{digest}")] },
    });
    fs::write(work.path().join("config.json"), config.to_string()).unwrap();
    let manifest = serde_json::json!([{
        "Config": "config.json",
        "RepoTags": [tag],
        "Layers": ["layer.tar"],
    }]);
    fs::write(work.path().join("manifest.json"), manifest.to_string()).unwrap();
    run_ok(
        Command::new("tar")
            .arg("-C")
            .arg(work.path())
            .arg("-cf")
            .arg(out)
            .args(["manifest.json", "config.json", "layer.tar"]),
    );
}
