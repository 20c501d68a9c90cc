//! `runsbx image`: importing what podman saves, as root and rootless;
//! refusals that name the problem and leave the store as it was.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::fs;
use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::process::Command;

use runsbx_runtime::exit;
use runsbx_testkit::{self as kit, as_root_and_rootless, skip, Fixture, Out, Who};
use serde_json::Value;

/// The runsbx under test.
const RUNSBX: &str = env!("CARGO_BIN_EXE_runsbx");

/// Archives of the busybox test rootfs as `podman save` writes them, made
/// with podman's own storage under `dir`: (docker-archive, oci-archive).
fn podman_archives(dir: &Path) -> Option<(PathBuf, PathBuf)> {
    if !kit::have("podman") {
        return None;
    }
    let tar = kit::rootfs_tar(dir);
    let podman = |args: &[&str]| {
        let out = Out::of(
            Command::new("podman")
                .arg("--root")
                .arg(dir.join("storage"))
                .arg("--runroot")
                .arg(dir.join("runroot"))
                .arg("--tmpdir")
                .arg(dir.join("podman-tmp"))
                .args(["--storage-driver", "vfs", "--events-backend", "file"])
                .args(["--cgroup-manager", "cgroupfs"])
                .args(args)
                .env_remove("CONTAINERS_CONF")
                .output()
                .unwrap(),
        );
        assert_eq!(out.code, 0, "podman {args:?}: {out:?}");
    };
    let image = "localhost/runsbx-img:test";
    podman(&["import", tar.to_str().unwrap(), image]);
    let docker = dir.join("busybox.docker.tar");
    let oci = dir.join("busybox.oci.tar");
    for (format, file) in [("docker-archive", &docker), ("oci-archive", &oci)] {
        podman(&[
            "save",
            "--format",
            format,
            "-o",
            file.to_str().unwrap(),
            image,
        ]);
        fs::set_permissions(file, fs::Permissions::from_mode(0o644)).unwrap();
    }
    let _ = fs::remove_dir_all(dir.join("storage"));
    Some((docker, oci))
}

/// A data directory the fixture's user owns.
fn data_dir(fx: &Fixture) -> PathBuf {
    let dir = fx.dir.path().join("data");
    fs::create_dir(&dir).unwrap();
    if let Who::User(u) = &fx.who {
        nix::unistd::chown(&dir, Some(u.uid.into()), Some(u.gid.into())).unwrap();
    }
    dir
}

fn image(fx: &Fixture, data: &Path, args: &[&str]) -> Out {
    let mut all = vec!["image"];
    all.extend_from_slice(args);
    all.extend_from_slice(&["--data-dir", data.to_str().unwrap()]);
    fx.run(all)
}

fn names(fx: &Fixture, data: &Path) -> Vec<String> {
    let list = image(fx, data, &["ls", "--json"]).ok().json();
    list.as_array()
        .unwrap()
        .iter()
        .map(|i| i["name"].as_str().unwrap().to_owned())
        .collect()
}

/// What is in the store besides its lock file.
fn store_contents(data: &Path) -> Vec<String> {
    let mut left: Vec<String> = fs::read_dir(data.join("images"))
        .map(|entries| {
            entries
                .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
                .filter(|n| n != ".lock")
                .collect()
        })
        .unwrap_or_default();
    left.sort();
    left
}

fn import_podman_archives(fx: Fixture) {
    let Some((docker, oci)) = podman_archives(fx.dir.path()) else {
        skip!("podman is not installed (apt-get install podman)");
    };
    let data = data_dir(&fx);
    let (docker, oci) = (docker.to_str().unwrap(), oci.to_str().unwrap());

    // The docker-archive, under the name it carries.
    let out = image(&fx, &data, &["import", docker]).ok();
    assert_eq!(out.stdout, "runsbx-img\n");
    // The oci-archive carries the same name: refused without --replace.
    let out = image(&fx, &data, &["import", oci]);
    assert_eq!(out.code, exit::CONFLICT, "{out:?}");
    assert!(
        out.stderr.contains("image `runsbx-img` already exists")
            && out.stderr.contains("--replace"),
        "{out:?}"
    );
    image(&fx, &data, &["import", oci, "--name", "t1"]).ok();

    let list = image(&fx, &data, &["ls", "--json"]).ok().json();
    let t1 = list
        .as_array()
        .unwrap()
        .iter()
        .find(|i| i["name"] == "t1")
        .unwrap_or_else(|| panic!("t1 not listed: {list}"));
    assert!(t1["size"].as_u64().unwrap() > 100_000, "{t1}");
    assert!(
        t1["source"].as_str().unwrap().starts_with("oci-archive "),
        "{t1}"
    );
    let rootfs = PathBuf::from(t1["path"].as_str().unwrap()).join("rootfs");
    let busybox = fs::symlink_metadata(rootfs.join("bin/busybox")).unwrap();
    assert!(busybox.is_file());
    assert_eq!(busybox.mode() & 0o111, 0o111, "not executable");
    assert!(fs::symlink_metadata(rootfs.join("bin/sh"))
        .unwrap()
        .is_symlink());
    // Owners as in the archive for root; the caller's when rootless.
    let owner = match &fx.who {
        Who::Root => 0,
        Who::User(u) => u.uid,
    };
    assert_eq!(busybox.uid(), owner);

    // The imported images run: `runsbx call` on each.
    for name in ["runsbx-img", "t1"] {
        let out = fx.run([
            "call",
            "--json",
            "--image",
            name,
            "--data-dir",
            data.to_str().unwrap(),
            "--",
            "sh",
            "-c",
            "echo ran on $0; ls /bin/busybox",
            name,
        ]);
        let r = out.json();
        assert_eq!(r["exit_code"], 0, "{out:?}");
        assert_eq!(r["image"], name);
        assert_eq!(
            r["stdout"]["data"],
            format!("ran on {name}\n/bin/busybox\n"),
            "{out:?}"
        );
    }

    // An image a call runs on is not removed from under it.
    let mut running = fx.cmd([
        "call",
        "--image",
        "t1",
        "--data-dir",
        data.to_str().unwrap(),
        "--",
        "sh",
        "-c",
        "echo up; sleep 3",
    ]);
    running
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::null());
    let mut child = kit::spawn(&mut running);
    let mut line = String::new();
    std::io::BufRead::read_line(
        &mut std::io::BufReader::new(child.stdout.as_mut().unwrap()),
        &mut line,
    )
    .unwrap();
    assert_eq!(line, "up\n");
    let out = image(&fx, &data, &["rm", "t1"]);
    assert_eq!(out.code, exit::CONFLICT, "{out:?}");
    assert!(out.stderr.contains("image `t1` is in use"), "{out:?}");
    assert!(child.wait().unwrap().success());

    // --replace swaps the image in.
    image(&fx, &data, &["import", docker, "--name", "t1", "--replace"]).ok();
    let list = image(&fx, &data, &["ls", "--json"]).ok().json();
    let sources: Vec<&Value> = list
        .as_array()
        .unwrap()
        .iter()
        .map(|i| &i["source"])
        .collect();
    assert!(
        sources
            .iter()
            .all(|s| s.as_str().unwrap().starts_with("docker-archive ")),
        "{list}"
    );
    assert_eq!(store_contents(&data), ["runsbx-img", "t1"]);

    let out = image(&fx, &data, &["rm", "t1", "runsbx-img"]).ok();
    assert_eq!(out.stdout, "t1\nrunsbx-img\n");
    assert_eq!(names(&fx, &data), Vec::<String>::new());
    assert_eq!(store_contents(&data), Vec::<String>::new());
}

as_root_and_rootless!(RUNSBX, import_podman_archives: import_as_root, import_rootless);

#[test]
fn bad_inputs_are_refused_and_leave_nothing() {
    if !kit::is_root() {
        skip!("needs root to write the crafted archives' owners");
    }
    let fx = Fixture::new(RUNSBX, Who::Root);
    let data = fx.dir.path().join("data");
    let dir = fx.dir.path();
    let check = |args: &[&str], code: i32, says: &[&str]| {
        let out = image(&fx, &data, args);
        assert_eq!(out.code, code, "{args:?}: {out:?}");
        for s in says {
            assert!(out.stderr.contains(s), "{args:?}: {s:?} missing: {out:?}");
        }
        assert_eq!(store_contents(&data), Vec::<String>::new(), "{args:?}");
    };

    let missing = dir.join("missing.tar");
    check(
        &["import", missing.to_str().unwrap(), "--name", "x"],
        exit::INVALID_INPUT,
        &["missing.tar", "no such file"],
    );
    let garbage = dir.join("garbage.tar");
    fs::write(&garbage, "this is not an image archive\n".repeat(100)).unwrap();
    check(
        &["import", garbage.to_str().unwrap(), "--name", "x"],
        exit::INVALID_INPUT,
        &["garbage.tar", "not a docker-archive or oci-archive"],
    );
    for bad in ["Bad", "../x", ".hidden", "a/b"] {
        check(
            &["import", garbage.to_str().unwrap(), "--name", bad],
            exit::INVALID_INPUT,
            &["image name", "[a-z0-9._-]"],
        );
    }
    check(
        &["rm", "nosuch"],
        exit::NOT_FOUND,
        &["image `nosuch` not found", "runsbx image ls"],
    );

    // A docker-archive whose layer writes outside the root: refused half
    // way through, with nothing of it left in the store or outside.
    let escape = dir.join("escape.tar");
    craft_archive(&escape, &["ok-file", "../../escaped"]);
    check(
        &["import", escape.to_str().unwrap(), "--name", "x"],
        exit::INVALID_INPUT,
        &["escaped", "`..`"],
    );
    assert!(!data.join("escaped").exists() && !data.join("images/escaped").exists());
    // Without --name and without a RepoTag: it says to pass --name.
    let nameless = dir.join("nameless.tar");
    craft_archive(&nameless, &["ok-file"]);
    check(
        &["import", nameless.to_str().unwrap()],
        exit::INVALID_INPUT,
        &["--name"],
    );
    // And the same archive imports with a name.
    image(
        &fx,
        &data,
        &["import", nameless.to_str().unwrap(), "--name", "ok"],
    )
    .ok();
    assert_eq!(store_contents(&data), ["ok"]);
}

#[test]
fn build_needs_root_and_says_so() {
    if !kit::is_root() {
        skip!("needs root to switch to the test user");
    }
    let Some(user) = kit::test_user() else {
        skip!("no test user (hack/test.sh creates `runsbx-test`)");
    };
    let fx = Fixture::new(RUNSBX, Who::User(user));
    let data = data_dir(&fx);
    let out = image(&fx, &data, &["build", "python"]);
    assert_eq!(out.code, exit::UNSUPPORTED, "{out:?}");
    assert!(
        out.stderr.contains("sudo runsbx image build python")
            && out.stderr.contains("runsbx image import"),
        "{out:?}"
    );
    let out = image(&fx, &data, &["build", "nosuch"]);
    assert_eq!(out.code, exit::INVALID_INPUT, "{out:?}");
    assert_eq!(store_contents(&data), Vec::<String>::new());
}

/// A docker-archive with one layer holding a file at each of `paths`
/// (written with Python's tarfile: tar(1) will not store `..` names), and
/// no RepoTags.
fn craft_archive(out: &Path, paths: &[&str]) {
    let script = r#"
import io, json, sys, tarfile
out, paths = sys.argv[1], sys.argv[2:]
def member(tf, name, data):
    info = tarfile.TarInfo(name)
    info.size = len(data)
    tf.addfile(info, io.BytesIO(data))
layer = io.BytesIO()
with tarfile.open(fileobj=layer, mode="w", format=tarfile.GNU_FORMAT) as tf:
    for p in paths:
        member(tf, p, b"x")
config = json.dumps({"architecture": "amd64", "os": "linux",
                     "config": {"Cmd": ["sh"]}}).encode()
manifest = json.dumps([{"Config": "config.json", "Layers": ["layer.tar"]}]).encode()
with tarfile.open(out, mode="w") as tf:
    member(tf, "manifest.json", manifest)
    member(tf, "config.json", config)
    member(tf, "layer.tar", layer.getvalue())
"#;
    let out = Out::of(
        Command::new("python3")
            .arg("-c")
            .arg(script)
            .arg(out)
            .args(paths)
            .output()
            .expect("python3 is installed (apt-get install python3)"),
    );
    assert_eq!(out.code, 0, "{out:?}");
}
