#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use super::*;

#[test]
fn image_names() {
    for good in ["python", "a", "busybox-1.36", "my_tool.v2", "9lives"] {
        assert!(validate_name(good).is_ok(), "{good:?} was refused");
    }
    assert!(validate_name(&"a".repeat(MAX_NAME_LEN)).is_ok());
    let long = "a".repeat(MAX_NAME_LEN + 1);
    for bad in [
        "", ".", "..", ".hidden", "-x", "_x", "Python", "a/b", "../x", "a b", "é", "x:tag", &long,
    ] {
        let err = validate_name(bad).expect_err(bad);
        assert!(
            matches!(err, ImageError::Invalid { .. }),
            "{bad:?}: {err:?}"
        );
        assert!(err.to_string().contains("[a-z0-9._-]"), "{err}");
    }
}

/// A store in a temporary directory, with a system store there too.
fn store(dir: &Path) -> ImageStore {
    ImageStore {
        images: dir.join("user/images"),
        system: Some(dir.join("system/images")),
        rootless: false,
    }
}

/// An image directory as import or build leaves it.
fn fake_image(images: &Path, name: &str, cmd: &str) {
    let dir = images.join(name);
    fs::create_dir_all(dir.join("rootfs/bin")).unwrap();
    let json = ImageJson {
        name: name.to_owned(),
        source: "test".to_owned(),
        created: Utc::now(),
        size: 1,
        config: ImageConfig {
            cmd: vec![cmd.to_owned()],
            ..ImageConfig::default()
        },
    };
    fs::write(dir.join(IMAGE_JSON), serde_json::to_vec(&json).unwrap()).unwrap();
}

#[test]
fn unknown_image_names_the_dirs_searched_and_the_fix() {
    let tmp = tempfile::tempdir().unwrap();
    let s = store(tmp.path());
    let err = s.resolve("nope").expect_err("found");
    assert!(matches!(err, ImageError::NotFound { .. }), "{err:?}");
    let msg = err.to_string();
    for part in [
        "`nope`",
        "user/images",
        "system/images",
        "runsbx image ls",
        "sudo runsbx image build python",
        "runsbx image import FILE",
    ] {
        assert!(msg.contains(part), "{part:?} missing: {msg}");
    }
}

#[test]
fn own_images_come_before_the_system_store() {
    let tmp = tempfile::tempdir().unwrap();
    let s = store(tmp.path());
    let system = tmp.path().join("system/images");
    fake_image(&system, "python", "system");
    fake_image(&system, "other", "x");
    let image = s.resolve("python").unwrap();
    assert_eq!(image.config.cmd, ["system"]);
    assert_eq!(image.rootfs, system.join("python/rootfs"));

    fake_image(&s.images, "python", "own");
    assert_eq!(s.resolve("python").unwrap().config.cmd, ["own"]);
    let names: Vec<_> = s.list().unwrap().into_iter().map(|i| i.name).collect();
    assert_eq!(names, ["other", "python"]);

    // rm only touches the user's own store, and says so.
    s.remove("python").unwrap();
    assert_eq!(s.resolve("python").unwrap().config.cmd, ["system"]);
    let err = s
        .remove("python")
        .expect_err("removed from the system store");
    assert!(
        err.to_string().contains("sudo runsbx image rm python"),
        "{err}"
    );
    assert!(system.join("python").exists());
}

#[test]
fn remove_leaves_nothing_and_unknown_is_not_found() {
    let tmp = tempfile::tempdir().unwrap();
    let s = store(tmp.path());
    s.prepare().unwrap();
    fake_image(&s.images, "t1", "x");
    s.remove("t1").unwrap();
    let left: Vec<_> = fs::read_dir(&s.images)
        .unwrap()
        .map(|e| e.unwrap().file_name())
        .collect();
    assert_eq!(left, [LOCK_FILE]);
    let err = s.remove("t1").expect_err("removed twice");
    assert!(matches!(err, ImageError::NotFound { .. }), "{err:?}");
}

#[test]
fn a_broken_image_says_how_to_fix_it() {
    let tmp = tempfile::tempdir().unwrap();
    let s = store(tmp.path());
    fs::create_dir_all(s.images.join("half")).unwrap();
    let err = s.resolve("half").expect_err("resolved");
    assert!(err.to_string().contains("runsbx image rm"), "{err}");
    // ls skips it instead of failing.
    assert!(s.list().unwrap().is_empty());
}

#[test]
fn staging_is_removed_unless_committed() {
    let tmp = tempfile::tempdir().unwrap();
    let s = store(tmp.path());
    s.prepare().unwrap();
    {
        let staging = Staging::create(&s.images, "t1").unwrap();
        fs::write(staging.rootfs().join("f"), "x").unwrap();
    }
    assert!(s.list().unwrap().is_empty());
    assert_eq!(fs::read_dir(&s.images).unwrap().count(), 0);

    let staging = Staging::create(&s.images, "t1").unwrap();
    fs::write(staging.rootfs().join("f"), "old").unwrap();
    staging
        .commit("one".into(), ImageConfig::default(), false)
        .unwrap();
    let staging = Staging::create(&s.images, "t1").unwrap();
    let err = staging
        .commit("two".into(), ImageConfig::default(), false)
        .expect_err("replaced without replace");
    assert!(matches!(err, ImageError::Exists { .. }), "{err:?}");
    let staging = Staging::create(&s.images, "t1").unwrap();
    fs::write(staging.rootfs().join("f"), "new").unwrap();
    let info = staging
        .commit("two".into(), ImageConfig::default(), true)
        .unwrap();
    assert_eq!(info.source, "two");
    assert_eq!(info.size, 3);
    let rootfs = s.resolve("t1").unwrap().rootfs;
    assert_eq!(fs::read_to_string(rootfs.join("f")).unwrap(), "new");
    let left: Vec<_> = fs::read_dir(&s.images)
        .unwrap()
        .map(|e| e.unwrap().file_name())
        .collect();
    assert_eq!(left, ["t1"], "the old image or a staging dir was left");
}

#[test]
fn stale_staging_of_dead_processes_is_swept() {
    let tmp = tempfile::tempdir().unwrap();
    let s = store(tmp.path());
    s.prepare().unwrap();
    // pid_max is at most 2^22: no process has this pid.
    let dead = s.images.join(".tmp-t1-99999999");
    let alive = s.images.join(format!(".tmp-t2-{}", std::process::id()));
    fs::create_dir_all(dead.join("rootfs")).unwrap();
    fs::create_dir_all(&alive).unwrap();
    sweep_stale(&s.images);
    assert!(!dead.exists());
    assert!(alive.exists());
}
