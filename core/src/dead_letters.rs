//! Dead letters: what a record a sink refused becomes. Each is one JSON line
//! that carries the record's exact bytes and where it came from (stream,
//! source, partition, position), the batch that held it (sink,
//! `compaction_id`, sequence number), the sink's reason and when the refusal
//! was decided. Everything in it comes from the WAL's refusal, so a replay
//! writes identical bytes and the dead-letter destination's ledger judges it
//! a replay.

use crate::ids::*;
use std::fmt::Write as _;

/// The longest reason a refusal keeps, in bytes (a longer one is cut at a
/// character boundary): the WAL holds one per refused record.
pub const REASON_BYTES_MAX: usize = 512;

/// The reason of a record found by splitting a batch its sink answered
/// `fatal` for (a sink that names no record it refuses): the sink answered
/// `fatal` for it alone.
pub const FATAL_ALONE: &str = "the sink answered fatal for a batch of this record alone";

/// One refused record and where it came from, by name.
pub struct Letter<'a> {
    pub stream: &'a str,
    pub sink: &'a str,
    pub source: &'a str,
    pub partition: u32,
    pub position: Position,
    /// The attempt the sink refused, and its batch's number.
    pub compaction_id: CompactionId,
    pub seq: CompactionSeq,
    pub reason: &'a str,
    pub at_ms: u64,
    pub record: &'a [u8],
}

impl Letter<'_> {
    /// The dead letter's bytes: a JSON object on one line, the record
    /// embedded as the source sent it (a JSON value without a line break,
    /// as intake checked), last.
    pub fn write(&self, out: &mut Vec<u8>) {
        let mut head = String::with_capacity(256);
        let text = |s: &str| serde_json::to_string(s).expect("a string serializes");
        let _ = write!(
            head,
            "{{\"stream\":{},\"sink\":{},\"source\":{},\"partition\":{},\"position\":{},\"compaction_id\":\"{}\",\
             \"seq\":{},\"reason\":{},\"decided_at\":\"{}\",\"decided_at_ms\":{},\"record\":",
            text(self.stream),
            text(self.sink),
            text(self.source),
            self.partition,
            self.position.0,
            self.compaction_id,
            self.seq.0,
            text(self.reason),
            rfc3339(self.at_ms),
            self.at_ms,
        );
        out.extend_from_slice(head.as_bytes());
        out.extend_from_slice(self.record);
        out.push(b'}');
    }
}

/// A reason as the WAL keeps it: control characters and the invisible
/// ones that reorder or hide text escaped (`\n`, `\u{1b}`, `\u{202e}`: a
/// reason reaches log lines and a terminal, where a plugin's raw bytes
/// could forge a line, move the cursor or show text other than it is),
/// then at most
/// `REASON_BYTES_MAX` bytes, cut at a character boundary; an empty one says
/// so.
pub fn kept_reason(reason: &str) -> String {
    if reason.is_empty() {
        return "(the sink gave no reason)".to_string();
    }
    let mut kept = String::with_capacity(reason.len().min(REASON_BYTES_MAX));
    for c in reason.chars() {
        let before = kept.len();
        if c.is_control() || hides_text(c) {
            kept.extend(c.escape_default());
        } else {
            kept.push(c);
        }
        if kept.len() > REASON_BYTES_MAX {
            kept.truncate(before);
            break;
        }
    }
    kept
}

/// Bidirectional overrides, embeddings, isolates and marks (the
/// "Trojan Source" characters), zero-width characters and the byte-order
/// mark: shown as they are, they make a line read other than its bytes.
fn hides_text(c: char) -> bool {
    matches!(c, '\u{061c}' | '\u{200b}'..='\u{200f}' | '\u{202a}'..='\u{202e}' | '\u{2060}'..='\u{2069}' | '\u{feff}')
}

/// Milliseconds since the Unix epoch as RFC 3339 in UTC (fractions of a
/// second without trailing zeros).
pub fn rfc3339(ms: u64) -> String {
    let at = ::time::OffsetDateTime::UNIX_EPOCH + ::time::Duration::milliseconds(ms.min(i64::MAX as u64) as i64);
    at.format(&::time::format_description::well_known::Rfc3339)
        .unwrap_or_else(|_| format!("{ms} ms after the Unix epoch"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_dead_letter_is_one_json_line_with_the_record_as_sent() {
        let letter = Letter {
            stream: "orders",
            sink: "postgres",
            source: "file",
            partition: 3,
            position: Position(1201),
            compaction_id: CompactionId(0x51fa_c6e8_d4f3_338e),
            seq: CompactionSeq(41),
            reason: "invalid input syntax for type bigint: \"x\"\nline 2",
            at_ms: 1_764_990_000_123,
            record: br#"{"id": "x" ,"n":1}"#,
        };
        let mut out = Vec::new();
        letter.write(&mut out);
        let text = std::str::from_utf8(&out).unwrap();
        assert!(!text.contains('\n'), "one line: {text}");
        let v: serde_json::Value = serde_json::from_str(text).unwrap();
        assert_eq!(v["reason"], "invalid input syntax for type bigint: \"x\"\nline 2");
        assert_eq!(v["compaction_id"], "51fac6e8d4f3338e");
        assert_eq!(v["decided_at"], "2025-12-06T03:00:00.123Z");
        assert_eq!(v["record"]["id"], "x");
        assert!(text.ends_with(r#""record":{"id": "x" ,"n":1}}"#), "the record's bytes as sent: {text}");
    }

    #[test]
    fn reasons_are_cut_at_a_character_boundary() {
        let long = "é".repeat(REASON_BYTES_MAX);
        let kept = kept_reason(&long);
        assert!(kept.len() <= REASON_BYTES_MAX && kept.len() >= REASON_BYTES_MAX - 1);
        assert_eq!(kept_reason(""), "(the sink gave no reason)");
        assert_eq!(kept_reason("short"), "short");
    }

    #[test]
    fn control_characters_in_reasons_are_escaped() {
        assert_eq!(kept_reason("bad\nINFO forged\x1b[2J\t"), "bad\\nINFO forged\\u{1b}[2J\\t");
        // Text that would show reversed, or hide a word, shows its code points.
        assert_eq!(kept_reason("id \u{202e}txt.exe\u{2066}x\u{200b}"), "id \\u{202e}txt.exe\\u{2066}x\\u{200b}");
        assert_eq!(kept_reason("naïve ✓ 東京"), "naïve ✓ 東京", "other text stays as it is");
        // An escape is never cut in half.
        let near = format!("{}\n", "x".repeat(REASON_BYTES_MAX - 1));
        assert_eq!(kept_reason(&near), "x".repeat(REASON_BYTES_MAX - 1));
    }
}
