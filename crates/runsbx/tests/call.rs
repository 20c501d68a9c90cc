//! `runsbx call`: one tool call in a fresh sandbox, observed from the
//! outside (its result, the host afterwards), as root and rootless.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::fs;
use std::io::Write;
use std::path::Path;
use std::process::Stdio;
use std::time::{Duration, Instant};

use runsbx_testkit::{self as kit, as_root_and_rootless, skip, Fixture, Out, Who};
use serde_json::Value;

/// The runsbx under test.
const RUNSBX: &str = env!("CARGO_BIN_EXE_runsbx");

/// Runs `runsbx call --json --rootfs <busybox> ARGS… -- COMMAND…`.
fn call(fx: &Fixture, opts: &[&str], command: &[&str]) -> (Out, Value) {
    let mut args: Vec<&str> = vec!["call", "--json", "--rootfs"];
    args.push(kit::rootfs().to_str().unwrap());
    args.extend(opts);
    args.push("--");
    args.extend(command);
    let out = fx.run(&args);
    let json = out.json();
    (out, json)
}

fn text(v: &Value) -> &str {
    v["data"].as_str().unwrap()
}

fn python_output_comes_back(fx: Fixture) {
    if !kit::have_python_image() {
        skip!("no `python` image: run `sudo runsbx image build python` (hack/test.sh does)");
    }
    // The agent's secrets, planted on the host: not there in the sandbox.
    let agent = fx.dir.path().join("agent");
    fs::create_dir_all(&agent).unwrap();
    fs::write(agent.join(".env"), "OPENAI_API_KEY=sk-runsbx-test-token").unwrap();
    let script = format!(
        "import math, os\nprint(sum(math.factorial(n) for n in range(10)))\n\
         try:\n    print(open({:?}).read())\n\
         except OSError as e:\n    print('secret:', type(e).__name__)\n",
        agent.join(".env")
    );
    let out = fx.run(["call", "--json", "--", "python3", "-c", &script]);
    let r = out.json();
    assert_eq!(r["schema"], "runsbx.call/v1", "{out:?}");
    assert_eq!(r["status"], "exited", "{out:?}");
    assert_eq!(r["exit_code"], 0, "{out:?}");
    assert_eq!(r["image"], "python");
    assert_eq!(
        text(&r["stdout"]),
        "409114\nsecret: FileNotFoundError\n",
        "{out:?}"
    );
    assert_eq!(r["stdout"]["encoding"], "utf-8");
    assert_eq!(r["stdout"]["truncated"], false);
    assert_eq!(r["timed_out"], false);
    assert!(r["duration_ms"].as_f64().unwrap() > 0.0);
    let layers: Vec<&str> = r["attestation"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|l| l["in_force"] == true)
        .map(|l| l["layer"].as_str().unwrap())
        .collect();
    for want in ["seccomp", "no_new_privileges", "network", "rootfs_readonly"] {
        assert!(
            layers.iter().any(|l| l.contains(want)),
            "{want}: {layers:?}"
        );
    }
    // No --allow-host: no way out, and the attestation says so.
    let egress = r["attestation"]
        .as_array()
        .unwrap()
        .iter()
        .find(|l| l["layer"] == "egress")
        .unwrap_or_else(|| panic!("no egress layer: {}", r["attestation"]));
    assert_eq!(egress["in_force"], true, "{egress}");
    assert!(
        egress["detail"].as_str().unwrap().starts_with("none"),
        "{egress}"
    );
    assert!(r["egress"].is_null(), "{}", r["egress"]);
    assert_eq!(out.code, 0);
    assert!(!out.stdout.contains("sk-runsbx-test-token"));
    fx.assert_clean();
}
as_root_and_rootless!(RUNSBX, python_output_comes_back: python_as_root, python_rootless);

fn human_output_and_exit_codes(fx: Fixture) {
    let rootfs = kit::rootfs().to_str().unwrap().to_owned();
    let human = |cmd: &str| fx.run(["call", "--rootfs", &rootfs, "--", "sh", "-c", cmd]);
    let out = human("echo out; echo err >&2; exit 7");
    assert_eq!(
        (out.code, out.stdout.as_str(), out.stderr.as_str()),
        (7, "out\n", "err\n")
    );
    // The command is the sandbox's pid 1, which a signal sent from inside
    // does not end; a real fault does.
    let out = fx.run([
        "call",
        "--rootfs",
        &rootfs,
        "--",
        "sh",
        "-c",
        "echo partial; exec probe segv",
    ]);
    assert_eq!(
        (out.code, out.stdout.as_str()),
        (128 + 11, "partial\n"),
        "{out:?}"
    );
    let (out, r) = call(&fx, &[], &["probe", "segv"]);
    assert_eq!(out.code, 139);
    assert_eq!(
        (
            r["status"].as_str(),
            r["signal"].as_str(),
            r["exit_code"].as_i64()
        ),
        (Some("signaled"), Some("SIGSEGV"), Some(139))
    );
    // SIGPIPE has its default action in the sandbox (Rust ignores it in
    // runsbx, and an ignored signal is inherited): `yes` ends with `head`.
    let (out, r) = call(&fx, &["--timeout", "20s"], &["sh", "-c", "yes | head -n 3"]);
    assert_eq!((out.code, text(&r["stdout"])), (0, "y\ny\ny\n"), "{out:?}");
    let (_, r) = call(&fx, &[], &["sh", "-c", "exit 3"]);
    assert_eq!(
        (r["status"].as_str(), r["exit_code"].as_i64()),
        (Some("exited"), Some(3))
    );
    fx.assert_clean();
}
as_root_and_rootless!(RUNSBX, human_output_and_exit_codes: exit_codes_as_root, exit_codes_rootless);

fn stdin_reaches_the_command(fx: Fixture) {
    let file = fx.dir.path().join("in.txt");
    fs::write(&file, "from a file\n").unwrap();
    let (_, r) = call(&fx, &["--stdin", file.to_str().unwrap()], &["cat"]);
    assert_eq!(text(&r["stdout"]), "from a file\n");
    // `--stdin -`: runsbx's own stdin.
    let mut cmd = fx.cmd(["call", "--json", "--stdin", "-", "--rootfs"]);
    cmd.arg(kit::rootfs()).args(["--", "wc", "-c"]);
    let mut child = kit::spawn(cmd.stdin(Stdio::piped()).stdout(Stdio::piped()));
    child
        .stdin
        .take()
        .unwrap()
        .write_all(&[b'x'; 100_000])
        .unwrap();
    let out = Out::of(child.wait_with_output().unwrap());
    assert_eq!(text(&out.json()["stdout"]).trim(), "100000", "{out:?}");
    // Without --stdin the command reads nothing, not the agent's stdin.
    let (_, r) = call(&fx, &[], &["wc", "-c"]);
    assert_eq!(text(&r["stdout"]).trim(), "0");
    fx.assert_clean();
}
as_root_and_rootless!(RUNSBX, stdin_reaches_the_command: stdin_as_root, stdin_rootless);

/// `--stream`: each chunk comes out as a JSON line while the command is
/// still running (the call is not over when the first line is read), in
/// order, stdout and stderr apart; the result is the last line; the cap
/// says where it cut.
fn streamed_output_arrives_while_the_command_runs(fx: Fixture) {
    use std::io::BufRead;
    let mut cmd = fx.cmd(["call", "--stream", "--stdin", "-", "--rootfs"]);
    cmd.arg(kit::rootfs()).args([
        "--",
        "sh",
        "-c",
        // The command waits for the test to have read its first line.
        "echo one; read go; echo two >&2; echo three",
    ]);
    let mut child = kit::spawn(cmd.stdin(Stdio::piped()).stdout(Stdio::piped()));
    let mut lines = std::io::BufReader::new(child.stdout.take().unwrap()).lines();
    let first: Value = serde_json::from_str(&lines.next().unwrap().unwrap()).unwrap();
    assert_eq!(
        (
            first["type"].as_str(),
            first["data"].as_str(),
            first["encoding"].as_str()
        ),
        (Some("stdout"), Some("one\n"), Some("utf-8")),
        "{first}"
    );
    assert!(
        child.try_wait().unwrap().is_none(),
        "the call ended before its first line was read"
    );
    // Let the command go on.
    child.stdin.take().unwrap().write_all(b"go\n").unwrap();
    let rest: Vec<Value> = lines
        .map(|l| serde_json::from_str(&l.unwrap()).unwrap())
        .collect();
    assert!(child.wait().unwrap().success());
    // stdout and stderr apart (two pipes: no order between them).
    let mut kinds: Vec<(&str, &str)> = rest[..2]
        .iter()
        .map(|l| (l["type"].as_str().unwrap(), l["data"].as_str().unwrap()))
        .collect();
    kinds.sort();
    assert_eq!(
        kinds,
        [("stderr", "two\n"), ("stdout", "three\n")],
        "{rest:?}"
    );
    assert!(
        rest[..2]
            .iter()
            .all(|l| l["t_ms"].as_f64() > first["t_ms"].as_f64()),
        "{rest:?}"
    );
    let result = rest.last().unwrap();
    assert_eq!(rest.len(), 3, "{rest:?}");
    assert_eq!(
        (result["schema"].as_str(), result["exit_code"].as_i64()),
        (Some("runsbx.call/v1"), Some(0))
    );
    assert_eq!(text(&result["stdout"]), "one\nthree\n");

    // Past --max-output's head, nothing more streams; the result has the tail.
    let out = fx.run([
        "call",
        "--stream",
        "--max-output",
        "8",
        "--rootfs",
        kit::rootfs().to_str().unwrap(),
        "--",
        "sh",
        "-c",
        "printf 0123456789abcdef",
    ]);
    let got: Vec<Value> = out
        .stdout
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    assert_eq!(got[0]["data"], "0123", "{out:?}");
    assert_eq!(
        (got[1]["type"].as_str(), got[1]["kept_bytes"].as_u64()),
        (Some("capped"), Some(4))
    );
    assert_eq!(got.len(), 3, "{out:?}");
    assert_eq!(got[2]["stdout"]["truncated"], true, "{out:?}");
    assert_eq!(text(&got[2]["stdout"]), "0123cdef", "{out:?}");
    fx.assert_clean();
}
as_root_and_rootless!(RUNSBX, streamed_output_arrives_while_the_command_runs: stream_as_root, stream_rootless);

/// A caller that stops reading the stream does not hold the sandbox past
/// its deadline: the output waits in runsbx's memory (bounded by the
/// heads), the sandbox is killed on time, and the caller gets it all,
/// result last, once it reads again.
fn a_stalled_reader_does_not_stretch_the_deadline(fx: Fixture) {
    let mark = marker(&fx, 7);
    let mut cmd = fx.cmd(["call", "--stream", "--timeout", "1s", "--rootfs"]);
    cmd.arg(kit::rootfs()).args([
        "--",
        "sh",
        "-c",
        // Far more than a pipe holds, then a sleep to find on the host.
        &format!("yes 0123456789abcdef | head -c 600000; sleep {mark}"),
    ]);
    let child = kit::spawn(cmd.stdout(Stdio::piped()));
    kit::wait_until("the call's sleep to run", Duration::from_secs(20), || {
        !processes_with(&mark).is_empty()
    });
    // Nobody reads runsbx's stdout, and still the deadline ends it.
    kit::wait_until(
        "the deadline to kill the sandbox",
        Duration::from_secs(20),
        || processes_with(&mark).is_empty(),
    );
    let out = Out::of(child.wait_with_output().unwrap());
    let last: Value = serde_json::from_str(out.stdout.lines().last().unwrap()).unwrap();
    assert_eq!(last["timed_out"], true, "{}", &out.stderr);
    assert_eq!(out.code, 124);
    fx.assert_clean();
}
as_root_and_rootless!(RUNSBX, a_stalled_reader_does_not_stretch_the_deadline: stalled_reader_as_root, stalled_reader_rootless);

/// A number unique to this test process, `tag` and who runs the call
/// (the root and rootless variants of a test run at the same time), given
/// to `sleep` so that the sandbox's processes can be found on the host.
fn marker(fx: &Fixture, tag: u32) -> String {
    format!("{tag}{}{:07}", u8::from(fx.rootless()), std::process::id())
}

/// Host processes with `token` as a whole word of their command line.
fn processes_with(token: &str) -> Vec<String> {
    processes_matching(token, false)
        .into_iter()
        .map(|(pid, command)| format!("{pid}: {command}"))
        .collect()
}

/// The pids of runsbx processes with `token` as a whole word of their
/// command line.
fn runsbx_processes_with(token: &str) -> Vec<i32> {
    processes_matching(token, true)
        .into_iter()
        .map(|(pid, _)| pid)
        .collect()
}

/// Host processes (not zombies) with `token` as a whole word of their
/// command line, runsbx's own (a word of it ends in `runsbx`) when
/// `runtime`, the others otherwise.
fn processes_matching(token: &str, runtime: bool) -> Vec<(i32, String)> {
    let mut found = Vec::new();
    for e in fs::read_dir("/proc").unwrap().flatten() {
        let Ok(pid) = e.file_name().to_string_lossy().parse::<i32>() else {
            continue;
        };
        let cmdline = fs::read(format!("/proc/{pid}/cmdline")).unwrap_or_default();
        let words: Vec<String> = cmdline
            .split(|b| *b == 0 || *b == b' ' || *b == b';' || *b == b'\'')
            .map(|w| String::from_utf8_lossy(w).into_owned())
            .collect();
        let stat = fs::read_to_string(format!("/proc/{pid}/stat")).unwrap_or_default();
        let is_runtime = words.iter().any(|w| w.ends_with("runsbx"));
        if words.iter().any(|w| w == token) && is_runtime == runtime && !stat.contains(") Z") {
            found.push((pid, words.join(" ")));
        }
    }
    found
}

/// Whether `sleep TOKEN` itself runs (not just the shell that starts it).
fn sleeping(token: &str) -> bool {
    processes_with(token).iter().any(|p| {
        p.split_once(": ")
            .is_some_and(|(_, c)| c.starts_with("sleep "))
    })
}

fn deadline_kills_everything(fx: Fixture) {
    let (daemon, fg) = (marker(&fx, 1), marker(&fx, 2));
    // A daemon double-forked into its own session, then a foreground sleep.
    let script = format!("setsid sh -c 'sleep {daemon}' & sleep {fg}; echo never");
    let mut cmd = fx.cmd(["call", "--json", "--timeout", "1s", "--rootfs"]);
    cmd.arg(kit::rootfs()).args(["--", "sh", "-c", &script]);
    let started = Instant::now();
    let out = kit::output_within(&mut cmd, Duration::from_secs(20));
    let took = started.elapsed();
    let r = out.json();
    assert_eq!(out.code, 124, "{out:?}");
    assert_eq!(
        (r["status"].as_str(), r["timed_out"].as_bool()),
        (Some("timed_out"), Some(true))
    );
    assert!(!text(&r["stdout"]).contains("never"));
    // About a second: reported, not asserted tightly (a loaded CI machine).
    eprintln!("timeout 1s call returned after {took:?}");
    assert!(took < Duration::from_secs(10), "{took:?}");
    assert_eq!(
        [processes_with(&daemon), processes_with(&fg)].concat(),
        Vec::<String>::new(),
        "sandbox processes left"
    );
    fx.assert_clean();
}
as_root_and_rootless!(RUNSBX, deadline_kills_everything: deadline_as_root, deadline_rootless);

fn background_processes_die_with_the_call(fx: Fixture) {
    let m = marker(&fx, 3);
    let script = format!("setsid sh -c 'sleep {m}' & echo started");
    let (out, r) = call(&fx, &[], &["sh", "-c", &script]);
    assert_eq!(out.code, 0, "{out:?}");
    assert_eq!(text(&r["stdout"]), "started\n");
    assert_eq!(processes_with(&m), Vec::<String>::new());
    fx.assert_clean();
}
as_root_and_rootless!(RUNSBX, background_processes_die_with_the_call: background_as_root, background_rootless);

/// Peak RSS of a finished child (wait4's rusage, in KiB).
fn run_measuring_rss(cmd: &mut std::process::Command) -> (i32, i64, Vec<u8>) {
    let out = tempfile::tempfile().unwrap();
    cmd.stdout(out.try_clone().unwrap())
        .stderr(Stdio::null())
        .stdin(Stdio::null());
    // Reaped by wait4 below (for its rusage), not by Child::wait.
    #[allow(clippy::zombie_processes)]
    let child = kit::spawn(cmd);
    let mut status = 0;
    // SAFETY: an all-zero rusage is valid; wait4 fills it.
    let mut usage: nix::libc::rusage = unsafe { std::mem::zeroed() };
    // SAFETY: waiting for our own child with valid pointers.
    let pid = unsafe { nix::libc::wait4(child.id() as i32, &mut status, 0, &mut usage) };
    assert_eq!(pid, child.id() as i32);
    let mut bytes = Vec::new();
    use std::io::{Read, Seek};
    let mut out = out;
    out.rewind().unwrap();
    out.read_to_end(&mut bytes).unwrap();
    (nix::libc::WEXITSTATUS(status), usage.ru_maxrss, bytes)
}

fn output_flood_is_capped(fx: Fixture) {
    let mut cmd = fx.cmd(["call", "--json", "--rootfs"]);
    cmd.arg(kit::rootfs()).args([
        "--",
        "sh",
        "-c",
        "echo first; head -c 209715200 /dev/zero | tr '\\0' x; echo; echo last",
    ]);
    let (code, max_rss_kib, stdout) = run_measuring_rss(&mut cmd);
    assert_eq!(code, 0);
    let r: Value = serde_json::from_slice(&stdout).unwrap();
    let s = &r["stdout"];
    assert_eq!(s["truncated"], true);
    assert!(s["bytes"].as_u64().unwrap() > 200 << 20, "{s}");
    let data = text(s);
    assert!(data.len() <= 1 << 20, "{}", data.len());
    assert!(data.starts_with("first\nxxxx"), "head kept");
    assert!(data.ends_with("\nlast\n"), "tail kept");
    eprintln!("runsbx peak RSS during a 200 MiB flood: {max_rss_kib} KiB");
    assert!(max_rss_kib < 64 * 1024, "peak RSS {max_rss_kib} KiB");
    fx.assert_clean();
}
as_root_and_rootless!(RUNSBX, output_flood_is_capped: flood_as_root, flood_rootless);

fn binary_output_survives(fx: Fixture) {
    let (_, r) = call(&fx, &[], &["sh", "-c", "printf '\\377\\000\\001'"]);
    assert_eq!(r["stdout"]["encoding"], "base64");
    assert_eq!(text(&r["stdout"]), "/wAB");
    fx.assert_clean();
}
as_root_and_rootless!(RUNSBX, binary_output_survives: binary_as_root, binary_rootless);

fn calls_share_nothing(fx: Fixture) {
    let (_, r) = call(
        &fx,
        &[],
        &[
            "sh",
            "-c",
            "echo secret > /tmp/left; echo x > /workspace/w; ls /tmp",
        ],
    );
    assert_eq!(text(&r["stdout"]), "left\n");
    let (_, r) = call(&fx, &[], &["sh", "-c", "ls -A /tmp /workspace"]);
    assert_eq!(text(&r["stdout"]), "/tmp:\n\n/workspace:\n", "{r}");
    fx.assert_clean();
}
as_root_and_rootless!(RUNSBX, calls_share_nothing: fresh_as_root, fresh_rootless);

fn inputs_in_outputs_out(fx: Fixture) {
    let src = fx.dir.path().join("src");
    fs::create_dir_all(src.join("lib")).unwrap();
    fs::write(src.join("lib/data.txt"), "3 1 2\n").unwrap();
    let single = fx.dir.path().join("script.sh");
    fs::write(&single, "tr ' ' '\\n' < src/lib/data.txt | sort > sorted.txt\nmkdir -p out && echo done > out/flag\n").unwrap();
    let secret = fx.dir.path().join("host-secret");
    fs::write(&secret, "HOST-TOKEN").unwrap();
    let outdir = fx.dir.path().join("results");
    fs::create_dir_all(&outdir).unwrap();
    if let Who::User(u) = &fx.who {
        for p in [&src, &src.join("lib"), &outdir] {
            nix::unistd::chown(p, Some(u.uid.into()), Some(u.gid.into())).unwrap();
        }
    }
    let link_cmd = format!(
        "sh script.sh && ln -s {} link && ln -s / root-link",
        secret.display()
    );
    let (out, r) = call(
        &fx,
        &[
            "--input",
            src.to_str().unwrap(),
            "--input",
            &format!("{}:script.sh", single.display()),
            "--output",
            "sorted.txt",
            "--output",
            "out/*",
            "--output",
            "link",
            "--output",
            "root-link/etc/passwd",
            "--output-dir",
            outdir.to_str().unwrap(),
        ],
        &["sh", "-c", &link_cmd],
    );
    assert_eq!(r["exit_code"], 0, "{out:?}");
    assert_eq!(
        fs::read_to_string(outdir.join("sorted.txt")).unwrap(),
        "1\n2\n3\n"
    );
    assert_eq!(
        fs::read_to_string(outdir.join("out/flag")).unwrap(),
        "done\n"
    );
    let outputs = r["outputs"].as_array().unwrap();
    let by = |p: &str| {
        outputs
            .iter()
            .find(|o| o["path"] == p)
            .unwrap_or_else(|| panic!("{p}: {r}"))
    };
    assert_eq!(by("sorted.txt")["bytes"], 6);
    assert!(
        by("link")["error"]
            .as_str()
            .unwrap()
            .contains("symbolic link"),
        "{r}"
    );
    assert!(by("root-link/etc/passwd")["error"].is_string(), "{r}");
    assert!(!outdir.join("link").exists());
    assert!(!outdir.join("root-link").exists());
    // Nothing of the host secret reached the results.
    let mut all = String::new();
    for e in walk(&outdir) {
        all.push_str(&fs::read_to_string(e).unwrap_or_default());
    }
    assert!(!all.contains("HOST-TOKEN"));
    fx.assert_clean();
}
as_root_and_rootless!(RUNSBX, inputs_in_outputs_out: files_as_root, files_rootless);

fn walk(dir: &Path) -> Vec<std::path::PathBuf> {
    let mut files = Vec::new();
    for e in fs::read_dir(dir).unwrap().flatten() {
        let ft = e.file_type().unwrap();
        if ft.is_dir() {
            files.extend(walk(&e.path()));
        } else {
            files.push(e.path());
        }
    }
    files
}

fn bad_inputs_are_refused(fx: Fixture) {
    let rootfs = kit::rootfs().to_str().unwrap().to_owned();
    let data = fx.dir.path().join("data");
    let fifo = fx.dir.path().join("fifo");
    nix::unistd::mkfifo(&fifo, nix::sys::stat::Mode::from_bits_truncate(0o644)).unwrap();
    let cases: Vec<(Vec<String>, i32, &str)> = vec![
        (
            vec![
                "--image".into(),
                "no-such-image".into(),
                "--data-dir".into(),
                data.display().to_string(),
            ],
            125,
            "image `no-such-image` not found",
        ),
        (
            vec![
                "--timeout".into(),
                "soon".into(),
                "--rootfs".into(),
                rootfs.clone(),
            ],
            125,
            "--timeout \"soon\": is not a duration",
        ),
        (
            vec![
                "--input".into(),
                "/nonexistent/file.csv".into(),
                "--rootfs".into(),
                rootfs.clone(),
            ],
            125,
            "--input \"/nonexistent/file.csv\"",
        ),
        (
            vec![
                "--env".into(),
                "1BAD".into(),
                "--rootfs".into(),
                rootfs.clone(),
            ],
            125,
            "--env",
        ),
        (
            vec!["--rootfs".into(), "/nonexistent-rootfs".into()],
            125,
            "--rootfs",
        ),
        (
            vec![
                "--allow-host".into(),
                "bad host!".into(),
                "--rootfs".into(),
                rootfs.clone(),
            ],
            125,
            "--allow-host or --allow: allowlist entry \"bad host!\": host name holds a character",
        ),
        // Bytes, where megabytes were meant: no sandbox starts in 512
        // bytes (libcontainer's own error, exit 123, before the floor).
        (
            vec![
                "--memory".into(),
                "512".into(),
                "--rootfs".into(),
                rootfs.clone(),
            ],
            125,
            "--memory \"512\": 512 bytes is below 4194304 (4M)",
        ),
        // Not something a workspace holds (a host failure, 123, before).
        (
            vec![
                "--input".into(),
                fifo.display().to_string(),
                "--rootfs".into(),
                rootfs.clone(),
            ],
            125,
            "is not a regular file, directory or symlink: give files, directories and links",
        ),
        // A directory opens, and the command would only read EISDIR.
        (
            vec![
                "--stdin".into(),
                fx.dir.path().display().to_string(),
                "--rootfs".into(),
                rootfs.clone(),
            ],
            125,
            "is a directory: give a file",
        ),
        // Outside /workspace: before, the command ran and the result said
        // "no such file in /workspace" of /etc/passwd.
        (
            vec![
                "--output".into(),
                "/etc/passwd".into(),
                "--output-dir".into(),
                fx.dir.path().display().to_string(),
                "--rootfs".into(),
                rootfs.clone(),
            ],
            125,
            "--output \"/etc/passwd\": names no file in /workspace",
        ),
        // Kept in runsbx's memory: 100G grew it to 6 GB, before.
        (
            vec![
                "--max-output".into(),
                "65M".into(),
                "--rootfs".into(),
                rootfs.clone(),
            ],
            125,
            "--max-output 65M: is more than the 64M of each stream a call may keep in memory",
        ),
    ];
    for (opts, code, message) in cases {
        let mut args = vec!["call".to_owned()];
        args.extend(opts.clone());
        args.extend(["--".into(), "true".into()]);
        let out = fx.run(&args);
        assert_eq!(out.code, code, "{opts:?}: {out:?}");
        assert!(
            out.stderr.contains(message),
            "{opts:?}: {message:?} missing: {out:?}"
        );
        // The same refusal as JSON.
        let mut json_args = vec!["call".to_owned(), "--json".to_owned()];
        json_args.extend(args[1..].iter().cloned());
        let out = fx.run(&json_args);
        assert_eq!(out.code, code, "{opts:?}: {out:?}");
        let r = out.json();
        assert_eq!(r["status"], "error");
        assert!(
            r["error"]["message"].as_str().unwrap().contains(message),
            "{r}"
        );
    }
    let out = fx.run(["call", "--rootfs", &rootfs, "--", "no-such-command"]);
    assert_eq!(out.code, 127, "{out:?}");
    assert!(
        out.stderr
            .contains("command `no-such-command`: executable file not found in $PATH"),
        "{out:?}"
    );
    let out = fx.run(["call", "--json", "--rootfs", &rootfs, "--", "/etc/passwd"]);
    assert_eq!(out.code, 126, "{out:?}");
    assert_eq!(out.json()["error"]["kind"], "not_executable");
    // Not looked for as each directory of PATH (exit 126, before).
    let out = fx.run(["call", "--json", "--rootfs", &rootfs, "--", ""]);
    assert_eq!(out.code, 125, "{out:?}");
    assert_eq!(out.json()["error"]["kind"], "bad_input");
    let message = &out.json()["error"]["message"];
    assert!(
        message.as_str().unwrap().contains("is an empty string"),
        "{message}"
    );
    fx.assert_clean();
}
as_root_and_rootless!(RUNSBX, bad_inputs_are_refused: bad_input_as_root, bad_input_rootless);

/// The built-in profile's text, to write variants of.
fn default_profile() -> String {
    fs::read_to_string(
        Path::new(env!("CARGO_MANIFEST_DIR")).join("../../bundles/profiles/default.toml"),
    )
    .unwrap()
}

/// `--profile NAME` picks a profile the operator made selectable, when it
/// is at least as strict as the operator's; anything else is refused with
/// the flag named, and makes nothing.
fn a_selectable_profile_only_tightens(fx: Fixture) {
    let default = default_profile();
    let named = |name: &str, from: &str, to: &str| {
        assert!(
            default.contains(from),
            "{from:?} is not in the default profile"
        );
        default
            .replace("name = \"default\"", &format!("name = \"{name}\""))
            .replace(from, to)
    };
    let profiles = fx.dir.path().join("profiles");
    fs::create_dir(&profiles).unwrap();
    let tight = named("tight", "nofile = 1024", "nofile = 64");
    fs::write(profiles.join("tight.toml"), tight).unwrap();
    let wide = named("wide", "memory = \"512M\"", "memory = \"1G\"");
    fs::write(profiles.join("wide.toml"), wide).unwrap();
    let config = fx.dir.path().join("config.toml");
    fs::write(
        &config,
        format!(
            "profile = \"default\"\nprofiles_dir = {:?}\nselectable = [\"tight\", \"wide\", \"ghost\"]\n",
            profiles.display().to_string()
        ),
    )
    .unwrap();
    let config = config.to_str().unwrap();
    let rootfs = kit::rootfs().to_str().unwrap().to_owned();
    let open_files = |profile: Option<&str>| {
        let mut args = vec!["--config", config, "call", "--json", "--rootfs", &rootfs];
        args.extend(profile.iter().flat_map(|p| ["--profile", *p]));
        args.extend(["--", "sh", "-c", "ulimit -n"]);
        let out = fx.run(&args);
        let r = out.json();
        assert_eq!(r["exit_code"], 0, "{out:?}");
        text(&r["stdout"]).trim().to_owned()
    };
    assert_eq!(open_files(None), "1024");
    assert_eq!(open_files(Some("tight")), "64");

    let refusals = [
        (
            "wide",
            125,
            "runsbx: call: --profile \"wide\": profile `wide` allows more than the operator's \
             `default`, and a profile chosen here may only tighten it\n",
        ),
        (
            "nope",
            125,
            "runsbx: call: --profile \"nope\": not one of the profiles the operator made \
             selectable: tight, wide, ghost\n",
        ),
        // Selectable, but the operator's file is missing: the host's fault.
        (
            "ghost",
            123,
            "/ghost.toml\" (profiles_dir in the operator config): No such file or directory",
        ),
    ];
    for (name, code, said) in refusals {
        let out = fx.run([
            "--config",
            config,
            "call",
            "--rootfs",
            &rootfs,
            "--profile",
            name,
            "--",
            "true",
        ]);
        assert_eq!(out.code, code, "--profile {name}: {out:?}");
        assert!(out.stderr.contains(said), "--profile {name}: {out:?}");
        assert_eq!(out.stderr.lines().count(), 1, "--profile {name}: {out:?}");
    }
    let session = format!("refused-profile-{}", std::process::id());
    let out = fx.run([
        "--config",
        config,
        "session",
        "create",
        "--profile",
        "nope",
        &session,
    ]);
    assert_eq!(out.code, 3, "{out:?}");
    assert!(
        out.stderr
            .starts_with("runsbx: error: --profile \"nope\": not one of the profiles"),
        "{out:?}"
    );
    let listed = fx.run(["session", "ls", "--json"]).json();
    assert!(
        !listed
            .as_array()
            .unwrap()
            .iter()
            .any(|s| s["name"] == session.as_str()),
        "{listed}"
    );
    fx.assert_clean();
}

as_root_and_rootless!(RUNSBX, a_selectable_profile_only_tightens: selectable_as_root, selectable_rootless);

/// An operator profile with a deadline shorter than a call's default 30 s:
/// a call or session that asks for none gets the profile's (each was
/// refused, as if it had asked for 30 s); one that asks for more is
/// refused with the option named; so is a session's limit above the
/// profile's, which its calls would never get.
fn a_profiles_deadline_and_limits_bound_calls_and_sessions(fx: Fixture) {
    let default = default_profile();
    let short = default
        .replace("name = \"default\"", "name = \"short\"")
        .replace("[limits]\n", "[limits]\ntimeout = \"10s\"\n");
    assert!(short.contains("timeout = \"10s\""), "{short}");
    let config = kit::operator_config(fx.dir.path(), "short", &short);
    let config = config.to_str().unwrap();
    let rootfs = kit::rootfs().to_str().unwrap().to_owned();
    let call = |opts: &[&str]| {
        let mut args = vec!["--config", config, "call", "--json", "--rootfs", &rootfs];
        args.extend(opts);
        args.extend(["--", "true"]);
        fx.run(&args)
    };
    let out = call(&[]);
    assert_eq!(out.code, 0, "{out:?}");
    assert_eq!(out.json()["limits"]["timeout_ms"], 10_000, "{out:?}");
    let out = call(&["--timeout", "5s"]);
    assert_eq!(out.json()["limits"]["timeout_ms"], 5_000, "{out:?}");
    let out = call(&["--timeout", "1m"]);
    assert_eq!(out.code, 125, "{out:?}");
    assert_eq!(
        out.json()["error"]["message"],
        "--timeout 60000ms: longer than the profile's deadline of 10000ms (a deadline may \
         only be shortened)"
    );

    let name = format!("short-deadline-{}", std::process::id());
    let out = fx.run(["--config", config, "session", "create", "--json", &name]);
    assert_eq!(out.code, 0, "{out:?}");
    assert_eq!(out.json()["timeout_ms"], 10_000, "{out:?}");
    let out = fx.run([
        "--config",
        config,
        "call",
        "--json",
        "--session",
        &name,
        "--",
        "true",
    ]);
    assert_eq!(out.code, 0, "{out:?}");
    assert_eq!(out.json()["limits"]["timeout_ms"], 10_000, "{out:?}");
    assert_eq!(fx.run(["session", "rm", &name]).code, 0);
    for (option, value, said) in [
        (
            "--timeout",
            "20s",
            "--timeout 20000ms: is more than the 10000ms profile `short`",
        ),
        (
            "--memory",
            "1G",
            "--memory 1G: is more than the 512M profile `short`",
        ),
        (
            "--pids",
            "1000",
            "--pids 1000: is more than the 256 profile `short`",
        ),
    ] {
        let out = fx.run([
            "--config", config, "session", "create", option, value, &name,
        ]);
        assert_eq!(out.code, 3, "{option}: {out:?}");
        assert!(
            out.stderr.starts_with(&format!("runsbx: error: {said}")),
            "{option}: {out:?}"
        );
    }
    assert_eq!(fx.run(["session", "rm", &name]).code, 4);
    fx.assert_clean();
}

as_root_and_rootless!(RUNSBX, a_profiles_deadline_and_limits_bound_calls_and_sessions: profile_bounds_as_root, profile_bounds_rootless);

fn interrupted_call_cleans_up(fx: Fixture) {
    let m = marker(&fx, 4);
    let mut cmd = fx.cmd(["call", "--json", "--rootfs"]);
    cmd.arg(kit::rootfs())
        .args(["--", "sh", "-c", &format!("echo up; sleep {m}")]);
    let out_file = tempfile::NamedTempFile::new().unwrap();
    cmd.stdout(out_file.reopen().unwrap())
        .stderr(Stdio::null())
        .stdin(Stdio::null());
    let mut child = kit::spawn(&mut cmd);
    // `sleep` runs: `echo up` has been written.
    kit::wait_until("the call's sleep to run", Duration::from_secs(20), || {
        sleeping(&m)
    });
    nix::sys::signal::kill(
        nix::unistd::Pid::from_raw(child.id() as i32),
        nix::sys::signal::Signal::SIGTERM,
    )
    .unwrap();
    let status = child.wait().unwrap();
    assert_eq!(status.code(), Some(128 + 15));
    let r: Value = serde_json::from_str(&fs::read_to_string(out_file.path()).unwrap()).unwrap();
    assert_eq!(
        (r["status"].as_str(), r["signal"].as_str()),
        (Some("interrupted"), Some("SIGTERM"))
    );
    assert_eq!(text(&r["stdout"]), "up\n");
    assert_eq!(processes_with(&m), Vec::<String>::new());
    fx.assert_clean();
}
as_root_and_rootless!(RUNSBX, interrupted_call_cleans_up: sigterm_as_root, sigterm_rootless);

fn killed_call_is_swept_by_the_next(fx: Fixture) {
    let m = marker(&fx, 5);
    kill_while_sleeping(&fx, &m);
    // The call's watchdog (or else the next call) removes what it left;
    // the watchdog works on its own time, so this waits for it.
    let (out, _) = call(&fx, &[], &["true"]);
    assert_eq!(out.code, 0, "{out:?}");
    clean_soon(&fx, &m);
}
as_root_and_rootless!(RUNSBX, killed_call_is_swept_by_the_next: sigkill_as_root, sigkill_rootless);

/// With no other runsbx started after it, a call killed with SIGKILL is
/// cleaned up by its own watchdog (cloned sharing the call's memory, it
/// execs `runsbx abandon-call` once the call is gone).
fn killed_call_is_cleaned_by_its_watchdog(fx: Fixture) {
    let m = marker(&fx, 8);
    kill_while_sleeping(&fx, &m);
    clean_soon(&fx, &m);
}
as_root_and_rootless!(RUNSBX, killed_call_is_cleaned_by_its_watchdog: watchdog_as_root, watchdog_rootless);

/// A running call's own directory (its workspace's mount point, its
/// seccomp listener's socket) and, as root, its staged rootfs and binds are
/// in tmpfs mounts that only the call's mount namespace sees: on the host,
/// the state root's `@calls` and /run/runsbx-rootfs hold nothing of it,
/// while its state (named by its id) is there.
fn a_running_call_makes_no_directory_on_the_host(fx: Fixture) {
    let m = marker(&fx, 9);
    let mut child = running_sleep(&fx, &m);
    let names = |dir: &Path| -> Vec<String> {
        fs::read_dir(dir)
            .map(|d| {
                d.flatten()
                    .map(|e| e.file_name().to_string_lossy().into_owned())
                    .collect()
            })
            .unwrap_or_default()
    };
    let ids: Vec<String> = names(&fx.state)
        .into_iter()
        .filter(|n| n.starts_with("call-"))
        .collect();
    let calls = names(&fx.state.join("@calls"));
    let staged: Vec<String> = names(Path::new("/run/runsbx-rootfs"))
        .into_iter()
        .filter(|n| ids.iter().any(|id| n.ends_with(&format!("-{id}"))))
        .collect();
    child.kill().unwrap();
    child.wait().unwrap();
    assert_eq!(ids.len(), 1, "the running call's state: {ids:?}");
    assert_eq!(
        calls,
        Vec::<String>::new(),
        "the call's directory on the host"
    );
    assert_eq!(staged, Vec::<String>::new(), "the call's stage on the host");
    clean_soon(&fx, &m);
}
as_root_and_rootless!(RUNSBX, a_running_call_makes_no_directory_on_the_host: private_dirs_as_root, private_dirs_rootless);

/// As root, a call's read-only rootfs is an overlay of detached layers
/// (the image's tree, idmapped, and an empty tmpfs). The call keeps them
/// attached in its private mount namespace, to go with it at its end
/// rather than each dissolved on its own: there they are read-only, under
/// a directory only host root may enter.
#[test]
fn a_calls_kept_layers_are_read_only_and_root_only() {
    use std::os::unix::fs::{MetadataExt, PermissionsExt};
    if !kit::is_root() {
        skip!("a_calls_kept_layers_are_read_only_and_root_only: needs root");
    }
    let fx = Fixture::new(RUNSBX, Who::Root);
    let m = marker(&fx, 11);
    let mut child = running_sleep(&fx, &m);
    // The call's runsbx and its watchdog share its mount namespace.
    let pid = runsbx_processes_with(&m)[0];
    let mountinfo = fs::read_to_string(format!("/proc/{pid}/mountinfo")).unwrap();
    let kept: Vec<(String, String)> = mountinfo
        .lines()
        .filter_map(|l| {
            let f: Vec<&str> = l.split(' ').collect();
            (f[4].starts_with("/run/runsbx-rootfs/") && f[4].contains("/layers/"))
                .then(|| (f[4].to_owned(), f[5].to_owned()))
        })
        .collect();
    let dir = kept.first().map(|(at, _)| {
        let layers = Path::new(at).parent().unwrap().to_owned();
        fs::metadata(format!("/proc/{pid}/root{}", layers.display())).unwrap()
    });
    child.kill().unwrap();
    child.wait().unwrap();
    assert_eq!(
        kept.len(),
        2,
        "the layers kept in the call's namespace: {kept:?}"
    );
    for (at, options) in &kept {
        assert!(
            options.split(',').any(|o| o == "ro"),
            "{at} is mounted {options}, not read-only"
        );
    }
    let dir = dir.unwrap();
    assert_eq!((dir.uid(), dir.permissions().mode() & 0o777), (0, 0o700));
    clean_soon(&fx, &m);
}

/// A call killed with SIGKILL together with its watchdog: the next call's
/// sweep finds it by its lock and removes all of it, its sandbox's
/// processes included.
fn killed_call_and_watchdog_are_swept_by_the_next(fx: Fixture) {
    use nix::sys::signal::{kill, Signal};
    let m = marker(&fx, 10);
    let mut child = running_sleep(&fx, &m);
    // The call's runsbx and its watchdog (a clone of it, same command
    // line): stopped first, so that the watchdog never sees the call die.
    let runsbx = runsbx_processes_with(&m);
    assert_eq!(runsbx.len(), 2, "the call and its watchdog: {runsbx:?}");
    for signal in [Signal::SIGSTOP, Signal::SIGKILL] {
        for pid in &runsbx {
            kill(nix::unistd::Pid::from_raw(*pid), signal).unwrap();
        }
    }
    child.wait().unwrap();
    kit::wait_until(
        "the call and its watchdog to go",
        Duration::from_secs(10),
        || runsbx_processes_with(&m).is_empty(),
    );
    assert!(
        !fx.leftovers().is_empty(),
        "a call killed with its watchdog left its state"
    );
    let (out, _) = call(&fx, &[], &["true"]);
    assert_eq!(out.code, 0, "{out:?}");
    assert_eq!(processes_with(&m), Vec::<String>::new());
    fx.assert_clean();
}
as_root_and_rootless!(RUNSBX, killed_call_and_watchdog_are_swept_by_the_next: sweep_as_root, sweep_rootless);

/// SIGKILLs a call of `sleep MARKER` once its sleep runs.
fn kill_while_sleeping(fx: &Fixture, marker: &str) {
    let mut child = running_sleep(fx, marker);
    child.kill().unwrap();
    child.wait().unwrap();
}

/// A call of `sleep MARKER` in the background, once its sleep runs.
fn running_sleep(fx: &Fixture, marker: &str) -> std::process::Child {
    let child = sleeping_call(fx, marker);
    kit::wait_until("the call's sleep to run", Duration::from_secs(20), || {
        sleeping(marker)
    });
    child
}

/// A call of `sleep MARKER` in the background, its output discarded.
fn sleeping_call(fx: &Fixture, marker: &str) -> std::process::Child {
    let mut cmd = fx.cmd(["call", "--json", "--rootfs"]);
    cmd.arg(kit::rootfs()).args(["--", "sleep", marker]);
    cmd.stdout(Stdio::null())
        .stderr(Stdio::null())
        .stdin(Stdio::null());
    kit::spawn(&mut cmd)
}

/// Waits for the watchdogs of killed calls (they work on their own time),
/// then asserts nothing is left.
fn clean_soon(fx: &Fixture, marker: &str) {
    kit::wait_until(
        "the killed calls' processes and state to be gone",
        Duration::from_secs(20),
        || {
            processes_with(marker).is_empty()
                && fx.stray_processes().is_empty()
                && fx.leftovers().is_empty()
        },
    );
    fx.assert_clean();
}

fn many_calls_at_once(fx: Fixture) {
    let n = 50;
    let children: Vec<_> = (0..n)
        .map(|i| {
            let mut cmd = fx.cmd(["call", "--json", "--rootfs"]);
            cmd.arg(kit::rootfs()).args([
                "--",
                "sh",
                "-c",
                &format!("echo {i}; id -u; cat /proc/self/uid_map; sleep 5"),
            ]);
            let out = tempfile::tempfile().unwrap();
            cmd.stdout(out.try_clone().unwrap())
                .stderr(Stdio::piped())
                .stdin(Stdio::null());
            (kit::spawn(&mut cmd), out)
        })
        .collect();
    let mut host_uids = std::collections::BTreeSet::new();
    for (i, (child, out)) in children.into_iter().enumerate() {
        let o = child.wait_with_output().unwrap();
        use std::io::{Read, Seek};
        let mut out = out;
        let mut s = String::new();
        out.rewind().unwrap();
        out.read_to_string(&mut s).unwrap();
        assert_eq!(
            o.status.code(),
            Some(0),
            "call {i}: {:?} {s} {}",
            o.status,
            String::from_utf8_lossy(&o.stderr)
        );
        let r: Value = serde_json::from_str(&s).unwrap();
        let lines: Vec<&str> = text(&r["stdout"]).lines().collect();
        assert_eq!(lines[0], i.to_string());
        assert_eq!(lines[1], "0");
        host_uids.insert(lines[2].split_whitespace().nth(1).unwrap().to_owned());
    }
    if !fx.rootless() {
        // As root every live sandbox has host ids of its own (each sleeps
        // long enough for all fifty to be alive at once; a range is reused
        // only after its sandbox is gone).
        assert_eq!(host_uids.len(), n, "{host_uids:?}");
    }
    fx.assert_clean();
}
as_root_and_rootless!(RUNSBX, many_calls_at_once: fifty_as_root, fifty_rootless);

/// As root the memory limit is a cgroup limit, and the result says it was
/// hit; rootless the host cannot tell.
#[test]
fn memory_limit_hit_is_reported() {
    if !kit::is_root() {
        skip!("memory_limit_hit_is_reported: needs root");
    }
    if !kit::have_python_image() {
        skip!("no `python` image: run `sudo runsbx image build python`");
    }
    let fx = Fixture::new(RUNSBX, Who::Root);
    kit::assert_balloon_stopped(&fx);
    fx.assert_clean();
    let Some(user) = kit::test_user() else {
        skip!(
            "memory_limit_hit_is_reported, rootless: no test user (hack/test.sh creates `runsbx-test`)"
        );
    };
    let fx = Fixture::new(RUNSBX, Who::User(user));
    let (_, r) = call(&fx, &[], &["true"]);
    assert_eq!(r["limits"]["memory_hit"], Value::Null, "{r}");
    fx.assert_clean();
}

/// The runtime may be killed at any point of a call's life and must leave
/// nothing behind: calls SIGKILLed at 20 points from 0 to 40 ms into their
/// life (in create, in start, while running) leave nothing once their
/// watchdogs and the next call are done.
fn killed_at_any_point(fx: Fixture) {
    let m = marker(&fx, 6);
    for i in 0..20u64 {
        let mut child = sleeping_call(&fx, &m);
        std::thread::sleep(Duration::from_millis(i * 2));
        child.kill().unwrap();
        child.wait().unwrap();
    }
    let (out, _) = call(&fx, &[], &["true"]);
    assert_eq!(out.code, 0, "{out:?}");
    clean_soon(&fx, &m);
}
as_root_and_rootless!(RUNSBX, killed_at_any_point: killed_anywhere_as_root, killed_anywhere_rootless);
