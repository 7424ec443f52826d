//! Three raft-rs nodes in memory, stepped by hand: ticks in a fixed order,
//! messages delivered first in, first out, every `Ready` handled the way
//! the engine will (entries and hard state stored before the persisted
//! messages leave).

use super::*;
use raft::eraftpb::{ConfState, Message};
use raft::storage::MemStorage;
use raft::{RawNode, StateRole, Storage};
use std::collections::{BTreeMap, VecDeque};

struct Node {
    raft: RawNode<MemStorage>,
    jitter: TickJitter,
    withheld: u64,
    /// (term, role) when last looked at.
    seen: (u64, StateRole),
    committed: Vec<Vec<u8>>,
}

struct Cluster {
    nodes: Vec<Node>,
    inbox: VecDeque<Message>,
    /// Every (term, leader) observed, and a trace of what happened.
    leaders: BTreeMap<u64, u64>,
    trace: Vec<(u64, u64, u64, u64)>,
    /// A node cut off: every message to or from it is lost.
    cut: Option<u64>,
}

fn logger() -> slog::Logger {
    slog::Logger::root(slog::Discard, slog::o!())
}

impl Cluster {
    fn new(seed: u64) -> Cluster {
        let limits = Limits::default();
        let nodes = (1..=3)
            .map(|id| {
                let store = MemStorage::new_with_conf_state(ConfState::from((vec![1, 2, 3], vec![])));
                let raft = RawNode::new(&raft_config(id, &limits), store, &logger()).expect("a valid config");
                let seen = (raft.raft.term, raft.raft.state);
                Node { raft, jitter: TickJitter::new(seed, id), withheld: 0, seen, committed: Vec::new() }
            })
            .collect();
        Cluster { nodes, inbox: VecDeque::new(), leaders: BTreeMap::new(), trace: Vec::new(), cut: None }
    }

    /// One tick for every node (or one withheld tick), then every message
    /// delivered until none is left.
    fn round(&mut self, round: u64) {
        for i in 0..self.nodes.len() {
            let node = &mut self.nodes[i];
            if node.withheld > 0 {
                node.withheld -= 1;
            } else {
                node.raft.tick();
            }
            self.after_input(i, round);
        }
        self.deliver(round);
    }

    /// Every message delivered (and every reply to it) until none is left.
    fn deliver(&mut self, round: u64) {
        while let Some(m) = self.inbox.pop_front() {
            if self.cut.is_some_and(|c| c == m.to || c == m.from) {
                continue;
            }
            let to = m.to as usize - 1;
            // A message raft-rs refuses (a stale term, say) is simply dropped.
            let _ = self.nodes[to].raft.step(m);
            self.after_input(to, round);
        }
    }

    fn after_input(&mut self, i: usize, round: u64) {
        self.observe(i, round);
        self.handle_ready(i);
    }

    /// Withholds ticks after a term or role change, and checks one leader
    /// per term.
    fn observe(&mut self, i: usize, round: u64) {
        let node = &mut self.nodes[i];
        let now = (node.raft.raft.term, node.raft.raft.state);
        if now != node.seen {
            node.seen = now;
            node.withheld = node.jitter.draw();
            self.trace.push((round, i as u64 + 1, now.0, node.withheld));
        }
        if now.1 == StateRole::Leader {
            let previous = self.leaders.insert(now.0, i as u64 + 1);
            assert!(previous.is_none_or(|p| p == i as u64 + 1), "two leaders in term {}", now.0);
        }
    }

    fn handle_ready(&mut self, i: usize) {
        let node = &mut self.nodes[i];
        if !node.raft.has_ready() {
            return;
        }
        let mut rd = node.raft.ready();
        // A leader's messages may leave before its own entries are durable.
        self.inbox.extend(rd.take_messages());
        let store = node.raft.raft.raft_log.store.clone();
        store.wl().append(rd.entries()).expect("entries follow the log");
        if let Some(hs) = rd.hs() {
            store.wl().set_hardstate(hs.clone());
        }
        // Votes and acknowledgements only once entries and hard state are stored.
        self.inbox.extend(rd.take_persisted_messages());
        let committed = rd.take_committed_entries();
        let mut light = node.raft.advance(rd);
        if let Some(commit) = light.commit_index() {
            store.wl().mut_hard_state().set_commit(commit);
        }
        self.inbox.extend(light.take_messages());
        for e in committed.into_iter().chain(light.take_committed_entries()) {
            if !e.data.is_empty() {
                node.committed.push(e.data.to_vec());
            }
        }
        node.raft.advance_apply();
    }

    fn leader(&self) -> Option<usize> {
        self.nodes.iter().position(|n| n.raft.raft.state == StateRole::Leader)
    }
}

/// Runs a cluster from `seed` until a leader has committed `entries`
/// proposals on every node; returns the trace of term and role changes.
fn run(seed: u64, entries: u8) -> Vec<(u64, u64, u64, u64)> {
    let mut c = Cluster::new(seed);
    let mut proposed = 0;
    for round in 0..2_000 {
        c.round(round);
        if let Some(l) = c.leader() {
            if proposed < entries && c.nodes[l].raft.propose(vec![], vec![proposed]).is_ok() {
                proposed += 1;
                c.handle_ready(l);
            }
        }
        if c.nodes.iter().all(|n| n.committed.len() == entries as usize) {
            let expected: Vec<Vec<u8>> = (0..entries).map(|e| vec![e]).collect();
            assert!(c.nodes.iter().all(|n| n.committed == expected), "every node commits the same entries in order");
            assert!(!c.leaders.is_empty());
            return c.trace;
        }
    }
    panic!("seed {seed}: {entries} entries not committed everywhere within 2,000 rounds");
}

#[test]
fn three_nodes_elect_one_leader_per_term_and_commit_the_same_entries() {
    for seed in 0..20 {
        run(seed, 20);
    }
}

#[test]
fn the_same_seed_gives_the_same_elections_whatever_the_os_random_numbers() {
    // raft-rs draws each election timeout from `thread_rng()`; the second
    // run finds that generator where the first left it. Only the seed
    // decides, and different seeds do differ.
    let traces: Vec<_> = (0..10).map(|seed| run(seed, 5)).collect();
    for (seed, trace) in traces.iter().enumerate() {
        assert_eq!(&run(seed as u64, 5), trace, "seed {seed}");
    }
    assert!(traces.windows(2).any(|w| w[0] != w[1]), "the seed's jitter changes the elections");
}

#[test]
fn the_pinned_election_timeout_admits_no_other_value() {
    // Why jitter comes from withheld ticks, not from raft-rs itself.
    let store = MemStorage::new_with_conf_state(ConfState::from((vec![1], vec![])));
    let mut node = RawNode::new(&raft_config(1, &Limits::default()), store, &logger()).unwrap();
    node.raft.set_randomized_election_timeout(ELECTION_TICKS);
    assert_eq!(node.raft.randomized_election_timeout(), ELECTION_TICKS);
    let refused = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
        node.raft.set_randomized_election_timeout(ELECTION_TICKS + 1);
    }));
    assert!(refused.is_err(), "raft-rs asserts min <= t < max");
}

#[test]
fn tick_jitter_is_a_function_of_seed_and_node_and_spans_its_range() {
    let draws = |seed, node| {
        let mut j = TickJitter::new(seed, node);
        (0..200).map(|_| j.draw()).collect::<Vec<_>>()
    };
    assert_eq!(draws(7, 1), draws(7, 1));
    assert_ne!(draws(7, 1), draws(7, 2));
    assert_ne!(draws(7, 1), draws(8, 1));
    let seen: std::collections::BTreeSet<u64> = draws(7, 1).into_iter().collect();
    assert_eq!(seen, (0..=JITTER_TICKS_MAX).collect(), "every value in 0..=max comes up");
}

#[test]
fn the_configuration_is_valid_and_capped_by_the_engine_limits() {
    let limits = Limits::default();
    let cfg = raft_config(3, &limits);
    cfg.validate().expect("raft-rs accepts it");
    assert!(cfg.pre_vote && cfg.check_quorum);
    assert_eq!((cfg.min_election_tick(), cfg.max_election_tick()), (ELECTION_TICKS, ELECTION_TICKS + 1));
    assert_eq!(cfg.max_size_per_msg, limits.group_bytes_max);
    assert_eq!(cfg.max_uncommitted_size, limits.pending_bytes_max);
    assert!(cfg.max_committed_size_per_ready >= limits.group_bytes_max && cfg.max_inflight_msgs > 0);
}

#[test]
fn a_lagging_follower_is_sent_entries_the_leader_reads_back_asynchronously() {
    // Entries older than what the engine keeps in memory come back from the
    // WAL through an I/O request: raft-rs's storage answers "temporarily
    // unavailable" for a SendAppend, and `on_entries_fetched` resumes once
    // the read is done. Only sends to followers may wait like this
    // (committed entries for a Ready and leader transfers must be served at
    // once), so the engine keeps the unapplied tail in memory.
    let mut c = Cluster::new(3);
    let mut round = 0;
    while c.leader().is_none() {
        c.round(round);
        round += 1;
    }
    let l = c.leader().unwrap();
    let behind = (0..3).find(|&i| i != l).unwrap();
    c.cut = Some(behind as u64 + 1);
    for e in 0..30u8 {
        c.nodes[l].raft.propose(vec![], vec![e]).unwrap();
        c.handle_ready(l);
        c.round(round);
        round += 1;
    }
    assert_eq!(c.nodes[l].committed.len(), 30, "a majority commits without the cut-off node");
    assert!(c.nodes[behind].committed.is_empty());
    // The entries the follower needs are "on disk" now: reads wait.
    let store = c.nodes[l].raft.raft.raft_log.store.clone();
    store.wl().trigger_log_unavailable(true);
    c.cut = None;
    let mut contexts = Vec::new();
    for _ in 0..30 {
        c.round(round);
        round += 1;
        contexts.extend(store.wl().take_get_entries_context());
    }
    assert!(!contexts.is_empty(), "the leader asked for the entries instead of failing");
    assert!(c.nodes[behind].committed.is_empty(), "nothing reached the follower while the read was pending");
    // The read completes: the entries are there, and the send resumes, with
    // no tick in between (no heartbeat could have asked again).
    store.wl().trigger_log_unavailable(false);
    for context in contexts {
        c.nodes[l].raft.on_entries_fetched(context);
        c.handle_ready(l);
    }
    c.deliver(round);
    assert_eq!(c.nodes[behind].committed, c.nodes[l].committed, "the follower caught up from the read-back");
}

/// A persisting request in flight: the `Ready`'s number, its entries and
/// hard state, and the messages that wait for them.
type Persisting = (u64, Vec<raft::eraftpb::Entry>, Option<raft::eraftpb::HardState>, Vec<Message>);

/// The engine's way with persistence: a `Ready`'s entries and hard state
/// become an I/O request, raft-rs is told at once that they are on their
/// way (`advance_append_async`), the persisted messages wait, and only when
/// the request completes are they stored, sent, and raft-rs told
/// (`on_persist_ready`). `ack_early` plants the bug of sending them first.
struct AsyncCluster {
    c: Cluster,
    pending: Vec<VecDeque<Persisting>>,
    ack_early: bool,
}

impl AsyncCluster {
    fn new(seed: u64, ack_early: bool) -> AsyncCluster {
        AsyncCluster { c: Cluster::new(seed), pending: vec![VecDeque::new(); 3], ack_early }
    }

    fn ready(&mut self, i: usize) {
        let node = &mut self.c.nodes[i];
        if !node.raft.has_ready() {
            return;
        }
        let mut rd = node.raft.ready();
        self.c.inbox.extend(rd.take_messages());
        let persisted = rd.take_persisted_messages();
        let persisted = if self.ack_early {
            self.c.inbox.extend(persisted);
            Vec::new()
        } else {
            persisted
        };
        for e in rd.take_committed_entries() {
            if !e.data.is_empty() {
                node.committed.push(e.data.to_vec());
            }
        }
        self.pending[i].push_back((rd.number(), rd.entries().clone(), rd.hs().cloned(), persisted));
        node.raft.advance_append_async(rd);
        node.raft.advance_apply();
    }

    /// The requests in flight complete: stored, then their messages leave.
    fn complete(&mut self, i: usize) {
        while let Some((number, entries, hs, msgs)) = self.pending[i].pop_front() {
            let node = &mut self.c.nodes[i];
            let store = node.raft.raft.raft_log.store.clone();
            store.wl().append(&entries).expect("entries follow the log");
            if let Some(hs) = hs {
                store.wl().set_hardstate(hs);
            }
            self.c.inbox.extend(msgs);
            node.raft.on_persist_ready(number);
        }
        self.ready(i);
    }

    /// No node's commit index may pass what a majority has made durable.
    fn check(&self) -> Result<(), String> {
        for (i, n) in self.c.nodes.iter().enumerate() {
            let committed = n.raft.raft.raft_log.committed;
            let durable = self.c.nodes.iter().filter(|m| m.raft.raft.raft_log.store.last_index().unwrap() >= committed);
            if committed > 0 && durable.count() < 2 {
                return Err(format!("node {} committed {committed}, durable on fewer than a majority", i + 1));
            }
        }
        Ok(())
    }

    /// One round: every node ticks, messages are delivered with each
    /// receiver's `Ready` turned into a request, then each node's requests
    /// complete in turn. Checked after every delivery and completion.
    fn round(&mut self) -> Result<(), String> {
        for i in 0..3 {
            let node = &mut self.c.nodes[i];
            if node.withheld > 0 {
                node.withheld -= 1;
            } else {
                node.raft.tick();
            }
            self.c.observe(i, 0);
            self.ready(i);
        }
        while let Some(m) = self.c.inbox.pop_front() {
            let to = m.to as usize - 1;
            let _ = self.c.nodes[to].raft.step(m);
            self.c.observe(to, 0);
            self.ready(to);
            self.check()?;
        }
        for i in 0..3 {
            self.complete(i);
            self.check()?;
        }
        Ok(())
    }

    fn leader(&self) -> Option<usize> {
        self.c.leader()
    }
}

/// Runs an asynchronously persisting cluster from `seed` until 20 entries
/// are committed everywhere, or the check fails.
fn run_async(seed: u64, ack_early: bool) -> Result<(), String> {
    let mut a = AsyncCluster::new(seed, ack_early);
    let mut proposed = 0u8;
    for _ in 0..2_000 {
        a.round()?;
        if let Some(l) = a.leader() {
            if proposed < 20 && a.c.nodes[l].raft.propose(vec![], vec![proposed]).is_ok() {
                proposed += 1;
                a.ready(l);
            }
        }
        if a.c.nodes.iter().all(|n| n.committed.len() == 20) {
            return Ok(());
        }
    }
    let got: Vec<usize> = a.c.nodes.iter().map(|n| n.committed.len()).collect();
    Err(format!("seed {seed}: not everything committed: {got:?} of {proposed}"))
}

#[test]
fn persisting_asynchronously_commits_only_what_a_majority_made_durable() {
    for seed in 0..20 {
        run_async(seed, false).unwrap();
    }
}

#[test]
fn acknowledging_before_persisting_is_caught_by_the_durability_check() {
    let caught = (0..20).filter(|&seed| run_async(seed, true).is_err()).count();
    assert!(caught > 0, "the planted bug went unnoticed in every seed");
}

/// A log of the genesis group and one more group at LSN 1 holding `frame`.
fn two_groups(frame: &crate::wal::Frame) -> Vec<u8> {
    let (_, mut bytes) = entry::genesis(1 << 16);
    bytes.extend_from_slice(&crate::wal::encode_group(SegmentId(0), crate::ids::Epoch(1), Lsn(1), &[frame]));
    bytes
}

#[test]
fn the_committed_prefix_digest_tells_logs_apart_and_names_what_is_held() {
    use crate::wal::{scan, Frame};
    let digest = |bytes: &[u8], commit: u64, from: Option<u64>, through: Option<u64>| {
        let view = [(SegmentId(0), bytes)];
        let scanned = scan(&view, false).expect("the log scans");
        prefix_digest(&view, &scanned, commit, from.map(Lsn), through.map(Lsn))
    };
    let (a, b) = (two_groups(&Frame::Finished), two_groups(&Frame::AllFinished));
    let whole = digest(&a, 1, None, None).unwrap();
    assert_eq!((whole.oldest, whole.committed, whole.from, whole.through), (Lsn(0), Lsn(1), Lsn(0), Lsn(1)));
    assert_eq!(whole, digest(&a, 1, None, None).unwrap(), "the same log, the same digest");
    assert_ne!(whole.digest, digest(&b, 1, None, None).unwrap().digest, "another group at LSN 1");
    assert_eq!(digest(&a, 1, None, Some(0)).unwrap().digest, digest(&b, 1, None, Some(0)).unwrap().digest);
    // A group past the saved commit index is not part of the prefix.
    assert_eq!(digest(&a, 0, None, None).unwrap().committed, Lsn(0));
    assert_eq!(digest(&a, 0, None, None).unwrap().digest, digest(&b, 0, None, None).unwrap().digest);
    let outside = digest(&a, 0, None, Some(1)).unwrap_err();
    assert!(outside.contains("committed groups 0..=0 only"), "{outside}");
}
