//! Part `Replication`: clustered mode's writer authority, a closed state
//! machine. Its `Phase` is where start-up stands (`start.rs`: the
//! hard-state file read, the log restored, the raft node started); once
//! running, it owns the raft node (`consensus::Replica` over the `Log`),
//! the tick clock and its `Role` (`role.rs`: following, or leading a term
//! and serving once a group of that term has committed; only then may it
//! commit, acknowledge, write offsets or run plugins, `may_write`). Its
//! sub-part `Saves` (`saves.rs`) makes what raft asks durable, in order,
//! and numbers the hard-state file's saves; the stall room's `QuorumWatch`
//! reports a missing majority (and, under `--once`, ends the run after the
//! stall limit). Reads for a lagging follower are `fetch.rs`'s, membership
//! changes `join.rs`'s.
//!
//! What raft asks of the disk leaves through `Effects` as WAL requests
//! (`WalOp::Replicate`, `WalOp::ReadGroups` for a lagging follower); what
//! raft decides comes back to the coordinator as `RaftNews`: a committed
//! group to apply, the start of serving, the end of leading.

mod fetch;
mod join;
mod role;
mod saves;
mod start;

use super::effects::{Effects, Pending, Retry};
use super::stall::{QuorumWatch, StallAction};
use crate::config::{ClusterConfig, Limits};
use crate::consensus::entry::{encode_entry, Opening, Placement};
use crate::consensus::membership::Join;
use crate::consensus::replica::{CommittedGroup, Replica, ReplicaOutput};
use crate::ids::*;
use crate::io::{IoOp, Output, PeerMessage, StopReason, WalOp};
use crate::mutation::{Mutation, Mutations};
use crate::time::Instant;
use crate::wal::{check_group, Corruption, GroupPlace, SEGMENT_HEADER_BYTES};
use role::Role;
use saves::{Saved, Saves};

pub(super) struct Replication {
    config: ClusterConfig,
    seed: u64,
    phase: Phase,
    saves: Saves,
    quorum: QuorumWatch,
    /// A membership change is among the WAL writer's pending frames.
    change_queued: bool,
    /// The read of old groups in flight for a lagging follower (kept for
    /// a retry after a failed read).
    fetching: Option<Vec<GroupPlace>>,
    /// The LSN of the group this host proposed last.
    proposed: Option<Lsn>,
    /// Planted bugs of clustered mode.
    mutations: Mutations,
}

/// Where this host stands: the hard-state file not read yet, read but the
/// log not restored, or the raft node running.
enum Phase {
    Unread,
    Loaded(Box<Saved>),
    Running(Box<Node>),
}

struct Node {
    replica: Replica,
    role: Role,
    next_tick: Instant,
}

/// What raft decided, for the coordinator to route.
pub(super) enum RaftNews {
    /// A group is committed: apply it.
    Committed(CommittedGroup),
    /// A group of this leader's own term committed: rerun recovery's
    /// leader half, then serve.
    Serving {
        term: u64,
    },
    /// This host led `term` and no longer does.
    Deposed {
        term: u64,
    },
    /// A quorum confirmed this host still leads (after `confirm_leadership`).
    LeaderConfirmed,
    Stop(StopReason),
}

fn cluster_log(what: impl ToString) -> StopReason {
    StopReason::ClusterLog { what: what.to_string() }
}

impl Replication {
    pub(super) fn new(
        config: ClusterConfig,
        limits: &Limits,
        seed: u64,
        mutations: Mutations,
        now: Instant,
    ) -> Replication {
        // Two election timeouts: longer than a live peer keeps quiet.
        let silence = config.tick.saturating_mul(2 * crate::consensus::ELECTION_TICKS as u64);
        Replication {
            config,
            seed,
            phase: Phase::Unread,
            saves: Saves::new(),
            quorum: QuorumWatch::new(now, limits.stall_report_after, limits.stall_stop_after, silence),
            change_queued: false,
            fetching: None,
            proposed: None,
            mutations,
        }
    }

    fn node(&self) -> Option<&Node> {
        match &self.phase {
            Phase::Running(node) => Some(node),
            _ => None,
        }
    }

    fn replica(&self) -> Option<&Replica> {
        self.node().map(|n| &n.replica)
    }

    fn replica_mut(&mut self) -> Option<&mut Replica> {
        match &mut self.phase {
            Phase::Running(node) => Some(&mut node.replica),
            _ => None,
        }
    }

    pub(super) fn hard_state_loaded(&self) -> bool {
        !matches!(self.phase, Phase::Unread)
    }

    pub(super) fn shared_offsets(&self) -> bool {
        self.config.shared_offsets
    }

    pub(super) fn serving(&self) -> bool {
        self.node().is_some_and(|n| n.role.serving() && n.replica.is_leader())
    }

    /// The next tick that may act: a follower's ticks before its election
    /// timeout only count, so its timer is set past them (`catch_up` counts
    /// them when something else happens first), and an idle cluster wakes
    /// its followers rarely. A stall report that is to be lifted waits for
    /// the next tick, as it always did.
    pub(super) fn deadline(&self) -> Option<Instant> {
        let node = self.node()?;
        let quiet = if self.quorum.lifting() { Some(0) } else { node.replica.ticks_to_effect().map(|k| k - 1) };
        let tick = quiet.map(|q| node.next_tick + self.config.tick.saturating_mul(q));
        [self.quorum.deadline(), tick].into_iter().flatten().min()
    }

    /// Before any input at `now`: the ticks due by then that only count
    /// (those before the one `deadline` waits for) are counted, so raft-rs
    /// sees the time that passed exactly as if each had fired on time.
    pub(super) fn catch_up(&mut self, now: Instant) {
        let lifting = self.quorum.lifting();
        let tick = self.config.tick;
        let Phase::Running(node) = &mut self.phase else { return };
        if now < node.next_tick || lifting {
            return;
        }
        let due = (now - node.next_tick).as_micros() / tick.as_micros() + 1;
        let quiet = match node.replica.ticks_to_effect() {
            Some(k) => due.min(k - 1),
            None => due,
        };
        if quiet > 0 {
            node.replica.tick_quietly(quiet);
            node.next_tick = node.next_tick + tick.saturating_mul(quiet);
        }
    }

    pub(super) fn on_timeout(&mut self, fx: &mut Effects) -> Vec<RaftNews> {
        let tick = self.config.tick;
        let Phase::Running(node) = &mut self.phase else { return Vec::new() };
        if fx.now >= node.next_tick {
            node.replica.tick();
            node.next_tick = fx.now + tick;
        }
        let mut news = self.drain(fx);
        match self.quorum.check(fx.now) {
            (StallAction::None, false) => {}
            (StallAction::None, true) => fx.emit(Output::Unstalled),
            (StallAction::Report { what, for_ }, _) => fx.emit(Output::Stalled { what, for_ }),
            (StallAction::Stop { what, for_ }, _) => news.push(RaftNews::Stop(StopReason::Stalled { what, for_ })),
        }
        news
    }

    pub(super) fn step(&mut self, fx: &mut Effects, m: PeerMessage) -> Vec<RaftNews> {
        let Some(r) = self.replica_mut() else { return Vec::new() };
        r.step(m);
        self.quorum.heard(fx.now);
        self.drain(fx)
    }

    /// Peer `by` says node `node` was removed from the cluster. Heeded when
    /// `node` is this host and `by` a member it knows: a removal is a
    /// committed membership change, never undone, so one member's word is
    /// enough. This host's own log may predate it (started again on its old
    /// disk after another host took its place).
    pub(super) fn told_removed(&mut self, by: u64, node: u64) -> Vec<RaftNews> {
        let Some(r) = self.replica() else { return Vec::new() };
        if node != self.config.node || by == node || !r.knows(by) {
            return Vec::new();
        }
        vec![RaftNews::Stop(StopReason::NotMember {
            what: format!(
                "node {by} says node {node} was removed from the cluster (another host took its place while this \
                 one was away); the id is refused forever: bring this host back under a new id with `skipprd \
                 cluster join` on an empty DATA_DIR"
            ),
        })]
    }

    /// The request in flight is durable: raft hears of each `Ready` in it.
    pub(super) fn persisted(&mut self, fx: &mut Effects) -> Vec<RaftNews> {
        let landed = self.saves.landed();
        let Phase::Running(node) = &mut self.phase else { panic!("a replicate request implies a replica") };
        let term = node.replica.term();
        for n in landed.numbers {
            node.replica.persisted(n);
        }
        let mut news = Vec::new();
        let serving = node.role.serving();
        if let Some(g) = landed.groups.into_iter().find(|g| serving && Some(g.place.lsn) == self.proposed) {
            // The planted bug: the leader's own copy taken for a majority's.
            self.saves.take_early(g.place.lsn);
            news.push(RaftNews::Committed(CommittedGroup { term, group: g }));
        }
        news.extend(self.drain(fx));
        if let Some(index) = landed.installed {
            // The leader hears first (the messages waiting for the install
            // have left); the committed state is rebuilt by recovery.
            news.push(RaftNews::Stop(StopReason::SnapshotInstalled { index }));
        }
        news
    }

    /// Leading: the transfer of a snapshot to `to` ended.
    pub(super) fn snapshot_served(&mut self, fx: &mut Effects, to: u64, ok: bool) -> Vec<RaftNews> {
        let Some(r) = self.replica_mut() else { return Vec::new() };
        r.snapshot_served(to, ok);
        self.drain(fx)
    }

    /// The segments before `first_kept` may be deleted once raft's log
    /// starts after them (see `Replica::compact_to`), and once the saved
    /// commit index reaches `justified_at`, the snapshot whose commit made
    /// them deletable: a restart rebuilds state only through the saved
    /// index, and must find there the acknowledgements that let them go.
    /// A commit index alone is saved lazily; here a save is asked for.
    pub(super) fn compact_to(&mut self, fx: &mut Effects, first_kept: SegmentId, justified_at: Lsn) -> bool {
        if !self.commit_saved(fx, justified_at) {
            return false;
        }
        self.replica_mut().is_some_and(|r| r.compact_to(first_kept))
    }

    /// Whether the hard-state file holds a commit index through `at`. When
    /// it does not, a save is asked for (a commit index alone is saved
    /// lazily), once nothing else is waiting to be made durable.
    pub(super) fn commit_saved(&mut self, fx: &mut Effects, at: Lsn) -> bool {
        let Phase::Running(node) = &mut self.phase else { return false };
        if self.saves.saved_through(at) {
            return true;
        }
        if self.saves.idle() {
            let saved = node.replica.hard_to_save();
            self.saves.save_alone(fx, saved);
        }
        false
    }

    /// Stopping on SIGTERM, the raft node held still (no message in, no
    /// tick): once nothing raft asked for is in flight and the hard-state
    /// file holds the commit index applied (a save is asked for when it
    /// does not), that index and raft's log, for a stop record. `None`
    /// meanwhile, and when the node never started.
    pub(super) fn settled(&mut self, fx: &mut Effects) -> Option<(u64, crate::consensus::log::LogRecord)> {
        let Phase::Running(node) = &mut self.phase else { return None };
        if !self.saves.idle() || self.fetching.is_some() {
            return None;
        }
        let applied = node.replica.applied();
        if !self.saves.saved_exactly(applied) {
            let saved = node.replica.hard_to_save();
            self.saves.save_alone(fx, saved);
            return None;
        }
        Some((applied, node.replica.log().record()))
    }

    /// See `Host::raft_log`.
    pub(super) fn log_view(&self) -> Option<((u64, u64, u64), crate::consensus::log::LogRecord, u64)> {
        let log = self.replica()?.log();
        let hard = log.hard_state();
        Some(((hard.term, hard.vote, hard.commit), log.record(), log.held_bytes()))
    }

    /// The raft node started (the log restored).
    pub(super) fn running(&self) -> bool {
        self.node().is_some()
    }

    pub(super) fn status(&self) -> Option<crate::consensus::replica::RaftStatus> {
        self.replica().map(|r| r.status())
    }

    /// Leading, at a SIGTERM once drained: hands leadership over. The
    /// voter it goes to, if any.
    pub(super) fn hand_over(&mut self, fx: &mut Effects) -> (Option<u64>, Vec<RaftNews>) {
        let to = match self.replica_mut() {
            Some(r) if r.is_leader() => r.transfer_leader(),
            _ => None,
        };
        (to, self.drain(fx))
    }

    /// Two election timeouts: how long a handover may take.
    pub(super) fn hand_over_patience(&self) -> crate::time::Duration {
        self.config.tick.saturating_mul(2 * crate::consensus::ELECTION_TICKS as u64)
    }

    /// Whether this host leads, or follows a leader it knows of.
    pub(super) fn leads(&self) -> bool {
        self.replica().is_some_and(|r| r.is_leader())
    }

    /// A voter that follows a leader it knows of. A learner, which would
    /// not notice its leader gone, never counts as one.
    pub(super) fn leader_known(&self) -> bool {
        self.replica().is_some_and(|r| r.leader() != 0 && r.promotable())
    }

    /// Clustered `--once`: while this host leads, the other members that
    /// have not reported a commit index through `at` (they have not learnt
    /// that the terminal entry committed); none while it follows.
    pub(super) fn unconfirmed(&self, at: Lsn) -> Vec<u64> {
        match self.replica() {
            Some(r) if r.is_leader() => {
                r.peer_progress().into_iter().filter(|p| p.committed < at.0).map(|p| p.node).collect()
            }
            _ => Vec::new(),
        }
    }

    /// A finding that may only mean another host leads now (a shared sink
    /// ahead of this host's WAL): a quorum is asked whether this host
    /// still leads before the finding is believed.
    pub(super) fn confirm_leadership(&mut self, fx: &mut Effects) -> Vec<RaftNews> {
        let Some(r) = self.replica_mut() else { return Vec::new() };
        r.confirm_leadership(b"doubt".to_vec());
        self.drain(fx)
    }

    /// Raft's commit index, last index and the bytes held past the commit
    /// index, as the log was restored.
    pub(super) fn restored(&self) -> (u64, u64, u64) {
        let log = self.replica().expect("restored").log();
        (log.hard_state().commit, log.last_index(), log.held_bytes())
    }

    /// The next group goes here: (LSN, segment, offset) from where the log
    /// ends, and the epoch (the term) it carries.
    pub(super) fn log_end(&self) -> crate::consensus::entry::LogEnd {
        self.replica().expect("serving implies a replica").log().end()
    }

    /// Proposes the group the WAL writer built at (`segment`, `offset`); one
    /// holding a membership change (`change`, its frame's bytes) goes as a
    /// conf-change entry.
    pub(super) fn propose(
        &mut self,
        fx: &mut Effects,
        segment: SegmentId,
        offset: u64,
        bytes: &[u8],
        segment_bytes: u64,
        change: Option<Vec<u8>>,
    ) -> Vec<RaftNews> {
        let Phase::Running(node) = &mut self.phase else { panic!("serving implies a replica") };
        let r = &mut node.replica;
        let opens =
            (offset == SEGMENT_HEADER_BYTES as u64).then_some(Opening { epoch: Epoch(r.term()), segment_bytes });
        let data = encode_entry(&Placement { segment, offset, opens }, bytes);
        self.proposed = Some(Lsn(r.log().last_index() + 1));
        self.quorum.waiting(fx.now);
        let proposed = match change {
            Some(cc) => {
                self.change_queued = false;
                match r.propose_change(&cc, data) {
                    Err(raft::Error::ConfChangeError(what)) => return vec![RaftNews::Stop(cluster_log(what))],
                    other => other,
                }
            }
            None => r.propose(data),
        };
        if proposed.is_err() {
            // Refused: no longer the leader, or a leader transfer under way.
            return vec![RaftNews::Deposed { term: node.role.led().unwrap_or(0) }];
        }
        self.drain(fx)
    }

    /// Turns what the raft node put out into requests, messages and news.
    fn drain(&mut self, fx: &mut Effects) -> Vec<RaftNews> {
        let mut news = Vec::new();
        let Phase::Running(node) = &mut self.phase else { return news };
        while let Some(out) = node.replica.poll() {
            match out {
                ReplicaOutput::Send(m) => fx.emit(Output::Send(Box::new(m))),
                ReplicaOutput::Persist(p) => self.saves.queue(p),
                ReplicaOutput::Committed(groups) => {
                    if groups.iter().any(|c| Some(c.group.place.lsn) == self.proposed) || !node.role.serving() {
                        self.quorum.quorum();
                    }
                    for c in groups {
                        if !self.saves.committed_early(c.group.place.lsn) {
                            node.role.committed(c, &mut news);
                        }
                    }
                }
                ReplicaOutput::Fetch(places) => {
                    self.fetching = Some(places.clone());
                    fx.io(Pending::RaftFetch, IoOp::Wal(WalOp::ReadGroups { places }));
                }
                ReplicaOutput::Role { term, leader, is_leader } => {
                    fx.emit(Output::Role { term, leader, is_leader });
                    match leader {
                        0 => self.quorum.waiting(fx.now),
                        _ if !is_leader => self.quorum.quorum(),
                        _ => {}
                    }
                    let serve_early = self.mutations.has(Mutation::ServeBeforeTermCommit);
                    node.role.changed(term, is_leader, serve_early, &mut news);
                }
                ReplicaOutput::Failed(e) => news.push(RaftNews::Stop(cluster_log(e))),
                ReplicaOutput::LeaderConfirmed => news.push(RaftNews::LeaderConfirmed),
                ReplicaOutput::FromRemoved(to) => fx.emit(Output::TellRemoved { to }),
                ReplicaOutput::Removed => news.push(RaftNews::Stop(StopReason::NotMember {
                    what: format!(
                        "node {} was removed from the cluster (another host took its place); it is refused forever",
                        self.config.node
                    ),
                })),
            }
        }
        if let Err(stop) = self.saves.send(fx, self.mutations.has(Mutation::CommitBeforeQuorum)) {
            news.push(RaftNews::Stop(stop));
        }
        news
    }
}
