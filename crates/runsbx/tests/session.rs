//! Sessions: files and installed packages persist across calls, while
//! each call is still a fresh sandbox; sessions are isolated from each
//! other, bounded, removed whole, and never lead runsbx out through a
//! link. Observed from the outside, as root and rootless.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::fs;
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

use runsbx_testkit::{self as kit, as_root_and_rootless, Fixture, Out};
use serde_json::Value;

/// The runsbx under test.
const RUNSBX: &str = env!("CARGO_BIN_EXE_runsbx");

/// A session of this test's own, removed (with a check that it is gone)
/// when dropped.
struct TestSession<'a> {
    fx: &'a Fixture,
    name: String,
    json: Value,
}

impl<'a> TestSession<'a> {
    fn create(fx: &'a Fixture, opts: &[&str]) -> Self {
        let name = format!("t-{}", kit::unique_mark());
        let mut args = vec!["session", "create", &name, "--json"];
        args.extend(opts);
        let out = fx.run(&args).ok();
        let json = out.json();
        assert_eq!(json["schema"], "runsbx.session/v1", "{out:?}");
        assert_eq!(json["name"], name.as_str());
        Self { fx, name, json }
    }

    /// `runsbx call --json --session NAME OPTS -- COMMAND`.
    fn call(&self, opts: &[&str], command: &[&str]) -> (Out, Value) {
        let mut args = vec!["call", "--json", "--session", &self.name];
        args.extend(opts);
        args.push("--");
        args.extend(command);
        let out = self.fx.run(&args);
        let json = out.json();
        (out, json)
    }

    /// `sh -c SCRIPT` in the session; its stdout, after checking it
    /// exited 0.
    fn sh(&self, opts: &[&str], script: &str) -> String {
        let (out, r) = self.call(opts, &["sh", "-c", script]);
        assert_eq!(r["status"], "exited", "{out:?}");
        assert_eq!(r["exit_code"], 0, "{out:?}");
        r["stdout"]["data"].as_str().unwrap().to_owned()
    }

    /// The session's directory on the host (as the runsbx that made it
    /// sees its data directory).
    fn dir(&self) -> PathBuf {
        let data = match &self.fx.who {
            kit::Who::Root => PathBuf::from("/var/lib/runsbx"),
            kit::Who::User(u) => u.home.join(".local/share/runsbx"),
        };
        data.join("sessions").join(&self.name)
    }
}

impl Drop for TestSession<'_> {
    fn drop(&mut self) {
        let out = self.fx.run(["session", "rm", &self.name]);
        if !std::thread::panicking() {
            assert_eq!(out.code, 0, "session rm: {out:?}");
            assert!(!self.dir().exists(), "{:?} is left", self.dir());
        }
    }
}

fn need_python(fx: &Fixture) -> bool {
    if !kit::have_python_image() {
        kit::skipped("no `python` image: run `sudo runsbx image build python` (hack/test.sh does)");
        return false;
    }
    let _ = fx;
    true
}

/// A wheel of package `runsbxdemo`, made on the host with Python's
/// zipfile, in a directory the fixture's user can read.
fn demo_wheel(fx: &Fixture) -> PathBuf {
    let dir = fx.dir.path().join("wheels");
    fs::create_dir_all(&dir).unwrap();
    let script = r#"
import base64, hashlib, sys, zipfile
files = {
    "runsbxdemo/__init__.py": "VALUE = 'demo-42'\n",
    "runsbxdemo-1.0.dist-info/METADATA": "Metadata-Version: 2.1\nName: runsbxdemo\nVersion: 1.0\n",
    "runsbxdemo-1.0.dist-info/WHEEL": "Wheel-Version: 1.0\nGenerator: runsbx-test\nRoot-Is-Purelib: true\nTag: py3-none-any\n",
}
record = []
with zipfile.ZipFile(sys.argv[1], "w") as z:
    for path, text in files.items():
        z.writestr(path, text)
        digest = base64.urlsafe_b64encode(hashlib.sha256(text.encode()).digest()).rstrip(b"=")
        record.append(f"{path},sha256={digest.decode()},{len(text)}")
    record.append("runsbxdemo-1.0.dist-info/RECORD,,")
    z.writestr("runsbxdemo-1.0.dist-info/RECORD", "\n".join(record) + "\n")
"#;
    let wheel = dir.join("runsbxdemo-1.0-py3-none-any.whl");
    let out = Command::new("python3")
        .args(["-c", script])
        .arg(&wheel)
        .output()
        .unwrap();
    assert!(out.status.success(), "{out:?}");
    for p in [&dir, &wheel] {
        std::os::unix::fs::chown(p, Some(fx.dir.path().metadata().unwrap().uid()), None).unwrap();
    }
    wheel
}

fn files_and_packages_persist(fx: Fixture) {
    if !need_python(&fx) {
        return;
    }
    let s = TestSession::create(&fx, &[]);
    let wheel = demo_wheel(&fx);
    let wheel_input = wheel.to_str().unwrap();
    // Call 1: pip installs the wheel (offline), and leaves a file in the
    // workspace and one in $HOME, a file in /tmp and a process behind.
    let out = s.sh(
        &["-i", wheel_input],
        "pip install --no-index --no-cache-dir --break-system-packages \
         runsbxdemo-1.0-py3-none-any.whl >/dev/null 2>&1 && echo installed; \
         echo kept > /workspace/note.txt; echo home > \"$HOME/.dotfile\"; \
         echo gone > /tmp/scratch; (sleep 1000 &) ; echo done",
    );
    assert_eq!(out, "installed\ndone\n");
    // Call 2: a fresh sandbox over the same files.
    let out = s.sh(
        &[],
        "python3 -c 'import runsbxdemo; print(runsbxdemo.VALUE)'; cat /workspace/note.txt \"$HOME/.dotfile\"; \
         ls -A /tmp; for p in /proc/[0-9]*; do cat $p/cmdline 2>/dev/null | tr '\\0' ' '; echo; done | grep -c '^sleep 1000' || true",
    );
    assert_eq!(out, "demo-42\nkept\nhome\n0\n", "{out:?}");
    drop(s);
    fx.assert_clean();
}
as_root_and_rootless!(RUNSBX, files_and_packages_persist: persist_as_root, persist_rootless);

fn sessions_are_isolated(fx: Fixture) {
    if !need_python(&fx) {
        return;
    }
    let a = TestSession::create(&fx, &[]);
    let b = TestSession::create(&fx, &[]);
    let token = format!("runsbx-token-{}", kit::unique_mark());
    // Planted in A's workspace, its home and (where the image lets the
    // sandbox's root write) its layer over the image.
    a.sh(
        &[],
        &format!(
            "echo {token} > /workspace/secret; echo {token} > $HOME/.secret; \
             echo {token} > /var/tmp/secret 2>/dev/null || true"
        ),
    );
    assert!(a.sh(&[], "cat /workspace/secret").contains(&token));
    // B sees none of it, searching everything it can read.
    let found = b.sh(
        &[],
        &format!("grep -rsl {token} / --exclude-dir=proc --exclude-dir=sys 2>/dev/null; ls -A /workspace; echo end"),
    );
    assert_eq!(found, "end\n", "session B saw A's files");
    drop((a, b));
    fx.assert_clean();
}
as_root_and_rootless!(RUNSBX, sessions_are_isolated: isolated_as_root, isolated_rootless);

fn the_disk_is_bounded(fx: Fixture) {
    if !need_python(&fx) {
        return;
    }
    let s = TestSession::create(&fx, &["--disk", "64M"]);
    assert_eq!(s.json["disk"]["limit_bytes"], 64 << 20);
    let (out, r) = s.call(
        &[],
        &["sh", "-c", "dd if=/dev/zero of=/workspace/big bs=1M count=100 2>&1 | grep -o 'No space left on device' | head -1; ls -s /workspace/big"],
    );
    assert_eq!(r["session"]["name"], s.name.as_str(), "{out:?}");
    if fx.rootless() {
        // Rootless runsbx cannot mount a filesystem image: said, not claimed.
        assert_eq!(s.json["disk"]["enforced"], false);
        assert_eq!(r["session"]["disk"]["enforced"], false);
        let reason = r["session"]["disk"]["reason"].as_str().unwrap();
        assert!(reason.contains("rootless"), "{reason}");
    } else {
        assert_eq!(r["session"]["disk"]["enforced"], true, "{out:?}");
        let text = r["stdout"]["data"].as_str().unwrap();
        assert!(
            text.starts_with("No space left on device\n"),
            "the writer was not stopped inside: {out:?}"
        );
        // The host holds the disk's blocks and nothing more.
        let disk = fs::metadata(s.dir().join("disk.img")).unwrap();
        assert_eq!(disk.len(), 64 << 20);
        assert!(disk.blocks() * 512 <= 64 << 20, "{} blocks", disk.blocks());
        // And the session goes on once space is freed.
        assert_eq!(
            s.sh(
                &[],
                "rm /workspace/big && echo ok > /workspace/f && cat /workspace/f"
            ),
            "ok\n"
        );
    }
    drop(s);
    fx.assert_clean();
}
as_root_and_rootless!(RUNSBX, the_disk_is_bounded: disk_as_root, disk_rootless);

fn removal_leaves_nothing_and_waits_for_calls(fx: Fixture) {
    if !need_python(&fx) {
        return;
    }
    let s = TestSession::create(&fx, &[]);
    let dir = s.dir();
    let slot = s.json["id_slot"].as_u64();
    assert_eq!(slot.is_some(), !fx.rootless(), "{}", s.json);
    // A call holds the session: rm is refused while it runs.
    let mut busy = fx.cmd(["call", "--session", &s.name, "--", "sleep", "3"]);
    let mut child = kit::spawn(busy.stdout(std::process::Stdio::null()));
    kit::wait_until(
        "the call holds the session",
        Duration::from_secs(10),
        || {
            fx.run(["session", "ls", "--json"])
                .json()
                .as_array()
                .unwrap()
                .iter()
                .any(|x| x["name"] == s.name.as_str() && x["in_use"] == true)
        },
    );
    let out = fx.run(["session", "rm", &s.name]);
    assert_eq!(out.code, 5, "{out:?}");
    assert!(out.stderr.contains("in use"), "{out:?}");
    assert!(child.wait().unwrap().success());
    drop(s);
    assert!(!dir.exists());
    if let Some(slot) = slot {
        assert!(
            !Path::new("/run/runsbx-ids").join(slot.to_string()).exists(),
            "id range {slot} kept"
        );
        let loops = fs::read_dir("/sys/block")
            .unwrap()
            .flatten()
            .filter(|e| {
                fs::read_to_string(e.path().join("loop/backing_file"))
                    .is_ok_and(|b| b.contains(dir.to_str().unwrap()))
            })
            .count();
        assert_eq!(loops, 0, "a loop device still holds the disk");
    }
    let mounts = fs::read_to_string("/proc/self/mountinfo").unwrap();
    assert!(!mounts.contains(dir.to_str().unwrap()), "{mounts}");
    let ls = fx.run(["session", "ls", "--json"]).ok().json();
    assert!(!ls
        .as_array()
        .unwrap()
        .iter()
        .any(|x| x["name"] == dir.file_name().unwrap().to_str().unwrap()));
    fx.assert_clean();
}
as_root_and_rootless!(RUNSBX, removal_leaves_nothing_and_waits_for_calls: rm_as_root, rm_rootless);

fn calls_may_only_tighten(fx: Fixture) {
    if !need_python(&fx) {
        return;
    }
    let s = TestSession::create(&fx, &["--timeout", "10s", "--memory", "256M"]);
    for (opts, says) in [
        (vec!["--timeout", "11s"], "--timeout"),
        (vec!["--memory", "1G"], "--memory"),
        (vec!["--image", "nope"], "--image"),
        (vec!["--allow-host", "example.com"], "--allow-host"),
    ] {
        let (out, r) = s.call(&opts, &["true"]);
        assert_eq!(out.code, 125, "{opts:?}: {out:?}");
        assert_eq!(r["error"]["kind"], "bad_input");
        let msg = r["error"]["message"].as_str().unwrap();
        assert!(msg.contains(says) && msg.contains(&s.name), "{msg}");
    }
    // Tighter is fine, and the session's own limits are the defaults.
    let (out, r) = s.call(&["--timeout", "5s"], &["true"]);
    assert_eq!(r["exit_code"], 0, "{out:?}");
    assert_eq!(r["limits"]["timeout_ms"], 5000);
    let (_, r) = s.call(&[], &["true"]);
    assert_eq!(r["limits"]["timeout_ms"], 10_000);
    if !fx.rootless() {
        assert_eq!(r["limits"]["memory_bytes"], 256 << 20);
    }
    // No such session; a bad name; a name taken.
    let out = fx.run([
        "call",
        "--json",
        "--session",
        "no-such-session",
        "--",
        "true",
    ]);
    assert_eq!(out.code, 125, "{out:?}");
    assert!(out.json()["error"]["message"]
        .as_str()
        .unwrap()
        .contains("does not exist"));
    let out = fx.run(["session", "create", "../up"]);
    assert_eq!(out.code, 3, "{out:?}");
    assert!(out.stderr.contains("session name"), "{out:?}");
    let out = fx.run(["session", "create", &s.name]);
    assert_eq!(out.code, 5, "{out:?}");
    assert!(out.stderr.contains("exists already"), "{out:?}");
    // A bad option is invalid input, as a bad name is (each was exit 1),
    // and a memory limit no call could start in is refused at create,
    // not at each call (exit 123 there, before); nothing is made.
    for (opts, says) in [
        (["--timeout", "0"], "--timeout \"0\": is not a duration"),
        (["--disk", "1T"], "--disk \"1T\": \"1T\" is not a size"),
        (
            ["--disk", "10M"],
            "--disk 10M: is too small: a session's disk needs at least 16M",
        ),
        (["--allow", "x"], "--allow \"x\": names no method or path"),
        (
            ["--memory", "1M"],
            "--memory: 1048576 bytes is below 4194304 (4M)",
        ),
    ] {
        let out = fx.run(["session", "create", "--json", opts[0], opts[1], "bad-opt"]);
        assert_eq!(out.code, 3, "{opts:?}: {out:?}");
        assert!(out.stderr.contains(says), "{opts:?}: {out:?}");
    }
    assert_eq!(fx.run(["session", "rm", "bad-opt"]).code, 4);
    let out = fx.run(["session", "rm", "no-such-session"]);
    assert_eq!(out.code, 4, "{out:?}");
    drop(s);
    fx.assert_clean();
}
as_root_and_rootless!(RUNSBX, calls_may_only_tighten: tighten_as_root, tighten_rootless);

fn links_are_never_followed(fx: Fixture) {
    if !need_python(&fx) {
        return;
    }
    let s = TestSession::create(&fx, &[]);
    // A directory of the fixture's user on the host, which a link left in
    // the workspace names.
    let host_dir = fx.dir.path().join("host-target");
    fs::create_dir(&host_dir).unwrap();
    std::os::unix::fs::chown(
        &host_dir,
        Some(fx.dir.path().metadata().unwrap().uid()),
        None,
    )
    .unwrap();
    let input = fx.dir.path().join("data.txt");
    fs::write(&input, "payload").unwrap();
    s.sh(&[], &format!("ln -s {} /workspace/out", host_dir.display()));
    // Copying an input through that link: refused or kept inside, never
    // written to the host directory.
    let (out, _) = s.call(
        &["-i", &format!("{}:out/data.txt", input.display())],
        &["true"],
    );
    assert_eq!(fs::read_dir(&host_dir).unwrap().count(), 0, "{out:?}");
    // The session's own directories replaced by links to the host: the
    // call is refused and follows none of them.
    let (planted, target) = if fx.rootless() {
        (s.dir().join("fs/workspace"), host_dir.clone())
    } else {
        (s.dir().join("disk.img"), fx.dir.path().join("host-file"))
    };
    if !fx.rootless() {
        fs::write(&target, "host file").unwrap();
    }
    let moved = s.dir().join("moved-away");
    let mut mv = Command::new("mv");
    mv.arg(&planted).arg(&moved);
    fx.as_who(&mut mv);
    // Rootless, the session's files are in the caller's home: moved there
    // as that user (its own user namespace is not needed for a rename).
    assert!(mv.status().unwrap().success());
    let mut ln = Command::new("ln");
    ln.arg("-s").arg(&target).arg(&planted);
    fx.as_who(&mut ln);
    assert!(ln.status().unwrap().success());
    let (out, r) = s.call(&[], &["sh", "-c", "echo x > /workspace/through-link"]);
    assert_eq!(out.code, 123, "{out:?}");
    assert!(
        r["error"]["message"].as_str().unwrap().contains("session"),
        "{out:?}"
    );
    if fx.rootless() {
        assert_eq!(fs::read_dir(&host_dir).unwrap().count(), 0);
    } else {
        assert_eq!(fs::read_to_string(&target).unwrap(), "host file");
    }
    // Put back, the session works again.
    fs::remove_file(&planted).unwrap();
    let mut back = Command::new("mv");
    back.arg(&moved).arg(&planted);
    fx.as_who(&mut back);
    assert!(back.status().unwrap().success());
    assert_eq!(s.sh(&[], "echo fine"), "fine\n");
    drop(s);
    fx.assert_clean();
}
as_root_and_rootless!(RUNSBX, links_are_never_followed: links_as_root, links_rootless);

fn export_and_import(fx: Fixture) {
    if !need_python(&fx) {
        return;
    }
    let s = TestSession::create(&fx, &["--disk", "128M", "--timeout", "20s"]);
    // Files in the workspace, a link, and in $HOME; as root (where the
    // sandbox's root owns the image's files: rootless they are nobody's),
    // a file in the layer and one deleted from the image, a whiteout.
    let layer = if fx.rootless() {
        ""
    } else {
        "rm /usr/bin/pydoc3 && mkdir -p /var/tmp/x && echo four > /var/tmp/x/f && "
    };
    let script = format!(
        "{layer}echo one > /workspace/a && ln -s a /workspace/l && mkdir -p /workspace/d && \
         echo two > /workspace/d/b && echo three > $HOME/.rc"
    );
    s.sh(&[], &script);
    let tar = fx.dir.path().join("s.tar");
    fx.run(["session", "export", &s.name, tar.to_str().unwrap()])
        .ok();
    // Exporting over an existing file is refused, and leaves it.
    let out = fx.run(["session", "export", &s.name, tar.to_str().unwrap()]);
    assert_eq!(out.code, 3, "{out:?}");
    let copy = TestSession {
        fx: &fx,
        name: format!("{}-copy", s.name),
        json: Value::Null,
    };
    let out = fx
        .run(["session", "import", tar.to_str().unwrap(), &copy.name])
        .ok();
    assert_eq!(out.stdout.trim(), copy.name);
    let got = copy.sh(
        &[],
        "cat /workspace/a /workspace/l /workspace/d/b $HOME/.rc; cat /var/tmp/x/f 2>/dev/null; \
         test -e /usr/bin/pydoc3 && echo pydoc; true",
    );
    let from_layer = if fx.rootless() { "pydoc\n" } else { "four\n" };
    assert_eq!(got, format!("one\none\ntwo\nthree\n{from_layer}"));
    let (_, r) = copy.call(&[], &["true"]);
    assert_eq!(r["limits"]["timeout_ms"], 20_000, "the settings came along");
    // Not an archive of a session: refused, and no session is left.
    let junk = fx.dir.path().join("junk.tar");
    fs::write(&junk, b"not a tar file").unwrap();
    let out = fx.run(["session", "import", junk.to_str().unwrap(), "junk"]);
    assert_eq!(out.code, 3, "{out:?}");
    assert!(out.stderr.contains("session archive"), "{out:?}");
    let ls = fx.run(["session", "ls", "--json"]).ok().json();
    assert!(!ls.as_array().unwrap().iter().any(|x| x["name"] == "junk"));
    drop((s, copy));
    fx.assert_clean();
}
as_root_and_rootless!(RUNSBX, export_and_import: export_as_root, export_rootless);
