//! Three `Replica`s with in-memory disks on a seeded network that delays,
//! reorders, loses and duplicates messages and cuts hosts off. Each disk
//! image is what the host's persisting requests made durable; the checks
//! are the clustered WAL's: no commit index passes what a majority holds
//! durably, every host applies the same groups in LSN order, and once the
//! cluster is quiet every host's segments are byte-identical and scan, with
//! the WAL's own scan, as exactly the log raft agreed on.

use super::entry::{encode_entry, genesis};
use super::hard_state::{decode_file, encode_slot, slot_offset, Members, FILE_BYTES};
use super::log::Log;
use super::replica::{Persist, Replica, ReplicaOutput};
use crate::config::Limits;
use crate::ids::*;
use crate::wal::{encode_group, encode_header, scan, Frame, GroupPlace, Record, SourceBatch};
use raft::eraftpb::{ConfState, HardState, Message};
use std::collections::{BTreeMap, VecDeque};

const SEGMENT_BYTES: u64 = 8 << 10;
const HOSTS: u64 = 3;

struct Host {
    replica: Replica,
    /// The durable image: segment → bytes.
    disk: BTreeMap<SegmentId, Vec<u8>>,
    /// The durable hard-state file and the next save's sequence number.
    hard_file: Vec<u8>,
    hard_seq: u64,
    /// Index → term of each group durably on the disk.
    durable: BTreeMap<u64, u64>,
    persists: VecDeque<Persist>,
    fetches: VecDeque<Vec<GroupPlace>>,
    /// (index, term, bytes) of every group applied, in order.
    applied: Vec<(u64, u64, Vec<u8>)>,
}

struct World {
    hosts: Vec<Host>,
    /// Messages in flight.
    net: Vec<Message>,
    rng: u64,
    /// A host cut off from the others, and until which step.
    cut: Option<(u64, u64)>,
    step: u64,
    proposed: u64,
    truncations: u64,
    fetches: u64,
    crashes: u64,
    plant: fn(&mut Replica),
    leaders: BTreeMap<u64, u64>,
}

fn limits() -> Limits {
    Limits { group_bytes_max: 1 << 10, pending_bytes_max: 8 << 10, ..Limits::default() }
}

fn members(node: u64) -> Members {
    Members { cluster: 1, node, segment_bytes: SEGMENT_BYTES, ..Members::default() }
}

impl World {
    fn new(seed: u64, plant: fn(&mut Replica)) -> World {
        let hosts = (1..=HOSTS)
            .map(|id| {
                let (end, first) = genesis(SEGMENT_BYTES);
                let conf = ConfState::from(((1..=HOSTS).collect::<Vec<_>>(), vec![]));
                let log = Log::new(HardState::default(), conf, (0, 0), end);
                let mut replica = Replica::new(log, members(id), 0, &limits(), seed).expect("a valid config");
                plant(&mut replica);
                let mut segment = first;
                segment.resize(SEGMENT_BYTES as usize, 0);
                Host {
                    replica,
                    disk: BTreeMap::from([(SegmentId(0), segment)]),
                    hard_file: vec![0; FILE_BYTES],
                    hard_seq: 1,
                    durable: BTreeMap::from([(0, 0)]),
                    persists: VecDeque::new(),
                    fetches: VecDeque::new(),
                    applied: Vec::new(),
                }
            })
            .collect();
        World {
            hosts,
            net: Vec::new(),
            rng: seed.wrapping_mul(0x2545_f491_4f6c_dd1d) | 1,
            cut: None,
            step: 0,
            proposed: 0,
            truncations: 0,
            fetches: 0,
            crashes: 0,
            plant,
            leaders: BTreeMap::new(),
        }
    }

    fn next(&mut self, n: u64) -> u64 {
        self.rng ^= self.rng << 13;
        self.rng ^= self.rng >> 7;
        self.rng ^= self.rng << 17;
        self.rng % n
    }

    fn leader(&self) -> Option<usize> {
        self.hosts.iter().position(|h| h.replica.is_leader())
    }

    /// Drains host `i`'s outputs into the network and its request queues.
    fn drain(&mut self, i: usize) -> Result<(), String> {
        while let Some(out) = self.hosts[i].replica.poll() {
            match out {
                ReplicaOutput::Send(m) => self.net.push(m),
                ReplicaOutput::Persist(p) => self.hosts[i].persists.push_back(p),
                ReplicaOutput::Fetch(places) => self.hosts[i].fetches.push_back(places),
                ReplicaOutput::Committed(groups) => {
                    for c in groups {
                        let h = &mut self.hosts[i];
                        let expected = h.applied.last().map_or(1, |a| a.0 + 1);
                        if c.group.place.lsn.0 != expected {
                            return Err(format!(
                                "host {} applied {} after {}",
                                i + 1,
                                c.group.place.lsn.0,
                                expected - 1
                            ));
                        }
                        h.applied.push((c.group.place.lsn.0, c.term, c.group.bytes.to_vec()));
                    }
                }
                ReplicaOutput::Role { term, is_leader, .. } => {
                    if is_leader {
                        let id = i as u64 + 1;
                        if *self.leaders.entry(term).or_insert(id) != id {
                            return Err(format!("two leaders in term {term}"));
                        }
                    }
                }
                ReplicaOutput::Failed(e) => return Err(format!("host {}: {e}", i + 1)),
                ReplicaOutput::LeaderConfirmed => {}
                ReplicaOutput::Removed => return Err(format!("host {} was removed", i + 1)),
                ReplicaOutput::FromRemoved(id) => return Err(format!("host {} heard from removed node {id}", i + 1)),
            }
        }
        Ok(())
    }

    /// Performs host `i`'s oldest persisting request on its disk.
    fn persist(&mut self, i: usize) {
        let h = &mut self.hosts[i];
        let Some(p) = h.persists.pop_front() else { return };
        if !p.appended.remove.is_empty() || !p.appended.zero.is_empty() {
            self.truncations += 1;
        }
        if let Some(first) = p.appended.groups.first() {
            h.durable.split_off(&first.place.lsn.0);
        }
        h.persists.push_front(p);
        self.persist_quietly(i);
        let h = &mut self.hosts[i];
        let p = h.persists.pop_front().expect("pushed back above");
        for g in &p.appended.groups {
            let term = h.replica.log().term_of(g.place.lsn.0).unwrap_or(0);
            h.durable.insert(g.place.lsn.0, term);
        }
        if let Some((hard, conf, members)) = &p.hard {
            let slot = encode_slot(h.hard_seq, hard, conf, members).expect("fits a slot");
            let at = slot_offset(h.hard_seq) as usize;
            h.hard_file[at..at + slot.len()].copy_from_slice(&slot);
            h.hard_seq += 1;
        }
        h.replica.persisted(p.number);
    }

    /// Host `i` crashes: what its oldest request had written may survive
    /// without the hard state that follows it (saved last), every other
    /// request is lost, and it restarts from its disk and hard-state file,
    /// having applied what that file says is committed.
    fn crash(&mut self, i: usize, seed: u64) -> Result<(), String> {
        self.crashes += 1;
        let h = &mut self.hosts[i];
        if let Some(mut p) = h.persists.pop_front() {
            if seed.is_multiple_of(2) {
                p.hard = None;
                h.persists.push_front(p);
                self.persist_quietly(i);
            }
        }
        let h = &mut self.hosts[i];
        h.persists.clear();
        h.fetches.clear();
        let conf = ConfState::from(((1..=HOSTS).collect::<Vec<_>>(), vec![]));
        let (hard, conf) = match decode_file(&h.hard_file).map_err(|e| format!("{e}"))? {
            Some(saved) => (saved.hard, saved.conf),
            None => (HardState::default(), conf),
        };
        let refs: Vec<(SegmentId, &[u8])> = h.disk.iter().map(|(s, b)| (*s, b.as_slice())).collect();
        let commit = hard.commit;
        let (log, scanned) = Log::restore(hard, conf, &refs).map_err(|e| format!("host {} restarts: {e}", i + 1))?;
        let groups: Vec<_> = scanned.iter().flat_map(|s| &s.groups).collect();
        h.durable = groups.iter().map(|g| (g.lsn.0, g.epoch.0)).collect();
        h.applied = groups
            .iter()
            .filter(|g| g.lsn.0 >= 1 && g.lsn.0 <= commit)
            .map(|g| {
                let seg = scanned.iter().find(|s| s.groups.iter().any(|x| x.lsn == g.lsn)).expect("found");
                (g.lsn.0, g.epoch.0, h.disk[&seg.id][g.offset as usize..g.end as usize].to_vec())
            })
            .collect();
        let mut replica =
            Replica::new(log, members(i as u64 + 1), commit, &limits(), seed).map_err(|e| format!("{e}"))?;
        (self.plant)(&mut replica);
        h.replica = replica;
        Ok(())
    }

    /// Writes the groups of host `i`'s oldest request to its disk (a crash
    /// may come before its hard state is saved and the replica told).
    fn persist_quietly(&mut self, i: usize) {
        let h = &mut self.hosts[i];
        let Some(p) = h.persists.front() else { return };
        for segment in &p.appended.remove {
            h.disk.remove(segment);
        }
        for place in &p.appended.zero {
            let seg = h.disk.get_mut(&place.segment).expect("zeroing a segment the host has");
            seg[place.offset as usize..(place.offset + place.len) as usize].fill(0);
        }
        for g in &p.appended.groups {
            if let Some(o) = g.opens {
                let mut seg = encode_header(g.place.segment, o.epoch);
                seg.resize(o.segment_bytes as usize, 0);
                h.disk.insert(g.place.segment, seg);
            }
            let seg = h.disk.get_mut(&g.place.segment).expect("a group goes to a segment the host has");
            seg[g.place.offset as usize..(g.place.offset + g.place.len) as usize].copy_from_slice(&g.bytes);
        }
    }

    fn fetch(&mut self, i: usize) {
        let h = &mut self.hosts[i];
        let Some(places) = h.fetches.pop_front() else { return };
        self.fetches += 1;
        // A read for a lagging follower fetches what one message takes: at
        // most a message of `group_bytes_max` bytes or a `Ready` of committed
        // entries (four times that), or one group.
        let bytes: u64 = places.iter().map(|p| p.len).sum();
        assert!(
            places.len() == 1 || bytes <= 4 * limits().group_bytes_max,
            "a fetch of {} groups, {bytes} bytes",
            places.len()
        );
        let groups = places
            .iter()
            .map(|p| h.disk[&p.segment][p.offset as usize..(p.offset + p.len) as usize].to_vec())
            .collect();
        h.replica.fetched(groups);
    }

    /// The leader proposes a group of 1 to 6 records, sealing its segment
    /// when another group of the largest size would not fit after it.
    fn propose(&mut self) {
        let Some(l) = self.leader() else { return };
        let n = 1 + self.next(6) as usize;
        let r = &mut self.hosts[l].replica;
        let (term, index, end) = (r.term(), r.log().last_index() + 1, r.log().end());
        let at = end.next(Epoch(term));
        let key = PartitionKey { source: SourceId(0), partition: 0 };
        let records = (0..n).map(|k| Record { position: Position(index * 8 + k as u64), bytes: vec![index as u8; 30] });
        let batch = Frame::SourceBatch(SourceBatch {
            key,
            stream: StreamId(0),
            end: Position(index * 8 + n as u64),
            checkpoint: None,
            records: records.collect(),
            counted: None,
            provisional: false,
        });
        let len = encode_group(at.segment, Epoch(term), Lsn(index), &[&batch]).len() as u64;
        let size = at.opens.map_or(end.segment_bytes, |o| o.segment_bytes);
        let seal = at.offset + len + 2 * limits().group_bytes_max > size;
        let frames: Vec<&Frame> = if seal { vec![&batch, &Frame::Seal] } else { vec![&batch] };
        let group = encode_group(at.segment, Epoch(term), Lsn(index), &frames);
        if r.propose(encode_entry(&at, &group)).is_ok() {
            self.proposed += 1;
        }
    }

    fn deliver(&mut self, at: usize) {
        let m = self.net.swap_remove(at);
        let cut = self.cut.is_some_and(|(c, _)| c == m.to || c == m.from);
        if !cut {
            self.hosts[m.to as usize - 1].replica.step(m);
        }
    }

    /// One random step, then the checks.
    fn step(&mut self, proposals: bool) -> Result<(), String> {
        self.step += 1;
        if self.cut.is_some_and(|(_, until)| until <= self.step) {
            self.cut = None;
        }
        let i = self.next(HOSTS) as usize;
        match self.next(100) {
            0..=14 => self.hosts[i].replica.tick(),
            15..=59 if !self.net.is_empty() => {
                let at = self.next(self.net.len() as u64) as usize;
                match self.next(50) {
                    0 => drop(self.net.swap_remove(at)),
                    1 => {
                        let copy = self.net[at].clone();
                        self.net.push(copy);
                    }
                    _ => self.deliver(at),
                }
            }
            60..=84 => self.persist(i),
            85..=89 => self.fetch(i),
            90..=98 if proposals && self.proposed < 400 => self.propose(),
            99 if self.next(4) == 0 => {
                let seed = self.next(1 << 32);
                self.crash(i, seed)?;
            }
            99 if self.cut.is_none() => {
                let until = self.step + 200 + self.next(1_500);
                self.cut = Some((self.next(HOSTS) + 1, until));
            }
            _ => {}
        }
        for h in 0..self.hosts.len() {
            self.drain(h)?;
        }
        self.check_durability()
    }

    /// No host's commit index passes what a majority holds durably, with
    /// the same term.
    fn check_durability(&self) -> Result<(), String> {
        for (i, h) in self.hosts.iter().enumerate() {
            let c = h.replica.commit_index();
            let Some(term) = h.replica.log().term_of(c) else { continue };
            let holders = self.hosts.iter().filter(|o| o.durable.get(&c) == Some(&term)).count();
            if holders * 2 <= self.hosts.len() {
                return Err(format!("host {} committed {c}, durable on {holders} of {}", i + 1, self.hosts.len()));
            }
        }
        Ok(())
    }

    /// Heals the network and runs without proposals until every request
    /// completed and every host applied the same last group.
    fn settle(&mut self) -> Result<(), String> {
        self.cut = None;
        for _ in 0..200_000 {
            self.step(false)?;
            let last = self.hosts[0].applied.last().map(|a| a.0);
            let same = self.hosts.iter().all(|h| h.applied.last().map(|a| a.0) == last);
            let idle = self.hosts.iter().all(|h| h.persists.is_empty() && h.fetches.is_empty());
            let logs = self.hosts.iter().map(|h| h.replica.log().last_index()).collect::<Vec<_>>();
            if same && idle && self.net.is_empty() && logs.iter().all(|&l| Some(l) == last) {
                return Ok(());
            }
        }
        Err("the cluster never settled".into())
    }

    /// Every host applied the same groups, holds byte-identical segments,
    /// and those segments scan as the applied log, and the hard-state file
    /// holds the commit index.
    fn check_settled(&self) -> Result<(), String> {
        let first = &self.hosts[0];
        for (i, h) in self.hosts.iter().enumerate() {
            if h.applied != first.applied {
                return Err(format!("host {} applied other groups than host 1", i + 1));
            }
            if h.disk != first.disk {
                return Err(format!("host {}'s segments differ from host 1's", i + 1));
            }
            let refs: Vec<(SegmentId, &[u8])> = h.disk.iter().map(|(s, b)| (*s, b.as_slice())).collect();
            let scanned = scan(&refs, false).map_err(|c| format!("host {}: {c:?}", i + 1))?;
            let groups: Vec<(u64, u64)> =
                scanned.iter().flat_map(|s| s.groups.iter().map(|g| (g.lsn.0, g.epoch.0))).collect();
            let expected: Vec<(u64, u64)> =
                std::iter::once((0, 0)).chain(h.applied.iter().map(|a| (a.0, a.1))).collect();
            if groups != expected {
                return Err(format!(
                    "host {}'s WAL scans as {} groups, raft applied {}",
                    i + 1,
                    groups.len(),
                    expected.len() - 1
                ));
            }
            let saved = decode_file(&h.hard_file).map_err(|e| format!("{e:?}"))?.expect("a hard state was saved");
            // A commit index alone is saved with the next save, not at once.
            let last_durable = h.durable.keys().last().copied().unwrap_or(0);
            if saved.hard.commit > h.replica.commit_index() || saved.hard.commit > last_durable {
                let (saved, commit) = (saved.hard.commit, h.replica.commit_index());
                return Err(format!("host {}'s saved commit {saved} passes {commit} or its durable log", i + 1));
            }
        }
        Ok(())
    }
}

fn run(seed: u64, plant: fn(&mut Replica)) -> Result<World, String> {
    let mut w = World::new(seed, plant);
    for _ in 0..30_000 {
        w.step(true)?;
    }
    w.settle()?;
    w.check_settled()?;
    Ok(w)
}

#[test]
fn replicated_groups_are_the_same_wal_on_every_host() {
    let (mut truncations, mut fetches, mut applied, mut crashes) = (0, 0, 0, 0);
    for seed in 0..12 {
        let w = run(seed, |_| {}).unwrap_or_else(|e| panic!("seed {seed}: {e}"));
        truncations += w.truncations;
        fetches += w.fetches;
        crashes += w.crashes;
        applied += w.hosts[0].applied.len();
    }
    assert!(applied > 12 * 100, "groups were committed ({applied})");
    assert!(truncations > 0, "some seed truncated a conflicting tail");
    assert!(fetches > 0, "some seed read old groups back for a lagging follower");
    assert!(crashes > 0, "some seed crashed a host");
}

#[test]
fn forgetting_the_vote_across_a_restart_is_caught() {
    let caught = (0..40).filter(|&s| run(s, |r| r.plant_vote_not_persisted()).is_err()).count();
    assert!(caught > 0, "vote-not-persisted went unnoticed");
}

#[test]
fn acknowledging_before_the_fsync_is_caught() {
    let caught = (0..12).filter(|&s| run(s, |r| r.plant_ack_before_persist()).is_err()).count();
    assert!(caught > 0, "ack-before-persist went unnoticed");
}

#[test]
fn overwriting_a_conflicting_tail_without_truncating_is_caught() {
    let caught = (0..12).filter(|&s| run(s, |r| r.plant_no_truncate()).is_err()).count();
    assert!(caught > 0, "no-truncate-on-conflict went unnoticed");
}

#[test]
fn the_same_seed_gives_the_same_run() {
    let a = run(5, |_| {}).unwrap();
    let b = run(5, |_| {}).unwrap();
    assert_eq!(a.hosts[0].applied, b.hosts[0].applied);
    assert_eq!((a.truncations, a.fetches, &a.leaders), (b.truncations, b.fetches, &b.leaders));
}

#[test]
fn a_host_whose_disk_lost_committed_groups_refuses_to_start() {
    let w = run(1, |_| {}).unwrap();
    let h = &w.hosts[0];
    let saved = decode_file(&h.hard_file).unwrap().unwrap();
    let mut disk = h.disk.clone();
    let last = *disk.keys().last().unwrap();
    disk.remove(&last);
    let refs: Vec<(SegmentId, &[u8])> = disk.iter().map(|(s, b)| (*s, b.as_slice())).collect();
    let e = Log::restore(saved.hard.clone(), saved.conf.clone(), &refs).err().expect("refused");
    assert!(matches!(e, super::log::RestoreError::CommitLost { .. }), "{e:?}");
    assert!(e.to_string().contains("acknowledged groups are gone"), "{e}");
    // Without its first segment, raft's log starts at the next one's first
    // group (as after deletions); whether older segments may be missing is
    // recovery's to judge, from the snapshot that segment opens with.
    let refs: Vec<(SegmentId, &[u8])> = h.disk.iter().skip(1).map(|(s, b)| (*s, b.as_slice())).collect();
    let (log, scanned) = Log::restore(saved.hard.clone(), saved.conf.clone(), &refs).expect("restored");
    let first = scanned.iter().find_map(|s| s.groups.first()).expect("a group").lsn.0;
    assert_eq!(log.base().0, first);
    assert!(log.hard_state().commit >= first);
    let refs: Vec<(SegmentId, &[u8])> = h.disk.iter().filter(|(s, _)| s.0 == 0).map(|(s, b)| (*s, &b[..0])).collect();
    let e = Log::restore(saved.hard, saved.conf, &refs).err().expect("refused");
    assert_eq!(e, super::log::RestoreError::NoGenesis);
}

/// A follower's ticks before its election timeout only count: its timer is
/// set past them (`ticks_to_effect`), and counting them at once
/// (`tick_quietly`) leaves raft-rs exactly where ticking each would have.
#[test]
fn a_followers_quiet_ticks_counted_at_once_do_what_ticking_each_would() {
    let fresh = |seed| {
        let (end, _) = genesis(SEGMENT_BYTES);
        let conf = ConfState::from(((1..=HOSTS).collect::<Vec<_>>(), vec![]));
        let log = Log::new(HardState::default(), conf, (0, 0), end);
        Replica::new(log, members(1), 0, &limits(), seed).expect("a valid config")
    };
    let outputs = |r: &mut Replica| std::iter::from_fn(|| r.poll()).map(|o| format!("{o:?}")).collect::<Vec<_>>();
    let heartbeat = |term| {
        let mut m = Message::default();
        m.set_msg_type(raft::eraftpb::MessageType::MsgHeartbeat);
        (m.from, m.to, m.term) = (2, 1, term);
        m
    };
    for seed in 0..30 {
        let (mut eager, mut lazy) = (fresh(seed), fresh(seed));
        assert_eq!(outputs(&mut eager), outputs(&mut lazy));
        for round in 0..4u64 {
            // Hearing from a leader part way resets the election timeout.
            let k = lazy.ticks_to_effect().expect("a voter campaigns in the end");
            let before = (seed + round) % k;
            for _ in 0..before {
                eager.tick();
            }
            lazy.tick_quietly(before);
            assert!(outputs(&mut eager).is_empty(), "seed {seed}: a tick before the timeout acted");
            eager.step(heartbeat(round + 1));
            lazy.step(heartbeat(round + 1));
            assert_eq!(outputs(&mut eager), outputs(&mut lazy), "seed {seed}");
            // Then no leader is heard from: the first tick that acts is the
            // one `ticks_to_effect` named, and both campaign alike.
            let k = lazy.ticks_to_effect().expect("a voter campaigns in the end");
            let mut ticks = 0;
            let acted = loop {
                eager.tick();
                ticks += 1;
                let out = outputs(&mut eager);
                if !out.is_empty() {
                    break out;
                }
            };
            assert_eq!(ticks, k, "seed {seed} round {round}");
            lazy.tick_quietly(k - 1);
            assert!(outputs(&mut lazy).is_empty());
            lazy.tick();
            assert_eq!(outputs(&mut lazy), acted, "seed {seed} round {round}");
        }
    }
}

/// A host whose hard state lost the term its log had reached (a disk that
/// dropped a synced slot) and that then leads in a lower term must stop
/// rather than write an entry of that term after the log's later ones
/// (the power-cut loop's `hard-state-unsynced` reaches this).
#[test]
fn an_entry_whose_term_is_below_the_one_before_it_is_refused_not_written() {
    let (end, _) = genesis(SEGMENT_BYTES);
    let conf = ConfState::from(((1..=HOSTS).collect::<Vec<_>>(), vec![]));
    let mut log = Log::new(HardState::default(), conf, (0, 0), end);
    let fence = |index, term| raft::eraftpb::Entry { index, term, ..Default::default() };
    assert!(log.append(&[fence(1, 5), fence(2, 5)]).is_ok());
    let refused = log.append(&[fence(3, 2)]).expect_err("a term that went down");
    assert_eq!(refused.index, 3);
    assert!(refused.what.contains("hard state lost a term"), "{refused}");
    // Within one append too, and a truncating append is checked against
    // the entry it follows.
    assert!(log.append(&[fence(2, 6), fence(3, 4)]).is_err());
    assert!(log.append(&[fence(2, 4)]).is_err(), "index 1 is of term 5");
    assert!(log.append(&[fence(2, 5), fence(3, 7)]).is_ok(), "terms that rise or stay are taken");
}

/// A crash between a `Ready`'s groups and its hard state leaves entries of
/// a term the saved state never reached (a follower's first append in a
/// new term; a first start's term 0). The host restarts in its log's term
/// with no vote: at term 0, raft-rs panicked rejecting a pre-vote.
#[test]
fn a_hard_state_behind_its_logs_term_is_raised_to_it_with_no_vote() {
    let w = run(1, |_| {}).unwrap();
    let h = &w.hosts[0];
    let saved = decode_file(&h.hard_file).unwrap().unwrap();
    let refs: Vec<(SegmentId, &[u8])> = h.disk.iter().map(|(s, b)| (*s, b.as_slice())).collect();
    let (log, _) = Log::restore(saved.hard.clone(), saved.conf.clone(), &refs).expect("restored");
    let last_term = log.term_of(log.last_index()).expect("held");
    assert!(last_term > 0 && saved.hard.term >= last_term, "the run saved its term");
    assert_eq!(log.hard_state(), &saved.hard, "a hard state at its log's term is kept as it is");
    let behind = HardState { term: 0, vote: 0, commit: 0, ..Default::default() };
    let (log, _) = Log::restore(behind, saved.conf.clone(), &refs).expect("restored");
    assert_eq!((log.hard_state().term, log.hard_state().vote), (last_term, 0));
    // A candidate whose log is behind asks for a pre-vote: refused, in the
    // log's term.
    let last = log.last_index();
    let mut replica = Replica::new(log, members(1), 0, &limits(), 1).expect("a valid config");
    let mut m = Message::default();
    m.set_msg_type(raft::eraftpb::MessageType::MsgRequestPreVote);
    (m.from, m.to, m.term, m.index, m.log_term) = (2, 1, 1, 0, 0);
    replica.step(m);
    let answers: Vec<_> = std::iter::from_fn(|| replica.poll())
        .filter_map(|o| match o {
            ReplicaOutput::Send(m) => Some((m.get_msg_type(), m.reject, m.term)),
            _ => None,
        })
        .collect();
    assert_eq!(answers, [(raft::eraftpb::MessageType::MsgRequestPreVoteResponse, true, last_term)], "{last}");
}
