//! What the engine admits from outside: the rules a record and a stream name
//! must meet before anything is built from them. Every source checks its
//! records here, once, where they enter; the sinks and plugins that receive
//! them later rely on these rules (a record is embedded verbatim in a plugin
//! message because it is exactly one JSON value on one line).

use std::fmt;

/// The default largest record, in bytes (less where a WAL segment is
/// smaller than twice this: [`record_bytes_max_for`]).
pub const RECORD_BYTES_MAX_DEFAULT: u64 = 4 << 20;
/// The largest record `--record-bytes-max` may allow: a commit group that
/// holds one stays well within the largest frame the WAL and the peer
/// protocol accept (64 MiB).
pub const RECORD_BYTES_MAX_LIMIT: u64 = 32 << 20;

/// The largest record a WAL of `segment_bytes` segments takes: half a
/// segment, so that a record too large for a usual commit group gets a
/// group of its own in a fresh segment, beside the segment's snapshot.
pub fn segment_record_bytes_max(segment_bytes: u64) -> u64 {
    segment_bytes / 2
}

/// The record limit when none is configured: the default, or half a
/// segment where that is less.
pub fn record_bytes_max_for(segment_bytes: u64) -> u64 {
    RECORD_BYTES_MAX_DEFAULT.min(segment_record_bytes_max(segment_bytes))
}
/// The longest stream name, in bytes: PostgreSQL's identifier limit, so a
/// stream's table is named by the stream and never truncated.
pub const STREAM_NAME_BYTES_MAX: usize = 63;
/// Names a stream may not take: the PostgreSQL sink's own tables.
pub const RESERVED_STREAM_NAMES: &[&str] = &["skippr_progress"];

/// Why a record was refused.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum RecordFault {
    /// Larger than the configured limit.
    TooLarge { bytes: u64, bytes_max: u64 },
    /// Not valid UTF-8 (the byte offset of the first bad byte).
    NotUtf8 { at: usize },
    /// A line break outside a string: it would end a JSON-lines message.
    LineBreak { at: usize },
    /// Not exactly one JSON value (the parser's reason, with its place).
    NotJson(String),
}

impl fmt::Display for RecordFault {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            RecordFault::TooLarge { bytes, bytes_max } => {
                write!(f, "it is {bytes} bytes, more than --record-bytes-max ({bytes_max})")
            }
            RecordFault::NotUtf8 { at } => write!(f, "it is not valid UTF-8 (byte {at})"),
            RecordFault::LineBreak { at } => write!(f, "it holds a line break outside a string (byte {at})"),
            RecordFault::NotJson(why) => write!(f, "it is not exactly one JSON value: {why}"),
        }
    }
}

/// Checks that `bytes` is one record the engine may admit: at most
/// `bytes_max` bytes, valid UTF-8, exactly one JSON value (whitespace around
/// it allowed; the parse does not recurse, so nesting costs no stack), and no
/// line break (a raw CR or LF can only be whitespace between tokens in valid
/// JSON).
pub fn check_record(bytes: &[u8], bytes_max: u64) -> Result<(), RecordFault> {
    if bytes.len() as u64 > bytes_max {
        return Err(RecordFault::TooLarge { bytes: bytes.len() as u64, bytes_max });
    }
    let text = std::str::from_utf8(bytes).map_err(|e| RecordFault::NotUtf8 { at: e.valid_up_to() })?;
    serde_json::from_str::<serde::de::IgnoredAny>(text).map_err(|e| RecordFault::NotJson(e.to_string()))?;
    if let Some(at) = memchr::memchr2(b'\n', b'\r', bytes) {
        return Err(RecordFault::LineBreak { at });
    }
    Ok(())
}

/// Whether a record refused at intake for `fault` goes to the dead letters
/// (`letters`: they are on) rather than stopping the daemon. A record too
/// large never does: the WAL would have to hold it whole, and a letter
/// carries the record whole, so its limit is the one it broke.
pub fn quarantines(fault: &RecordFault, letters: bool) -> bool {
    letters && !matches!(fault, RecordFault::TooLarge { .. })
}

/// Checks a stream name: 1 to 63 bytes of ASCII letters, digits, `_`, `-`
/// and `.`, starting with a letter, a digit or `_`, and not reserved. Such a
/// name is a safe directory name, S3 key part and PostgreSQL identifier.
pub fn check_stream_name(name: &str) -> Result<(), String> {
    let first_ok = name.bytes().next().is_some_and(|b| b.is_ascii_alphanumeric() || b == b'_');
    let rest_ok = name.bytes().all(|b| b.is_ascii_alphanumeric() || matches!(b, b'_' | b'-' | b'.'));
    if name.is_empty() {
        Err("a stream name may not be empty".into())
    } else if name.len() > STREAM_NAME_BYTES_MAX {
        Err(format!("the stream name {:?} is {} bytes, more than {STREAM_NAME_BYTES_MAX}", clip(name), name.len()))
    } else if !first_ok || !rest_ok {
        Err(format!(
            "the stream name {name:?} is refused: use ASCII letters, digits, '_', '-' and '.', starting with a \
             letter, a digit or '_'"
        ))
    } else if RESERVED_STREAM_NAMES.contains(&name.to_ascii_lowercase().as_str()) {
        Err(format!("the stream name {name:?} is reserved (a sink's own table): rename the stream"))
    } else {
        Ok(())
    }
}

fn clip(name: &str) -> String {
    name.chars().take(40).collect::<String>() + if name.chars().count() > 40 { "..." } else { "" }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_record_is_one_json_value_on_one_line_within_the_limit() {
        for ok in [&b"{\"a\":1}"[..], b"1", b"\"x\"", b"  [1, 2]\t", b"null", "{\"é\":\"\\n\"}".as_bytes()] {
            assert_eq!(check_record(ok, 100), Ok(()), "{:?}", String::from_utf8_lossy(ok));
        }
        assert_eq!(check_record(b"{}", 1), Err(RecordFault::TooLarge { bytes: 2, bytes_max: 1 }));
        assert_eq!(check_record(b"\"\xff\"", 100), Err(RecordFault::NotUtf8 { at: 1 }));
        assert_eq!(check_record(b"{\"a\":\n1}", 100), Err(RecordFault::LineBreak { at: 5 }));
        assert_eq!(check_record(b"1\r", 100), Err(RecordFault::LineBreak { at: 1 }));
        for bad in [&b""[..], b"   ", b"{\"a\":1}]", b"1 2", b"{\"a\":1},{\"b\":2}", b"{", b"\"\x01\"", b"nul"] {
            assert!(
                matches!(check_record(bad, 100), Err(RecordFault::NotJson(_))),
                "{:?} was admitted",
                String::from_utf8_lossy(bad)
            );
        }
        // The check does not recurse: nesting costs no stack.
        let deep = "[".repeat(100_000) + &"]".repeat(100_000);
        assert_eq!(check_record(deep.as_bytes(), 1 << 20), Ok(()));
    }

    #[test]
    fn stream_names_are_safe_as_paths_keys_and_identifiers() {
        for ok in ["events", "a", "public-users", "db.table_1", "_x", &"n".repeat(63)] {
            assert_eq!(check_stream_name(ok), Ok(()), "{ok}");
        }
        for bad in
            ["", ".", "..", "../x", "a/b", "-x", ".hidden", "a b", "é", "x\0", "skippr_progress", "SKIPPR_PROGRESS"]
        {
            assert!(check_stream_name(bad).is_err(), "{bad:?} was admitted");
        }
        assert!(check_stream_name(&"n".repeat(64)).unwrap_err().contains("more than 63"));
    }
}
