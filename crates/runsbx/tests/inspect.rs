//! TLS inspection: `--allow "METHODS HOST/PATH"` over HTTPS. A real HTTPS
//! server on the host's loopback, its certificate from a test CA that the
//! proxy trusts as an operator's store would (`SSL_CERT_FILE` of runsbx),
//! serving an API and a git repository over smart HTTP (`git
//! http-backend`); Python's urllib and requests, curl, git, pip and
//! openssl from the default image inside, with no flag of their own. As
//! root and rootless.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

mod upstream;

use std::path::Path;

use runsbx_testkit::{self as kit, as_root_and_rootless, output_via_files, skip, Fixture, Out};
use serde_json::Value;
use upstream::Upstream;

/// The runsbx under test.
const RUNSBX: &str = env!("CARGO_BIN_EXE_runsbx");

/// `runsbx call --json` of `script` (sh) with `opts`, the proxy trusting
/// the test CA for upstreams.
fn call(fx: &Fixture, up: &Upstream, opts: &[String], script: &str) -> (Out, Value) {
    let mut args: Vec<String> = vec![
        "call".into(),
        "--json".into(),
        "--timeout".into(),
        "120s".into(),
    ];
    args.extend(opts.iter().cloned());
    args.extend(["--".into(), "sh".into(), "-c".into(), script.into()]);
    let mut cmd = fx.cmd(&args);
    cmd.env("SSL_CERT_FILE", up.trust());
    let out = output_via_files(&mut cmd);
    let json = out.json();
    (out, json)
}

fn opts(up: &Upstream, allow: &[String]) -> Vec<String> {
    let mut o = Vec::new();
    for a in allow {
        o.extend(["--allow".to_owned(), a.clone()]);
    }
    for (name, port) in [("allowed.test", up.port), ("whole.test", up.whole_port)] {
        o.extend([
            "--proxy-resolve".to_owned(),
            format!("{name}=127.0.0.1"),
            "--proxy-allow-address".to_owned(),
            format!("127.0.0.1:{port}"),
        ]);
    }
    o
}

fn have_tools() -> bool {
    let image = Path::new("/var/lib/runsbx/images/python/rootfs/usr/bin");
    kit::have_python_image()
        && ["git", "curl", "openssl"]
            .iter()
            .all(|t| image.join(t).exists())
}

fn https_requests_are_read_and_judged(fx: Fixture) {
    if !have_tools() {
        skip!("the `python` image lacks git, curl or openssl: rebuild it (`sudo runsbx image build --replace python`)");
    }
    let up = Upstream::start();
    let p = up.port;
    let allow = [
        format!("GET,HEAD allowed.test:{p}/api/**"),
        format!("GET allowed.test:{p}/git/repo.git/info/refs?service=git-upload-pack"),
        format!("POST allowed.test:{p}/git/repo.git/git-upload-pack"),
        format!("GET allowed.test:{p}/simple/**"),
    ];
    let mut o = opts(&up, &allow);
    o.extend([
        "--allow-host".to_owned(),
        format!("whole.test:{}", up.whole_port),
    ]);
    let base = format!("https://allowed.test:{p}");
    let script = format!(
        r#"
unset NO_PROXY no_proxy
python3 -c "import urllib.request as u; print('urllib', u.urlopen('{base}/api/a').read().decode())"
python3 -c "import requests; print('requests', requests.get('{base}/api/b').text)"
echo "curl $(curl -sS {base}/api/c)"
echo "post $(curl -sS -o /dev/null -w '%{{http_code}}' -X POST -d x {base}/api/c)"
git clone -q {base}/git/repo.git /tmp/repo && echo "clone $(cat /tmp/repo/README)"
cd /tmp/repo && git -c user.name=a -c user.email=a@a commit -q --allow-empty -m two
git push -q origin HEAD:main >/dev/null 2>&1; echo "push $?"
pip index versions tool --index-url {base}/simple 2>/dev/null | head -1 | sed 's/^/pip /'
echo | openssl s_client -proxy 127.0.0.1:3128 -connect allowed.test:{p} -servername allowed.test 2>/dev/null | grep -m1 '^issuer' | sed 's/^/inspected /'
echo | openssl s_client -proxy 127.0.0.1:3128 -connect whole.test:{whole} -servername whole.test 2>/dev/null | grep -m1 '^issuer' | sed 's/^/tunnelled /'
"#,
        whole = up.whole_port
    );
    let (out, r) = call(&fx, &up, &o, &script);
    assert_eq!(r["exit_code"], 0, "{out:?}");
    let stdout = r["stdout"]["data"].as_str().unwrap();
    for line in [
        "urllib hello GET /api/a",
        "requests hello GET /api/b",
        "curl hello GET /api/c",
        "post 403",
        "clone inspected clone",
        "push 128",
        "pip tool (1.0)",
        "inspected issuer=CN = runsbx sandbox CA ",
        "tunnelled issuer=CN = runsbx test upstream CA",
    ] {
        assert!(
            stdout.contains(line),
            "missing {line:?} in:\n{stdout}\n{}",
            r["stderr"]
        );
    }
    // The server saw the allowed requests and none of the refused ones.
    let seen = up.requests();
    assert!(seen.contains(&"GET /api/a".to_owned()), "{seen:?}");
    assert!(
        seen.contains(&"POST /git/repo.git/git-upload-pack".to_owned()),
        "{seen:?}"
    );
    assert!(!seen.iter().any(|r| r.starts_with("POST /api")), "{seen:?}");
    assert!(!seen.iter().any(|r| r.contains("receive-pack")), "{seen:?}");
    let denied = r["egress"]["denied"].as_array().unwrap();
    let refused: Vec<String> = denied
        .iter()
        .map(|e| {
            format!(
                "{} {} {}",
                e["reason"]["code"].as_str().unwrap(),
                e["method"].as_str().unwrap(),
                e["path"].as_str().unwrap()
            )
        })
        .collect();
    assert!(
        refused.contains(&"request_not_allowed POST /api/c".to_owned()),
        "{refused:?}"
    );
    assert!(
        refused.contains(
            &"request_not_allowed GET /git/repo.git/info/refs?service=git-receive-pack".to_owned()
        ),
        "{refused:?}"
    );
    let push = denied
        .iter()
        .find(|e| e["path"].as_str().unwrap().contains("receive-pack"))
        .unwrap();
    assert_eq!(push["host"], "allowed.test");
    assert!(
        push["reason"]["rules"].as_array().unwrap().len() == 4,
        "{push}"
    );
    // Nothing of the inspection is left: no state, no trust bundle.
    fx.assert_clean();
}

as_root_and_rootless!(RUNSBX, https_requests_are_read_and_judged: inspect_as_root, inspect_rootless);

/// Without request rules, nothing is inspected: no trust bundle, no
/// variables, the end-to-end certificate.
fn hosts_allowed_whole_are_not_inspected(fx: Fixture) {
    if !have_tools() {
        skip!("the `python` image lacks git, curl or openssl: rebuild it (`sudo runsbx image build --replace python`)");
    }
    let up = Upstream::start();
    let mut o = opts(&up, &[]);
    o.extend([
        "--allow-host".to_owned(),
        format!("whole.test:{}", up.whole_port),
    ]);
    let script = format!(
        r#"
echo "env ${{SSL_CERT_FILE:-none}}"
grep -c 'runsbx' /proc/self/mountinfo | sed 's/^/mounts /'
echo | openssl s_client -proxy 127.0.0.1:3128 -connect whole.test:{} -servername whole.test 2>/dev/null | grep -m1 '^issuer'
"#,
        up.whole_port
    );
    let (out, r) = call(&fx, &up, &o, &script);
    assert_eq!(r["exit_code"], 0, "{out:?}");
    let stdout = r["stdout"]["data"].as_str().unwrap();
    assert!(stdout.contains("env none"), "{stdout}");
    assert!(
        stdout.contains("issuer=CN = runsbx test upstream CA"),
        "{stdout}"
    );
    let mounts = layer_detail(&r, "no_host_mounts");
    assert!(!mounts.contains("TLS trust"), "{mounts}");
}

as_root_and_rootless!(RUNSBX, hosts_allowed_whole_are_not_inspected: whole_as_root, whole_rootless);

fn layer_detail(r: &Value, name: &str) -> String {
    r["attestation"]
        .as_array()
        .unwrap()
        .iter()
        .find(|l| l["layer"] == name)
        .map(|l| l["detail"].as_str().unwrap().to_owned())
        .unwrap_or_default()
}

/// An image without a CA bundle has nothing to add the inspection's CA
/// to: its plain HTTP is still judged by the rules, and HTTPS to a host
/// rules narrow is refused with the reason, never tunnelled unread.
fn an_image_without_a_ca_bundle_is_not_inspected(fx: Fixture) {
    let rootfs = kit::rootfs();
    assert!(
        !rootfs.join("etc/ssl/certs/ca-certificates.crt").exists(),
        "the busybox rootfs was expected to have no CA bundle"
    );
    let up = Upstream::start();
    let p = up.port;
    let mut o = opts(&up, &[format!("GET allowed.test:{p}/api/**")]);
    o.extend(["--rootfs".to_owned(), rootfs.display().to_string()]);
    let script = format!(
        r#"
unset NO_PROXY no_proxy
echo "env ${{SSL_CERT_FILE:-none}}"
printf 'CONNECT allowed.test:{p} HTTP/1.1\r\n\r\n' | nc 127.0.0.1 3128 | head -1
"#
    );
    let (out, r) = call(&fx, &up, &o, &script);
    assert_eq!(r["exit_code"], 0, "{out:?}");
    let stdout = r["stdout"]["data"].as_str().unwrap();
    assert!(stdout.contains("env none"), "{stdout}");
    assert!(stdout.contains("HTTP/1.1 403"), "{stdout}");
    let denied = r["egress"]["denied"].as_array().unwrap();
    assert_eq!(
        denied[0]["reason"]["code"], "request_not_allowed",
        "{denied:?}"
    );
    assert!(
        denied[0]["message"]
            .as_str()
            .unwrap()
            .contains("without TLS inspection"),
        "{denied:?}"
    );
    assert!(up.requests().is_empty());
    fx.assert_clean();
}

as_root_and_rootless!(RUNSBX, an_image_without_a_ca_bundle_is_not_inspected: no_bundle_as_root, no_bundle_rootless);

/// `--secret`: the sandbox holds a sentinel; the upstream of the secret's
/// host gets the credential in its header; the sentinel sent to another
/// host, or in the path, is refused and reported; the credential's bytes
/// are nowhere the sandbox or the caller can see.
fn secrets_reach_their_host_and_nowhere_else(fx: Fixture) {
    if !have_tools() {
        skip!("the `python` image lacks git, curl or openssl: rebuild it (`sudo runsbx image build --replace python`)");
    }
    let up = Upstream::start();
    let (p, w) = (up.port, up.whole_port);
    let value = format!("cred-{}", std::process::id() as u64 * 7919 + 123_457);
    let file = up.dir.path().join("api.secret");
    std::fs::write(&file, format!("{value}\n")).unwrap();
    std::fs::set_permissions(&file, std::os::unix::fs::PermissionsExt::from_mode(0o600)).unwrap();
    if fx.rootless() {
        let u = kit::test_user().unwrap();
        nix::unistd::chown(&file, Some(u.uid.into()), Some(u.gid.into())).unwrap();
    }
    let mut o = opts(&up, &[]);
    o.extend([
        "--allow-host".to_owned(),
        format!("allowed.test:{p}"),
        "--allow-host".to_owned(),
        format!("whole.test:{w}"),
        "--secret".to_owned(),
        format!("API=file:{},host=allowed.test:{p}", file.display()),
    ]);
    let script = format!(
        r#"
unset NO_PROXY no_proxy
env > /workspace/env.txt
echo "sentinel $(echo $RUNSBX_SECRET_API | cut -c1-18)"
curl -sS -H "Authorization: Bearer $RUNSBX_SECRET_API" https://allowed.test:{p}/api/s | tee /workspace/body.txt; echo
echo "other $(curl -sS -o /dev/null -w '%{{http_code}}' -H "Authorization: Bearer $RUNSBX_SECRET_API" https://whole.test:{w}/x)"
echo "path $(curl -sS -o /dev/null -w '%{{http_code}}' "https://allowed.test:{p}/api/t?k=$RUNSBX_SECRET_API")"
echo "header $(curl -sS -o /dev/null -w '%{{http_code}}' -H "X-Leak: $RUNSBX_SECRET_API" https://allowed.test:{p}/api/u)"
"#
    );
    let outdir = tempfile::tempdir().unwrap();
    upstream::sh(
        std::process::Command::new("chmod")
            .arg("777")
            .arg(outdir.path()),
    );
    o.extend([
        "--output".to_owned(),
        "*.txt".to_owned(),
        "--output-dir".to_owned(),
        outdir.path().display().to_string(),
    ]);
    let (out, r) = call(&fx, &up, &o, &script);
    assert_eq!(r["exit_code"], 0, "{out:?}");
    let stdout = r["stdout"]["data"].as_str().unwrap();
    for line in [
        "sentinel runsbx-secret-API",
        "hello GET /api/s",
        "other 403",
        "path 403",
        "header 403",
    ] {
        assert!(
            stdout.contains(line),
            "missing {line:?} in:\n{stdout}\n{}",
            r["stderr"]
        );
    }
    // The upstream of the secret's host got the credential, once; no
    // other request carried it or its sentinel.
    let seen = up.requests_with_auth();
    assert!(
        seen.contains(&format!("allowed.test:{p} GET /api/s Bearer {value}")),
        "{seen:?}"
    );
    assert_eq!(seen.len(), 1, "{seen:?}");
    let denied = r["egress"]["denied"].as_array().unwrap();
    let codes: Vec<String> = denied
        .iter()
        .map(|e| {
            format!(
                "{} {} {}",
                e["reason"]["code"].as_str().unwrap(),
                e["host"].as_str().unwrap(),
                e["reason"]["secret"].as_str().unwrap_or("")
            )
        })
        .collect();
    assert_eq!(
        codes,
        [
            "secret_misdirected whole.test API",
            "secret_misdirected allowed.test API",
            "secret_misdirected allowed.test API"
        ],
        "{denied:?}"
    );
    // The credential's bytes: not in the sandbox's output or files, not in
    // the result, not in what runsbx printed.
    let files: String = ["env.txt", "body.txt"]
        .iter()
        .map(|f| std::fs::read_to_string(outdir.path().join(f)).unwrap())
        .collect();
    assert!(
        files.contains("RUNSBX_SECRET_API=runsbx-secret-API-"),
        "{files}"
    );
    for (what, text) in [
        ("files", files.as_str()),
        ("result", &r.to_string()),
        ("stdout", &out.stdout),
        ("stderr", &out.stderr),
    ] {
        assert!(!text.contains(&value), "the credential is in the {what}");
    }
    fx.assert_clean();
}

as_root_and_rootless!(RUNSBX, secrets_reach_their_host_and_nowhere_else: secrets_as_root, secrets_rootless);

/// Bad `--secret`s: each refused with its cause first, nothing made.
fn bad_secrets_are_refused(fx: Fixture) {
    let dir = tempfile::tempdir().unwrap();
    let open_file = dir.path().join("open.secret");
    std::fs::write(&open_file, "v\n").unwrap();
    std::fs::set_permissions(
        &open_file,
        std::os::unix::fs::PermissionsExt::from_mode(0o644),
    )
    .unwrap();
    let cases = [
        (
            format!("A=file:{}/missing,host=h.test", dir.path().display()),
            vec!["--allow-host", "h.test"],
            "No such file",
        ),
        (
            format!("A=file:{},host=h.test", open_file.display()),
            vec!["--allow-host", "h.test"],
            "chmod o-r",
        ),
        (
            "A=env:RUNSBX_TEST_NO_SUCH_VAR,host=h.test".to_owned(),
            vec!["--allow-host", "h.test"],
            "no RUNSBX_TEST_NO_SUCH_VAR",
        ),
        (
            "lower=env:HOME,host=h.test".to_owned(),
            vec!["--allow-host", "h.test"],
            "upper-case",
        ),
        (
            "A=env:HOME".to_owned(),
            vec!["--allow-host", "h.test"],
            "host=HOST",
        ),
        (
            "A=env:HOME,host=other.test".to_owned(),
            vec!["--allow-host", "h.test"],
            "not on the call's allowlist",
        ),
        (
            "A=env:HOME,host=h.test".to_owned(),
            vec!["--secret", "A=env:HOME,host=h.test"],
            "given twice",
        ),
        (
            "A=env:HOME,host=h.test".to_owned(),
            vec!["--env", "RUNSBX_SECRET_A=x"],
            "--env sets RUNSBX_SECRET_A",
        ),
    ];
    for (secret, extra, needle) in cases {
        let mut args = vec!["call".to_owned(), "--secret".to_owned(), secret.clone()];
        args.extend(extra.iter().map(|s| (*s).to_owned()));
        args.extend(["--".to_owned(), "/bin/true".to_owned()]);
        let out = fx.run(&args);
        assert_eq!(out.code, 125, "{secret}: {out:?}");
        let first = out.stderr.lines().next().unwrap_or_default();
        assert!(first.contains(needle), "{secret}: {first}");
        assert!(!first.contains("v\n"));
    }
    fx.assert_clean();
}

as_root_and_rootless!(RUNSBX, bad_secrets_are_refused: bad_secrets_as_root, bad_secrets_rootless);
