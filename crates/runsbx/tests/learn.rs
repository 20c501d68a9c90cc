//! Learn mode and `runsbx profile suggest`: a call (and an engine's
//! container, by its profile) that fetches two URLs over HTTPS and makes
//! one denied syscall is recorded; the suggested profile, applied, lets
//! exactly those two through and refuses the rest. Against a real HTTPS
//! server on the host's loopback (tests/upstream), as root and rootless.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

mod upstream;

use std::path::{Path, PathBuf};

use runsbx_testkit::{self as kit, as_root_and_rootless, output_via_files, skip, Fixture, Out};
use serde_json::Value;
use upstream::Upstream;

/// The runsbx under test.
const RUNSBX: &str = env!("CARGO_BIN_EXE_runsbx");

/// Fetches `https://allowed.test:PORT` + each path argument, printing
/// `PATH STATUS` (and the proxy's deny code), then tries mount(2).
const FETCH: &str = r#"
import ctypes, os, sys, urllib.error, urllib.request
port = sys.argv[1]
for path in sys.argv[2:]:
    try:
        r = urllib.request.urlopen(f"https://allowed.test:{port}{path}", timeout=30)
        print(path, r.status, r.read().decode())
    except urllib.error.HTTPError as e:
        print(path, e.code, e.headers.get("X-Runsbx-Deny"))
libc = ctypes.CDLL(None, use_errno=True)
rc = libc.mount(b"none", b"/mnt", b"tmpfs", 0, None)
print("mount", rc, os.strerror(ctypes.get_errno()))
"#;

/// The resolver override and address exemption that point `allowed.test`
/// at the test server.
fn reach(up: &Upstream) -> Vec<String> {
    vec![
        "--proxy-resolve".to_owned(),
        "allowed.test=127.0.0.1".to_owned(),
        "--proxy-allow-address".to_owned(),
        format!("127.0.0.1:{}", up.port),
    ]
}

/// The image's rootfs: its CA bundle is what inspection adds the CA to.
fn image_rootfs() -> PathBuf {
    PathBuf::from("/var/lib/runsbx/images/python/rootfs")
}

/// `runsbx profile suggest RECORD --name learned`, as the fixture's user.
fn suggest(fx: &Fixture, record: &Path) -> Out {
    fx.run([
        "profile",
        "suggest",
        record.to_str().unwrap(),
        "--name",
        "learned",
    ])
}

/// `runsbx --config CONFIG run` of FETCH over `paths` on the image's
/// rootfs, as an engine runs a container.
fn run_fetch(fx: &Fixture, up: &Upstream, config: &Path, id: &str, paths: &[&str]) -> Out {
    let port = up.port.to_string();
    let mut args = vec!["/usr/bin/python3", "-c", FETCH, &port];
    args.extend(paths);
    let b = fx.bundle(id, &args, |c| {
        c["root"]["path"] = Value::from(image_rootfs().to_str().unwrap());
        c["root"]["readonly"] = Value::from(true);
        c["process"]["env"] = serde_json::json!(["PATH=/usr/bin:/bin", "HOME=/tmp"]);
    });
    let mut cmd = fx.cmd([
        "--config",
        config.to_str().unwrap(),
        "run",
        "--bundle",
        b.to_str().unwrap(),
        id,
    ]);
    cmd.env("SSL_CERT_FILE", up.trust());
    output_via_files(&mut cmd)
}

/// The learned requests of a record, `METHOD HOST:PORT PATH tls` each.
fn learned(record: &Value) -> Vec<String> {
    record["learned"]["requests"]
        .as_array()
        .unwrap()
        .iter()
        .map(|r| {
            format!(
                "{} {}:{} {} {} {}",
                r["method"].as_str().unwrap(),
                r["host"].as_str().unwrap(),
                r["port"],
                r["path"].as_str().unwrap_or("-"),
                r["tls"],
                r["count"]
            )
        })
        .collect()
}

/// The acceptance of learn mode: record, suggest, apply.
fn learn_mode_suggests_the_narrowest_profile(fx: Fixture) {
    if !kit::have_python_image() {
        skip!("no `python` image: build it (`sudo runsbx image build python`)");
    }
    let up = Upstream::start();
    let p = up.port;

    // 1. A learning call, allowed the whole host: both fetches pass, read
    // through the sandbox's CA, and mount is denied and reported.
    let mut args: Vec<String> = ["call", "--json", "--timeout", "120s", "--learn"]
        .map(String::from)
        .into();
    args.extend(["--allow-host".to_owned(), format!("allowed.test:{p}")]);
    args.extend(reach(&up));
    args.extend(["--", "python3", "-c", FETCH, &p.to_string(), "/one", "/two"].map(String::from));
    let mut cmd = fx.cmd(&args);
    cmd.env("SSL_CERT_FILE", up.trust());
    let out = output_via_files(&mut cmd);
    let result = out.json();
    assert_eq!(result["exit_code"], 0, "{out:?}");
    let stdout = result["stdout"]["data"].as_str().unwrap();
    assert!(stdout.contains("/one 200 hello GET /one"), "{stdout}");
    assert!(stdout.contains("/two 200 hello GET /two"), "{stdout}");
    assert!(
        stdout.contains("mount -1 Operation not permitted"),
        "{stdout}"
    );
    assert_eq!(
        learned(&result),
        [
            format!("GET allowed.test:{p} /one true 1"),
            format!("GET allowed.test:{p} /two true 1"),
        ],
        "{result}"
    );
    let denied = &result["seccomp"]["denied"];
    assert!(
        denied
            .as_array()
            .unwrap()
            .iter()
            .any(|d| d["syscall"] == "mount"),
        "{denied}"
    );
    assert_eq!(up.requests(), ["GET /one", "GET /two"]);

    // 2. The suggestion: exactly those two, each with its reason, the
    // names' overrides, and the mount denial listed as still denied.
    let record = fx.dir.path().join("call-result.json");
    std::fs::write(&record, &out.stdout).unwrap();
    let out = suggest(&fx, &record);
    assert_eq!(out.code, 0, "{out:?}");
    let text = out.stdout.clone();
    let profile: toml::Table = toml::from_str(&text).unwrap();
    assert_eq!(profile["name"].as_str(), Some("learned"));
    let allow: Vec<&str> = profile["egress"]["allow"]
        .as_array()
        .unwrap()
        .iter()
        .map(|v| v.as_str().unwrap())
        .collect();
    assert_eq!(
        allow,
        [
            format!("GET allowed.test:{p}/one"),
            format!("GET allowed.test:{p}/two")
        ],
        "{text}"
    );
    assert!(text.contains("# seen: GET 1 time\n"), "{text}");
    assert!(text.contains("#   mount by python3, 1 time"), "{text}");
    assert_eq!(
        profile["egress"]["resolve"]["allowed.test"].as_str(),
        Some("127.0.0.1")
    );

    // 3. Applied: the two pass, a third path is refused by the proxy
    // before the server sees it, and mount stays denied.
    let config = kit::operator_config(fx.dir.path(), "learned", &text);
    let out = run_fetch(&fx, &up, &config, "applied", &["/one", "/two", "/three"]);
    assert_eq!(out.code, 0, "{out:?}");
    assert!(out.stdout.contains("/one 200 hello GET /one"), "{out:?}");
    assert!(out.stdout.contains("/two 200 hello GET /two"), "{out:?}");
    assert!(
        out.stdout.contains("/three 403 request_not_allowed"),
        "{out:?}"
    );
    assert!(
        out.stdout.contains("mount -1 Operation not permitted"),
        "{out:?}"
    );
    assert_eq!(
        up.requests(),
        ["GET /one", "GET /two", "GET /one", "GET /two"]
    );
    fx.assert_clean();
}

as_root_and_rootless!(RUNSBX, learn_mode_suggests_the_narrowest_profile: learn_as_root, learn_rootless);

/// An engine's container learns by its profile (`[egress] learn = DIR`):
/// its supervisor writes `DIR/<id>.json` when it ends, and the suggestion
/// from that record is the same as from a call's.
fn containers_learn_by_their_profile(fx: Fixture) {
    if !kit::have_python_image() {
        skip!("no `python` image: build it (`sudo runsbx image build python`)");
    }
    let up = Upstream::start();
    let p = up.port;
    let dir = fx.dir.path().join("learned");
    std::fs::create_dir(&dir).unwrap();
    // The supervisor runs as the fixture's user.
    upstream::sh(std::process::Command::new("chmod").arg("777").arg(&dir));
    let default = std::fs::read_to_string(
        Path::new(env!("CARGO_MANIFEST_DIR")).join("../../bundles/profiles/default.toml"),
    )
    .unwrap();
    let profile = default.replace("name = \"default\"", "name = \"learning\"")
        + &format!(
            "\n[egress]\nallow = [\"allowed.test:{p}\"]\nresolve = {{ \"allowed.test\" = \"127.0.0.1\" }}\n\
             allow_addresses = [\"127.0.0.1:{p}\"]\nlearn = {:?}\n",
            dir.display().to_string()
        );
    let config = kit::operator_config(fx.dir.path(), "learning", &profile);
    let out = run_fetch(&fx, &up, &config, "c1", &["/one", "/two", "/one"]);
    assert_eq!(out.code, 0, "{out:?}");
    assert!(out.stdout.contains("/two 200 hello GET /two"), "{out:?}");
    let path = dir.join("c1.json");
    kit::wait_until(
        "the supervisor to write the learn record",
        std::time::Duration::from_secs(10),
        || path.exists(),
    );
    let record: Value = serde_json::from_str(&std::fs::read_to_string(&path).unwrap()).unwrap();
    assert_eq!(record["schema"], "runsbx.learn/v1");
    assert_eq!(record["id"], "c1");
    assert_eq!(
        learned(&record),
        [
            format!("GET allowed.test:{p} /one true 2"),
            format!("GET allowed.test:{p} /two true 1"),
        ],
        "{record}"
    );
    let out = suggest(&fx, &path);
    assert_eq!(out.code, 0, "{out:?}");
    let profile: toml::Table = toml::from_str(&out.stdout).unwrap();
    assert_eq!(
        profile["egress"]["allow"].as_array().unwrap().len(),
        2,
        "{}",
        out.stdout
    );
    assert!(
        out.stdout.contains("# seen: GET 2 times\n"),
        "{}",
        out.stdout
    );
    kit::settle(
        std::time::Duration::from_secs(10),
        kit::POLL,
        || fx.stray_processes(),
        Vec::is_empty,
    );
    fx.assert_clean();
}

as_root_and_rootless!(RUNSBX, containers_learn_by_their_profile: container_learn_as_root, container_learn_rootless);

/// Bad records and outputs: the first line names the file and the fix,
/// exit 3 (invalid input), and nothing is written.
fn bad_records_are_refused(fx: Fixture) {
    let d = fx.dir.path();
    let not_learned = d.join("plain.json");
    std::fs::write(
        &not_learned,
        r#"{"schema": "runsbx.call/v1", "id": "x", "learned": null}"#,
    )
    .unwrap();
    let garbage = d.join("garbage.json");
    std::fs::write(&garbage, "not json").unwrap();
    let good = d.join("good.json");
    std::fs::write(
        &good,
        r#"{"id": "y", "learned": {"requests": [{"method": "GET", "host": "a.test", "port": 443, "path": "/x", "tls": true, "count": 1}], "dropped": 0}}"#,
    )
    .unwrap();
    let exists = d.join("exists.toml");
    std::fs::write(&exists, "keep").unwrap();
    let cases: [(Vec<&str>, &str); 4] = [
        (
            vec![not_learned.to_str().unwrap()],
            "has no `learned` part: it is not from learn mode; run the call again with --learn",
        ),
        (
            vec![garbage.to_str().unwrap()],
            "is not a call result or learn record",
        ),
        (vec!["/nonexistent/r.json"], "cannot be read"),
        (
            vec![good.to_str().unwrap(), "-o", exists.to_str().unwrap()],
            "name a file that does not exist yet",
        ),
    ];
    for (args, fix) in cases {
        let mut all = vec!["profile", "suggest"];
        all.extend(args);
        let out = fx.run(&all);
        assert_eq!(out.code, 3, "{all:?}: {out:?}");
        let first = out.stderr.lines().next().unwrap_or_default();
        assert!(first.contains(fix), "{all:?}: {out:?}");
        assert_eq!(out.stderr.lines().count(), 1, "{out:?}");
        assert!(out.stdout.is_empty(), "{out:?}");
    }
    assert_eq!(std::fs::read_to_string(&exists).unwrap(), "keep");
    fx.assert_clean();
}

as_root_and_rootless!(RUNSBX, bad_records_are_refused: bad_records_as_root, bad_records_rootless);
