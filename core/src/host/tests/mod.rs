//! Named scenarios: the engine stepped by hand against an in-memory disk and
//! offsets store, one rule of the contract per test.

use super::*;
use crate::admit::RecordFault;
use crate::config::Limits;
use crate::io::{OffsetsOp, PluginOp, WalOp};
use crate::offsets::OffsetValue;
use crate::wal::{encode_header, scan, Frame, Record, SEGMENT_HEADER_BYTES};
use std::sync::Arc;

fn config() -> HostConfig {
    HostConfig {
        seed: 1,
        sources: vec!["src".into()],
        sinks: vec!["sink".into()],
        streams: vec!["orders".into()],
        limits: Limits {
            segment_bytes: 64 * 1024,
            group_bytes_max: 4096,
            pending_bytes_max: 8192,
            ..Limits::default()
        },
        stop_when_exhausted: false,
        schema_plugin: false,
        lease: None,
        cluster: None,
        mutations: crate::Mutations::NONE,
        skips: Vec::new(),
        batch_skips: Vec::new(),
        dead_letters: None,
        wall_origin_ms: 0,
    }
}

/// An engine with a disk and an offsets store that answer at once, and every
/// other request held for the test to answer.
struct Harness {
    host: Host,
    now: Instant,
    disk: BTreeMap<SegmentId, Vec<u8>>,
    offsets: BTreeMap<PartitionKey, Vec<u8>>,
    held: Vec<(IoId, IoOp)>,
    stopped: Option<StopReason>,
    /// What the sink answers when recovery asks for its progress.
    sink_progress: Vec<(StreamId, CompactionSeq)>,
    /// The holders of every `LeaseWait` output, in order.
    lease_waits: Vec<u64>,
    /// Set: the WAL lists as an object store with these objects per segment.
    objects: Option<BTreeMap<SegmentId, Vec<u64>>>,
    /// Every deletion performed, in order.
    deleted: Vec<SegmentId>,
    /// `WalFull` (true) and `WalRoom` (false) outputs, in order.
    wal_full: Vec<bool>,
    /// Every `Skip` and `BatchSkip` output's `recorded`, in order.
    skips: Vec<bool>,
    /// Every window recovery read: its length asked and answered.
    reads: Vec<(usize, usize)>,
    /// The stop record the WAL's store holds.
    stop_record: Option<Vec<u8>>,
    /// Every recovery's summary.
    recovered: Vec<RecoverySummary>,
    /// Every `Refused` output's reasons, in order.
    refused: Vec<Vec<String>>,
    /// The batch number of every `Split` output, in order.
    split: Vec<CompactionSeq>,
    /// The digests kept of every `TailCut` output, in order.
    tail_cuts: Vec<usize>,
}

impl Harness {
    fn start(disk: BTreeMap<SegmentId, Vec<u8>>, offsets: BTreeMap<PartitionKey, Vec<u8>>) -> Harness {
        Harness::start_full(config(), disk, offsets, Vec::new())
    }

    fn start_full(
        cfg: HostConfig,
        disk: BTreeMap<SegmentId, Vec<u8>>,
        offsets: BTreeMap<PartitionKey, Vec<u8>>,
        sink_progress: Vec<(StreamId, CompactionSeq)>,
    ) -> Harness {
        let mut h = Harness::unsettled(cfg, disk, offsets, sink_progress);
        h.settle();
        h
    }

    /// A harness whose WAL lists as an object store holding `objects`.
    fn start_objects(disk: BTreeMap<SegmentId, Vec<u8>>, objects: BTreeMap<SegmentId, Vec<u64>>) -> Harness {
        let mut h = Harness::unsettled(config(), disk, BTreeMap::new(), Vec::new());
        h.objects = Some(objects);
        h.settle();
        h
    }

    fn unsettled(
        cfg: HostConfig,
        disk: BTreeMap<SegmentId, Vec<u8>>,
        offsets: BTreeMap<PartitionKey, Vec<u8>>,
        sink_progress: Vec<(StreamId, CompactionSeq)>,
    ) -> Harness {
        let host = Host::new(cfg, Instant::ZERO).unwrap();
        let held = Vec::new();
        Harness {
            host,
            now: Instant::ZERO,
            disk,
            offsets,
            held,
            stopped: None,
            sink_progress,
            lease_waits: vec![],
            objects: None,
            deleted: vec![],
            wal_full: vec![],
            skips: vec![],
            reads: vec![],
            stop_record: None,
            recovered: vec![],
            refused: vec![],
            split: vec![],
            tail_cuts: vec![],
        }
    }

    /// Drains outputs, performing WAL and offsets requests until none is left.
    fn settle(&mut self) {
        loop {
            while let Some(out) = self.host.poll_output() {
                match out {
                    Output::Io { id, op } => self.held.push((id, op)),
                    Output::Stopped(reason) => self.stopped = Some(reason),
                    Output::LeaseWait { holder, .. } => self.lease_waits.push(holder),
                    Output::WalFull { .. } => self.wal_full.push(true),
                    Output::WalRoom { .. } => self.wal_full.push(false),
                    Output::Skip { recorded, .. } | Output::BatchSkip { recorded, .. } => self.skips.push(recorded),
                    Output::Refused { reasons, .. } => self.refused.push(reasons),
                    Output::Split { seq, .. } => self.split.push(seq),
                    Output::TailCut { kept, .. } => self.tail_cuts.push(kept),
                    Output::Recovered(summary) => self.recovered.push(summary),
                    Output::Stalled { .. } | Output::Unstalled => {}
                    Output::Send(_)
                    | Output::TellRemoved { .. }
                    | Output::Role { .. }
                    | Output::JoinRefused { .. }
                    | Output::LogRestored(_) => {
                        unreachable!("not clustered")
                    }
                }
            }
            let Some(i) = self.held.iter().position(|(_, op)| is_storage(op)) else {
                return;
            };
            let (id, op) = self.held.remove(i);
            let result = self.perform(op);
            self.host.handle(self.now, Input::IoDone { id, result });
        }
    }

    fn perform(&mut self, op: IoOp) -> Result<IoReply, IoError> {
        Ok(match op {
            IoOp::Wal(WalOp::Sync) => IoReply::Done,
            IoOp::Wal(WalOp::List) => match &self.objects {
                Some(objects) => IoReply::Segments(WalListing::Objects(objects.clone())),
                None => IoReply::Segments(WalListing::Files(
                    self.disk.iter().map(|(id, b)| (*id, b.len() as u64)).collect(),
                )),
            },
            IoOp::Wal(WalOp::ReadStopRecord) => IoReply::StopRecord(self.stop_record.clone()),
            IoOp::Wal(WalOp::WriteStopRecord(bytes)) => {
                self.stop_record = Some(bytes);
                IoReply::Done
            }
            IoOp::Wal(WalOp::ReadAt { segment, offset, len }) => {
                let bytes = window(&self.disk[&segment], offset, len);
                self.reads.push((len, bytes.len()));
                IoReply::SegmentBytes(bytes.into())
            }
            IoOp::Wal(WalOp::Create { segment, header, .. }) => {
                let mut file = vec![0; config().limits.segment_bytes as usize];
                file[..header.len()].copy_from_slice(&header);
                self.disk.insert(segment, file);
                IoReply::Done
            }
            IoOp::Wal(WalOp::Append { segment, offset, bytes, .. }) => {
                let file = self.disk.get_mut(&segment).unwrap();
                file[offset as usize..offset as usize + bytes.len()].copy_from_slice(&bytes);
                IoReply::Done
            }
            IoOp::Wal(WalOp::Delete { segment }) => {
                self.disk.remove(&segment);
                self.deleted.push(segment);
                if let Some(objects) = &mut self.objects {
                    objects.remove(&segment);
                }
                IoReply::Done
            }
            IoOp::Offsets(OffsetsOp::Read) => {
                IoReply::Offsets(self.offsets.iter().map(|(k, v)| (*k, v.clone(), None)).collect())
            }
            IoOp::Offsets(OffsetsOp::Write { entries }) => {
                for e in entries {
                    self.offsets.insert(e.key, e.value.encode().to_vec());
                }
                IoReply::Done
            }
            // The harness's sink keeps no progress of its own: it answers
            // that it cannot tell; `sink_progress` tests set an answer.
            IoOp::Plugin(PluginOp::SinkProgress { .. }) => IoReply::SinkProgress(self.sink_progress.clone()),
            other => unreachable!("not a storage request: {other:?}"),
        })
    }

    /// Removes and returns the first held request that `pick` accepts.
    fn take<T>(&mut self, pick: impl Fn(&IoOp) -> Option<T>) -> (IoId, T) {
        let i = self.held.iter().position(|(_, op)| pick(op).is_some()).unwrap_or_else(|| {
            panic!("no such request among {:?}", self.held.iter().map(|(_, op)| op).collect::<Vec<_>>())
        });
        let (id, op) = self.held.remove(i);
        (id, pick(&op).unwrap())
    }

    fn has(&self, pick: impl Fn(&IoOp) -> bool) -> bool {
        self.held.iter().any(|(_, op)| pick(op))
    }

    fn answer(&mut self, id: IoId, result: Result<IoReply, IoError>) {
        self.host.handle(self.now, Input::IoDone { id, result });
        self.settle();
    }

    fn open_source(&mut self) -> Vec<ResumePoint> {
        let (id, resume) = self.take(|op| match op {
            IoOp::Plugin(PluginOp::SourceOpen { resume, .. }) => Some(resume.clone()),
            _ => None,
        });
        self.answer(id, Ok(IoReply::Done));
        resume
    }

    /// Answers the source's read with records `from..to` of partition 0 and
    /// returns the outputs that follow at once, without performing any.
    fn feed_unsettled(&mut self, from: u64, to: u64) -> Vec<Output> {
        let (id, ()) = self.take(|op| matches!(op, IoOp::Plugin(PluginOp::SourceRead { .. })).then_some(()));
        let result = Ok(IoReply::Batches { batches: vec![batch(from, to)], exhausted: false });
        self.host.handle(self.now, Input::IoDone { id, result });
        std::iter::from_fn(|| self.host.poll_output()).collect()
    }

    /// Answers the source's read with records `from..to` of partition 0.
    fn feed(&mut self, from: u64, to: u64) {
        let (id, ()) = self.take(|op| matches!(op, IoOp::Plugin(PluginOp::SourceRead { .. })).then_some(()));
        self.answer(id, Ok(IoReply::Batches { batches: vec![batch(from, to)], exhausted: false }));
    }

    /// Positions of the records each committed source-batch frame holds.
    fn committed_positions(&self) -> Vec<u64> {
        let files: Vec<(SegmentId, &[u8])> = self.disk.iter().map(|(k, v)| (*k, v.as_slice())).collect();
        let mut out = Vec::new();
        for seg in scan(&files, false).unwrap() {
            for g in seg.groups {
                for f in g.frames {
                    if let Frame::SourceBatch(b) = f {
                        out.extend(b.records.iter().map(|r| r.position.0));
                    }
                }
            }
        }
        out
    }

    /// The held read-back request: its id and the bytes the disk holds at
    /// each place it names.
    fn read_back(&mut self) -> (IoId, Vec<Vec<u8>>) {
        let (id, places) = self.take(|op| match op {
            IoOp::Wal(WalOp::ReadGroups { places }) => Some(places.clone()),
            _ => None,
        });
        let groups = places
            .iter()
            .map(|p| self.disk[&p.segment][p.offset as usize..(p.offset + p.len) as usize].to_vec())
            .collect();
        (id, groups)
    }

    /// The held sink apply's id and the records it carries.
    fn sink_records(&mut self) -> (IoId, Vec<Vec<u8>>) {
        self.take(|op| match op {
            IoOp::Plugin(PluginOp::SinkApply(a)) => Some(a.records.iter().map(<[u8]>::to_vec).collect()),
            _ => None,
        })
    }

    fn sink_apply(&mut self) -> (IoId, CompactionId, CompactionSeq, usize) {
        let (id, (cid, seq, n)) = self.take(|op| match op {
            IoOp::Plugin(PluginOp::SinkApply(a)) => Some((a.id, a.seq, a.records.len())),
            _ => None,
        });
        (id, cid, seq, n)
    }
}

/// Records `from..to` of partition 0, three bytes each.
fn batch(from: u64, to: u64) -> SourceBatchIn {
    batch_of((from..to).map(|p| Record { position: Position(p), bytes: vec![p as u8; 3] }).collect(), to)
}

/// `records` of partition 0 up to `end`: no checkpoint, schema or fault.
fn batch_of(records: Vec<Record>, end: u64) -> SourceBatchIn {
    let (stream, end) = (StreamId(0), Position(end));
    let (window, keys, faults) = (Window::None, Vec::new(), Vec::new());
    SourceBatchIn { partition: 0, stream, records, end, checkpoint: None, schema: None, faults, window, keys }
}

/// The append among `outputs`: its id, segment and bytes.
fn the_append(outputs: Vec<Output>) -> (IoId, SegmentId, Arc<Vec<u8>>) {
    outputs
        .into_iter()
        .find_map(|o| match o {
            Output::Io { id, op: IoOp::Wal(WalOp::Append { segment, bytes, .. }) } => Some((id, segment, bytes)),
            _ => None,
        })
        .expect("an append")
}

/// `len` bytes of a segment's `bytes` from `offset`, fewer at their end.
fn window(bytes: &[u8], offset: u64, len: usize) -> Vec<u8> {
    let from = (offset as usize).min(bytes.len());
    bytes[from..from + len.min(bytes.len() - from)].to_vec()
}

fn is_storage(op: &IoOp) -> bool {
    matches!(
        op,
        IoOp::Wal(WalOp::Sync)
            | IoOp::Wal(WalOp::List)
            | IoOp::Wal(WalOp::ReadAt { .. })
            | IoOp::Wal(WalOp::ReadStopRecord)
            | IoOp::Wal(WalOp::WriteStopRecord(_))
            | IoOp::Wal(WalOp::Create { .. })
            | IoOp::Wal(WalOp::Append { .. })
            | IoOp::Wal(WalOp::Delete { .. })
            | IoOp::Offsets(OffsetsOp::Read)
            | IoOp::Offsets(OffsetsOp::Write { .. })
            | IoOp::Plugin(PluginOp::SinkProgress { .. })
    )
}

fn key0() -> PartitionKey {
    PartitionKey { source: SourceId(0), partition: 0 }
}

mod batch_skips;
mod cluster;
mod dead_letters;
mod engine;
mod lease;
mod memory;
mod recovery;
mod skips;
mod stop_record;
mod windows;
