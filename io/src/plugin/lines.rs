//! What a child process prints, read with bounds: its stdout as protocol
//! lines of at most a given length, handed over through a queue bounded in
//! bytes, and its stderr as log lines with control characters escaped (a
//! `\r` or an escape sequence never reaches the daemon's log raw).

use std::io::{self, BufRead, BufReader, Read};
use std::sync::{mpsc, Arc, Condvar, Mutex};
use std::time::Duration;
use tracing::info;

/// A line of a child's stdout, as the reader thread saw it.
#[derive(Debug)]
pub enum Line {
    /// A line without its `\n` (and without a `\r` before it).
    Text(String),
    /// A line that is not UTF-8, shown lossily and cut short.
    NotUtf8(String),
    /// A line longer than the bound: nothing more is read.
    TooLong { bytes_max: usize },
    /// The child closed its stdout (it exited).
    End,
}

/// Longest stderr line logged whole; the rest of a longer one is dropped.
const LOG_LINE_BYTES_MAX: usize = 16 << 10;

/// The consumer's end of a child's stdout: lines read ahead hold at most
/// `queue_bytes` between them (or one line, if it is longer).
pub struct Lines {
    rx: mpsc::Receiver<Line>,
    queued: Arc<Queued>,
}

/// Bytes of lines in the queue, and whether the consumer is gone (the
/// reader then stops instead of waiting for room).
type Queued = (Mutex<(usize, bool)>, Condvar);

impl Lines {
    pub fn recv_timeout(&self, timeout: Duration) -> Result<Line, mpsc::RecvTimeoutError> {
        self.rx.recv_timeout(timeout).inspect(|l| self.taken(l))
    }

    pub fn try_recv(&self) -> Result<Line, mpsc::TryRecvError> {
        self.rx.try_recv().inspect(|l| self.taken(l))
    }

    fn taken(&self, line: &Line) {
        let (state, room) = &*self.queued;
        state.lock().unwrap_or_else(|p| p.into_inner()).0 -= line.bytes();
        room.notify_one();
    }
}

impl Drop for Lines {
    fn drop(&mut self) {
        let (state, room) = &*self.queued;
        state.lock().unwrap_or_else(|p| p.into_inner()).1 = true;
        room.notify_one();
    }
}

impl Line {
    fn bytes(&self) -> usize {
        match self {
            Line::Text(t) => t.len(),
            _ => 0,
        }
    }
}

/// One line of `r`, keeping at most `bytes_max` bytes of it in `buf`; of a
/// longer line, the rest is read and dropped if `drop_rest`, else left
/// unread (the caller gives up on the input). Returns `None` at the end of
/// the input, else whether the line was cut.
pub fn read_capped(
    r: &mut impl BufRead,
    bytes_max: usize,
    drop_rest: bool,
    buf: &mut Vec<u8>,
) -> io::Result<Option<bool>> {
    buf.clear();
    let mut cut = false;
    let mut any = false;
    loop {
        let chunk = match r.fill_buf() {
            Ok(c) => c,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
            Err(e) => return Err(e),
        };
        if chunk.is_empty() {
            return Ok(any.then_some(cut));
        }
        any = true;
        let (take, done) = match memchr::memchr(b'\n', chunk) {
            Some(i) => (i, Some(i + 1)),
            None => (chunk.len(), None),
        };
        let room = bytes_max.saturating_sub(buf.len());
        cut |= take > room;
        buf.extend_from_slice(&chunk[..take.min(room)]);
        if cut && !drop_rest {
            return Ok(Some(true));
        }
        let consumed = done.unwrap_or(chunk.len());
        r.consume(consumed);
        if done.is_some() {
            if buf.last() == Some(&b'\r') && !cut {
                buf.pop();
            }
            return Ok(Some(cut));
        }
    }
}

/// Reads `stdout` on a thread of its own into a queue of lines of at most
/// `bytes_max` bytes each, `queue_bytes` in all. After `TooLong`, `NotUtf8`
/// or `End` the thread stops: the caller kills the child.
pub fn stdout_lines(stdout: impl Read + Send + 'static, bytes_max: usize, queue_bytes: usize) -> Lines {
    let (tx, rx) = mpsc::channel();
    let queued: Arc<Queued> = Arc::new((Mutex::new((0, false)), Condvar::new()));
    let room = Arc::clone(&queued);
    std::thread::spawn(move || {
        let mut reader = BufReader::with_capacity(64 << 10, stdout);
        let mut buf = Vec::new();
        loop {
            let line = match read_capped(&mut reader, bytes_max, false, &mut buf) {
                Ok(Some(true)) => Line::TooLong { bytes_max },
                Ok(Some(false)) => match String::from_utf8(std::mem::take(&mut buf)) {
                    Ok(text) => Line::Text(text),
                    Err(e) => Line::NotUtf8(super::process::clip(&String::from_utf8_lossy(e.as_bytes()))),
                },
                Ok(None) | Err(_) => Line::End,
            };
            let last = !matches!(line, Line::Text(_));
            {
                let (state, freed) = &*room;
                let mut held = state.lock().unwrap_or_else(|p| p.into_inner());
                while !held.1 && held.0 > 0 && held.0 + line.bytes() > queue_bytes {
                    held = freed.wait(held).unwrap_or_else(|p| p.into_inner());
                }
                if held.1 {
                    return;
                }
                held.0 += line.bytes();
            }
            if tx.send(line).is_err() || last {
                return;
            }
        }
    });
    Lines { rx, queued }
}

/// Logs each line of `stderr` at INFO under `plugin`, escaped (below).
pub fn log_stderr(stderr: impl Read + Send + 'static, plugin: String) {
    std::thread::spawn(move || {
        let mut reader = BufReader::new(stderr);
        let mut buf = Vec::new();
        while let Ok(Some(cut)) = read_capped(&mut reader, LOG_LINE_BYTES_MAX, true, &mut buf) {
            let text = printable(&String::from_utf8_lossy(&buf));
            let more = if cut { " [line cut]" } else { "" };
            info!(plugin = %plugin, "{text}{more}");
        }
    });
}

/// `s` with every control character but a tab escaped (`\r`, `\u{1b}`).
pub fn printable(s: &str) -> String {
    if !s.chars().any(|c| c.is_control() && c != '\t') {
        return s.to_string();
    }
    s.chars()
        .map(|c| if c.is_control() && c != '\t' { c.escape_default().to_string() } else { c.to_string() })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lines_are_capped_and_the_rest_of_a_long_one_is_dropped() {
        let mut r = BufReader::with_capacity(4, &b"abc\r\nabcdefgh\nxy"[..]);
        let mut buf = Vec::new();
        assert_eq!(read_capped(&mut r, 5, true, &mut buf).unwrap(), Some(false));
        assert_eq!(buf, b"abc");
        assert_eq!(read_capped(&mut r, 5, true, &mut buf).unwrap(), Some(true));
        assert_eq!(buf, b"abcde");
        assert_eq!(read_capped(&mut r, 5, true, &mut buf).unwrap(), Some(false));
        assert_eq!(buf, b"xy");
        assert_eq!(read_capped(&mut r, 5, true, &mut buf).unwrap(), None);
        // Without dropping the rest, a long line ends the reading at once,
        // even with no newline ever coming.
        let mut endless = BufReader::with_capacity(4, std::io::repeat(b'x'));
        assert_eq!(read_capped(&mut endless, 5, false, &mut buf).unwrap(), Some(true));
    }

    #[test]
    fn control_characters_are_escaped_for_the_log() {
        assert_eq!(printable("a\rb\u{1b}[31m\tc"), "a\\rb\\u{1b}[31m\tc");
        assert_eq!(printable("plain"), "plain");
    }
}
