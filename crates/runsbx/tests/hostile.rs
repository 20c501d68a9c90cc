//! Specs that would make runsbx harm what is outside the sandbox: a
//! cgroup path that names the hierarchy's root or another container's
//! cgroup (libcgroups kills every process of a cgroup it removes), a
//! rootfs that is the host's `/`.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::fs;
use std::process::Command;

use runsbx_testkit::{self as kit, as_root_and_rootless, skip, Fixture, Who};
use serde_json::Value;

/// The runsbx under test.
const RUNSBX: &str = env!("CARGO_BIN_EXE_runsbx");

/// Runs `runsbx run` of `bundle` inside a new pid namespace beside a
/// canary process, so that a runsbx that signalled every pid it could
/// see would kill only the canary. Returns runsbx's exit code, its
/// stderr, and whether the canary was still alive afterwards.
fn run_beside_canary(fx: &Fixture, bundle: &std::path::Path) -> (i32, String, bool) {
    let err = fx.dir.path().join("stderr");
    let script = format!(
        "sleep 1000 & canary=$!; {bin} --root {root} run --bundle {bundle} hostile 2>{err}; \
         echo rc=$?; kill -0 $canary && echo canary-alive; kill $canary",
        bin = fx.bin().display(),
        root = fx.state.display(),
        bundle = bundle.display(),
        err = err.display(),
    );
    let out = kit::output_via_files(Command::new("unshare").args([
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
    if !kit::is_root() {
        skip!("hostile_cgroup_paths_harm_nothing: cgroups are root's here");
    }
    if !kit::have("unshare") {
        skip!("unshare is not installed (apt-get install util-linux)");
    }
    let fx = Fixture::new(RUNSBX, Who::Root);
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
        kit::rootfs().to_str().unwrap(),
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
as_root_and_rootless!(RUNSBX, host_root_is_no_rootfs: host_root_as_root, host_root_rootless);

/// A small deterministic generator (an LCG), so that a failure names the
/// seed that reproduces it.
struct Lcg(u64);

impl Lcg {
    fn next(&mut self) -> u64 {
        self.0 = self
            .0
            .wrapping_mul(6_364_136_223_846_793_005)
            .wrapping_add(1_442_695_040_888_963_407);
        self.0 >> 33
    }

    fn below(&mut self, n: usize) -> usize {
        (self.next() % n.max(1) as u64) as usize
    }
}

/// Values a mutation puts somewhere in a spec: wrong types, edge numbers,
/// hostile paths, huge strings and arrays.
fn mutant(rng: &mut Lcg) -> Value {
    match rng.below(16) {
        0 => Value::Null,
        1 => Value::from(-1),
        2 => Value::from(u64::MAX),
        3 => Value::from(""),
        4 => Value::from("/"),
        5 => Value::from("../../.."),
        6 => Value::from("x".repeat(70_000)),
        7 => Value::from(vec![Value::from("/"); 3]),
        8 => serde_json::json!({}),
        9 => Value::from(true),
        10 => Value::from(1.5),
        11 => Value::from("/proc/self/fd/3"),
        12 => Value::from(vec!["a/".repeat(200)]),
        13 => serde_json::json!({"runsbx.timeout": "-1s", "runsbx.limits.memory": "1"}),
        14 => Value::from("\u{0}"),
        _ => Value::from(i64::MIN),
    }
}

/// Replaces a random node of `json` (never `process.args`, so that the
/// container's own exit code stays 0) with a mutant.
fn mutate(json: &mut Value, rng: &mut Lcg, depth: usize) {
    let stop = depth > 0 && rng.below(3) == 0;
    match json {
        Value::Object(map) if !map.is_empty() && !stop => {
            let keys: Vec<String> = map.keys().filter(|k| *k != "args").cloned().collect();
            if keys.is_empty() {
                return;
            }
            let key = keys[rng.below(keys.len())].clone();
            if let Some(child) = map.get_mut(&key) {
                mutate(child, rng, depth + 1);
            }
        }
        Value::Array(items) if !items.is_empty() && !stop => {
            let n = items.len();
            mutate(&mut items[rng.below(n)], rng, depth + 1);
        }
        other => *other = mutant(rng),
    }
}

/// Text that is Rust's Debug formatting of an error, not a sentence.
fn looks_like_debug(text: &str) -> Option<&'static str> {
    [
        "Error(",
        "Os {",
        "Some(",
        "kind: ",
        "Nix(",
        "Errno(",
        "None,",
        "ErrorKind",
    ]
    .into_iter()
    .find(|p| text.contains(p))
}

/// 300 specs mangled at random from the busybox bundle's: each is run or
/// refused with a documented exit code and a sentence, never a panic or a
/// Debug dump, and nothing is left behind.
fn mutated_specs_fail_cleanly(fx: Fixture) {
    let base = fx.bundle("base", &["true"], |_| {});
    let config: Value =
        serde_json::from_str(&fs::read_to_string(base.join("config.json")).unwrap()).unwrap();
    let seed = 0x5eed_u64 + u64::from(fx.rootless());
    let mut rng = Lcg(seed);
    for n in 0..300 {
        let mut json = config.clone();
        mutate(&mut json, &mut rng, 0);
        fs::write(base.join("config.json"), serde_json::to_vec(&json).unwrap()).unwrap();
        let id = format!("m{n}");
        let out = fx.run(["run", "--bundle", base.to_str().unwrap(), &id]);
        let what = || {
            let mut text = format!("{out:?}");
            if text.len() > 3000 {
                let cut = (0..=3000)
                    .rev()
                    .find(|i| text.is_char_boundary(*i))
                    .unwrap_or(0);
                text.truncate(cut);
                text.push('…');
            }
            // The mutant, kept for whoever reproduces the failure.
            let keep = std::env::temp_dir().join(format!("runsbx-mutant-{seed:x}-{n}.json"));
            let _ = fs::copy(base.join("config.json"), &keep);
            format!("seed {seed:#x}, mutation {n} ({keep:?}): {text}")
        };
        assert!(!out.stderr.contains("panicked"), "{}", what());
        // 0 ran; 1, 3-7 documented failures; 128+N a signal ended the
        // container (a mutated rlimit or memory limit); 124 its deadline.
        // Not 134: runsbx aborts on a panic (panic = "abort").
        let documented = matches!(out.code, 0 | 1 | 3..=7 | 124) || (129..=159).contains(&out.code);
        assert!(documented && out.code != 134, "{}", what());
        if let Some(p) = looks_like_debug(&out.stderr) {
            panic!("Debug formatting ({p}) in {}", what());
        }
        let _ = fx.run(["delete", "--force", &id]);
    }
    fx.assert_clean();
}
as_root_and_rootless!(RUNSBX, mutated_specs_fail_cleanly: mutated_specs_as_root, mutated_specs_rootless);

/// Specs past runsbx's documented limits are refused up front, naming the
/// limit, before any work in proportion to their size.
fn oversized_specs_are_refused(fx: Fixture) {
    let deep = format!("/{}", vec!["d"; 40_000].join("/"));
    type Edit = Box<dyn Fn(&mut Value)>;
    let cases: Vec<(&str, Edit, &str)> = vec![
        (
            "100,000 env entries",
            Box::new(|c: &mut Value| {
                let env: Vec<String> = (0..100_000).map(|i| format!("V{i}=x")).collect();
                c["process"]["env"] = Value::from(env);
            }),
            "process.env: 100000 entries, more than runsbx takes (4096)",
        ),
        (
            "a mount 40,000 directories deep",
            Box::new(move |c: &mut Value| {
                c["mounts"]
                    .as_array_mut()
                    .unwrap()
                    .push(serde_json::json!({"destination": deep.clone(), "type": "tmpfs", "source": "tmpfs"}));
            }),
            "mounts[].destination",
        ),
        (
            "a 5 MiB config.json",
            Box::new(|c: &mut Value| {
                c["annotations"] = serde_json::json!({"pad": "x".repeat(5 << 20)});
            }),
            "config.json is larger than runsbx reads",
        ),
    ];
    for (what, edit, needle) in cases {
        let b = fx.bundle("big", &["true"], |c| edit(c));
        let out = fx.run(["run", "--bundle", b.to_str().unwrap(), "c1"]);
        assert_eq!(
            out.code,
            3,
            "{what}: {}",
            &out.stderr[..out.stderr.len().min(500)]
        );
        assert!(
            out.stderr.contains(needle),
            "{what}: {}",
            &out.stderr[..out.stderr.len().min(500)]
        );
        fs::remove_dir_all(&b).unwrap();
    }
    fx.assert_clean();
}
as_root_and_rootless!(RUNSBX, oversized_specs_are_refused: oversized_as_root, oversized_rootless);
