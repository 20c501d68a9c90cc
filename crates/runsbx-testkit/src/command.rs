//! Running commands to their end, and reading a child's output as it comes.

use std::fs;
use std::io::{BufRead, BufReader, Read};
use std::os::unix::process::ExitStatusExt;
use std::process::{Child, Command, ExitStatus, Output, Stdio};
use std::sync::mpsc;
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

/// A finished command: exit code (128 + the signal that ended it) and
/// text output.
#[derive(Debug)]
pub struct Out {
    pub code: i32,
    pub stdout: String,
    pub stderr: String,
}

fn code_of(status: ExitStatus) -> i32 {
    status
        .code()
        .unwrap_or_else(|| 128 + status.signal().unwrap_or(0))
}

impl Out {
    pub fn of(o: Output) -> Self {
        Self {
            code: code_of(o.status),
            stdout: String::from_utf8_lossy(&o.stdout).into_owned(),
            stderr: String::from_utf8_lossy(&o.stderr).into_owned(),
        }
    }

    pub fn json(&self) -> serde_json::Value {
        serde_json::from_str(&self.stdout).unwrap_or_else(|e| panic!("not JSON ({e}): {self:?}"))
    }

    pub fn ok(self) -> Self {
        assert_eq!(self.code, 0, "command failed: {self:?}");
        self
    }
}

/// Spawns `cmd`, retrying while its binary is "busy": a test thread that
/// forks while another copies a binary (the runsbx copy in the shared
/// directory) holds a write fd to it until its child execs.
pub fn spawn(cmd: &mut Command) -> Child {
    for _ in 0..100 {
        match cmd.spawn() {
            Err(e) if e.raw_os_error() == Some(nix::libc::ETXTBSY) => {
                std::thread::sleep(Duration::from_millis(10))
            }
            other => return other.unwrap(),
        }
    }
    panic!("{cmd:?}: still ETXTBSY after 1 s");
}

/// Runs `cmd` to its end with stdout and stderr sent to files, not pipes:
/// a container made by `create` or `run --detach` inherits runsbx's stdio
/// and would hold a pipe open long after runsbx has exited.
pub fn output_via_files(cmd: &mut Command) -> Out {
    let out = tempfile::tempfile().unwrap();
    let err = tempfile::tempfile().unwrap();
    cmd.stdin(Stdio::null())
        .stdout(out.try_clone().unwrap())
        .stderr(err.try_clone().unwrap());
    let status = spawn(cmd).wait().unwrap();
    let read = |mut f: fs::File| {
        use std::io::Seek;
        let mut s = String::new();
        f.rewind().unwrap();
        f.read_to_string(&mut s).unwrap();
        s
    };
    Out {
        code: code_of(status),
        stdout: read(out),
        stderr: read(err),
    }
}

/// Runs `cmd` and fails the test if it has not ended within `limit`.
pub fn output_within(cmd: &mut Command, limit: Duration) -> Out {
    let mut child = spawn(
        cmd.stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped()),
    );
    let deadline = Instant::now() + limit;
    loop {
        if child.try_wait().unwrap().is_some() {
            return Out::of(child.wait_with_output().unwrap());
        }
        if Instant::now() > deadline {
            let _ = child.kill();
            let out = child.wait_with_output().unwrap();
            panic!("{cmd:?} did not end within {limit:?}: {:?}", Out::of(out));
        }
        std::thread::sleep(Duration::from_millis(5));
    }
}

/// Runs `cmd`, fails the test unless it succeeds, returns its stdout.
pub fn run_ok(cmd: &mut Command) -> String {
    let out = cmd.stdin(Stdio::null()).output().unwrap();
    assert!(
        out.status.success(),
        "{cmd:?}: {}\n{}{}",
        out.status,
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// The lines a child writes to a pipe, read on a thread of their own so
/// that a test can wait for one of them with a deadline: the signal that
/// the child got somewhere, instead of a guessed sleep.
pub struct Lines {
    rx: mpsc::Receiver<String>,
    seen: String,
    reader: Option<JoinHandle<()>>,
}

impl Lines {
    pub fn of(pipe: impl Read + Send + 'static) -> Self {
        let (tx, rx) = mpsc::channel();
        let reader = std::thread::spawn(move || {
            let mut pipe = BufReader::new(pipe);
            loop {
                let mut line = String::new();
                match pipe.read_line(&mut line) {
                    Ok(0) | Err(_) => return,
                    Ok(_) => {
                        if tx.send(line).is_err() {
                            return;
                        }
                    }
                }
            }
        });
        Self {
            rx,
            seen: String::new(),
            reader: Some(reader),
        }
    }

    /// Waits until a line reading exactly `line` has come; fails the test
    /// with everything read so far if the pipe closes first or `limit`
    /// passes.
    pub fn wait_for(&mut self, line: &str, limit: Duration) {
        let deadline = Instant::now() + limit;
        loop {
            let left = deadline.saturating_duration_since(Instant::now());
            match self.rx.recv_timeout(left) {
                Ok(got) => {
                    self.seen.push_str(&got);
                    if got.strip_suffix('\n').unwrap_or(&got) == line {
                        return;
                    }
                }
                Err(mpsc::RecvTimeoutError::Timeout) => {
                    panic!(
                        "no {line:?} line within {limit:?}; read so far: {:?}",
                        self.seen
                    )
                }
                Err(mpsc::RecvTimeoutError::Disconnected) => {
                    panic!(
                        "the pipe closed before a {line:?} line; read: {:?}",
                        self.seen
                    )
                }
            }
        }
    }

    /// Everything read, from the first line to the end of the pipe.
    pub fn all(mut self) -> String {
        while let Ok(line) = self.rx.recv() {
            self.seen.push_str(&line);
        }
        if let Some(reader) = self.reader.take() {
            reader.join().unwrap();
        }
        std::mem::take(&mut self.seen)
    }
}
