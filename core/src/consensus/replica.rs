//! Part `Replica`: one host's raft-rs node (`RawNode` over the `Log`),
//! turned into the engine's vocabulary. Inputs: a tick, a peer's message,
//! a proposal, the completion of a persisting request, entries read back.
//! Outputs (`poll`): messages to peers, requests to make a `Ready`'s
//! groups and hard state durable, committed groups to apply, reads of old
//! groups for a lagging follower, and changes of term or role.
//!
//! The order is raft's: a `Ready`'s entries and hard state go out as one
//! request and raft-rs is told at once that they are on their way
//! (`advance_append_async`); its persisted messages (votes, append
//! acknowledgements) wait with the request, and leave only when it has
//! completed, in order, before raft-rs hears `on_persist_ready`. A
//! leader's own messages may leave before its entries are durable: they
//! only carry entries, and an entry counts toward a commit on a host only
//! when that host's acknowledgement, which waits for its fsync, says so.

use super::entry::{EntryError, EntryGroup};
use super::hard_state::Members;
use super::log::{Appended, Log};
use super::membership::{sorted, Join, Membership};
use super::snapshot::Manifest;
use super::{raft_config, TickJitter, SNAPSHOT_TICKS};
use crate::config::Limits;
use crate::ids::SegmentId;
use crate::wal::GroupPlace;
use protobuf::Message as _;
use raft::eraftpb::{ConfChangeV2, ConfState, EntryType, HardState, Message, MessageType};
use raft::{ProgressState, RawNode, SnapshotStatus, StateRole};
use std::collections::{BTreeMap, VecDeque};

pub struct Replica {
    raw: RawNode<Log>,
    jitter: TickJitter,
    /// Ticks still withheld after the last term or role change.
    withheld: u64,
    /// (term, role) when last looked at.
    seen: (u64, StateRole),
    /// The leader's id when last looked at (0: none known).
    seen_leader: u64,
    /// Persisting requests in flight, oldest first: the `Ready`'s number,
    /// the messages that wait for it, and the last `Ready` raft-rs may hear
    /// of as persisted when it completes (later ones that had nothing to
    /// write ride it).
    persisting: VecDeque<(u64, Vec<Message>, u64)>,
    /// The read of old entries in flight: its first index, and raft-rs's
    /// contexts to resume when it completes.
    fetching: Option<(u64, Vec<raft::GetEntriesContext>)>,
    out: VecDeque<ReplicaOutput>,
    /// The planted bug `ack-before-persist`: persisted messages leave
    /// before their request completes.
    ack_early: bool,
    vote_unsaved: bool,
    /// The hard state last handed over to be saved.
    saved_hard: HardState,
    membership: Membership,
    /// Leading: followers sent a snapshot whose transfer has not ended, and
    /// the ticks left before it counts as failed. While any is open, the
    /// segments it names stay (`pinned`).
    transfers: BTreeMap<u64, u64>,
    /// Following: the `Ready` whose snapshot is being installed.
    installing: Option<(u64, Manifest)>,
}

#[derive(Debug)]
pub enum ReplicaOutput {
    /// A message for a peer.
    Send(Message),
    /// Make these durable, in order, then call `persisted(number)`.
    Persist(Persist),
    /// Groups raft committed, in index order, for the engine to apply.
    Committed(Vec<CommittedGroup>),
    /// Read back these groups and hand them to `fetched`.
    Fetch(Vec<GroupPlace>),
    /// The term or role changed (`leader`: the leader's id, 0 if unknown).
    Role { term: u64, leader: u64, is_leader: bool },
    /// An entry is not a group this host may write: it stops.
    Failed(EntryError),
    /// A quorum confirmed this host's leadership after `read_index(ctx)`.
    LeaderConfirmed,
    /// A committed membership change removed this host's own id.
    Removed,
    /// A message came from `from`, an id removed for good: it is dropped,
    /// and its sender should hear why.
    FromRemoved(u64),
}

/// What a host knows of the cluster, for metrics and `cluster status`.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct RaftStatus {
    pub node: u64,
    pub term: u64,
    /// The leader it knows of (0: none).
    pub leader: u64,
    pub is_leader: bool,
    pub commit: u64,
    /// The last index of its log.
    pub last_index: u64,
    /// Leading: every other member's progress; empty while following.
    pub peers: Vec<PeerProgress>,
}

/// What a leader knows of one other member's log.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct PeerProgress {
    pub node: u64,
    pub matched: u64,
    pub committed: u64,
}

#[derive(Debug)]
pub struct Persist {
    pub number: u64,
    pub appended: Appended,
    /// The hard state to save once the groups are durable, with the
    /// configuration and membership record as of its commit index.
    pub hard: Option<(HardState, ConfState, Members)>,
    /// A snapshot to install (then `appended` is empty): copy the
    /// manifest's segments from node `from` and swap them in for the whole
    /// WAL, together with `hard`.
    pub install: Option<Box<(u64, Manifest)>>,
}

#[derive(Debug)]
pub struct CommittedGroup {
    pub term: u64,
    pub group: EntryGroup,
}

fn logger() -> slog::Logger {
    slog::Logger::root(slog::Discard, slog::o!())
}

impl Replica {
    /// Node `members.node` over `log`, having applied everything up to
    /// `applied`; `seed` drives its election jitter.
    pub fn new(
        mut log: Log,
        members: Members,
        applied: u64,
        limits: &Limits,
        seed: u64,
    ) -> Result<Replica, raft::Error> {
        let id = members.node;
        let config = raft::Config { applied, ..raft_config(id, limits) };
        let saved_hard = log.hard_state().clone();
        log.set_members(0, members.clone());
        let raw = RawNode::new(&config, log, &logger())?;
        let seen = (raw.raft.term, raw.raft.state);
        Ok(Replica {
            raw,
            jitter: TickJitter::new(seed, id),
            withheld: 0,
            seen,
            seen_leader: 0,
            persisting: VecDeque::new(),
            fetching: None,
            out: VecDeque::new(),
            ack_early: false,
            vote_unsaved: false,
            saved_hard,
            membership: Membership::new(members),
            transfers: BTreeMap::new(),
            installing: None,
        })
    }

    pub fn plant_ack_before_persist(&mut self) {
        self.ack_early = true;
    }

    /// The planted bug `vote-not-persisted`: the hard state saved lacks the
    /// vote, so a restarted host may vote twice in one term.
    pub fn plant_vote_not_persisted(&mut self) {
        self.vote_unsaved = true;
    }

    /// The planted bug `no-truncate-on-conflict`.
    pub fn plant_no_truncate(&mut self) {
        self.raw.mut_store().plant_no_truncate();
    }

    pub fn poll(&mut self) -> Option<ReplicaOutput> {
        self.out.pop_front()
    }

    pub fn id(&self) -> u64 {
        self.raw.raft.id
    }

    pub fn term(&self) -> u64 {
        self.raw.raft.term
    }

    pub fn is_leader(&self) -> bool {
        self.raw.raft.state == StateRole::Leader
    }

    /// The leader this host knows of (0: none, as while it campaigns). A
    /// learner never campaigns, so it keeps the last one it heard.
    pub fn leader(&self) -> u64 {
        self.raw.raft.leader_id
    }

    /// A voter (a learner neither votes nor campaigns).
    pub fn promotable(&self) -> bool {
        self.raw.raft.promotable()
    }

    pub fn commit_index(&self) -> u64 {
        self.raw.raft.raft_log.committed
    }

    pub fn log(&self) -> &Log {
        self.raw.store()
    }

    /// Leading: hands leadership to the voter whose log matches furthest
    /// (raft-rs catches it up, then tells it to campaign at once). `None`
    /// when no other voter exists.
    pub fn transfer_leader(&mut self) -> Option<u64> {
        let voters = self.raw.raft.prs().conf().voters().ids();
        let to = self.peer_progress().into_iter().filter(|p| voters.contains(p.node)).max_by_key(|p| p.matched)?;
        self.raw.transfer_leader(to.node);
        self.pump();
        Some(to.node)
    }

    pub fn status(&self) -> RaftStatus {
        RaftStatus {
            node: self.id(),
            term: self.term(),
            leader: self.leader(),
            is_leader: self.is_leader(),
            commit: self.commit_index(),
            last_index: self.log().last_index(),
            peers: if self.is_leader() { self.peer_progress() } else { Vec::new() },
        }
    }

    /// Leading: every other member (voters and learners), in id order, with
    /// the index its log matches this one's through and the commit index
    /// it last reported in an answer.
    pub fn peer_progress(&self) -> Vec<PeerProgress> {
        let me = self.id();
        let mut peers: Vec<PeerProgress> = self
            .raw
            .raft
            .prs()
            .iter()
            .filter(|(id, _)| **id != me)
            .map(|(id, p)| PeerProgress { node: *id, matched: p.matched, committed: p.committed_index })
            .collect();
        peers.sort_by_key(|p| p.node);
        peers
    }

    /// How many ticks from now the first one that does anything falls
    /// (1: the next; `None`: none ever does while nothing else happens).
    /// A leader acts on most ticks (heartbeats, quorum checks, membership
    /// changes), so it is always 1. A follower's ticks before its election
    /// timeout only count: withheld ticks, then raft-rs's elapsed count.
    pub fn ticks_to_effect(&self) -> Option<u64> {
        let raft = &self.raw.raft;
        if raft.state == StateRole::Leader {
            return Some(1);
        }
        let transfer = self.transfers.values().min().copied();
        let election = (raft.promotable() && self.installing.is_none()).then(|| {
            let (elapsed, timeout) = (raft.election_elapsed, raft.randomized_election_timeout());
            self.withheld + timeout.saturating_sub(elapsed).max(1) as u64
        });
        [transfer, election].into_iter().flatten().min()
    }

    /// `n` ticks that `ticks_to_effect` says only count, without the work
    /// of a tick that may act. The same state as `n` calls of `tick`.
    pub fn tick_quietly(&mut self, n: u64) {
        debug_assert!(self.ticks_to_effect().is_none_or(|k| n < k), "{n} ticks are not all quiet");
        let withheld = n.min(self.withheld);
        self.withheld -= withheld;
        if self.installing.is_none() {
            for _ in withheld..n {
                let acted = self.raw.tick();
                debug_assert!(!acted, "a quiet tick acted");
            }
        }
        for left in self.transfers.values_mut() {
            *left -= n;
        }
    }

    /// One tick. While a snapshot is being installed raft-rs hears none:
    /// a follower that campaigned with the snapshot not yet durable would
    /// make raft-rs read entries its log does not hold (it panics), and the
    /// host restarts from the installed snapshot once it is durable anyway.
    pub fn tick(&mut self) {
        if self.withheld > 0 {
            self.withheld -= 1;
        } else if self.installing.is_none() {
            self.raw.tick();
        }
        let expired: Vec<u64> = self
            .transfers
            .iter_mut()
            .filter_map(|(&to, left)| {
                *left = left.saturating_sub(1);
                (*left == 0).then_some(to)
            })
            .collect();
        for to in expired {
            self.transfers.remove(&to);
            self.raw.report_snapshot(to, SnapshotStatus::Failure);
        }
        self.pump();
    }

    /// Leading: the transfer of a snapshot's segments to `to` ended (it
    /// copied them all, or the copy failed); raft-rs hears the outcome.
    pub fn snapshot_served(&mut self, to: u64, ok: bool) {
        if self.transfers.remove(&to).is_some() {
            self.raw.report_snapshot(to, if ok { SnapshotStatus::Finish } else { SnapshotStatus::Failure });
            self.pump();
        }
    }

    /// The hard state to save now, out of raft-rs's `Ready`s (none may be
    /// waiting or in flight): its term and vote, the commit index as far
    /// as it is applied, the configuration and membership as of it.
    pub fn hard_to_save(&mut self) -> (HardState, ConfState, Members) {
        let hs = self.raw.raft.hard_state();
        let commit = hs.commit.min(self.raw.raft.raft_log.applied);
        let saved = self.as_saved(HardState { commit, ..hs });
        self.saved_hard = saved.clone();
        (saved, self.log().conf_state().clone(), self.membership.members().clone())
    }

    /// The hard state as it is saved (the planted bug `vote-not-persisted`
    /// saves it without the vote).
    fn as_saved(&self, hs: HardState) -> HardState {
        HardState { vote: if self.vote_unsaved { 0 } else { hs.vote }, ..hs }
    }

    /// A snapshot's transfer is open: its segments must stay.
    pub fn pinned(&self) -> bool {
        !self.transfers.is_empty()
    }

    /// The segments before `first_kept` are about to be deleted: raft's log
    /// starts after them. False while they are needed (a snapshot's
    /// transfer, a read for a lagging follower) or the group that starts
    /// `first_kept` is not applied and durable here.
    pub fn compact_to(&mut self, first_kept: SegmentId) -> bool {
        !self.pinned() && self.fetching.is_none() && self.raw.mut_store().compact_to(first_kept)
    }

    /// Whether `id` is in this host's configuration (a voter or learner,
    /// incoming or outgoing).
    pub fn knows(&self, id: u64) -> bool {
        super::membership::all_ids(&self.conf()).contains(&id)
    }

    /// The configuration as this host applied it.
    pub fn conf(&self) -> ConfState {
        sorted(self.raw.raft.prs().conf().to_conf_state())
    }

    /// A message from a peer. One raft-rs refuses (a stale term, a peer it
    /// does not know) is dropped, and so is one from a removed id: raft
    /// retransmits what matters. A removed sender is named (`FromRemoved`):
    /// it may be a host started again on its old disk, which never heard of
    /// its removal.
    pub fn step(&mut self, m: Message) {
        if self.membership.refuses(m.from) {
            self.out.push_back(ReplicaOutput::FromRemoved(m.from));
            return;
        }
        let _ = self.raw.step(m);
        self.pump();
    }

    /// Proposes an entry (`entry::encode_entry` of a group placed at
    /// `log().end().next(..)`, index `log().last_index() + 1`, epoch
    /// `term()`). Refused when this host is not the leader or raft-rs's
    /// uncommitted budget is spent.
    pub fn propose(&mut self, data: Vec<u8>) -> Result<(), raft::Error> {
        debug_assert_eq!(self.raw.raft.raft_log.last_index(), self.log().last_index(), "readies handled");
        self.raw.propose(Vec::new(), data)?;
        self.pump();
        Ok(())
    }

    /// A leader is asked to let a new host join in place of a lost voter.
    pub fn ask_join(&mut self, join: Join) -> Result<(), super::membership::JoinRefusal> {
        if !self.is_leader() {
            return Err(super::membership::JoinRefusal::NotLeader);
        }
        let conf = self.conf();
        self.membership.ask(join, &conf)
    }

    /// The membership change this leader should propose next, if one is
    /// due and raft-rs has none pending.
    pub fn next_change(&mut self) -> Option<ConfChangeV2> {
        if !self.is_leader() || self.raw.raft.has_pending_conf() {
            return None;
        }
        let conf = self.conf();
        let commit = self.commit_index();
        let prs = self.raw.raft.prs();
        self.membership.next_change(&conf, |id| prs.get(id).is_some_and(|p| p.matched >= commit))
    }

    /// Proposes a group holding membership change `cc` (its frame's bytes)
    /// as a conf-change entry. Refused as `propose` is; raft-rs may also
    /// ignore a change it does not allow now and keep an empty entry in its
    /// place, which would lose the group's other frames: that is an error.
    pub fn propose_change(&mut self, cc: &[u8], data: Vec<u8>) -> Result<(), raft::Error> {
        let change = ConfChangeV2::parse_from_bytes(cc).map_err(|e| raft::Error::ConfChangeError(e.to_string()))?;
        let pending = self.raw.raft.has_pending_conf();
        self.raw.propose_conf_change(data, change)?;
        if pending || !self.raw.raft.has_pending_conf() {
            return Err(raft::Error::ConfChangeError("raft-rs ignored the membership change".into()));
        }
        self.pump();
        Ok(())
    }

    /// Asks a quorum to confirm this host still leads (raft's read index);
    /// the answer comes as `LeaderConfirmed`, or never if it does not.
    pub fn confirm_leadership(&mut self, ctx: Vec<u8>) {
        self.raw.read_index(ctx);
        self.pump();
    }

    /// The persisting request `number` completed: its waiting messages
    /// leave, then raft-rs hears of it.
    pub fn persisted(&mut self, number: u64) {
        let (n, messages, upto) = self.persisting.pop_front().expect("a request was in flight");
        assert_eq!(n, number, "persisting requests complete in order");
        if let Some((_, manifest)) = self.installing.take_if(|(i, _)| *i == number) {
            self.raw.mut_store().installed(&manifest);
        }
        self.out.extend(messages.into_iter().map(ReplicaOutput::Send));
        self.raw.on_persist_ready(upto);
        self.pump();
    }

    /// The groups of the read in flight, in index order, as read back.
    pub fn fetched(&mut self, groups: Vec<Vec<u8>>) {
        let (from, contexts) = self.fetching.take().expect("a read was in flight");
        let log = self.raw.store();
        let entries = groups.iter().enumerate().map(|(i, b)| log.entry_read_back(from + i as u64, b)).collect();
        self.raw.mut_store().set_fetched(Some((from, entries)));
        for context in contexts {
            self.raw.on_entries_fetched(context);
        }
        self.pump();
        self.raw.mut_store().set_fetched(None);
    }

    /// Handles every `Ready` raft-rs has, then asks for entries it wanted.
    fn pump(&mut self) {
        loop {
            self.observe();
            if !self.raw.has_ready() {
                break;
            }
            let mut rd = self.raw.ready();
            for m in rd.messages().iter().filter(|m| m.get_msg_type() == MessageType::MsgSnapshot) {
                // The transfer starts when the follower asks for the
                // segments; it must end within this many ticks.
                self.transfers.insert(m.to, SNAPSHOT_TICKS);
            }
            if !rd.snapshot().is_empty() {
                if let Err(e) = self.install(rd) {
                    self.out.push_back(ReplicaOutput::Failed(e));
                    return;
                }
                continue;
            }
            self.out.extend(rd.take_messages().into_iter().map(ReplicaOutput::Send));
            for _ in rd.take_read_states() {
                self.out.push_back(ReplicaOutput::LeaderConfirmed);
            }
            let committed = rd.take_committed_entries();
            let mut conf_changed = false;
            for e in committed.iter().filter(|e| e.get_entry_type() == EntryType::EntryConfChangeV2) {
                conf_changed = true;
                if let Err(what) = self.apply_change(e.index, &e.data) {
                    self.out.push_back(ReplicaOutput::Failed(EntryError { index: e.index, what }));
                    return;
                }
            }
            let entries = rd.take_entries();
            let appended = match self.raw.mut_store().append(&entries) {
                Ok(a) => a,
                Err(e) => {
                    self.out.push_back(ReplicaOutput::Failed(e));
                    return;
                }
            };
            let persisted = rd.take_persisted_messages();
            // The configuration saved goes with the commit index saved: never
            // past what this host applied (a restart applies from there, and
            // so applies again any change not yet in the saved configuration).
            let applied = committed.last().map_or(self.raw.raft.raft_log.applied, |e| e.index);
            if let Some(hs) = rd.hs() {
                self.raw.mut_store().set_hard_state(hs.clone());
            }
            let mut hard =
                rd.hs().cloned().or_else(|| conf_changed.then(|| self.log().hard_state().clone())).map(|hs| {
                    let commit = hs.commit.min(applied);
                    let saved = self.as_saved(HardState { commit, ..hs });
                    (saved, self.log().conf_state().clone(), self.membership.members().clone())
                });
            // A new commit index alone need not be durable at once (raft
            // recovers it from its leader): it rides the next save, and a
            // restart before that rebuilds state through the older index.
            let commit_only = |h: &HardState| h.term == self.saved_hard.term && h.vote == self.saved_hard.vote;
            if entries.is_empty()
                && persisted.is_empty()
                && !conf_changed
                && hard.as_ref().is_some_and(|(h, _, _)| commit_only(h))
            {
                hard = None;
            }
            if let Some((h, _, _)) = &hard {
                self.saved_hard = h.clone();
            }
            let number = rd.number();
            if !committed.is_empty() {
                let log = self.raw.store();
                let groups = committed.iter().map(|e| CommittedGroup { term: e.term, group: log.group_of(e) });
                self.out.push_back(ReplicaOutput::Committed(groups.collect()));
            }
            let last_committed = committed.last().map(|e| e.index);
            self.raw.advance_append_async(rd);
            if let Some(index) = last_committed {
                self.raw.advance_apply_to(index);
            }
            if appended == Appended::default() && hard.is_none() {
                // Nothing to write (a follower's heartbeat answer, a
                // rejection): its messages wait only for the requests before
                // it, and leave at once when there are none.
                match self.persisting.back_mut() {
                    Some((_, waiting, upto)) => {
                        waiting.extend(persisted);
                        *upto = number;
                    }
                    None => {
                        self.out.extend(persisted.into_iter().map(ReplicaOutput::Send));
                        self.raw.on_persist_ready(number);
                    }
                }
            } else {
                if self.ack_early {
                    self.out.extend(persisted.into_iter().map(ReplicaOutput::Send));
                    self.persisting.push_back((number, Vec::new(), number));
                } else {
                    self.persisting.push_back((number, persisted, number));
                }
                self.out.push_back(ReplicaOutput::Persist(Persist { number, appended, hard, install: None }));
            }
            let durable = self.raw.raft.raft_log.persisted.min(self.raw.raft.raft_log.applied);
            self.raw.mut_store().release_through(durable);
            self.raw.mut_store().set_durable(durable);
        }
        let prs = self.raw.raft.prs();
        self.transfers.retain(|id, _| prs.get(*id).is_some_and(|p| p.state == ProgressState::Snapshot));
        self.want_reads();
    }

    /// A `Ready` with a snapshot from the leader (raft-rs has dropped this
    /// host's log past its commit index for it): one request copies the
    /// manifest's segments and swaps them in, with the hard state that
    /// makes them committed; raft-rs hears of it when that is durable.
    fn install(&mut self, mut rd: raft::Ready) -> Result<(), EntryError> {
        let snap = rd.snapshot().clone();
        let meta = snap.get_metadata();
        let index = meta.index;
        let manifest = Manifest::decode(&snap.data)
            .filter(|m| m.index == index && m.term == meta.term && !m.segments.is_empty())
            .ok_or(EntryError { index, what: "a snapshot's manifest does not decode" })?;
        assert!(rd.entries().is_empty() && rd.committed_entries().is_empty(), "raft-rs sends a snapshot alone");
        let conf = sorted(meta.get_conf_state().clone());
        let hs = rd.hs().cloned().unwrap_or_else(|| self.log().hard_state().clone());
        let hs = HardState { commit: index, ..hs };
        let saved = self.as_saved(hs.clone());
        self.saved_hard = saved.clone();
        let mut members = self.membership.members().clone();
        members.removed = manifest.members.removed.clone();
        members.replacing = manifest.members.replacing.clone();
        let store = self.raw.mut_store();
        store.set_hard_state(hs);
        store.set_conf_state(conf.clone());
        store.set_members(index, members.clone());
        self.out.extend(rd.take_messages().into_iter().map(ReplicaOutput::Send));
        for _ in rd.take_read_states() {
            self.out.push_back(ReplicaOutput::LeaderConfirmed);
        }
        let persisted = rd.take_persisted_messages();
        let number = rd.number();
        let from = self.raw.raft.leader_id;
        self.raw.advance_append_async(rd);
        self.persisting.push_back((number, persisted, number));
        self.installing = Some((number, manifest.clone()));
        let hard = Some((saved, conf, members));
        self.out.push_back(ReplicaOutput::Persist(Persist {
            number,
            appended: Appended::default(),
            hard,
            install: Some(Box::new((from, manifest))),
        }));
        Ok(())
    }

    /// Applies a committed membership change (raft-rs's `ConfChangeV2`
    /// bytes) to raft, the log's saved configuration and the membership
    /// record; this host's own removal is reported.
    fn apply_change(&mut self, index: u64, data: &[u8]) -> Result<(), &'static str> {
        let cc = ConfChangeV2::parse_from_bytes(data).map_err(|_| "a committed membership change does not decode")?;
        let before = self.conf();
        let after = self.raw.apply_conf_change(&cc).map_err(|_| "raft-rs refused a committed membership change")?;
        let after = sorted(after);
        self.membership.applied(&cc, &before, &after);
        let members = self.membership.members().clone();
        let store = self.raw.mut_store();
        store.set_conf_state(after);
        store.set_members(index, members);
        if self.membership.self_removed() {
            self.out.push_back(ReplicaOutput::Removed);
        }
        Ok(())
    }

    /// Entries raft-rs wanted that memory no longer holds: one read at a
    /// time, of the range the earliest waiting send starts at.
    fn want_reads(&mut self) {
        let wanted = self.raw.mut_store().take_wanted();
        if wanted.is_empty() {
            return;
        }
        if let Some((_, contexts)) = &mut self.fetching {
            contexts.extend(wanted.into_iter().map(|w| w.2));
            return;
        }
        let low = wanted.iter().map(|w| w.0).min().expect("not empty");
        let high = wanted.iter().map(|w| w.1).max().expect("not empty");
        let places = (low..high).map(|i| self.log().place(i)).collect();
        self.fetching = Some((low, wanted.into_iter().map(|w| w.2).collect()));
        self.out.push_back(ReplicaOutput::Fetch(places));
    }

    /// After a term or role change the next ticks are withheld (the jitter
    /// that keeps split votes from repeating), and the engine hears of it.
    fn observe(&mut self) {
        let now = (self.raw.raft.term, self.raw.raft.state);
        let leader = self.raw.raft.leader_id;
        if now != self.seen {
            self.seen = now;
            self.seen_leader = leader;
            self.withheld = self.jitter.draw();
            let (term, is_leader) = (now.0, now.1 == StateRole::Leader);
            self.out.push_back(ReplicaOutput::Role { term, leader, is_leader });
        } else if leader != self.seen_leader {
            // A follower learned its leader within the term (no jitter: the
            // election is over).
            self.seen_leader = leader;
            self.out.push_back(ReplicaOutput::Role { term: now.0, leader, is_leader: false });
        }
    }
}
