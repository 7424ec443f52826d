//! Part `Replication`: clustered mode's writer authority. Owns this host's
//! raft node (`replication::Replica` over the `Log`), the hard-state
//! file's save sequence, the tick clock, and whether this host serves:
//! leads a term in which a group of its own has committed. Only then may
//! it commit, acknowledge, write offsets or run plugins (`may_write`).
//!
//! What raft asks of the disk leaves through `Effects` as WAL requests
//! (`WalOp::Replicate`, `WalOp::ReadGroups` for a lagging follower); what
//! raft decides comes back to the coordinator as `RaftNews`: a committed
//! group to apply, the start of serving, the end of leading.

use super::effects::{Effects, Pending, Retry};
use crate::config::{ClusterConfig, Limits};
use crate::consensus::entry::{encode_entry, genesis, EntryGroup, Opening, Placement};
use crate::consensus::hard_state::{decode_file, encode_slot, slot_offset, Members};
use crate::consensus::log::Log;
use crate::consensus::membership::Join;
use crate::consensus::replica::{CommittedGroup, Persist, Replica, ReplicaOutput};
use crate::consensus::{ConfState, HardState};
use crate::ids::*;
use crate::io::{Install, IoOp, Output, PeerMessage, Replicate, StopReason, WalOp};
use crate::mutation::{Mutation, Mutations};
use crate::time::Instant;
use crate::wal::{GroupPlace, ScannedSegment, SEGMENT_HEADER_BYTES};
use std::collections::VecDeque;

pub(super) struct Replication {
    config: ClusterConfig,
    seed: u64,
    replica: Option<Replica>,
    /// The hard state read at start, until the log is restored.
    loaded: Option<(HardState, ConfState, Members)>,
    /// A membership change is among the WAL writer's pending frames.
    change_queued: bool,
    /// The sequence number of the next hard-state save.
    next_seq: u64,
    /// The term this host leads, once it has seen itself become leader.
    led: Option<u64>,
    /// A group of `led`'s term has committed: this host serves.
    serving: bool,
    next_tick: Instant,
    /// The read of old groups in flight for a lagging follower (kept for
    /// a retry after a failed read).
    fetching: Option<Vec<GroupPlace>>,
    /// `Ready`s waiting to be made durable, and the numbers of those in the
    /// one request in flight. Requests go one at a time, in order (raft
    /// needs them durable in order); `Ready`s that queued meanwhile go
    /// together, with one sync, unless one truncates (its removals and
    /// zeroing must come after what the `Ready`s before it wrote).
    queued: VecDeque<Persist>,
    in_flight: Option<Vec<u64>>,
    /// The request in flight installs a snapshot ending at this index: once
    /// it is durable, this host restarts to recover from it.
    installing: Option<u64>,
    /// The commit index the hard-state file holds durably, and the one the
    /// request in flight saves.
    saved_commit: u64,
    saving_commit: Option<u64>,
    /// The planted bug `commit-before-quorum`: the groups of the request in
    /// flight, and the LSNs already taken as committed.
    in_flight_groups: Vec<crate::consensus::entry::EntryGroup>,
    landed_early: std::collections::BTreeSet<Lsn>,
    /// The LSN of the group this leader proposed last.
    proposed: Option<Lsn>,
    /// Planted bugs of clustered mode.
    mutations: Mutations,
    /// Since when this host has known no leader, or, leading, has waited
    /// for its proposal to commit; and whether that was reported.
    no_quorum_since: Option<Instant>,
    stall_reported: bool,
    /// When a peer's message last arrived: a stall with none since it
    /// began is reported as silence, not as a missing majority.
    heard_at: Option<Instant>,
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
    pub(super) fn new(config: ClusterConfig, seed: u64, mutations: Mutations, now: Instant) -> Replication {
        Replication {
            config,
            seed,
            replica: None,
            loaded: None,
            change_queued: false,
            next_seq: 1,
            led: None,
            serving: false,
            next_tick: now,
            fetching: None,
            queued: VecDeque::new(),
            in_flight: None,
            installing: None,
            saved_commit: 0,
            saving_commit: None,
            in_flight_groups: Vec::new(),
            landed_early: Default::default(),
            proposed: None,
            mutations,
            no_quorum_since: Some(now),
            stall_reported: false,
            heard_at: None,
        }
    }

    pub(super) fn hard_state_loaded(&self) -> bool {
        self.loaded.is_some() || self.replica.is_some()
    }

    pub(super) fn shared_offsets(&self) -> bool {
        self.config.shared_offsets
    }

    pub(super) fn serving(&self) -> bool {
        self.serving && self.replica.as_ref().is_some_and(|r| r.is_leader())
    }

    /// The hard-state file's bytes at start. `cluster init` or `cluster
    /// join` wrote its first state; a file that holds none (missing, or
    /// zeros) means this DATA_DIR has no cluster identity: never
    /// initialized, or wiped. Such a host takes no part, since a voter that
    /// forgot what it acknowledged could elect a log that lacks it; if its
    /// data was lost it comes back under a new id with `cluster join`.
    pub(super) fn on_hard_state(&mut self, file: &[u8], segment_bytes: u64) -> Result<(), StopReason> {
        let not_member = |what: String| StopReason::NotMember { what };
        let saved = decode_file(file).map_err(cluster_log)?;
        let node = self.config.node;
        self.loaded = Some(match saved {
            Some(s) => {
                if s.members.node != node {
                    return Err(not_member(format!(
                        "its DATA_DIR belongs to node {} of cluster {:016x}, and it is configured as node {node}",
                        s.members.node, s.members.cluster
                    )));
                }
                if s.members.removed.contains(&node) {
                    return Err(not_member(format!(
                        "node {node} was removed from the cluster and is refused forever; bring this host back \
                         under a new id with `skipprd cluster join`"
                    )));
                }
                self.next_seq = s.seq + 1;
                (s.hard, s.conf, s.members)
            }
            None if self.mutations.has(Mutation::WipedPeerVotes) => {
                // The planted bug: an empty DATA_DIR taken for a new voter.
                let members = Members { node, segment_bytes, ..Members::default() };
                (HardState::default(), ConfState::from((self.config.voters.clone(), vec![])), members)
            }
            None => {
                return Err(not_member(format!(
                    "its DATA_DIR holds no cluster identity (node {node}): run `skipprd cluster init` on every host \
                     of a new cluster, or, if this host's data was lost, `skipprd cluster join` under a new node id"
                )))
            }
        });
        Ok(())
    }

    /// Restores the log from the segments read at start and starts the raft
    /// node, having applied what the hard state says is committed. Returns
    /// the scan cut at the commit index (what this host may rebuild its
    /// state from; later groups wait for raft) and the log's segment size.
    pub(super) fn restore(
        &mut self,
        fx: &mut Effects,
        segments: &[(SegmentId, &[u8])],
        limits: &Limits,
        now: Instant,
    ) -> Result<(Vec<ScannedSegment>, u64), StopReason> {
        let (hard, conf, members) = self.loaded.take().expect("the hard state is read before the segments");
        let empty = || crate::wal::scan(segments, false).is_ok_and(|s| s.iter().all(|s| s.groups.is_empty()));
        let (log, mut scanned) = if hard == HardState::default() && empty() {
            // A host's first start (or a retry of one whose first write
            // failed): its WAL begins with the genesis group, written
            // before anything raft does.
            self.write_genesis(fx, members.segment_bytes);
            let (end, first) = genesis(members.segment_bytes);
            let scanned = crate::wal::scan(&[(SegmentId(0), &first)], false).expect("the genesis group scans");
            (Log::new(hard, conf, (0, 0), end), scanned)
        } else {
            Log::restore(hard, conf, segments).map_err(cluster_log)?
        };
        let segment_bytes = log.end().segment_bytes;
        let commit = log.hard_state().commit;
        self.saved_commit = commit;
        let mut replica = Replica::new(log, members, commit, limits, self.seed).map_err(cluster_log)?;
        if self.mutations.has(Mutation::AckBeforePersist) {
            replica.plant_ack_before_persist();
        }
        if self.mutations.has(Mutation::VoteNotPersisted) {
            replica.plant_vote_not_persisted();
        }
        if self.mutations.has(Mutation::NoTruncateOnConflict) {
            replica.plant_no_truncate();
        }
        self.replica = Some(replica);
        self.next_tick = now + self.config.tick;
        for seg in &mut scanned {
            let before = seg.groups.len();
            seg.groups.retain(|g| g.lsn.0 <= commit);
            if seg.groups.len() != before {
                seg.sealed = false;
            }
        }
        Ok((scanned, segment_bytes))
    }

    /// Segment 0 with the genesis group, as the first request.
    fn write_genesis(&mut self, fx: &mut Effects, segment_bytes: u64) {
        let (end, first) = genesis(segment_bytes);
        let offset = SEGMENT_HEADER_BYTES as u64;
        let group = EntryGroup {
            place: GroupPlace { lsn: Lsn(0), segment: SegmentId(0), offset, len: end.end - offset },
            opens: Some(Opening { epoch: Epoch(0), segment_bytes }),
            sealed: false,
            bytes: first[offset as usize..].to_vec().into(),
        };
        let op = Replicate { remove: Vec::new(), zero: Vec::new(), groups: vec![group], hard_state: None };
        self.in_flight = Some(Vec::new());
        self.installing = None;
        fx.io(Pending::WalReplicate(SegmentId(0)), IoOp::Wal(WalOp::Replicate(op)));
    }

    /// The next tick that may act: a follower's ticks before its election
    /// timeout only count, so its timer is set past them (`catch_up` counts
    /// them when something else happens first), and an idle cluster wakes
    /// its followers rarely. A stall report that is to be lifted waits for
    /// the next tick, as it always did.
    pub(super) fn deadline(&self, report_after: Option<crate::time::Duration>) -> Option<Instant> {
        let r = self.replica.as_ref()?;
        let quiet = if self.lifting_stall() { Some(0) } else { r.ticks_to_effect().map(|k| k - 1) };
        let tick = quiet.map(|q| self.next_tick + self.config.tick.saturating_mul(q));
        let stall = match (self.no_quorum_since, report_after, self.stall_reported) {
            (Some(since), Some(after), false) => Some(since + after),
            _ => None,
        };
        [stall, tick].into_iter().flatten().min()
    }

    /// Before any input at `now`: the ticks due by then that only count
    /// (those before the one `deadline` waits for) are counted, so raft-rs
    /// sees the time that passed exactly as if each had fired on time.
    pub(super) fn catch_up(&mut self, now: Instant) {
        if now < self.next_tick || self.lifting_stall() {
            return;
        }
        let Some(r) = self.replica.as_mut() else { return };
        let due = (now - self.next_tick).as_micros() / self.config.tick.as_micros() + 1;
        let quiet = match r.ticks_to_effect() {
            Some(k) => due.min(k - 1),
            None => due,
        };
        if quiet > 0 {
            r.tick_quietly(quiet);
            self.next_tick = self.next_tick + self.config.tick.saturating_mul(quiet);
        }
    }

    /// A stall was reported and is over: its end is reported at the next
    /// tick, so every tick fires until then.
    fn lifting_stall(&self) -> bool {
        self.stall_reported && self.no_quorum_since.is_none()
    }

    /// A visible stall: no leader known, or, leading, no commit of a
    /// proposed group, for `report_after` (without a majority nothing more
    /// is acknowledged; the pipeline waits, it never runs on fewer copies).
    fn watch_quorum(&mut self, fx: &mut Effects, report_after: Option<crate::time::Duration>) {
        match (self.no_quorum_since, report_after) {
            (Some(since), Some(after)) if !self.stall_reported && fx.now >= since + after => {
                self.stall_reported = true;
                let what = match self.heard_at {
                    Some(heard) if heard >= since => crate::io::Stall::RaftQuorum,
                    _ => crate::io::Stall::RaftNoPeer,
                };
                fx.emit(Output::Stalled { what, for_: fx.now - since });
            }
            (None, _) if self.stall_reported => {
                self.stall_reported = false;
                fx.emit(Output::Unstalled);
            }
            _ => {}
        }
    }

    pub(super) fn on_timeout(
        &mut self,
        fx: &mut Effects,
        report_after: Option<crate::time::Duration>,
    ) -> Vec<RaftNews> {
        let Some(r) = self.replica.as_mut() else { return Vec::new() };
        if fx.now >= self.next_tick {
            r.tick();
            self.next_tick = fx.now + self.config.tick;
        }
        let news = self.drain(fx);
        self.watch_quorum(fx, report_after);
        news
    }

    pub(super) fn step(&mut self, fx: &mut Effects, m: PeerMessage) -> Vec<RaftNews> {
        let Some(r) = self.replica.as_mut() else { return Vec::new() };
        self.heard_at = Some(fx.now);
        r.step(m);
        self.drain(fx)
    }

    /// Peer `by` says node `node` was removed from the cluster. Heeded when
    /// `node` is this host and `by` a member it knows: a removal is a
    /// committed membership change, never undone, so one member's word is
    /// enough. This host's own log may predate it (started again on its old
    /// disk after another host took its place).
    pub(super) fn told_removed(&mut self, by: u64, node: u64) -> Vec<RaftNews> {
        let Some(r) = self.replica.as_ref() else { return Vec::new() };
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
        let numbers = self.in_flight.take().expect("a replicate request was in flight");
        let r = self.replica.as_mut().expect("a replicate request implies a replica");
        let term = r.term();
        for n in numbers {
            r.persisted(n);
        }
        let mut news = Vec::new();
        let groups = std::mem::take(&mut self.in_flight_groups);
        if let Some(g) = groups.into_iter().find(|g| self.serving && Some(g.place.lsn) == self.proposed) {
            // The planted bug: the leader's own copy taken for a majority's.
            self.landed_early.insert(g.place.lsn);
            news.push(RaftNews::Committed(CommittedGroup { term, group: g }));
        }
        let installed = self.installing.take();
        if let Some(commit) = self.saving_commit.take() {
            self.saved_commit = self.saved_commit.max(commit);
        }
        news.extend(self.drain(fx));
        if let Some(index) = installed {
            // The leader hears first (the messages waiting for the install
            // have left); the committed state is rebuilt by recovery.
            news.push(RaftNews::Stop(StopReason::SnapshotInstalled { index }));
        }
        news
    }

    /// Leading: the transfer of a snapshot to `to` ended.
    pub(super) fn snapshot_served(&mut self, fx: &mut Effects, to: u64, ok: bool) -> Vec<RaftNews> {
        let Some(r) = self.replica.as_mut() else { return Vec::new() };
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
        self.replica.as_mut().is_some_and(|r| r.compact_to(first_kept))
    }

    /// Whether the hard-state file holds a commit index through `at`. When
    /// it does not, a save is asked for (a commit index alone is saved
    /// lazily), once nothing else is waiting to be made durable.
    pub(super) fn commit_saved(&mut self, fx: &mut Effects, at: Lsn) -> bool {
        let Some(r) = self.replica.as_mut() else { return false };
        if self.saved_commit >= at.0 {
            return true;
        }
        if self.in_flight.is_none() && self.queued.is_empty() {
            let saved = r.hard_to_save();
            let Ok(hard_state) = self.slot(saved).map(Some) else { return false };
            self.in_flight = Some(Vec::new());
            let op = Replicate { remove: Vec::new(), zero: Vec::new(), groups: Vec::new(), hard_state };
            fx.io(Pending::WalReplicate(SegmentId(0)), IoOp::Wal(WalOp::Replicate(op)));
        }
        false
    }

    pub(super) fn status(&self) -> Option<crate::consensus::replica::RaftStatus> {
        self.replica.as_ref().map(|r| r.status())
    }

    /// Leading, at a SIGTERM once drained: hands leadership over. The
    /// voter it goes to, if any.
    pub(super) fn hand_over(&mut self, fx: &mut Effects) -> (Option<u64>, Vec<RaftNews>) {
        let to = match self.replica.as_mut() {
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
        self.replica.as_ref().is_some_and(|r| r.is_leader())
    }

    /// A voter that follows a leader it knows of. A learner, which would
    /// not notice its leader gone, never counts as one.
    pub(super) fn leader_known(&self) -> bool {
        self.replica.as_ref().is_some_and(|r| r.leader() != 0 && r.promotable())
    }

    /// Clustered `--once`: while this host leads, the other members that
    /// have not reported a commit index through `at` (they have not learnt
    /// that the terminal entry committed); none while it follows.
    pub(super) fn unconfirmed(&self, at: Lsn) -> Vec<u64> {
        match self.replica.as_ref() {
            Some(r) if r.is_leader() => {
                r.peer_progress().into_iter().filter(|p| p.committed < at.0).map(|p| p.node).collect()
            }
            _ => Vec::new(),
        }
    }

    /// The next hard-state save's slot (its offset in the file, its bytes),
    /// for the request about to go, which saves this commit index.
    fn slot(
        &mut self,
        (hs, cs, members): (HardState, ConfState, Members),
    ) -> Result<(u64, Vec<u8>), crate::consensus::hard_state::HardStateError> {
        let slot = encode_slot(self.next_seq, &hs, &cs, &members)?;
        let at = slot_offset(self.next_seq);
        self.next_seq += 1;
        self.saving_commit = Some(hs.commit);
        Ok((at, slot))
    }

    /// Sends the next request if none is in flight.
    fn send_persist(&mut self, fx: &mut Effects) -> Result<(), StopReason> {
        if self.in_flight.is_some() {
            return Ok(());
        }
        let Some(first) = self.queued.pop_front() else { return Ok(()) };
        if let Some(install) = first.install {
            let (from, manifest) = *install;
            let hard_state = self.slot(first.hard.expect("an install saves its hard state")).map_err(cluster_log)?;
            self.in_flight = Some(vec![first.number]);
            self.installing = Some(manifest.index);
            let segment = manifest.segments[0].id;
            let op = WalOp::InstallSnapshot(Install { from, manifest, hard_state });
            fx.io(Pending::WalReplicate(segment), IoOp::Wal(op));
            return Ok(());
        }
        let mut numbers = vec![first.number];
        let (mut remove, mut zero, mut groups, mut hard) =
            (first.appended.remove, first.appended.zero, first.appended.groups, first.hard);
        while self
            .queued
            .front()
            .is_some_and(|p| p.appended.remove.is_empty() && p.appended.zero.is_empty() && p.install.is_none())
        {
            let p = self.queued.pop_front().expect("front exists");
            numbers.push(p.number);
            groups.extend(p.appended.groups);
            hard = p.hard.or(hard);
        }
        let hard_state = hard.map(|saved| self.slot(saved)).transpose().map_err(cluster_log)?;
        let segment = groups.first().map_or(SegmentId(0), |g| g.place.segment);
        if self.mutations.has(Mutation::CommitBeforeQuorum) {
            self.in_flight_groups = groups.clone();
        }
        let op = Replicate { remove: std::mem::take(&mut remove), zero: std::mem::take(&mut zero), groups, hard_state };
        self.in_flight = Some(numbers);
        fx.io(Pending::WalReplicate(segment), IoOp::Wal(WalOp::Replicate(op)));
        Ok(())
    }

    pub(super) fn fetched(&mut self, fx: &mut Effects, groups: Vec<Vec<u8>>) -> Vec<RaftNews> {
        fx.succeeded(Retry::RaftFetch);
        self.fetching = None;
        self.replica.as_mut().expect("a fetch implies a replica").fetched(groups);
        self.drain(fx)
    }

    /// A read for a lagging follower failed: it goes again after a backoff.
    pub(super) fn fetch_failed(&mut self, fx: &mut Effects) {
        fx.retry_later(Retry::RaftFetch);
    }

    pub(super) fn retry_fetch(&mut self, fx: &mut Effects) {
        let places = self.fetching.clone().expect("a fetch retry implies a fetch");
        fx.io(Pending::RaftFetch, IoOp::Wal(WalOp::ReadGroups { places }));
    }

    /// A finding that may only mean another host leads now (a shared sink
    /// ahead of this host's WAL): a quorum is asked whether this host
    /// still leads before the finding is believed.
    pub(super) fn confirm_leadership(&mut self, fx: &mut Effects) -> Vec<RaftNews> {
        let Some(r) = self.replica.as_mut() else { return Vec::new() };
        r.confirm_leadership(b"doubt".to_vec());
        self.drain(fx)
    }

    /// The next group goes here: (LSN, segment, offset) from where the log
    /// ends, and the epoch (the term) it carries.
    pub(super) fn log_end(&self) -> crate::consensus::entry::LogEnd {
        self.replica.as_ref().expect("serving implies a replica").log().end()
    }

    /// A leader is asked to let a host join (`Input::Join`).
    pub(super) fn ask_join(&mut self, fx: &mut Effects, join: Join) {
        let result = match self.replica.as_mut() {
            Some(r) if self.serving => r.ask_join(join),
            _ => Err(crate::consensus::membership::JoinRefusal::NotLeader),
        };
        if let Err(why) = result {
            fx.emit(Output::JoinRefused { node: join.node, why });
        }
    }

    /// The membership change a serving leader should make next, as the
    /// bytes of the frame that carries it, if one is due and none is queued
    /// or pending.
    pub(super) fn next_change(&mut self) -> Option<Vec<u8>> {
        if !self.serving() || self.change_queued {
            return None;
        }
        use protobuf::Message as _;
        let cc = self.replica.as_mut()?.next_change()?;
        self.change_queued = true;
        Some(cc.write_to_bytes().expect("a conf change encodes"))
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
        let r = self.replica.as_mut().expect("serving implies a replica");
        let opens =
            (offset == SEGMENT_HEADER_BYTES as u64).then_some(Opening { epoch: Epoch(r.term()), segment_bytes });
        let data = encode_entry(&Placement { segment, offset, opens }, bytes);
        self.proposed = Some(Lsn(r.log().last_index() + 1));
        self.no_quorum_since.get_or_insert(fx.now);
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
            let term = self.led.unwrap_or(0);
            return vec![RaftNews::Deposed { term }];
        }
        self.drain(fx)
    }

    /// Turns what the raft node put out into requests, messages and news.
    fn drain(&mut self, fx: &mut Effects) -> Vec<RaftNews> {
        let mut news = Vec::new();
        let Some(r) = self.replica.as_mut() else { return news };
        while let Some(out) = r.poll() {
            match out {
                ReplicaOutput::Send(m) => fx.emit(Output::Send(Box::new(m))),
                ReplicaOutput::Persist(p) => self.queued.push_back(p),
                ReplicaOutput::Committed(groups) => {
                    if groups.iter().any(|c| Some(c.group.place.lsn) == self.proposed) || !self.serving {
                        self.no_quorum_since = None;
                    }
                    for c in groups {
                        if self.landed_early.remove(&c.group.place.lsn) {
                            continue;
                        }
                        let own = self.led == Some(c.term) && !self.serving;
                        let term = c.term;
                        news.push(RaftNews::Committed(c));
                        if own {
                            self.serving = true;
                            news.push(RaftNews::Serving { term });
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
                        0 => self.no_quorum_since = self.no_quorum_since.or(Some(fx.now)),
                        _ if !is_leader => self.no_quorum_since = None,
                        _ => {}
                    }
                    if let Some(led) = self.led {
                        if !is_leader || term != led {
                            news.push(RaftNews::Deposed { term: led });
                            self.led = None;
                            self.serving = false;
                        }
                    }
                    if is_leader {
                        self.led = Some(term);
                        if self.mutations.has(Mutation::ServeBeforeTermCommit) && !self.serving {
                            self.serving = true;
                            news.push(RaftNews::Serving { term });
                        }
                    }
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
        if let Err(stop) = self.send_persist(fx) {
            news.push(RaftNews::Stop(stop));
        }
        news
    }
}
