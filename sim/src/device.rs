//! The WAL device one host writes to: a simulated disk or a simulated S3
//! bucket, behind one `perform(op)` that the world's main loop and the
//! recovery-idempotence check both use. Each backend keeps what its real
//! driver knows: the disk driver where its last durable appends end, the S3
//! driver which puts had an unknown outcome.
//!
//! A device decides no faults. The world's fault models decide whether a
//! request fails and tell `perform`; the schedule-level faults (an S3 put
//! that lands later, a frozen writer) stay in the world.

use crate::disk::{DiskStats, SimDisk};
use crate::s3::SimS3;
use skippr_core::WalOp;
use skippr_core::{IoError, IoReply, SegmentId, WalListing};
use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;

#[derive(Clone)]
pub enum SimWal {
    Disk(Box<DiskWal>),
    S3(S3Wal),
}

#[derive(Clone)]
pub struct DiskWal {
    disk: SimDisk,
    /// Clustered mode: the raft hard-state file (durable bytes).
    hard_state: Vec<u8>,
    /// The end of the last durable append, per segment, and the segment of
    /// the newest one: what the driver knows it made durable.
    durable_ends: BTreeMap<SegmentId, usize>,
    newest_append: Option<SegmentId>,
    /// `DATA_DIR/stop-record`: written whole (renamed over the old, synced
    /// with its directory) or not at all.
    stop_record: Option<Vec<u8>>,
}

#[derive(Clone)]
pub struct S3Wal {
    bucket: SimS3,
    /// (engine generation, segment, offset) of puts whose outcome was
    /// unknown: the planted bug `s3-overwrite-on-ambiguous` retries them
    /// without the condition.
    unknown: BTreeSet<(u64, SegmentId, u64)>,
    overwrite_on_unknown: bool,
    conflicts: u64,
    /// The stop record's object.
    stop_record: Option<Vec<u8>>,
}

impl SimWal {
    pub fn disk(seed: u64) -> SimWal {
        SimWal::Disk(Box::new(DiskWal {
            disk: SimDisk::new(seed),
            hard_state: vec![0; skippr_core::cluster::FILE_BYTES],
            durable_ends: BTreeMap::new(),
            newest_append: None,
            stop_record: None,
        }))
    }

    pub fn s3(overwrite_on_unknown: bool) -> SimWal {
        SimWal::S3(S3Wal {
            bucket: SimS3::default(),
            unknown: BTreeSet::new(),
            overwrite_on_unknown,
            conflicts: 0,
            stop_record: None,
        })
    }

    /// What a request does as it is issued: a disk write reaches the page
    /// cache, a created file exists (unsynced). S3 acts only at completion.
    pub fn issue(&mut self, op: &WalOp) {
        let SimWal::Disk(d) = self else { return };
        match op {
            WalOp::Append { segment, offset, bytes, .. } if !d.disk.write(*segment, *offset as usize, bytes) => {
                panic!("append to segment {} at {offset} outside the file", segment.0)
            }
            WalOp::Create { segment, header, size } => d.disk.create(*segment, header, *size as usize),
            _ => {}
        }
    }

    /// Performs a request of engine generation `gen` at its completion and
    /// answers it. `fails`: the fault model says it fails (an `fdatasync`
    /// error on disk, throttling or a 5xx on S3).
    pub fn perform(&mut self, gen: u64, op: WalOp, fails: bool) -> Result<IoReply, IoError> {
        match self {
            SimWal::Disk(d) => d.perform(op, fails),
            SimWal::S3(s) => s.perform(gen, op, fails),
        }
    }

    /// The segments an operator sees, with their bytes (through the page
    /// cache on disk).
    pub fn segments_on_device(&self) -> Vec<(SegmentId, Vec<u8>)> {
        match self {
            SimWal::Disk(d) => {
                d.disk.list().into_iter().filter_map(|id| d.disk.read_cached(id).map(|b| (id, b))).collect()
            }
            SimWal::S3(s) => {
                s.bucket.wal_segments().into_iter().filter_map(|id| s.bucket.read(id).ok().map(|b| (id, b))).collect()
            }
        }
    }

    /// The raft hard-state file's durable bytes (clustered mode).
    pub fn hard_state(&self) -> Option<&[u8]> {
        match self {
            SimWal::Disk(d) => Some(&d.hard_state),
            SimWal::S3(_) => None,
        }
    }

    /// `cluster init` or `cluster join`: the hard-state file's first bytes.
    pub fn init_hard_state(&mut self, file: Vec<u8>) {
        if let SimWal::Disk(d) = self {
            d.hard_state = file;
        }
    }

    /// The host's data is gone for good (a disk replaced): no segment, no
    /// hard-state file.
    pub fn wipe(&mut self) {
        if let SimWal::Disk(d) = self {
            for id in d.disk.list() {
                d.disk.delete(id);
            }
            d.hard_state.fill(0);
            d.durable_ends.clear();
            d.newest_append = None;
        }
    }

    /// What each segment holds durably (what a power cut would leave).
    pub fn segments_durable(&self) -> Vec<(SegmentId, Vec<u8>)> {
        match self {
            SimWal::Disk(d) => d.disk.list().into_iter().filter_map(|id| d.disk.read(id).map(|b| (id, b))).collect(),
            SimWal::S3(_) => self.segments_on_device(),
        }
    }

    /// Clustered mode: the first `steps` steps of a request's truncation,
    /// and no more (the host dies in the middle of it).
    pub fn truncate_partly(&mut self, r: &skippr_core::Replicate, steps: usize) {
        match self {
            SimWal::Disk(d) => {
                d.truncate(r, steps);
            }
            SimWal::S3(_) => unreachable!("clustered mode keeps its WAL on disks"),
        }
    }

    /// Clustered mode: a snapshot's segments replace the WAL (`DiskWal::install`).
    pub fn install(&mut self, segments: &[(SegmentId, Vec<u8>)], hard_state: &(u64, Vec<u8>), fails: bool) -> bool {
        match self {
            SimWal::Disk(d) => d.install(segments, hard_state, fails),
            SimWal::S3(_) => unreachable!("clustered mode keeps its WAL on disks"),
        }
    }

    /// An operator deletes the segment by hand.
    pub fn remove(&mut self, segment: SegmentId) {
        match self {
            SimWal::Disk(d) => d.disk.delete(segment),
            SimWal::S3(s) => {
                s.bucket.delete_header(segment);
                s.bucket.delete_rest(segment);
            }
        }
    }

    pub fn has_stop_record(&self) -> bool {
        match self {
            SimWal::Disk(d) => d.stop_record.is_some(),
            SimWal::S3(s) => s.stop_record.is_some(),
        }
    }

    /// The stop record removed (a copy's, to recover by a scan).
    pub fn forget_stop_record(&mut self) {
        match self {
            SimWal::Disk(d) => d.stop_record = None,
            SimWal::S3(s) => s.stop_record = None,
        }
    }

    /// The machine loses power (S3 does not notice).
    pub fn power_cut(&mut self, lost_dir_entry: f64) {
        if let SimWal::Disk(d) = self {
            d.disk.crash(lost_dir_entry);
        }
    }

    /// Changes to what the device holds so far: equal counts, equal devices.
    pub fn changes(&self) -> u64 {
        match self {
            SimWal::Disk(d) => d.disk.changes(),
            SimWal::S3(s) => s.bucket.changes(),
        }
    }

    pub fn disk_stats(&self) -> DiskStats {
        match self {
            SimWal::Disk(d) => d.disk.stats.clone(),
            SimWal::S3(_) => DiskStats::default(),
        }
    }

    pub fn disk_mut(&mut self) -> Option<&mut DiskWal> {
        match self {
            SimWal::Disk(d) => Some(d),
            SimWal::S3(_) => None,
        }
    }

    pub fn s3_mut(&mut self) -> Option<&mut S3Wal> {
        match self {
            SimWal::S3(s) => Some(s),
            SimWal::Disk(_) => None,
        }
    }
}

impl DiskWal {
    /// A segment written and synced before the run (`cluster init`).
    pub fn init(&mut self, segment: SegmentId, bytes: &[u8], size: usize) {
        self.disk.create(segment, &bytes[..skippr_core::format::SEGMENT_HEADER_BYTES], size);
        self.disk.write(segment, 0, bytes);
        self.disk.sync(segment, true, false);
    }

    fn perform(&mut self, op: WalOp, fails: bool) -> Result<IoReply, IoError> {
        let done = |ok: bool| if ok { Ok(IoReply::Done) } else { Err(IoError::Failed) };
        match op {
            WalOp::Sync => done(self.disk.sync_all(fails)),
            WalOp::List => Ok(IoReply::Segments(WalListing::Files(self.disk.sizes()))),
            WalOp::ReadStopRecord | WalOp::WriteStopRecord(_) if fails => Err(IoError::Failed),
            WalOp::ReadStopRecord => Ok(IoReply::StopRecord(self.stop_record.clone())),
            WalOp::WriteStopRecord(bytes) => {
                self.stop_record = Some(bytes);
                Ok(IoReply::Done)
            }
            WalOp::ReadAt { .. } if fails => Err(IoError::Failed),
            WalOp::ReadAt { segment, offset, len } => self
                .disk
                .read(segment)
                .map(|b| IoReply::SegmentBytes(window(&b, offset, len).into()))
                .ok_or(IoError::Failed),
            WalOp::ReadGroups { .. } if fails => Err(IoError::Failed),
            WalOp::ReadGroups { places } => places
                .iter()
                .map(|p| self.disk.read_at(p.segment, p.offset as usize, p.len as usize).ok_or(IoError::Failed))
                .collect::<Result<_, _>>()
                .map(IoReply::Groups),
            WalOp::Create { segment, .. } => done(self.disk.sync(segment, true, fails)),
            WalOp::Append { segment, offset, bytes, .. } => {
                let synced = self.disk.sync(segment, false, fails);
                if synced {
                    self.durable_ends.insert(segment, offset as usize + bytes.len());
                    self.newest_append = Some(segment);
                }
                done(synced)
            }
            WalOp::Delete { segment } => {
                self.disk.delete(segment);
                self.durable_ends.remove(&segment);
                Ok(IoReply::Done)
            }
            WalOp::ReadHardState => Ok(IoReply::HardState(self.hard_state.clone())),
            WalOp::Replicate(_) if fails => Err(IoError::Failed),
            WalOp::Replicate(r) => self.replicate(r),
            WalOp::InstallSnapshot(_) => unreachable!("the world installs snapshots: it reads another host's disk"),
        }
    }

    /// A snapshot's segments, staged and checked, replace every segment and
    /// the hard state at once (the world's step is atomic: no crash falls
    /// inside it); a failed sync leaves the old WAL.
    pub fn install(&mut self, segments: &[(SegmentId, Vec<u8>)], hard_state: &(u64, Vec<u8>), fails: bool) -> bool {
        if fails {
            return false;
        }
        for old in self.disk.list() {
            self.disk.delete(old);
        }
        self.durable_ends.clear();
        for (id, bytes) in segments {
            self.disk.create_zeroed(*id, &bytes[..skippr_core::format::SEGMENT_HEADER_BYTES], bytes.len());
            let written = self.disk.write(*id, 0, bytes) && self.disk.sync(*id, true, false);
            assert!(written, "a fresh file takes its bytes");
        }
        let (at, slot) = hard_state;
        self.hard_state[*at as usize..*at as usize + slot.len()].copy_from_slice(slot);
        true
    }

    /// A raft `Ready` made durable, step by step in the order the request
    /// gives, each step synced before the next.
    fn replicate(&mut self, r: skippr_core::Replicate) -> Result<IoReply, IoError> {
        if !self.truncate(&r, usize::MAX) {
            return Err(IoError::Failed);
        }
        let mut touched = BTreeSet::new();
        for g in &r.groups {
            if let Some(o) = g.opens {
                // Zeroed, as the disk driver creates every segment (it writes
                // zeros through the file): a segment a truncation removed and
                // a later group opens again holds nothing of its old self.
                let header = skippr_core::format::encode_header(g.place.segment, o.epoch);
                self.disk.create_zeroed(g.place.segment, &header, o.segment_bytes as usize);
            }
            if !self.disk.write(g.place.segment, g.place.offset as usize, &g.bytes) {
                return Err(IoError::Failed);
            }
            touched.insert((g.place.segment, g.opens.is_some()));
            self.durable_ends.insert(g.place.segment, (g.place.offset + g.place.len) as usize);
            self.newest_append = Some(g.place.segment);
        }
        for (segment, created) in touched {
            if !self.disk.sync(segment, created, false) {
                return Err(IoError::Failed);
            }
        }
        if let Some((at, slot)) = r.hard_state {
            self.hard_state[at as usize..at as usize + slot.len()].copy_from_slice(&slot);
        }
        Ok(IoReply::Done)
    }

    /// The first `steps` steps of a request's truncation (removals, then
    /// zeroed groups), each durable before the next.
    pub fn truncate(&mut self, r: &skippr_core::Replicate, steps: usize) -> bool {
        for segment in r.remove.iter().take(steps) {
            self.disk.delete(*segment);
            self.durable_ends.remove(segment);
        }
        for p in r.zero.iter().take(steps.saturating_sub(r.remove.len())) {
            let zeros = vec![0; p.len as usize];
            if !self.disk.write(p.segment, p.offset as usize, &zeros) || !self.disk.sync(p.segment, false, false) {
                return false;
            }
        }
        true
    }

    /// Flips a durable bit in a segment that a later durable commit
    /// follows, so the flip is detectable; `draw` picks the segment.
    pub fn rot(&mut self, draw: impl FnOnce(u64) -> u64) -> bool {
        let newest = self.newest_append;
        let candidates: Vec<(SegmentId, usize)> =
            self.durable_ends.iter().filter(|(id, _)| Some(**id) != newest).map(|(id, end)| (*id, *end)).collect();
        if candidates.is_empty() {
            return false;
        }
        let (segment, end) = candidates[draw(candidates.len() as u64 - 1) as usize];
        self.disk.rot(segment, end)
    }
}

impl S3Wal {
    fn perform(&mut self, gen: u64, op: WalOp, fails: bool) -> Result<IoReply, IoError> {
        match op {
            WalOp::Sync => Ok(IoReply::Done),
            WalOp::List | WalOp::ReadAt { .. } | WalOp::ReadGroups { .. } if fails => Err(IoError::Failed),
            WalOp::Create { .. } | WalOp::Append { .. } if fails => Err(IoError::Ambiguous),
            WalOp::List => Ok(IoReply::Segments(self.bucket.list())),
            WalOp::ReadStopRecord | WalOp::WriteStopRecord(_) if fails => Err(IoError::Failed),
            WalOp::ReadStopRecord => Ok(IoReply::StopRecord(self.stop_record.clone())),
            WalOp::WriteStopRecord(bytes) => {
                self.stop_record = Some(bytes);
                Ok(IoReply::Done)
            }
            WalOp::ReadAt { segment, offset, len } => {
                self.bucket.read(segment).map(|b| IoReply::SegmentBytes(window(&b, offset, len).into()))
            }
            WalOp::ReadGroups { places } => places
                .iter()
                .map(|p| self.bucket.objects_from(p.segment, p.offset, p.len))
                .collect::<Result<_, _>>()
                .map(IoReply::Groups),
            WalOp::Create { segment, header, .. } => {
                let conditional = self.conditional(gen, segment, 0);
                self.put(conditional, segment, 0, &Arc::new(header)).map(|()| IoReply::Done)
            }
            WalOp::Append { segment, offset, bytes, .. } => {
                let conditional = self.conditional(gen, segment, offset);
                self.put(conditional, segment, offset, &bytes).map(|()| IoReply::Done)
            }
            WalOp::Delete { segment } => {
                self.begin_delete(segment);
                self.bucket.delete_rest(segment);
                Ok(IoReply::Done)
            }
            WalOp::Replicate(_) | WalOp::ReadHardState | WalOp::InstallSnapshot(_) => {
                unreachable!("clustered mode keeps its WAL on disks")
            }
        }
    }

    /// A put as the S3 driver makes it: conditional, unless the planted bug
    /// retries a put whose outcome was unknown without the condition.
    pub fn conditional(&self, gen: u64, segment: SegmentId, offset: u64) -> bool {
        !(self.overwrite_on_unknown && self.unknown.contains(&(gen, segment, offset)))
    }

    /// The driver was told the put's outcome is unknown.
    pub fn outcome_unknown(&mut self, gen: u64, segment: SegmentId, offset: u64) {
        self.unknown.insert((gen, segment, offset));
    }

    /// The put reaches the bucket (now, or late for a put that was in flight).
    pub fn put(
        &mut self,
        conditional: bool,
        segment: SegmentId,
        offset: u64,
        bytes: &Arc<Vec<u8>>,
    ) -> Result<(), IoError> {
        let result = self.bucket.put(segment, offset, bytes, conditional);
        self.conflicts += (result == Err(IoError::Conflict)) as u64;
        result
    }

    /// The header goes first: from here on the segment is being deleted,
    /// whatever happens to the rest.
    pub fn begin_delete(&mut self, segment: SegmentId) {
        self.bucket.delete_header(segment);
    }

    /// Puts that found their key taken by other bytes.
    pub fn conflicts(&self) -> u64 {
        self.conflicts
    }
}

/// `len` bytes of `bytes` from `offset`, fewer at their end: a recovery
/// window.
fn window(bytes: &[u8], offset: u64, len: usize) -> Vec<u8> {
    let from = (offset as usize).min(bytes.len());
    bytes[from..from + len.min(bytes.len() - from)].to_vec()
}
