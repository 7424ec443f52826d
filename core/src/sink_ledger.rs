//! The sink ledger: the one rule every sink applies to a batch it is handed.
//!
//! A destination remembers, per (pipeline, WAL identity, stream, sequence
//! number), the batch it holds there: its `compaction_id` and a digest of
//! its records. A batch handed to the sink is a claim on that key. The
//! rule compares the claim with what is held: nothing held is a new batch
//! (write it); the same id with the same records is a replay
//! (`already_applied`, nothing written); anything else is a conflict
//! (`fatal`): two WALs, or two pipelines, would be writing one key, or the
//! destination was restored from elsewhere. The directory, S3 and
//! PostgreSQL sinks and the simulator's sink all ask [`judge`]; they differ
//! only in where they keep what is held and how they make a write atomic.
//!
//! The [`Scope`] (pipeline and WAL identity) is part of every key, so two
//! pipelines, or two WALs, may share a destination; its [`Scope::tag`] is
//! how file and object names carry it.

use crate::ids::CompactionId;
use crate::io::{Records, SinkOutcome};
use std::fmt;
use xxhash_rust::xxh3::{xxh3_128, xxh3_64, Xxh3};

/// Whose batches: one pipeline of one WAL.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Scope {
    /// The pipeline's name (`--pipeline`).
    pub pipeline: String,
    /// The WAL's identity: a directory on a host, a bucket and prefix, or a
    /// cluster.
    pub wal: String,
}

impl Scope {
    pub fn new(pipeline: &str, wal: &str) -> Scope {
        Scope { pipeline: pipeline.to_string(), wal: wal.to_string() }
    }

    /// The scope in a file or object name: the pipeline (characters other
    /// than ASCII letters, digits, `-` and `_` as `_`, at most 64 of them),
    /// `-`, and 16 hex digits of a hash of the pipeline and the WAL
    /// identity, so two scopes never share a tag (short of a 64-bit
    /// collision) and a tag never holds a `.`.
    pub fn tag(&self) -> String {
        let readable: String = self
            .pipeline
            .chars()
            .take(64)
            .map(|c| if c.is_ascii_alphanumeric() || c == '-' || c == '_' { c } else { '_' })
            .collect();
        let mut key = Vec::with_capacity(self.pipeline.len() + self.wal.len() + 1);
        key.extend_from_slice(self.pipeline.as_bytes());
        key.push(0);
        key.extend_from_slice(self.wal.as_bytes());
        format!("{readable}-{:016x}", xxh3_64(&key))
    }
}

/// A digest of a batch's records: xxh3-128 over each record followed by a
/// newline, which is the bytes the file-like sinks store, so a digest of a
/// file read back equals the digest of the batch that wrote it.
#[derive(Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Debug)]
pub struct Digest(pub u128);

impl Digest {
    pub fn of_records(records: &Records) -> Digest {
        let mut h = Xxh3::new();
        for r in records {
            h.update(r);
            h.update(b"\n");
        }
        Digest(h.digest128())
    }

    /// Of bytes as the file-like sinks store a batch (each record then `\n`).
    pub fn of_lines(body: &[u8]) -> Digest {
        Digest(xxh3_128(body))
    }

    /// 32 hex digits, as stored beside a batch.
    pub fn parse(hex: &str) -> Option<Digest> {
        (hex.len() == 32).then(|| u128::from_str_radix(hex, 16).ok()).flatten().map(Digest)
    }
}

impl fmt::Display for Digest {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{:032x}", self.0)
    }
}

/// A batch under one key: the claim, or what the destination holds.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub struct Entry {
    pub id: CompactionId,
    /// `None` where the destination kept no digest (PostgreSQL progress rows
    /// written before digests were kept): the id alone is compared.
    pub digest: Option<Digest>,
}

/// What the rule says about a claim.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub enum Verdict {
    /// Nothing is held under the key: write the batch.
    New,
    /// This very batch is held: a replay, `already_applied`.
    Same,
    /// Something else is held: `fatal`.
    Conflict(Conflict),
}

/// How a held batch differs from the claim.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub enum Conflict {
    /// Another batch holds the number.
    OtherId { held: CompactionId },
    /// The same id with other records.
    OtherRecords,
}

impl fmt::Display for Conflict {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Conflict::OtherId { held } => write!(f, "batch {held} already holds this number"),
            Conflict::OtherRecords => f.write_str("the batch is held with other records"),
        }
    }
}

/// The rule: a claim against what is held under its key.
pub fn judge(claim: Entry, held: Option<Entry>) -> Verdict {
    let Some(held) = held else { return Verdict::New };
    if held.id != claim.id {
        return Verdict::Conflict(Conflict::OtherId { held: held.id });
    }
    match (held.digest, claim.digest) {
        (Some(a), Some(b)) if a != b => Verdict::Conflict(Conflict::OtherRecords),
        _ => Verdict::Same,
    }
}

impl Verdict {
    /// The sink's answer once a `New` batch is written (`Applied`), or at
    /// once for the others.
    pub fn outcome(self) -> SinkOutcome {
        match self {
            Verdict::New => SinkOutcome::Applied,
            Verdict::Same => SinkOutcome::AlreadyApplied,
            Verdict::Conflict(_) => SinkOutcome::Fatal,
        }
    }
}

/// What an operator reads when a sink answers `fatal` on a conflict.
pub fn conflict_message(stream: &str, seq: u64, id: CompactionId, conflict: Conflict) -> String {
    format!(
        "batch {seq} of stream {stream} (compaction id {id}) conflicts with the destination: {conflict}; another WAL or \
         pipeline writes under this pipeline and WAL identity, or the destination was restored from elsewhere: give \
         this pipeline a destination of its own, or restore the destination with its WAL"
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    fn entry(id: u64, digest: Option<u128>) -> Entry {
        Entry { id: CompactionId(id), digest: digest.map(Digest) }
    }

    #[test]
    fn the_rule_answers_new_same_or_conflict() {
        assert_eq!(judge(entry(1, Some(7)), None), Verdict::New);
        assert_eq!(judge(entry(1, Some(7)), Some(entry(1, Some(7)))), Verdict::Same);
        assert_eq!(
            judge(entry(1, Some(7)), Some(entry(2, Some(7)))),
            Verdict::Conflict(Conflict::OtherId { held: CompactionId(2) })
        );
        assert_eq!(judge(entry(1, Some(7)), Some(entry(1, Some(8)))), Verdict::Conflict(Conflict::OtherRecords));
        // A destination that kept no digest compares the id alone.
        assert_eq!(judge(entry(1, Some(7)), Some(entry(1, None))), Verdict::Same);
        assert_eq!(
            judge(entry(1, Some(7)), Some(entry(2, None))),
            Verdict::Conflict(Conflict::OtherId { held: CompactionId(2) })
        );
        assert_eq!(Verdict::New.outcome(), SinkOutcome::Applied);
        assert_eq!(Verdict::Same.outcome(), SinkOutcome::AlreadyApplied);
        assert_eq!(Verdict::Conflict(Conflict::OtherRecords).outcome(), SinkOutcome::Fatal);
    }

    #[test]
    fn a_digest_of_records_is_the_digest_of_their_lines() {
        let records: Records = [&b"{\"a\":1}"[..], b"{\"a\":2}"].into_iter().collect();
        assert_eq!(Digest::of_records(&records), Digest::of_lines(b"{\"a\":1}\n{\"a\":2}\n"));
        assert_ne!(Digest::of_records(&records), Digest::of_lines(b"{\"a\":1}\n{\"a\":2}"));
        let d = Digest::of_records(&records);
        assert_eq!(Digest::parse(&d.to_string()), Some(d));
        assert_eq!(Digest::parse("xyz"), None);
    }

    #[test]
    fn tags_are_readable_distinct_and_dotless() {
        let a = Scope::new("main", "disk://h/data/wal/").tag();
        assert!(a.starts_with("main-") && a.len() == 5 + 16, "{a}");
        assert_ne!(a, Scope::new("main", "disk://h/other/wal/").tag());
        assert_ne!(a, Scope::new("main2", "disk://h/data/wal/").tag());
        // Sanitized names that read alike still differ by their hash.
        let (x, y) = (Scope::new("a.b", "w").tag(), Scope::new("a_b", "w").tag());
        assert!(x.starts_with("a_b-") && y.starts_with("a_b-") && x != y, "{x} {y}");
        assert!(!Scope::new("../x/y", "w").tag().contains(['.', '/']));
        // Pinned: the tag names files in destinations, so it never changes.
        assert_eq!(Scope::new("main", "w").tag(), "main-66a79aff5a2f62e1");
    }
}
