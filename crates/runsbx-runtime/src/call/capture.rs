//! Capturing what a call prints: the first and the last bytes of each
//! stream, whatever its size, in bounded memory; and passing the first on
//! as it comes, echoed (human output) or as JSON Lines (`--stream`).

use std::collections::VecDeque;
use std::io::Write;
use std::sync::{Arc, Mutex};
use std::time::Instant;

use base64::Engine as _;
use serde::Serialize;

/// One captured stream, as the result reports it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Stream {
    /// The kept bytes: the head, then the tail (when bytes were omitted
    /// between them, `head_bytes` says where the tail starts).
    pub data: String,
    /// `utf-8` when the kept bytes are valid UTF-8 text, else `base64`.
    pub encoding: &'static str,
    /// Every byte the command wrote to the stream.
    pub bytes: u64,
    pub truncated: bool,
    /// Bytes dropped between head and tail.
    pub omitted_bytes: u64,
    /// Length of the head in the decoded data.
    pub head_bytes: u64,
}

/// Where a stream's head goes as it arrives.
pub trait Live {
    /// The next bytes of the head.
    fn chunk(&mut self, data: &[u8]) -> std::io::Result<()>;
    /// The head is full: `kept` bytes went out, and from here on only the
    /// last bytes are kept, for the result.
    fn capped(&mut self, _kept: u64) -> std::io::Result<()> {
        Ok(())
    }
}

/// The head written as it is (human output).
pub struct Echo<W: Write>(pub W);

impl<W: Write> Live for Echo<W> {
    fn chunk(&mut self, data: &[u8]) -> std::io::Result<()> {
        self.0.write_all(data)?;
        self.0.flush()
    }
}

/// The head as JSON Lines on `out`, one object per chunk as it arrives:
/// `{"type": "stdout"|"stderr", "data", "encoding", "t_ms"}`, and a
/// `{"type": "capped", "stream", "kept_bytes", "t_ms"}` once the cap is
/// reached. A character split between two reads is held back until it is
/// whole, so that text chunks stay text (at most 3 bytes, for one read).
pub struct JsonLines<W: Write> {
    kind: &'static str,
    start: Instant,
    held: Vec<u8>,
    out: W,
}

impl<W: Write> JsonLines<W> {
    pub fn new(kind: &'static str, start: Instant, out: W) -> Self {
        Self {
            kind,
            start,
            held: Vec::new(),
            out,
        }
    }

    fn line(&mut self, value: &serde_json::Value) -> std::io::Result<()> {
        let mut line = serde_json::to_vec(value)?;
        line.push(b'\n');
        // One write per line: lines of stdout and stderr never interleave.
        self.out.write_all(&line)?;
        self.out.flush()
    }

    fn t_ms(&self) -> f64 {
        self.start.elapsed().as_secs_f64() * 1000.0
    }

    fn emit(&mut self, bytes: &[u8]) -> std::io::Result<()> {
        if bytes.is_empty() {
            return Ok(());
        }
        let (data, encoding) = encode(bytes);
        let value = serde_json::json!({
            "type": self.kind, "data": data, "encoding": encoding, "t_ms": self.t_ms(),
        });
        self.line(&value)
    }
}

impl<W: Write> Live for JsonLines<W> {
    fn chunk(&mut self, data: &[u8]) -> std::io::Result<()> {
        let mut bytes = std::mem::take(&mut self.held);
        bytes.extend_from_slice(data);
        // An incomplete character at the end waits for its other bytes.
        let keep = match std::str::from_utf8(&bytes) {
            Err(e) if e.error_len().is_none() => bytes.len() - e.valid_up_to(),
            _ => 0,
        };
        self.held = bytes.split_off(bytes.len() - keep);
        self.emit(&bytes)
    }

    fn capped(&mut self, kept: u64) -> std::io::Result<()> {
        let held = std::mem::take(&mut self.held);
        self.emit(&held)?;
        let value = serde_json::json!({
            "type": "capped", "stream": self.kind, "kept_bytes": kept, "t_ms": self.t_ms(),
        });
        self.line(&value)
    }
}

impl<W: Write> Drop for JsonLines<W> {
    fn drop(&mut self) {
        let held = std::mem::take(&mut self.held);
        let _ = self.emit(&held);
    }
}

/// runsbx's stdout or stderr, written by a thread of its own, so that a
/// reader who stops reading holds that thread and never the call's wait
/// (its deadline, its signals). What waits in memory is bounded by the
/// heads (half of `--max-output` per stream) and their JSON framing.
///
/// The thread starts with the first bytes written: a command that prints
/// nothing on a stream (most tool calls print on one at most) costs no
/// thread for it, whose start, wake-ups and end each wait, on a VM whose
/// idle CPUs halt, for a CPU to wake.
pub struct Background {
    state: Arc<Mutex<Writing>>,
}

/// A [`Background`] writer's thread, once started.
struct Writing {
    name: String,
    /// Until the thread starts, which then owns it.
    out: Option<Box<dyn Write + Send>>,
    tx: Option<std::sync::mpsc::Sender<Vec<u8>>>,
    thread: Option<std::thread::JoinHandle<()>>,
    /// Why the thread could not start, for [`Background::finish`].
    failed: Option<std::io::Error>,
}

impl Writing {
    fn send(&mut self, bytes: Vec<u8>) -> std::io::Result<()> {
        if self.tx.is_none() {
            let Some(mut out) = self.out.take() else {
                return Err(std::io::ErrorKind::BrokenPipe.into());
            };
            let (tx, rx) = std::sync::mpsc::channel::<Vec<u8>>();
            let started = std::thread::Builder::new()
                .name(self.name.clone())
                .spawn(move || {
                    for bytes in rx {
                        // A reader gone: the rest is dropped, the call goes on.
                        if out.write_all(&bytes).and_then(|()| out.flush()).is_err() {
                            break;
                        }
                    }
                });
            match started {
                Ok(thread) => {
                    self.tx = Some(tx);
                    self.thread = Some(thread);
                }
                Err(e) => {
                    let kind = e.kind();
                    self.failed = Some(e);
                    return Err(kind.into());
                }
            }
        }
        match &self.tx {
            Some(tx) if tx.send(bytes).is_ok() => Ok(()),
            _ => Err(std::io::ErrorKind::BrokenPipe.into()),
        }
    }
}

impl Background {
    /// Writes to `out` from a thread named `name`, started when the
    /// first bytes come.
    pub fn new<W: Write + Send + 'static>(out: W, name: &str) -> Self {
        Self {
            state: Arc::new(Mutex::new(Writing {
                name: name.to_owned(),
                out: Some(Box::new(out)),
                tx: None,
                thread: None,
                failed: None,
            })),
        }
    }

    /// A writer whose bytes the thread writes, in order.
    pub fn writer(&self) -> impl Write + Send + 'static {
        Queued(Arc::clone(&self.state))
    }

    /// Waits until everything queued so far is written (or the reader is
    /// gone); every writer must have been dropped. An error if the thread
    /// could not be started: what was to go out live did not.
    pub fn finish(self) -> std::io::Result<()> {
        self.stop().map_or(Ok(()), Err)
    }

    /// Ends the thread once it has written what was queued, and refuses
    /// whatever comes later (the thread is not started again); why it
    /// could not be started, if it could not.
    fn stop(&self) -> Option<std::io::Error> {
        let (thread, failed) = {
            let mut w = lock(&self.state);
            w.out = None;
            drop(w.tx.take());
            (w.thread.take(), w.failed.take())
        };
        if let Some(t) = thread {
            let _ = t.join();
        }
        failed
    }
}

impl Drop for Background {
    fn drop(&mut self) {
        self.stop();
    }
}

/// The writer's state; a thread that panicked holding it left nothing
/// half-done that matters here (a sender, a handle).
fn lock(state: &Mutex<Writing>) -> std::sync::MutexGuard<'_, Writing> {
    state
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner)
}

struct Queued(Arc<Mutex<Writing>>);

impl Write for Queued {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        lock(&self.0).send(buf.to_vec())?;
        Ok(buf.len())
    }

    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

/// Bytes as JSON text: themselves when UTF-8, else base64.
fn encode(bytes: &[u8]) -> (String, &'static str) {
    match std::str::from_utf8(bytes) {
        Ok(text) => (text.to_owned(), "utf-8"),
        Err(_) => (
            base64::engine::general_purpose::STANDARD.encode(bytes),
            "base64",
        ),
    }
}

/// Keeps the first `cap / 2` and the last `cap - cap / 2` bytes written.
/// The head can be passed on live as it arrives.
pub struct Capture {
    head_cap: usize,
    tail_cap: usize,
    head: Vec<u8>,
    tail: VecDeque<u8>,
    total: u64,
    live: Option<Box<dyn Live>>,
}

impl Capture {
    pub fn new(cap: usize, live: Option<Box<dyn Live>>) -> Self {
        let head_cap = cap / 2;
        Self {
            head_cap,
            tail_cap: cap - head_cap,
            head: Vec::new(),
            tail: VecDeque::new(),
            total: 0,
            live,
        }
    }

    pub fn push(&mut self, mut data: &[u8]) {
        let before = self.total;
        self.total += data.len() as u64;
        let room = self.head_cap - self.head.len();
        if room > 0 {
            let take = room.min(data.len());
            self.head.extend_from_slice(&data[..take]);
            self.pass_on(|live| live.chunk(&data[..take]));
            data = &data[take..];
        }
        // The first byte past the head.
        if !data.is_empty() && before <= self.head_cap as u64 {
            let kept = self.head.len() as u64;
            self.pass_on(|live| live.capped(kept));
        }
        if data.len() >= self.tail_cap {
            self.tail.clear();
            self.tail.extend(&data[data.len() - self.tail_cap..]);
            return;
        }
        self.tail.extend(data);
        let excess = self.tail.len().saturating_sub(self.tail_cap);
        self.tail.drain(..excess);
    }

    /// A closed terminal or pipe on our side must not stop the call: the
    /// result is still wanted.
    fn pass_on(&mut self, f: impl FnOnce(&mut dyn Live) -> std::io::Result<()>) {
        if let Some(live) = self.live.as_mut() {
            if f(live.as_mut()).is_err() {
                self.live = None;
            }
        }
    }

    /// The tail bytes (for human output, written after the head at the end)
    /// and the number of bytes omitted before them.
    pub fn finish(self) -> (Stream, Vec<u8>) {
        let mut head = self.head;
        let mut tail: Vec<u8> = self.tail.into();
        let mut omitted = self.total - head.len() as u64 - tail.len() as u64;
        if omitted > 0 {
            // Cut at character boundaries, so that text stays text.
            if let Err(e) = std::str::from_utf8(&head) {
                if e.error_len().is_none() {
                    omitted += (head.len() - e.valid_up_to()) as u64;
                    head.truncate(e.valid_up_to());
                }
            }
            let skip = tail
                .iter()
                .take(3)
                .take_while(|b| (**b & 0b1100_0000) == 0b1000_0000)
                .count();
            tail.drain(..skip);
            omitted += skip as u64;
        }
        let mut all = head.clone();
        all.extend_from_slice(&tail);
        let (data, encoding) = encode(&all);
        let stream = Stream {
            data,
            encoding,
            bytes: self.total,
            truncated: omitted > 0,
            omitted_bytes: omitted,
            head_bytes: head.len() as u64,
        };
        (stream, tail)
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    fn capture(cap: usize, chunks: &[&[u8]]) -> Stream {
        let mut c = Capture::new(cap, None);
        for chunk in chunks {
            c.push(chunk);
        }
        c.finish().0
    }

    /// A sink for tests: what was written, shared.
    #[derive(Clone, Default)]
    struct Sink(std::rc::Rc<std::cell::RefCell<Vec<u8>>>);
    impl Write for Sink {
        fn write(&mut self, b: &[u8]) -> std::io::Result<usize> {
            self.0.borrow_mut().extend_from_slice(b);
            Ok(b.len())
        }
        fn flush(&mut self) -> std::io::Result<()> {
            Ok(())
        }
    }

    fn lines(sink: &Sink) -> Vec<serde_json::Value> {
        String::from_utf8(sink.0.borrow().clone())
            .unwrap()
            .lines()
            .map(|l| serde_json::from_str(l).unwrap())
            .collect()
    }

    #[test]
    fn json_lines_carry_each_chunk_and_say_where_the_cap_cut() {
        let sink = Sink::default();
        let live = JsonLines::new("stdout", Instant::now(), sink.clone());
        let mut c = Capture::new(16, Some(Box::new(live)));
        // "é" split across two reads arrives whole, as text.
        c.push(b"one\n\xc3");
        c.push(b"\xa9\n");
        c.push(b"0123456789");
        c.push(b"past the head");
        drop(c.finish());
        let got = lines(&sink);
        let data: Vec<&str> = got.iter().filter_map(|l| l["data"].as_str()).collect();
        assert_eq!(data, ["one\n", "é\n", "0"], "{got:?}");
        assert!(got[..3]
            .iter()
            .all(|l| l["type"] == "stdout" && l["encoding"] == "utf-8"));
        assert!(got[0]["t_ms"].as_f64().unwrap() >= 0.0);
        assert_eq!(got[3]["type"], "capped", "{got:?}");
        assert_eq!(got[3]["kept_bytes"], 8);
        assert_eq!(got.len(), 4, "nothing after the cap: {got:?}");
    }

    #[test]
    fn a_background_writer_never_blocks_its_caller() {
        // A pipe nobody reads: 64 KiB fit, the rest would block a writer.
        let (r, w) = nix::unistd::pipe().unwrap();
        let bg = Background::new(std::fs::File::from(w), "test-writer");
        let mut writer = bg.writer();
        for _ in 0..64 {
            writer.write_all(&[b'x'; 4096]).unwrap();
        }
        drop(writer);
        // Read it all: then the thread ends and finish returns.
        let reader = std::thread::spawn(move || {
            let mut all = Vec::new();
            std::io::Read::read_to_end(&mut std::fs::File::from(r), &mut all).unwrap();
            all.len()
        });
        bg.finish().unwrap();
        assert_eq!(reader.join().unwrap(), 64 * 4096);
    }

    /// The names of this process's threads now.
    fn thread_names() -> Vec<String> {
        std::fs::read_dir("/proc/self/task")
            .unwrap()
            .flatten()
            .filter_map(|t| std::fs::read_to_string(t.path().join("comm")).ok())
            .map(|c| c.trim_end().to_owned())
            .collect()
    }

    #[test]
    fn a_background_writer_starts_its_thread_with_the_first_bytes() {
        let (r, w) = nix::unistd::pipe().unwrap();
        let bg = Background::new(std::fs::File::from(w), "lazy-writer");
        let mut writer = bg.writer();
        // Time enough for a thread started with the writer to have named
        // itself.
        std::thread::sleep(std::time::Duration::from_millis(50));
        assert!(
            !thread_names().iter().any(|n| n == "lazy-writer"),
            "no thread before anything is written"
        );
        writer.write_all(b"first").unwrap();
        // A new thread names itself once it runs.
        let named = (0..1000).any(|_| {
            std::thread::sleep(std::time::Duration::from_millis(1));
            thread_names().iter().any(|n| n == "lazy-writer")
        });
        assert!(named, "the first bytes start the thread");
        drop(writer);
        bg.finish().unwrap();
        let mut all = Vec::new();
        std::io::Read::read_to_end(&mut std::fs::File::from(r), &mut all).unwrap();
        assert_eq!(all, b"first");

        // Nothing written: nothing started, and finish has nothing to wait
        // for; the output is closed with it.
        let (r, w) = nix::unistd::pipe().unwrap();
        let bg = Background::new(std::fs::File::from(w), "idle-writer");
        drop(bg.writer());
        std::thread::sleep(std::time::Duration::from_millis(50));
        assert!(!thread_names().iter().any(|n| n == "idle-writer"));
        bg.finish().unwrap();
        let mut all = Vec::new();
        std::io::Read::read_to_end(&mut std::fs::File::from(r), &mut all).unwrap();
        assert!(all.is_empty());
    }

    #[test]
    fn json_lines_send_binary_as_base64() {
        let sink = Sink::default();
        let mut live = JsonLines::new("stderr", Instant::now(), sink.clone());
        live.chunk(&[0xff, 0x00, b'a']).unwrap();
        // A lone lead byte at the end is sent when the stream ends.
        live.chunk(&[0xe2]).unwrap();
        drop(live);
        let got = lines(&sink);
        assert_eq!(got.len(), 2, "{got:?}");
        assert_eq!(
            (got[0]["encoding"].as_str(), got[0]["data"].as_str()),
            (Some("base64"), Some("/wBh"))
        );
        assert_eq!(
            (got[1]["encoding"].as_str(), got[1]["data"].as_str()),
            (Some("base64"), Some("4g=="))
        );
    }

    #[test]
    fn small_output_is_kept_whole() {
        let s = capture(16, &[b"hello ", b"world"]);
        assert_eq!(s.data, "hello world");
        assert_eq!((s.bytes, s.truncated, s.omitted_bytes), (11, false, 0));
        assert_eq!(s.encoding, "utf-8");
    }

    #[test]
    fn a_flood_keeps_head_and_tail() {
        let mut c = Capture::new(8, None);
        c.push(b"abcd");
        for _ in 0..1000 {
            c.push(b"xxxxxxxxxxxxxxxx");
        }
        c.push(b"wxyz");
        let (s, tail) = c.finish();
        assert_eq!(s.data, "abcdwxyz");
        assert_eq!(tail, b"wxyz");
        assert_eq!(s.bytes, 4 + 16_000 + 4);
        assert!(s.truncated);
        assert_eq!(s.omitted_bytes, 16_000);
        assert_eq!(s.head_bytes, 4);
    }

    #[test]
    fn binary_output_is_base64() {
        let s = capture(64, &[&[0xff, 0x00, 0xfe]]);
        assert_eq!(s.encoding, "base64");
        assert_eq!(
            base64::engine::general_purpose::STANDARD
                .decode(&s.data)
                .unwrap(),
            vec![0xff, 0x00, 0xfe]
        );
    }

    #[test]
    fn truncation_never_splits_a_character() {
        // "é" is two bytes; cut points fall inside them.
        let text = "é".repeat(100);
        let s = capture(7, &[text.as_bytes()]);
        assert_eq!(s.encoding, "utf-8", "{s:?}");
        assert!(s.data.chars().all(|c| c == 'é'));
        assert_eq!(s.bytes, 200);
        assert_eq!(s.data.len() as u64 + s.omitted_bytes, 200);
    }

    #[test]
    fn the_live_sink_gets_the_head_once() {
        let sink = Sink::default();
        let mut c = Capture::new(4, Some(Box::new(Echo(sink.clone()))));
        c.push(b"abcdefgh");
        let (_, tail) = c.finish();
        assert_eq!(&*sink.0.borrow(), b"ab");
        assert_eq!(tail, b"gh");
    }
}
