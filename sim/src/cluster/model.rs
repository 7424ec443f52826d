//! The clustered checker's model of durability: what each host holds
//! durably (LSN → term of every group its disk has synced), from which it
//! derives what is *committed* (the same group durable on a majority of
//! voters), and the positions and compaction plans committed groups carry.
//! It asserts, at every ack, offsets write and dispatch, that what is acted
//! on is committed (a dispatched batch's plan as well as its records); that
//! the committed prefix never shrinks (no majority ever loses a committed
//! group); and, from the append messages it sees, that no term has two
//! leaders. It reads only disks, requests and messages, never an engine's
//! own bookkeeping.
//!
//! A group durable on a majority is not always committed in raft's sense
//! (an older term's entry can still be replaced, the case of figure 8 of
//! the raft paper), so the committed prefix here may shrink; what must
//! never happen is that it shrinks below a position some host already
//! acted on (acked, stored as an offset, or handed to a sink): that is an
//! acknowledged position a minority's loss would take away.

use crate::checker::Violation;
use bytes::Bytes;
use skippr_core::format::{Frame, GroupPlace, ScannedSegment};
use skippr_core::testing::EntryGroup;
use skippr_core::testing::{group_facts, group_shape, GroupFacts, PlannedBatch};
use skippr_core::SinkApply;
use skippr_core::{Lsn, PartitionKey, Position, SegmentId, SourceId};
use std::collections::{BTreeMap, BTreeSet};

/// Groups below the committed end whose validation is remembered.
const SHAPES_KEPT: usize = 256;

pub mod invariant {
    pub const ACK_BEFORE_MAJORITY: &str = "ack-before-majority";
    pub const OFFSETS_BEFORE_MAJORITY: &str = "offsets-before-majority";
    pub const DISPATCH_BEFORE_MAJORITY: &str = "dispatch-before-majority";
    pub const COMMITTED_LOST: &str = "committed-lost";
    pub const TWO_LEADERS: &str = "two-leaders-in-a-term";
    pub const PREFIXES_DIFFER: &str = "committed-prefixes-differ";
    pub const TRUNCATION_LEFT_BYTES: &str = "truncation-left-bytes";
    pub const COMMIT_BEFORE_QUORUM: &str = "commit-before-quorum";
}

#[derive(Default)]
pub struct Model {
    hosts: usize,
    /// Per host: LSN → term of every group durably on its disk.
    durable: Vec<BTreeMap<u64, u64>>,
    /// Per host: where each group it wrote or was found on its disk lies,
    /// and the groups (LSN, term, place) its last truncation replaced.
    places: Vec<BTreeMap<u64, GroupPlace>>,
    replaced: Vec<Vec<(u64, u64, GroupPlace)>>,
    /// Per host: what its disk held when it was wiped. A wipe is the loss
    /// of one host, which the cluster must survive, so what it held still
    /// counts toward the majority it helped form; a group that then drops
    /// out of every other host's disk is lost all the same.
    wiped: Vec<BTreeMap<u64, u64>>,
    /// LSN → the segment, bytes and term of the group last validated
    /// there: another host writing the same bytes at the same place holds
    /// the same group, without validating them again (a window near the
    /// committed end; a miss only costs a validation).
    shapes: BTreeMap<u64, (SegmentId, Bytes, u64)>,
    /// (LSN, term) → the partition ends its source batches carry and the
    /// destination batches its compaction plans name.
    facts: BTreeMap<(u64, u64), GroupFacts>,
    /// Every LSN up to this is committed (durable on a majority with the
    /// same term), and the term of each.
    committed: Vec<u64>,
    /// The highest end each partition reached in committed groups.
    committed_ends: BTreeMap<PartitionKey, u64>,
    /// The destination batches committed groups plan.
    committed_plans: BTreeSet<PlannedBatch>,
    /// The destination batches handed to a sink.
    dispatched: BTreeSet<PlannedBatch>,
    /// The highest position acted on per partition (acked, stored, or
    /// handed to a sink), and how.
    acted: BTreeMap<PartitionKey, (u64, &'static str)>,
    /// term → the host that sent appends in it.
    leaders: BTreeMap<u64, u64>,
    pub violation: Option<Violation>,
}

impl Model {
    pub fn new(hosts: usize) -> Model {
        Model {
            hosts,
            durable: vec![BTreeMap::new(); hosts],
            places: vec![BTreeMap::new(); hosts],
            replaced: vec![Vec::new(); hosts],
            wiped: vec![BTreeMap::new(); hosts],
            ..Model::default()
        }
    }

    /// Host `h`'s data is gone for good.
    pub fn wipe(&mut self, h: usize) {
        let held = std::mem::take(&mut self.durable[h]);
        self.wiped[h].extend(held);
        self.advance(0);
    }

    /// The longest durable log, and on which host.
    pub fn longest(&self) -> Option<usize> {
        (0..self.hosts).max_by_key(|&h| (self.durable[h].keys().last().copied(), h))
    }

    fn fail(&mut self, invariant: &'static str, detail: String) {
        if self.violation.is_none() {
            self.violation = Some(Violation { invariant, detail });
        }
    }

    /// Host `h` made these groups durable, replacing what followed the
    /// first of them. True when that replaced groups it held (its tail was
    /// truncated, whatever its requests said).
    pub fn durable_groups(&mut self, h: usize, groups: &[EntryGroup]) -> bool {
        let Some(first) = groups.first() else { return false };
        let from = first.place.lsn.0;
        // Most writes only extend the log: nothing to split off.
        let replaced = self.durable[h].range(from..).next().is_some();
        self.replaced[h] = Vec::new();
        if replaced || self.places[h].range(from..).next().is_some() {
            let old = self.durable[h].split_off(&from);
            let old_places = self.places[h].split_off(&from);
            self.replaced[h] =
                old.iter().filter_map(|(lsn, term)| old_places.get(lsn).map(|p| (*lsn, *term, *p))).collect();
        }
        for g in groups {
            let lsn = g.place.lsn.0;
            let seen = self.shapes.get(&lsn).filter(|(s, b, _)| *s == g.place.segment && *b == g.bytes);
            let term = match seen {
                Some(&(_, _, term)) => term,
                None => {
                    let Some(shape) = group_shape(g.place.segment, g.place.lsn, &g.bytes) else {
                        let detail = format!("host {} wrote a group at LSN {lsn} that does not decode", h + 1);
                        self.fail(invariant::PREFIXES_DIFFER, detail);
                        return replaced;
                    };
                    self.shapes.insert(lsn, (g.place.segment, g.bytes.clone(), shape.epoch.0));
                    shape.epoch.0
                }
            };
            self.durable[h].insert(lsn, term);
            self.places[h].insert(lsn, g.place);
            // Read once per group, whichever host writes it first.
            self.facts
                .entry((lsn, term))
                .or_insert_with(|| group_facts(g.place.segment, g.place.lsn, &g.bytes).unwrap_or_default());
        }
        // A log that only grew lost nothing: only a replaced tail is
        // checked against the committed prefix again.
        self.advance(if replaced { from } else { u64::MAX });
        if self.shapes.len() > 2 * SHAPES_KEPT {
            let keep_from = (self.committed.len() as u64).saturating_sub(SHAPES_KEPT as u64);
            self.shapes = self.shapes.split_off(&keep_from);
        }
        replaced
    }

    /// After a truncation: the host's disk, scanned, must hold exactly the
    /// log its requests wrote (no group of the replaced tail admitted, no
    /// remnant of one that breaks the scan), and no group of the replaced
    /// tail may still validate where it was (`segments`: the durable disk).
    pub fn check_truncated(
        &mut self,
        h: usize,
        segments: &[(SegmentId, &[u8])],
        scanned: Result<Vec<ScannedSegment>, String>,
    ) {
        for (lsn, term, p) in std::mem::take(&mut self.replaced[h]) {
            let bytes = segments
                .iter()
                .find(|s| s.0 == p.segment)
                .and_then(|s| s.1.get(p.offset as usize..(p.offset + p.len) as usize));
            let survives = bytes.and_then(|b| group_shape(p.segment, Lsn(lsn), b)).is_some_and(|g| g.epoch.0 == term);
            if survives {
                let detail = format!(
                    "host {} truncated its tail, and the replaced group at LSN {lsn} (term {term}) still validates \
                     in segment {} at byte {}",
                    h + 1,
                    p.segment.0,
                    p.offset
                );
                return self.fail(invariant::TRUNCATION_LEFT_BYTES, detail);
            }
            if let Some(at) = remnant(segments, &self.places[h], p) {
                let detail = format!(
                    "host {} truncated its tail, and a byte of the replaced group at LSN {lsn} (term {term}) is left \
                     in segment {} at byte {at}: a truncation zeroes or removes all it replaces",
                    h + 1,
                    p.segment.0,
                );
                return self.fail(invariant::TRUNCATION_LEFT_BYTES, detail);
            }
        }
        let found: Result<BTreeMap<u64, u64>, String> =
            scanned.map(|s| s.iter().flat_map(|s| &s.groups).map(|g| (g.lsn.0, g.epoch.0)).collect());
        // What lies before the disk's first group was deleted, not truncated.
        let first = found.as_ref().ok().and_then(|f| f.keys().next().copied()).unwrap_or(0);
        let written: BTreeMap<u64, u64> = self.durable[h].range(first..).map(|(l, t)| (*l, *t)).collect();
        match found {
            Ok(found) if found == written => {}
            Ok(found) => {
                let detail = format!(
                    "host {} truncated its tail, and its disk scans to LSN {:?} where it wrote to {:?}",
                    h + 1,
                    found.keys().last(),
                    written.keys().last()
                );
                self.fail(invariant::TRUNCATION_LEFT_BYTES, detail);
            }
            Err(e) => {
                let detail = format!("host {} truncated its tail, and its disk no longer scans: {e}", h + 1);
                self.fail(invariant::TRUNCATION_LEFT_BYTES, detail);
            }
        }
    }

    /// Host `h`'s durable image after a crash, scanned from its disk. What
    /// lies before its first group was deleted under the deletion rule,
    /// having been applied there: it still counts as held.
    pub fn rescanned(&mut self, h: usize, scanned: &[ScannedSegment]) {
        self.places[h] = places_of(scanned);
        let found: BTreeMap<u64, u64> = scanned.iter().flat_map(|s| &s.groups).map(|g| (g.lsn.0, g.epoch.0)).collect();
        let before = found.keys().next().map_or(BTreeMap::new(), |&first| {
            let mut d = std::mem::take(&mut self.durable[h]);
            d.split_off(&first);
            d
        });
        self.durable[h] = before.into_iter().chain(found).collect();
        for g in scanned.iter().flat_map(|s| &s.groups) {
            self.facts.entry((g.lsn.0, g.epoch.0)).or_insert_with(|| facts_of(&g.frames));
        }
        self.advance(0);
    }

    /// Host `h` installed a snapshot: its disk holds the scanned groups and
    /// nothing else, and everything before them is committed (what the
    /// leader deleted, having applied it), so it is held as committed.
    pub fn installed(&mut self, h: usize, scanned: &[ScannedSegment]) {
        self.places[h] = places_of(scanned);
        let found: BTreeMap<u64, u64> = scanned.iter().flat_map(|s| &s.groups).map(|g| (g.lsn.0, g.epoch.0)).collect();
        let first = found.keys().next().copied().unwrap_or(0);
        let committed = self.committed.iter().enumerate().take(first as usize).map(|(l, &t)| (l as u64, t));
        self.durable[h] = committed.chain(found).collect();
        for g in scanned.iter().flat_map(|s| &s.groups) {
            self.facts.entry((g.lsn.0, g.epoch.0)).or_insert_with(|| facts_of(&g.frames));
        }
        self.advance(0);
    }

    /// Re-checks the committed prefix from `from` on (where a host's
    /// durable log changed), moves it forward as far as majorities reach,
    /// and checks that nothing acted on fell out of it.
    fn advance(&mut self, from: u64) {
        let majority = self.hosts / 2 + 1;
        let holders = |lsn: u64, term: u64| {
            (0..self.hosts)
                .filter(|&h| self.durable[h].get(&lsn) == Some(&term) || self.wiped[h].get(&lsn) == Some(&term))
                .count()
        };
        let lost =
            (from as usize..self.committed.len()).find(|&lsn| holders(lsn as u64, self.committed[lsn]) < majority);
        if let Some(lsn) = lost {
            self.committed.truncate(lsn);
            self.committed_ends.clear();
            self.committed_plans.clear();
            for lsn in 0..self.committed.len() {
                self.count_committed(lsn as u64, self.committed[lsn]);
            }
        }
        loop {
            let next = self.committed.len() as u64;
            let mut terms: BTreeMap<u64, usize> = BTreeMap::new();
            for h in 0..self.hosts {
                let (d, w) = (self.durable[h].get(&next), self.wiped[h].get(&next));
                for &t in d.iter().chain(w.iter().filter(|&&w| Some(w) != d)).copied() {
                    *terms.entry(t).or_default() += 1;
                }
            }
            let Some((&term, _)) = terms.iter().find(|(_, &n)| n >= majority) else { break };
            self.committed.push(term);
            self.count_committed(next, term);
        }
        if lost.is_some() {
            let acted: Vec<_> = self.acted.iter().map(|(k, v)| (*k, *v)).collect();
            for (key, (pos, how)) in acted {
                if pos > self.committed_end(key) {
                    let detail = format!(
                        "{key} was {how} through {pos}, and a majority now holds it only through {}",
                        self.committed_end(key)
                    );
                    return self.fail(invariant::COMMITTED_LOST, detail);
                }
            }
            if let Some(b) = self.dispatched.difference(&self.committed_plans).next() {
                let detail = format!(
                    "sink {} was handed batch {} ({:?}) of stream {}, and a majority no longer holds its plan",
                    b.sink.0, b.seq.0, b.id, b.stream.0
                );
                self.fail(invariant::COMMITTED_LOST, detail);
            }
        }
    }

    /// What the committed group at `lsn` adds to the committed ends and
    /// plans.
    fn count_committed(&mut self, lsn: u64, term: u64) {
        let Some(facts) = self.facts.get(&(lsn, term)) else { return };
        for &(key, end) in &facts.ends {
            let e = self.committed_ends.entry(key).or_insert(0);
            *e = (*e).max(end.0);
        }
        self.committed_plans.extend(facts.plans.iter().copied());
    }

    fn acted_on(&mut self, key: PartitionKey, pos: u64, how: &'static str) {
        let a = self.acted.entry(key).or_insert((0, how));
        if pos > a.0 {
            *a = (pos, how);
        }
    }

    fn committed_end(&self, key: PartitionKey) -> u64 {
        self.committed_ends.get(&key).copied().unwrap_or(0)
    }

    /// A source is acked through these positions.
    pub fn on_ack(&mut self, host: usize, source: SourceId, acks: &[(u32, Position)]) {
        for &(partition, pos) in acks {
            let key = PartitionKey { source, partition };
            if pos.0 > self.committed_end(key) {
                let detail = format!(
                    "host {} acked {key} through {} while a majority holds it through {}",
                    host + 1,
                    pos.0,
                    self.committed_end(key)
                );
                self.fail(invariant::ACK_BEFORE_MAJORITY, detail);
            }
            self.acted_on(key, pos.0, "acked");
        }
    }

    pub fn on_offsets(&mut self, host: usize, key: PartitionKey, position: Position) {
        if position.0 > self.committed_end(key) {
            let detail = format!(
                "host {} stored {key} at {} while a majority holds it through {}",
                host + 1,
                position.0,
                self.committed_end(key)
            );
            self.fail(invariant::OFFSETS_BEFORE_MAJORITY, detail);
        }
        self.acted_on(key, position.0, "stored as an offset");
    }

    /// A sink is handed a batch (its records' bytes as the simulated
    /// sources make them: source, partition, position first): its records
    /// and its plan must be committed.
    pub fn on_dispatch(&mut self, host: usize, apply: &SinkApply) {
        for r in &apply.records {
            if r.len() < 6 {
                continue; // the exactly-once checker names foreign bytes
            }
            let key = PartitionKey { source: SourceId(r[0] as u16), partition: r[1] as u32 };
            let pos = u32::from_le_bytes(r[2..6].try_into().expect("four bytes")) as u64;
            if pos >= self.committed_end(key) {
                let detail = format!(
                    "host {} dispatched {key} position {pos} while a majority holds it through {}",
                    host + 1,
                    self.committed_end(key)
                );
                return self.fail(invariant::DISPATCH_BEFORE_MAJORITY, detail);
            }
            self.acted_on(key, pos + 1, "handed to a sink");
        }
        let batch = PlannedBatch { sink: apply.sink, stream: apply.stream, id: apply.id, seq: apply.seq };
        if !self.committed_plans.contains(&batch) {
            let detail = format!(
                "host {} handed sink {} batch {} ({:?}) of stream {}, whose plan no majority holds",
                host + 1,
                batch.sink.0,
                batch.seq.0,
                batch.id,
                batch.stream.0
            );
            return self.fail(invariant::DISPATCH_BEFORE_MAJORITY, detail);
        }
        self.dispatched.insert(batch);
    }

    /// Host `h` saved `commit` as its commit index: a majority must hold
    /// every group up to it.
    pub fn on_commit_saved(&mut self, h: usize, commit: u64) {
        if commit > 0 && commit >= self.committed.len() as u64 {
            let detail = format!(
                "host {} saved commit index {commit}; a majority holds groups only through LSN {}",
                h + 1,
                self.committed.len().saturating_sub(1)
            );
            self.fail(invariant::COMMIT_BEFORE_QUORUM, detail);
        }
    }

    /// Host `from` sent an append in `term`: only that term's leader does.
    pub fn on_append_sent(&mut self, from: u64, term: u64) {
        let leader = *self.leaders.entry(term).or_insert(from);
        if leader != from {
            self.fail(invariant::TWO_LEADERS, format!("hosts {leader} and {from} both sent appends in term {term}"));
        }
    }

    /// At the end: every host's durable log agrees with the committed
    /// prefix up to the commit index its hard-state file holds (past it, a
    /// stale uncommitted tail may wait for its leader to replace it).
    pub fn check_prefixes(&mut self, commits: &[u64]) {
        for (h, &commit) in commits.iter().enumerate() {
            if commit == 0 {
                continue; // nothing committed known (a joined host that has not started yet)
            }
            let upto = (commit as usize + 1).min(self.committed.len());
            for (lsn, &term) in self.committed[..upto].iter().enumerate() {
                match self.durable[h].get(&(lsn as u64)) {
                    None => {
                        let detail = format!("host {} saved commit index {commit} but lacks LSN {lsn}", h + 1);
                        return self.fail(invariant::PREFIXES_DIFFER, detail);
                    }
                    Some(&t) if t != term => {
                        let detail = format!("host {} holds LSN {lsn} of term {t}, committed in term {term}", h + 1);
                        return self.fail(invariant::PREFIXES_DIFFER, detail);
                    }
                    _ => {}
                }
            }
        }
    }

    pub fn terms(&self) -> usize {
        self.leaders.len()
    }
}

fn places_of(scanned: &[ScannedSegment]) -> BTreeMap<u64, GroupPlace> {
    let places = scanned.iter().flat_map(|s| {
        s.groups
            .iter()
            .map(|g| (g.lsn.0, GroupPlace { lsn: g.lsn, segment: s.id, offset: g.offset, len: g.end - g.offset }))
    });
    places.collect()
}

fn facts_of(frames: &[Frame]) -> GroupFacts {
    let mut facts = GroupFacts::default();
    for f in frames {
        match f {
            Frame::SourceBatch(b) => facts.ends.push((b.key, b.end)),
            Frame::CompactionPlanned(p) => {
                facts.plans.push(PlannedBatch { sink: p.sink, stream: p.stream, id: p.id, seq: p.seq })
            }
            Frame::Refused(r) => {
                facts.plans.push(PlannedBatch { sink: r.sink, stream: r.stream, id: r.then, seq: r.seq })
            }
            Frame::Split(x) => {
                facts.plans.push(PlannedBatch { sink: x.sink, stream: x.stream, id: x.then, seq: x.seq })
            }
            _ => {}
        }
    }
    facts
}

/// The first non-zero byte of `replaced`'s place that no group the host
/// holds now covers, if any: a segment that is gone holds nothing.
fn remnant(segments: &[(SegmentId, &[u8])], places: &BTreeMap<u64, GroupPlace>, replaced: GroupPlace) -> Option<u64> {
    let bytes = segments.iter().find(|s| s.0 == replaced.segment)?.1;
    let (from, to) = (replaced.offset, replaced.offset + replaced.len);
    let covered: Vec<(u64, u64)> = places
        .values()
        .filter(|g| g.segment == replaced.segment && g.offset < to && g.offset + g.len > from)
        .map(|g| (g.offset, g.offset + g.len))
        .collect();
    (from..to.min(bytes.len() as u64))
        .find(|&at| bytes[at as usize] != 0 && !covered.iter().any(|&(a, b)| (a..b).contains(&at)))
}
