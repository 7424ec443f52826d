//! WAL frames: what a commit group is made of, their payloads, and the frame
//! codec with its seeded CRC32C.
//!
//! A frame on disk is
//! `len: u32 | crc: u32 | lsn: u64 | epoch: u64 | kind: u8 | payload[len]`.
//! The checksum covers kind and payload and is seeded with the segment id, the
//! writer epoch and the LSN, so bytes left behind by an earlier use of the same
//! file (another segment id), an earlier writer (another epoch) or an earlier
//! group never pass as current ones.

use super::codec::{Reader, Writer};
use super::payload::{decode_payload_as, get_checkpoint, get_key};
use crate::ids::*;

pub const FRAME_HEADER_BYTES: usize = 4 + 4 + 8 + 8 + 1;
/// Payload bytes of a commit record: frame count and group bytes.
pub const COMMIT_PAYLOAD_BYTES: usize = 8;
pub const COMMIT_FRAME_BYTES: usize = FRAME_HEADER_BYTES + COMMIT_PAYLOAD_BYTES;
/// A group is never larger than this, whatever the configuration says.
pub const GROUP_BYTES_LIMIT: usize = 64 << 20;

#[repr(u8)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum FrameKind {
    SourceBatch = 1,
    SchemaDecision = 2,
    CompactionPlanned = 3,
    CompactionDone = 4,
    Snapshot = 5,
    Seal = 6,
    Commit = 7,
    Fence = 8,
    Membership = 9,
    Finished = 10,
    AllFinished = 11,
    Skipped = 12,
    Refused = 13,
    Settled = 14,
    BatchSkipped = 15,
    Split = 16,
    Window = 17,
}

impl FrameKind {
    fn from_u8(v: u8) -> Option<FrameKind> {
        Some(match v {
            1 => FrameKind::SourceBatch,
            2 => FrameKind::SchemaDecision,
            3 => FrameKind::CompactionPlanned,
            4 => FrameKind::CompactionDone,
            5 => FrameKind::Snapshot,
            6 => FrameKind::Seal,
            7 => FrameKind::Commit,
            8 => FrameKind::Fence,
            9 => FrameKind::Membership,
            10 => FrameKind::Finished,
            11 => FrameKind::AllFinished,
            12 => FrameKind::Skipped,
            13 => FrameKind::Refused,
            14 => FrameKind::Settled,
            15 => FrameKind::BatchSkipped,
            16 => FrameKind::Split,
            17 => FrameKind::Window,
            _ => return None,
        })
    }
}

/// One source record: its own position and its exact bytes.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Record {
    pub position: Position,
    pub bytes: Vec<u8>,
}

/// Records of one partition, the position after them, and the source's opaque
/// checkpoint at that position.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SourceBatch {
    pub key: PartitionKey,
    pub stream: StreamId,
    pub end: Position,
    pub checkpoint: Option<Vec<u8>>,
    pub records: Vec<Record>,
    /// Read back counted, not decoded (`RecordMode::Counted`): `records`
    /// is empty and this says what it would hold. Never written.
    pub counted: Option<Counted>,
    /// Its records belong to its source's open window: committed, but the
    /// partition's position, checkpoint, acks and offsets move only when a
    /// `Window` frame closes the window, and a void window's records are
    /// never delivered. Never with a checkpoint.
    pub provisional: bool,
}

/// What the records of a batch read in `RecordMode::Counted` are: how many,
/// their bytes, their first and last positions.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Counted {
    pub count: u64,
    pub bytes: u64,
    pub first: Position,
    pub last: Position,
}

impl SourceBatch {
    /// How many records the batch holds, decoded or counted.
    pub fn count(&self) -> u64 {
        self.counted.map_or(self.records.len() as u64, |c| c.count)
    }
}

/// How a source batch's records are read: each into its own bytes, or only
/// checked and counted (recovery, once its record cache is full, and `wal
/// verify`, which keep no record bytes).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum RecordMode {
    #[default]
    Owned,
    Counted,
}

/// Input of partition `key` from position `at` (included) to `next` (not
/// included) that an operator chose to give up, and why.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Skipped {
    pub key: PartitionKey,
    pub stream: StreamId,
    pub at: Position,
    pub next: Position,
    pub reason: String,
}

/// Records of an open compaction that its sink refused, and why
/// (`run --dead-letter`): the decision, committed before anything follows
/// from it. From then on the plan is sent without these records, as attempt
/// `then` under the same sequence number, until the sink holds one of the
/// plan's attempts (`Settled`).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Refusal {
    pub sink: SinkId,
    pub stream: StreamId,
    /// The attempt refused: the plan's id, or the `then` of the plan's last
    /// refusal.
    pub id: CompactionId,
    pub seq: CompactionSeq,
    /// The id the plan is sent under from now on (`compaction::without`).
    pub then: CompactionId,
    /// When the refusal was decided, in milliseconds since the Unix epoch,
    /// by the driver's clock: dead letters carry it, the same on every
    /// replay.
    pub at_ms: u64,
    /// In batch order.
    pub records: Vec<RefusedRecord>,
}

/// Which attempt of an open plan with refusals the sink holds, found by
/// its answer: the last one sent, or (a refused attempt that landed after
/// all, sent by a process that has since died) an earlier one, found by
/// sending them again newest first. The refusals before `held` stand and
/// their records go to the dead letters as batch `letters` of (sink,
/// stream); those after it are void (their records are in the sink).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Settled {
    pub sink: SinkId,
    pub stream: StreamId,
    pub seq: CompactionSeq,
    pub held: CompactionId,
    /// `None` where no refusal stands and the held attempt holds no
    /// record quarantined at intake.
    pub letters: Option<CompactionSeq>,
    /// How many records quarantined at intake the held attempt's ranges
    /// hold (never sent to the sink; in the dead letters after the
    /// refused ones).
    pub quarantined: u64,
}

impl Settled {
    /// The refusals that stand: those of `refusals` (the plan's, in order)
    /// made before the attempt the sink holds.
    pub fn standing<'a>(&self, refusals: &'a [Refusal]) -> &'a [Refusal] {
        // The sink holds the attempt a refusal made, or one made before
        // any (the plan's own, or a split's).
        let made = refusals.iter().position(|r| r.then == self.held).map_or(0, |i| i + 1);
        &refusals[..made]
    }
}

/// A sink answered `fatal` for every version of an open plan that has no
/// refusals, naming no record (`run --dead-letter`, a sink that cannot
/// refuse records by name): the plan is cut to the first half of the
/// records of its last version, sent as attempt `then` under the same
/// number; the rest is planned again after it. Halving down to one record
/// finds a record the sink cannot take, which is then refused like any
/// other (`Refusal`).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Split {
    pub sink: SinkId,
    pub stream: StreamId,
    /// The version cut: the plan's id or the `then` of its last split.
    pub id: CompactionId,
    pub seq: CompactionSeq,
    /// The id the plan is sent under from now on (`compaction::cut`).
    pub then: CompactionId,
    /// The plan's ranges, each cut (`from` as planned, `to` at most as
    /// planned, possibly empty).
    pub ranges: Vec<Range>,
}

/// The end of a source's open window (its provisional batches): closed,
/// the partitions it holds move to the ends given here with the closing
/// checkpoint; void (the source started over from its last closed window,
/// or a restart found the window open), they move to the same ends with
/// their checkpoints as they were, so that positions of a void window are
/// never used again, and its records are never delivered. Every sink that
/// had delivered everything before a void window moves past it too.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct WindowEnd {
    pub source: SourceId,
    /// `None` for a void window.
    pub checkpoint: Option<Vec<u8>>,
    pub closed: bool,
    /// Each partition the window holds records of, in partition order.
    pub parts: Vec<WindowPart>,
    /// Closed windows: each partition's records at its bookmark
    /// (`Tail`), for the partitions the window holds.
    pub tails: Vec<Tail>,
}

/// A partition's share of an open window: its records from `from` (the
/// partition's position when the window opened) to `to`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct WindowPart {
    pub partition: u32,
    pub stream: StreamId,
    pub from: Position,
    pub to: Position,
    pub records: u64,
}

/// The last records a partition committed that share one resume key (a
/// Singer tap's replication-key value): their digests, in order, at most
/// `TAIL_DIGESTS_MAX` (`more` when there were more). A source that
/// resumes inclusively sends them again first; those found here are
/// dropped (`host::sources`, the bookmark rule). No digests: the
/// partition's last records carried no resume key, and nothing is kept.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Tail {
    pub partition: u32,
    pub key: u64,
    pub digests: Vec<u64>,
    pub more: bool,
}

/// The most record digests a partition's tail keeps.
pub const TAIL_DIGESTS_MAX: usize = 4096;

/// An open plan an operator gave up (`run --skip-batch`): its records go to
/// neither the sink nor the dead letters, and the plan counts as done.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct BatchSkipped {
    pub sink: SinkId,
    pub stream: StreamId,
    pub seq: CompactionSeq,
    /// The plan's id (its first attempt's).
    pub id: CompactionId,
    pub reason: String,
}

/// One refused record: where it is, and the sink's reason.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub struct RefusedRecord {
    pub key: PartitionKey,
    pub position: Position,
    pub reason: String,
}

/// A schema plugin's answer for a stream, committed so that replay never asks
/// again.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SchemaDecision {
    pub stream: StreamId,
    pub fingerprint: u64,
}

/// The records of `key` with positions in `from..to`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub struct Range {
    pub key: PartitionKey,
    pub from: Position,
    pub to: Position,
}

/// A destination batch as planned: its stable id, dense number and ranges
/// (sorted by partition, never overlapping an earlier plan).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct CompactionPlan {
    pub sink: SinkId,
    pub stream: StreamId,
    pub id: CompactionId,
    pub seq: CompactionSeq,
    pub schema: u64,
    pub ranges: Vec<Range>,
}

/// A destination batch a compaction plan names (read from a group by
/// `group_facts`, without the plan's ranges).
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub struct PlannedBatch {
    pub sink: SinkId,
    pub stream: StreamId,
    pub id: CompactionId,
    pub seq: CompactionSeq,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct CompactionDone {
    pub sink: SinkId,
    pub stream: StreamId,
    pub id: CompactionId,
    pub seq: CompactionSeq,
    /// With dead letters on: how many records the sink holds of it (what
    /// the dead-letter breaker counts as decided, beside those refused).
    pub records: Option<u64>,
}

/// A partition's committed state: what the engine keeps per partition and
/// what a snapshot carries, in one shape.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PartitionState {
    pub stream: StreamId,
    /// The next position to read: everything below is committed.
    pub position: Position,
    /// The commit that moved `position` here.
    pub lsn: Lsn,
    pub records: u64,
    pub checkpoint: Option<Vec<u8>>,
}

/// Everything recovery needs that older segments held: written as the first
/// frame of every segment, so the segments before it can be deleted.
#[derive(Clone, Debug, PartialEq, Eq, Default)]
pub struct Snapshot {
    pub partitions: Vec<(PartitionKey, PartitionState)>,
    /// Acknowledged compacted-through position per (sink, partition).
    pub acked: Vec<(SinkId, PartitionKey, Position)>,
    /// Next sequence number per (sink, stream).
    pub next_seq: Vec<(SinkId, StreamId, CompactionSeq)>,
    pub schemas: Vec<SchemaDecision>,
    pub open: Vec<CompactionPlan>,
    /// The names behind every id the WAL uses: sources, sinks, streams, in
    /// id order. Recovery refuses a configuration that renames or reorders
    /// them.
    pub names: Names,
    /// Clustered `--once`: the terminal entry committed at this LSN and no
    /// source batch since, and where every member was known to have learnt
    /// so (written only when the first is set, so other snapshots keep
    /// their bytes).
    pub finished: Option<Lsn>,
    pub all_finished: Option<Lsn>,
    /// `run --dead-letter`'s state (written only where there is any, so
    /// other snapshots keep their bytes).
    pub letters: Box<LetterState>,
    /// Sources' open windows and partitions' tails (written only where
    /// there are any).
    pub windows: Box<WindowState>,
}

/// What a snapshot keeps of windows: each source's open window (its
/// parts), and each partition's tail.
#[derive(Clone, Debug, PartialEq, Eq, Default)]
pub struct WindowState {
    pub open: Vec<(SourceId, Vec<WindowPart>)>,
    pub tails: Vec<(SourceId, Tail)>,
    /// Void windows some sink has not passed: partition, from, to.
    pub voids: Vec<(PartitionKey, Position, Position)>,
}

/// What a snapshot keeps of dead letters: the next dead-letter batch
/// number per (sink, stream), the refusals and settlements of the open
/// plans, and the breaker's count.
#[derive(Clone, Debug, PartialEq, Eq, Default)]
pub struct LetterState {
    pub next_letters: Vec<(SinkId, StreamId, CompactionSeq)>,
    pub refusals: Vec<Refusal>,
    pub settled: Vec<Settled>,
    pub breaker: Breaker,
    /// The splits of open plans, in order (a tail of their own).
    pub splits: Vec<Split>,
}

/// What the dead-letter breaker counts, from the WAL: records decided
/// (held by a sink or refused) so far, and, for each plan whose refusals
/// stood, the count decided when it was done and how many it refused. The
/// engine sums those within its window (`--dead-letter-window`).
#[derive(Clone, Debug, PartialEq, Eq, Default)]
pub struct Breaker {
    pub decided: u64,
    pub refusals: Vec<(u64, u64)>,
}

impl Breaker {
    /// Records refused among the last `window` decided.
    pub fn refused_within(&self, window: u64) -> u64 {
        let from = self.decided.saturating_sub(window);
        self.refusals.iter().filter(|(at, _)| *at > from).map(|(_, n)| n).sum()
    }

    /// A plan done: `held` records in the sink, `refused` in the dead
    /// letters. Counts further back than any window may reach are dropped;
    /// past `BREAKER_ENTRIES` the two oldest are merged (at the later
    /// place), so the count stays bounded and only ever errs towards
    /// tripping early.
    pub fn decide(&mut self, held: u64, refused: u64) {
        self.decided += held + refused;
        if refused > 0 {
            self.refusals.push((self.decided, refused));
        }
        let from = self.decided.saturating_sub(BREAKER_WINDOW_MAX);
        self.refusals.retain(|(at, _)| *at > from);
        if self.refusals.len() > BREAKER_ENTRIES {
            let (_, n) = self.refusals.remove(0);
            self.refusals[0].1 += n;
        }
    }
}

/// The most plans with refusals the breaker keeps apart.
pub const BREAKER_ENTRIES: usize = 16;

/// The longest window the breaker may count over, in records.
pub const BREAKER_WINDOW_MAX: u64 = 100_000_000;

#[derive(Clone, Debug, PartialEq, Eq, Default)]
pub struct Names {
    pub sources: Vec<String>,
    pub sinks: Vec<String>,
    pub streams: Vec<String>,
}

impl Names {
    pub(super) fn encoded_len(&self) -> usize {
        [&self.sources, &self.sinks, &self.streams]
            .iter()
            .map(|l| 4 + l.iter().map(|n| 4 + n.len()).sum::<usize>())
            .sum()
    }
}

/// Closes a commit group: how many frames came before it in the group and how
/// many bytes they took, so a group missing a frame never validates.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct CommitRecord {
    pub frames: u32,
    pub bytes: u32,
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Frame {
    SourceBatch(SourceBatch),
    SchemaDecision(SchemaDecision),
    CompactionPlanned(CompactionPlan),
    CompactionDone(CompactionDone),
    Snapshot(Snapshot),
    /// The last group of a segment: the next group is in the next segment.
    Seal,
    Commit(CommitRecord),
    /// A new writer's first group: from here on, groups of a lower epoch
    /// (a writer that lost the lease and did not notice) are not the WAL's.
    Fence,
    /// Clustered mode: a change of the cluster's members, raft-rs's
    /// `ConfChangeV2` in its own protobuf encoding. A group holding one is
    /// a conf-change entry of the raft log; every host applies it to raft
    /// when it commits, and the committed state ignores it.
    Membership(Vec<u8>),
    /// Clustered `--once`: the leader's sources were exhausted and all
    /// they delivered went through the sinks (the terminal entry). A later
    /// source batch makes it void.
    Finished,
    /// Clustered `--once`: every member has learnt that the terminal entry
    /// committed. A host under `--once` that applies it stops.
    AllFinished,
    /// An operator gave up the input of a partition from `at` to `next`
    /// (`run --skip-input`). Committed where the partition's position is
    /// `at`, it moves the position to `next` (and every sink's acknowledged
    /// position with it, where that was `at`: the gap holds nothing to
    /// deliver); elsewhere it only records the decision, and the source
    /// batch that passes over the gap follows it.
    Skipped(Skipped),
    /// A sink refused records of the open plan of (sink, stream).
    Refused(Refusal),
    /// The sink holds this attempt of the open plan of (sink, stream).
    Settled(Settled),
    /// An operator gave up the open plan of (sink, stream): done without
    /// its sink, acknowledged positions past its ranges.
    BatchSkipped(BatchSkipped),
    /// A sink answered `fatal` for the whole of the open plan's last
    /// attempt: the plan is cut to its first records.
    Split(Split),
    /// A source's open window closed, or void.
    Window(WindowEnd),
}

impl Frame {
    pub fn kind(&self) -> FrameKind {
        match self {
            Frame::SourceBatch(_) => FrameKind::SourceBatch,
            Frame::SchemaDecision(_) => FrameKind::SchemaDecision,
            Frame::CompactionPlanned(_) => FrameKind::CompactionPlanned,
            Frame::CompactionDone(_) => FrameKind::CompactionDone,
            Frame::Snapshot(_) => FrameKind::Snapshot,
            Frame::Seal => FrameKind::Seal,
            Frame::Commit(_) => FrameKind::Commit,
            Frame::Fence => FrameKind::Fence,
            Frame::Membership(_) => FrameKind::Membership,
            Frame::Finished => FrameKind::Finished,
            Frame::AllFinished => FrameKind::AllFinished,
            Frame::Skipped(_) => FrameKind::Skipped,
            Frame::Refused(_) => FrameKind::Refused,
            Frame::Settled(_) => FrameKind::Settled,
            Frame::BatchSkipped(_) => FrameKind::BatchSkipped,
            Frame::Split(_) => FrameKind::Split,
            Frame::Window(_) => FrameKind::Window,
        }
    }

    /// Bytes this frame takes on disk, header included.
    pub fn encoded_len(&self) -> usize {
        FRAME_HEADER_BYTES + self.payload_len()
    }

    /// Appends the encoded frame to `out`.
    pub fn encode(&self, segment: SegmentId, epoch: Epoch, lsn: Lsn, out: &mut Vec<u8>) {
        let start = out.len();
        let payload_len = self.payload_len();
        out.reserve(FRAME_HEADER_BYTES + payload_len);
        let mut w = Writer { buf: out };
        w.u32(u32::try_from(payload_len).expect("frame fits u32"));
        w.u32(0); // checksum, filled in below
        w.u64(lsn.0);
        w.u64(epoch.0);
        w.u8(self.kind() as u8);
        self.encode_payload(&mut w);
        let body = &out[start + FRAME_HEADER_BYTES - 1..];
        assert_eq!(body.len(), payload_len + 1, "payload_len matches the encoding");
        let crc = crc32c::crc32c_append(frame_seed(segment, epoch, lsn), body);
        out[start + 4..start + 8].copy_from_slice(&crc.to_le_bytes());
    }
}

/// A frame read back from bytes, with the header fields that seeded it.
#[derive(Debug)]
pub struct DecodedFrame {
    pub lsn: Lsn,
    pub epoch: Epoch,
    pub frame: Frame,
    /// Bytes the frame took, header included.
    pub len: usize,
}

/// Why a frame at some offset is not a valid frame.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum FrameError {
    /// Fewer bytes than a header, or a length running past the end.
    Truncated,
    /// The checksum does not match (torn, rotten, or stale bytes).
    Checksum,
    /// The checksum matched but the kind or payload is not understood.
    Malformed,
}

/// Decodes the frame at the start of `buf`, which belongs to `segment`.
/// With `verify` off the checksum is not checked: only the planted bug
/// `admit-torn-segment` does that.
pub fn decode_frame(segment: SegmentId, buf: &[u8], verify: bool) -> Result<DecodedFrame, FrameError> {
    decode_frame_as(segment, buf, verify, RecordMode::Owned)
}

/// `decode_frame`, reading a source batch's records as `mode` says.
pub fn decode_frame_as(
    segment: SegmentId,
    buf: &[u8],
    verify: bool,
    mode: RecordMode,
) -> Result<DecodedFrame, FrameError> {
    let (lsn, epoch, kind, payload, len) = frame_parts(segment, buf, verify)?;
    let frame = decode_payload_as(kind, payload, mode).map_err(|_| FrameError::Malformed)?;
    Ok(DecodedFrame { lsn, epoch, frame, len })
}

/// The frame at the start of `buf`, checked but not decoded: LSN, epoch,
/// kind, payload and the bytes it took, header included.
pub(super) fn frame_parts(
    segment: SegmentId,
    buf: &[u8],
    verify: bool,
) -> Result<(Lsn, Epoch, FrameKind, &[u8], usize), FrameError> {
    if buf.len() < FRAME_HEADER_BYTES {
        return Err(FrameError::Truncated);
    }
    let payload_len = u32::from_le_bytes(buf[0..4].try_into().unwrap()) as usize;
    let crc = u32::from_le_bytes(buf[4..8].try_into().unwrap());
    let lsn = Lsn(u64::from_le_bytes(buf[8..16].try_into().unwrap()));
    let epoch = Epoch(u64::from_le_bytes(buf[16..24].try_into().unwrap()));
    if payload_len > GROUP_BYTES_LIMIT || buf.len() - FRAME_HEADER_BYTES < payload_len {
        return Err(FrameError::Truncated);
    }
    let len = FRAME_HEADER_BYTES + payload_len;
    let body = &buf[FRAME_HEADER_BYTES - 1..len];
    if verify && crc32c::crc32c_append(frame_seed(segment, epoch, lsn), body) != crc {
        return Err(FrameError::Checksum);
    }
    let kind = FrameKind::from_u8(body[0]).ok_or(FrameError::Malformed)?;
    Ok((lsn, epoch, kind, &body[1..], len))
}

/// True when `buf` starts with a checksum-valid commit record; returns its LSN.
/// Used to tell a torn tail (nothing valid follows) from corruption.
pub fn commit_record_at(segment: SegmentId, buf: &[u8]) -> Option<Lsn> {
    if buf.len() < COMMIT_FRAME_BYTES
        || buf[0..4] != (COMMIT_PAYLOAD_BYTES as u32).to_le_bytes()
        || buf[FRAME_HEADER_BYTES - 1] != FrameKind::Commit as u8
    {
        return None;
    }
    match decode_frame(segment, &buf[..COMMIT_FRAME_BYTES], true) {
        Ok(DecodedFrame { lsn, frame: Frame::Commit(_), .. }) => Some(lsn),
        _ => None,
    }
}

fn frame_seed(segment: SegmentId, epoch: Epoch, lsn: Lsn) -> u32 {
    let mut seed = [0u8; 24];
    seed[0..8].copy_from_slice(&segment.0.to_le_bytes());
    seed[8..16].copy_from_slice(&epoch.0.to_le_bytes());
    seed[16..24].copy_from_slice(&lsn.0.to_le_bytes());
    crc32c::crc32c(&seed)
}

/// Part of the planted bug `admit-torn-segment`: decodes a batch payload
/// that may be cut short, keeping every record it can, a truncated last one
/// included.
pub(crate) fn decode_batch_lenient(payload: &[u8]) -> Option<Frame> {
    let mut r = Reader::new(payload);
    let key = get_key(&mut r).ok()?;
    let stream = StreamId(r.u16().ok()?);
    let end = Position(r.u64().ok()?);
    let (checkpoint, provisional) = get_checkpoint(&mut r).ok()?;
    let n = r.u32().ok()?;
    let mut records = Vec::new();
    for _ in 0..n {
        let Ok(position) = r.u64() else { break };
        let Ok(len) = r.u32() else { break };
        let bytes = r.take_up_to(len as usize).to_vec();
        records.push(Record { position: Position(position), bytes });
    }
    Some(Frame::SourceBatch(SourceBatch { key, stream, end, checkpoint, records, counted: None, provisional }))
}
