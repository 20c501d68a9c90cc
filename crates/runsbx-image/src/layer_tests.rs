#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::fs;
use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::path::Path;

use super::*;

/// One tar entry, written byte for byte: the tar crate's builder refuses
/// the names these tests need (`..`, absolute paths).
enum E<'a> {
    Dir(&'a str, u32),
    File(&'a str, &'a str, u32),
    Symlink(&'a str, &'a str),
    Hardlink(&'a str, &'a str),
    CharDev(&'a str),
}

fn layer(entries: &[E]) -> Vec<u8> {
    let mut b = tar::Builder::new(Vec::new());
    for e in entries {
        let mut h = tar::Header::new_ustar();
        let (name, kind, data, mode, link) = match e {
            E::Dir(n, m) => (*n, EntryType::Directory, "", *m, None),
            E::File(n, d, m) => (*n, EntryType::Regular, *d, *m, None),
            E::Symlink(n, t) => (*n, EntryType::Symlink, "", 0o777, Some(*t)),
            E::Hardlink(n, t) => (*n, EntryType::Link, "", 0o644, Some(*t)),
            E::CharDev(n) => (*n, EntryType::Char, "", 0o666, None),
        };
        h.as_old_mut().name[..name.len()].copy_from_slice(name.as_bytes());
        if let Some(t) = link {
            h.as_old_mut().linkname[..t.len()].copy_from_slice(t.as_bytes());
        }
        h.set_entry_type(kind);
        h.set_mode(mode);
        h.set_size(data.len() as u64);
        h.set_mtime(1_600_000_000);
        h.set_uid(0);
        h.set_gid(0);
        h.set_cksum();
        b.append(&h, data.as_bytes()).unwrap();
    }
    b.into_inner().unwrap()
}

struct Fixture {
    _dir: tempfile::TempDir,
    root: PathBuf,
    outside: PathBuf,
}

impl Fixture {
    fn new() -> Self {
        let dir = tempfile::tempdir().unwrap();
        let root = dir.path().join("rootfs");
        let outside = dir.path().join("outside");
        fs::create_dir(&root).unwrap();
        fs::create_dir(&outside).unwrap();
        fs::write(outside.join("secret"), "host").unwrap();
        Self {
            _dir: dir,
            root,
            outside,
        }
    }

    /// Applies the layers in order; the error of the first that fails.
    fn apply(&self, layers: &[Vec<u8>]) -> Result<Unpacker> {
        let mut u = Unpacker::new(&self.root, false)?;
        for (i, l) in layers.iter().enumerate() {
            u.apply(&l[..], &format!("layer {}", i + 1))?;
        }
        Ok(u)
    }

    fn has(&self, p: &str) -> bool {
        fs::symlink_metadata(self.root.join(p)).is_ok()
    }

    fn outside_untouched(&self) {
        let names: Vec<_> = fs::read_dir(&self.outside)
            .unwrap()
            .map(|e| e.unwrap().file_name())
            .collect();
        assert_eq!(names, ["secret"], "something was written outside the root");
        let secret = self.outside.join("secret");
        assert_eq!(fs::read_to_string(&secret).unwrap(), "host");
        assert_eq!(fs::metadata(&secret).unwrap().nlink(), 1, "hard-linked");
    }
}

#[test]
fn whiteouts_hide_lower_layers_only() {
    let fx = Fixture::new();
    let lower = layer(&[
        E::Dir("a/", 0o755),
        E::File("a/keep", "1", 0o644),
        E::File("a/gone", "1", 0o644),
        E::Dir("d/", 0o755),
        E::File("d/old", "1", 0o644),
        E::Dir("d/sub/", 0o755),
        E::File("d/sub/x", "1", 0o644),
        E::File("top", "1", 0o644),
    ]);
    let upper = layer(&[
        E::File("a/fresh", "2", 0o644),
        E::File("a/.wh.gone", "", 0o644),
        // A whiteout never hides an entry of its own layer.
        E::File("a/.wh.fresh", "", 0o644),
        E::Dir("d/", 0o755),
        // Listed before the opaque marker: still this layer's.
        E::File("d/new", "2", 0o644),
        E::File("d/.wh..wh..opq", "", 0o644),
        E::File("./.wh.top", "", 0o644),
        E::File(".wh.never-there", "", 0o644),
    ]);
    fx.apply(&[lower, upper]).unwrap().finish().unwrap();
    assert!(fx.has("a/keep"));
    assert!(!fx.has("a/gone"));
    assert!(fx.has("a/fresh"));
    assert!(fx.has("d/new"));
    assert!(!fx.has("d/old"));
    assert!(!fx.has("d/sub"));
    assert!(!fx.has("top"));
    for marker in ["a/.wh.gone", "a/.wh.fresh", "d/.wh..wh..opq", ".wh.top"] {
        assert!(!fx.has(marker), "{marker} was written");
    }
}

#[test]
fn an_entry_replaces_a_symlink_instead_of_writing_through_it() {
    let fx = Fixture::new();
    let secret = fx.outside.join("secret");
    let lower = layer(&[
        E::Dir("etc/", 0o755),
        E::Symlink("etc/passwd", secret.to_str().unwrap()),
    ]);
    let upper = layer(&[E::File("etc/passwd", "root", 0o644)]);
    fx.apply(&[lower, upper]).unwrap().finish().unwrap();
    let passwd = fx.root.join("etc/passwd");
    assert!(fs::symlink_metadata(&passwd).unwrap().is_file());
    assert_eq!(fs::read_to_string(passwd).unwrap(), "root");
    fx.outside_untouched();
}

#[test]
fn paths_that_leave_the_root_are_refused() {
    for name in ["../x", "a/../../x", "/abs"] {
        let fx = Fixture::new();
        let err = fx
            .apply(&[layer(&[E::File(name, "x", 0o644)])])
            .err()
            .unwrap_or_else(|| panic!("{name:?} was accepted"));
        assert!(matches!(err, ImageError::Invalid { .. }), "{err}");
        assert!(err.to_string().contains(name), "{err}");
    }
}

#[test]
fn symlinks_never_lead_out_of_the_root() {
    let fx = Fixture::new();
    let outside = fx.outside.to_str().unwrap();
    let in_image = outside.trim_start_matches('/');
    // A file through a symlinked parent lands inside the root, where the
    // symlink points when the root is `/`.
    fx.apply(&[
        layer(&[
            E::Symlink("a", outside),
            E::Dir(&format!("{in_image}/"), 0o755),
        ]),
        layer(&[E::File("a/evil", "x", 0o644)]),
        // A whiteout through it removes nothing outside.
        layer(&[E::File("a/.wh.secret", "", 0o644)]),
    ])
    .unwrap()
    .finish()
    .unwrap();
    let inside = fx.root.join(in_image).join("evil");
    assert_eq!(fs::read_to_string(inside).unwrap(), "x");
    fx.outside_untouched();

    // Where it points to nothing in the image, the entry is refused.
    let fx = Fixture::new();
    let err = fx
        .apply(&[
            layer(&[E::Symlink("a", fx.outside.to_str().unwrap())]),
            layer(&[E::File("a/evil", "x", 0o644)]),
        ])
        .err()
        .expect("a file was written through a dangling symlink");
    assert!(matches!(err, ImageError::Invalid { .. }), "{err}");
    fx.outside_untouched();

    // A hard link through it finds no host file to link to.
    let fx = Fixture::new();
    let err = fx
        .apply(&[
            layer(&[E::Symlink("o", fx.outside.to_str().unwrap())]),
            layer(&[E::Hardlink("h", "o/secret")]),
        ])
        .err()
        .expect("a hard link to a host file was made");
    assert!(err.to_string().contains("not in the image"), "{err}");
    assert!(!fx.has("h"));
    fx.outside_untouched();

    // And `..` in a hard link target is refused.
    let fx = Fixture::new();
    let err = fx
        .apply(&[layer(&[E::Hardlink("h", "../outside/secret")])])
        .err()
        .expect("a hard link out of the root was made");
    assert!(matches!(err, ImageError::Invalid { .. }), "{err}");
    fx.outside_untouched();
}

#[test]
fn modes_hard_links_and_times_are_kept_devices_skipped() {
    let fx = Fixture::new();
    let lower = layer(&[
        E::Dir("ro/", 0o555),
        E::File("bin/su", "su", 0o4755),
        E::Hardlink("bin/su2", "bin/su"),
        E::CharDev("dev/null"),
    ]);
    // A later layer still writes into a read-only directory.
    let upper = layer(&[E::File("ro/later", "2", 0o600)]);
    let u = fx.apply(&[lower, upper]).unwrap();
    assert_eq!(u.skipped, 1);
    u.finish().unwrap();
    let mode = |p: &str| fs::symlink_metadata(fx.root.join(p)).unwrap().mode() & 0o7777;
    assert_eq!(mode("ro"), 0o555);
    assert_eq!(mode("ro/later"), 0o600);
    assert_eq!(mode("bin/su"), 0o4755);
    let su = fs::metadata(fx.root.join("bin/su")).unwrap();
    assert_eq!(su.nlink(), 2);
    assert_eq!(su.mtime(), 1_600_000_000);
    assert_eq!(
        fs::metadata(fx.root.join("ro")).unwrap().mtime(),
        1_600_000_000
    );
    assert!(!fx.has("dev/null"));
    // The tempdir can be removed by its owner again.
    fs::set_permissions(fx.root.join("ro"), fs::Permissions::from_mode(0o755)).unwrap();
}

#[test]
fn garbage_is_not_a_layer() {
    let fx = Fixture::new();
    let mut junk = vec![0x55u8; 4096];
    junk[..5].copy_from_slice(b"hello");
    let err = fx.apply(&[junk]).err().expect("garbage was accepted");
    assert!(matches!(err, ImageError::Invalid { .. }), "{err}");
}

#[test]
fn entry_paths() {
    assert_eq!(in_root(Path::new("./a/b")), Ok(Some(PathBuf::from("a/b"))));
    assert_eq!(in_root(Path::new("./")), Ok(None));
    assert!(in_root(Path::new("a/../b")).is_err());
    assert!(in_root(Path::new("/etc/passwd")).is_err());
}
