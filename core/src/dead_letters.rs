//! Dead letters: what a record a sink refused becomes. Each is one JSON line
//! that carries the record's exact bytes and where it came from (stream,
//! source, partition, position), the batch that held it (sink,
//! `compaction_id`, sequence number), the sink's reason and when the refusal
//! was decided. Everything in it comes from the WAL's refusal, so a replay
//! writes identical bytes and the dead-letter destination's ledger judges it
//! a replay.
//!
//! A record refused at intake (not one JSON value on one line) is committed
//! to the WAL all the same, wrapped as *quarantined* ([`quarantine`]): its
//! bytes prefixed by a line break, which no admitted record holds, the time
//! of the decision and its reason. Compaction never sends it to a sink; its
//! dead letter carries the bytes as text (`record_text`) or, where they are
//! not UTF-8, as base64 (`record_base64`), since they are no JSON value to
//! embed.

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
    pub record: LetterRecord<'a>,
}

/// A dead letter's record: one a sink refused (a JSON value, embedded as
/// the source sent it), or one refused at intake (any bytes).
#[derive(Clone, Copy)]
pub enum LetterRecord<'a> {
    Json(&'a [u8]),
    Intake(&'a [u8]),
}

impl Letter<'_> {
    /// The dead letter's bytes: a JSON object on one line, the record
    /// last: embedded as the source sent it (a JSON value without a line
    /// break, as intake checked), or, refused at intake, as a JSON string
    /// (`record_text`) or base64 (`record_base64`).
    pub fn write(&self, out: &mut Vec<u8>) {
        let mut head = String::with_capacity(256);
        let text = |s: &str| serde_json::to_string(s).expect("a string serializes");
        let _ = write!(
            head,
            "{{\"stream\":{},\"sink\":{},\"source\":{},\"partition\":{},\"position\":{},\"compaction_id\":\"{}\",\
             \"seq\":{},\"reason\":{},\"decided_at\":\"{}\",\"decided_at_ms\":{},",
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
        match self.record {
            LetterRecord::Json(record) => {
                out.extend_from_slice(b"\"record\":");
                out.extend_from_slice(record);
            }
            LetterRecord::Intake(bytes) => match std::str::from_utf8(bytes) {
                Ok(t) => out.extend_from_slice(format!("\"record_text\":{}", text(t)).as_bytes()),
                Err(_) => {
                    use base64::Engine as _;
                    let b64 = base64::engine::general_purpose::STANDARD.encode(bytes);
                    out.extend_from_slice(format!("\"record_base64\":\"{b64}\"").as_bytes());
                }
            },
        }
        out.push(b'}');
    }
}

/// How the reason of every record refused at intake begins (the rule it
/// broke follows): the metrics' reason class of such letters.
pub const AT_INTAKE: &str = "refused at intake";

/// The first byte of a quarantined record as the WAL holds it: a line
/// break, which `admit::check_record` never lets into a record.
const QUARANTINE_MARK: u8 = b'\n';
/// Mark, decision time (8 bytes) and reason length (2 bytes).
const QUARANTINE_HEAD: usize = 1 + 8 + 2;

/// A record refused at intake as the WAL holds it: what [`quarantine`]
/// wrapped.
#[derive(Debug, PartialEq, Eq)]
pub struct Quarantined<'a> {
    pub at_ms: u64,
    pub reason: &'a str,
    pub record: &'a [u8],
}

/// Wraps a record refused at intake for the WAL: the mark, when the
/// decision was made, why (kept like a sink's reason) and the bytes as the
/// source sent them.
pub fn quarantine(at_ms: u64, reason: &str, record: &[u8]) -> Vec<u8> {
    let reason = kept_reason(reason);
    let mut out = Vec::with_capacity(QUARANTINE_HEAD + reason.len() + record.len());
    out.push(QUARANTINE_MARK);
    out.extend_from_slice(&at_ms.to_le_bytes());
    out.extend_from_slice(&(reason.len() as u16).to_le_bytes());
    out.extend_from_slice(reason.as_bytes());
    out.extend_from_slice(record);
    out
}

/// What a quarantined record holds; `None` for any other record.
pub fn quarantined(bytes: &[u8]) -> Option<Quarantined<'_>> {
    if bytes.first() != Some(&QUARANTINE_MARK) || bytes.len() < QUARANTINE_HEAD {
        return None;
    }
    let at_ms = u64::from_le_bytes(bytes[1..9].try_into().expect("eight bytes"));
    let len = u16::from_le_bytes([bytes[9], bytes[10]]) as usize;
    let rest = &bytes[QUARANTINE_HEAD..];
    let reason = std::str::from_utf8(rest.get(..len)?).ok()?;
    Some(Quarantined { at_ms, reason, record: &rest[len..] })
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
            record: LetterRecord::Json(br#"{"id": "x" ,"n":1}"#),
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
    fn a_record_refused_at_intake_is_kept_whole_and_its_letter_is_json() {
        let bytes = b"{\"a\":\n1} \xff";
        let kept = quarantine(7, "not JSON", bytes);
        assert!(crate::admit::check_record(&kept, u64::MAX).is_err(), "never passes as a record");
        let q = quarantined(&kept).expect("quarantined");
        assert_eq!((q.at_ms, q.reason, q.record), (7, "not JSON", &bytes[..]));
        assert_eq!(quarantined(b"{\"a\":1}"), None);
        assert_eq!(quarantined(b"\n"), None, "too short to be one");
        let letter = |record| {
            let letter = Letter {
                stream: "s",
                sink: "k",
                source: "file",
                partition: 0,
                position: Position(4),
                compaction_id: CompactionId(1),
                seq: CompactionSeq(0),
                reason: "refused at intake",
                at_ms: 0,
                record,
            };
            let mut out = Vec::new();
            letter.write(&mut out);
            serde_json::from_slice::<serde_json::Value>(&out).expect("one JSON object")
        };
        let v = letter(LetterRecord::Intake(bytes));
        assert_eq!(v["record_base64"], "eyJhIjoKMX0g/w==", "not UTF-8: base64");
        let v = letter(LetterRecord::Intake(b"{\"a\":\n1}"));
        assert_eq!(v["record_text"], "{\"a\":\n1}", "UTF-8: as text");
        assert_eq!(v.get("record"), None);
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
