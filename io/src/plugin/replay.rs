//! Dead letters sent back through the pipeline (`skipprd dead-letters
//! replay`): a source of their own, with positions of their own, so the
//! WAL says how far the replay got and each letter goes in exactly once.
//!
//! The letters of a stream are read once, at start, from the dead-letter
//! destination: a dead-letter batch never changes once written and later
//! ones take the next numbers, so "batch `seq`, line `n`" orders every
//! letter there will ever be, and the letters written while a replay runs
//! (its own records refused again among them) lie past the bound it read
//! and wait for the next replay. A letter's position is `seq << 32 | n`;
//! its record is the `record` value of the letter, as it is stored.
//!
//! Partition `i` is stream `i` of the pipeline's streams, whose order the
//! WAL fixes. [`Paused`] stands in for the pipeline's own source meanwhile.

use super::{Batch, PluginError, Source};
use skippr_core::format::Record;
use skippr_core::{Position, ResumePoint};

/// The name the engine and the offsets store know the replay by (the
/// pipeline's own source is `source`).
pub const REPLAY_SOURCE: &str = "dead-letters";

/// One dead letter to send again.
#[derive(Debug, Clone, PartialEq)]
pub struct Replayed {
    pub position: Position,
    pub record: Vec<u8>,
}

/// The dead letters of each stream, in the order the destination holds them.
pub struct LetterReplay {
    streams: Vec<String>,
    letters: Vec<Vec<Replayed>>,
    /// The next letter to send, per stream.
    next: Vec<usize>,
}

/// The position of line `n` of dead-letter batch `seq`.
pub fn letter_position(seq: u64, n: usize) -> Result<Position, String> {
    if seq > u32::MAX as u64 || n > u32::MAX as usize {
        return Err(format!("dead-letter batch {seq} line {n} is past what a replay can number (2^32 of each)"));
    }
    Ok(Position(seq << 32 | n as u64))
}

/// What a replay reads of a dead letter: the record a sink refused,
/// embedded as the source sent it, or one refused at intake, as text or
/// base64.
#[derive(serde::Deserialize)]
struct Letter<'a> {
    /// Present or not: a record that is JSON `null` is a record.
    #[serde(borrow, default, deserialize_with = "present")]
    record: Option<&'a serde_json::value::RawValue>,
    record_text: Option<String>,
    record_base64: Option<String>,
}

/// A field that is there, whatever its value (`null` too).
fn present<'de, D: serde::Deserializer<'de>>(d: D) -> Result<Option<&'de serde_json::value::RawValue>, D::Error> {
    <&serde_json::value::RawValue as serde::Deserialize>::deserialize(d).map(Some)
}

impl Letter<'_> {
    /// The record's bytes as the source sent them.
    fn bytes(self) -> Result<Vec<u8>, String> {
        use base64::Engine as _;
        match (self.record, self.record_text, self.record_base64) {
            (Some(raw), None, None) => Ok(raw.get().as_bytes().to_vec()),
            (None, Some(text), None) => Ok(text.into_bytes()),
            (None, None, Some(b64)) => {
                base64::engine::general_purpose::STANDARD.decode(b64).map_err(|e| format!("record_base64: {e}"))
            }
            _ => Err("it holds not exactly one of record, record_text and record_base64".into()),
        }
    }
}

impl LetterReplay {
    /// The letters of `held` (batches as `(stream, seq, bytes)`, the bytes a
    /// dead letter per line) for the pipeline's `streams`. A letter of a
    /// stream the pipeline no longer has, or a line that is no dead letter,
    /// is an error naming it: nothing is sent.
    pub fn new(streams: Vec<String>, held: &[(String, u64, Vec<u8>)]) -> Result<LetterReplay, String> {
        let mut letters: Vec<Vec<Replayed>> = vec![Vec::new(); streams.len()];
        for (stream, seq, bytes) in held {
            let Some(i) = streams.iter().position(|s| s == stream) else {
                return Err(format!(
                    "dead-letter batch {seq} holds letters of stream {stream:?}, which the source no longer has \
                     (it has {}): run the replay with the source settings that have it",
                    streams.join(", ")
                ));
            };
            for (n, line) in bytes.split(|b| *b == b'\n').filter(|l| !l.is_empty()).enumerate() {
                let not_a_letter = |e| {
                    format!("line {} of dead-letter batch {seq} of stream {stream:?} is not a dead letter: {e}", n + 1)
                };
                let letter: Letter = serde_json::from_slice(line).map_err(|e| not_a_letter(e.to_string()))?;
                let record = letter.bytes().map_err(not_a_letter)?;
                letters[i].push(Replayed { position: letter_position(*seq, n)?, record });
            }
        }
        for l in &mut letters {
            // Batches come in number order from every destination; sorted
            // here so that no reader's order is relied on.
            l.sort_by_key(|r| r.position);
        }
        let next = vec![0; streams.len()];
        Ok(LetterReplay { streams, letters, next })
    }

    /// Letters per stream, all of them (including any a replay already sent).
    pub fn counts(&self) -> Vec<(String, usize)> {
        self.streams.iter().cloned().zip(self.letters.iter().map(Vec::len)).collect()
    }
}

impl Source for LetterReplay {
    fn streams(&self) -> Vec<String> {
        self.streams.clone()
    }

    fn open(&mut self, resume: &[ResumePoint]) -> Result<(), PluginError> {
        self.next.iter_mut().for_each(|n| *n = 0);
        for r in resume {
            if let (Some(next), Some(letters)) =
                (self.next.get_mut(r.partition as usize), self.letters.get(r.partition as usize))
            {
                *next = letters.partition_point(|l| l.position < r.position);
            }
        }
        Ok(())
    }

    fn read(&mut self, records_max: u32) -> Result<(Vec<Batch>, bool), PluginError> {
        let mut budget = records_max as usize;
        let mut batches = Vec::new();
        for (i, letters) in self.letters.iter().enumerate() {
            let from = self.next[i];
            let to = letters.len().min(from + budget);
            if to <= from {
                continue;
            }
            let records: Vec<Record> =
                letters[from..to].iter().map(|l| Record { position: l.position, bytes: l.record.clone() }).collect();
            let end = Position(letters[to - 1].position.0 + 1);
            batches.push(Batch {
                partition: i as u32,
                stream: self.streams[i].clone(),
                records,
                end,
                checkpoint: None,
                schema: None,
                window: skippr_core::Window::None,
                keys: Vec::new(),
            });
            budget -= to - from;
            self.next[i] = to;
        }
        let done = self.next.iter().zip(&self.letters).all(|(n, l)| *n >= l.len());
        Ok((batches, done))
    }

    fn ack(&mut self, _acks: &[(u32, Position)]) -> Result<(), PluginError> {
        Ok(())
    }

    fn describe(&self, partition: u32, position: Position) -> String {
        let stream = self.streams.get(partition as usize).map_or("?", String::as_str);
        format!(
            "the dead letter of stream {stream} at line {} of dead-letter batch {}",
            (position.0 & 0xffff_ffff) + 1,
            position.0 >> 32
        )
    }
}

/// A source that sends nothing and is done at once: the pipeline's own
/// source while a replay runs (its streams still name the pipeline's, and
/// nothing of its positions changes), or the replay's place in a daemon
/// that replays nothing.
pub struct Paused {
    streams: Vec<String>,
}

impl Paused {
    pub fn new(streams: Vec<String>) -> Paused {
        Paused { streams }
    }
}

impl Source for Paused {
    fn streams(&self) -> Vec<String> {
        self.streams.clone()
    }

    fn open(&mut self, _resume: &[ResumePoint]) -> Result<(), PluginError> {
        Ok(())
    }

    fn read(&mut self, _records_max: u32) -> Result<(Vec<Batch>, bool), PluginError> {
        Ok((Vec::new(), true))
    }

    fn ack(&mut self, _acks: &[(u32, Position)]) -> Result<(), PluginError> {
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn letter(record: &str) -> String {
        format!(r#"{{"stream":"s","reason":"r\n","record":{record}}}"#)
    }

    fn held(stream: &str, seq: u64, records: &[&str]) -> (String, u64, Vec<u8>) {
        let lines: Vec<String> = records.iter().map(|r| letter(r)).collect();
        (stream.into(), seq, format!("{}\n", lines.join("\n")).into_bytes())
    }

    fn drain(r: &mut LetterReplay, max: u32) -> Vec<(u32, Vec<u8>, u64)> {
        let mut out = Vec::new();
        loop {
            let (batches, done) = r.read(max).unwrap();
            for b in batches {
                assert!(b.records.iter().all(|x| x.position < b.end));
                out.extend(b.records.into_iter().map(|x| (b.partition, x.bytes, x.position.0)));
            }
            if done {
                return out;
            }
        }
    }

    #[test]
    fn letters_go_out_as_stored_in_batch_and_line_order_and_resume_after_a_position() {
        let held =
            vec![held("b", 1, &[r#"{"n": 3}"#]), held("b", 0, &[r#"{"n":1}"#, r#"[2, "x"]"#]), held("a", 4, &["7"])];
        let mut r = LetterReplay::new(vec!["a".into(), "b".into()], &held).unwrap();
        assert_eq!(r.counts(), vec![("a".to_string(), 1), ("b".to_string(), 3)]);
        let all = drain(&mut r, 2);
        let want: Vec<(u32, Vec<u8>, u64)> = vec![
            (0, b"7".to_vec(), 4 << 32),
            (1, br#"{"n":1}"#.to_vec(), 0),
            (1, br#"[2, "x"]"#.to_vec(), 1),
            (1, br#"{"n": 3}"#.to_vec(), 1 << 32),
        ];
        let mut sorted = all.clone();
        sorted.sort_by_key(|x| (x.0, x.2));
        assert_eq!(sorted, want, "each letter once, its record's bytes as stored");
        // Resumed after line 0 of batch 0 of `b`, and past everything of `a`.
        r.open(&[
            ResumePoint { partition: 1, position: Position(1), checkpoint: None },
            ResumePoint { partition: 0, position: Position((4 << 32) + 1), checkpoint: None },
        ])
        .unwrap();
        let rest: Vec<u64> = drain(&mut r, 100).into_iter().map(|x| x.2).collect();
        assert_eq!(rest, vec![1, 1 << 32]);
    }

    #[test]
    fn a_stream_the_source_lost_or_a_line_that_is_no_letter_is_named() {
        let e = LetterReplay::new(vec!["a".into()], &[held("gone", 2, &["1"])]).err().unwrap();
        assert!(e.contains("stream \"gone\"") && e.contains("batch 2"), "{e}");
        let broken = ("a".to_string(), 3, b"{\"record\":1}\nnot json\n".to_vec());
        let e = LetterReplay::new(vec!["a".into()], &[broken]).err().unwrap();
        assert!(e.contains("line 2 of dead-letter batch 3"), "{e}");
        assert!(letter_position(1 << 32, 0).is_err());
    }

    #[test]
    fn a_record_refused_at_intake_goes_back_as_its_bytes() {
        let lines = "{\"record_text\":\"{\\n\"}\n{\"record_base64\":\"Iv8i\"}\n";
        let mut r = LetterReplay::new(vec!["a".into()], &[("a".into(), 0, lines.as_bytes().to_vec())]).unwrap();
        let sent: Vec<Vec<u8>> = drain(&mut r, 10).into_iter().map(|x| x.1).collect();
        assert_eq!(sent, vec![b"{\n".to_vec(), b"\"\xff\"".to_vec()]);
        // A record that is JSON `null` is a record, not a missing one.
        let mut r = LetterReplay::new(vec!["a".into()], &[held("a", 0, &["null"])]).unwrap();
        assert_eq!(drain(&mut r, 10).into_iter().map(|x| x.1).collect::<Vec<_>>(), vec![b"null".to_vec()]);
        for bad in ["{\"record_base64\":\"!\"}", "{\"record\":1,\"record_text\":\"1\"}", "{}"] {
            let held = ("a".to_string(), 0, bad.as_bytes().to_vec());
            let e = LetterReplay::new(vec!["a".into()], &[held]).err().unwrap();
            assert!(e.contains("line 1 of dead-letter batch 0") && e.contains("is not a dead letter"), "{e}");
        }
    }

    #[test]
    fn nothing_to_replay_is_done_at_once() {
        let mut r = LetterReplay::new(vec!["a".into()], &[]).unwrap();
        assert_eq!(r.read(10).unwrap().0.len(), 0);
        assert!(r.read(10).unwrap().1);
        assert!(Paused::new(vec!["a".into()]).read(5).unwrap().1);
    }
}
