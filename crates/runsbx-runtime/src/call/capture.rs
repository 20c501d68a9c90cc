//! Capturing what a call prints: the first and the last bytes of each
//! stream, whatever its size, in bounded memory.

use std::collections::VecDeque;
use std::io::Write;

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

/// Keeps the first `cap / 2` and the last `cap - cap / 2` bytes written.
/// The head can be passed on live (human output) as it arrives.
pub struct Capture {
    head_cap: usize,
    tail_cap: usize,
    head: Vec<u8>,
    tail: VecDeque<u8>,
    total: u64,
    live: Option<Box<dyn Write>>,
}

impl Capture {
    pub fn new(cap: usize, live: Option<Box<dyn Write>>) -> Self {
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
        self.total += data.len() as u64;
        let room = self.head_cap - self.head.len();
        if room > 0 {
            let take = room.min(data.len());
            self.head.extend_from_slice(&data[..take]);
            if let Some(live) = self.live.as_mut() {
                // A closed terminal or pipe on our side must not stop the
                // call: the result is still wanted.
                if live
                    .write_all(&data[..take])
                    .and_then(|()| live.flush())
                    .is_err()
                {
                    self.live = None;
                }
            }
            data = &data[take..];
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

    /// The tail bytes (for human output, written after the head at the end)
    /// and the number of bytes omitted before them.
    pub fn finish(self) -> (Stream, Vec<u8>, Option<Box<dyn Write>>) {
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
        let (data, encoding) = match String::from_utf8(all) {
            Ok(text) => (text, "utf-8"),
            Err(e) => (
                base64::engine::general_purpose::STANDARD.encode(e.as_bytes()),
                "base64",
            ),
        };
        let stream = Stream {
            data,
            encoding,
            bytes: self.total,
            truncated: omitted > 0,
            omitted_bytes: omitted,
            head_bytes: head.len() as u64,
        };
        (stream, tail, self.live)
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
        let (s, tail, _) = c.finish();
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
        let sink = std::rc::Rc::new(std::cell::RefCell::new(Vec::new()));
        struct W(std::rc::Rc<std::cell::RefCell<Vec<u8>>>);
        impl Write for W {
            fn write(&mut self, b: &[u8]) -> std::io::Result<usize> {
                self.0.borrow_mut().extend_from_slice(b);
                Ok(b.len())
            }
            fn flush(&mut self) -> std::io::Result<()> {
                Ok(())
            }
        }
        let mut c = Capture::new(4, Some(Box::new(W(sink.clone()))));
        c.push(b"abcdefgh");
        let (_, tail, _) = c.finish();
        assert_eq!(&*sink.borrow(), b"ab");
        assert_eq!(tail, b"gh");
    }
}
