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

mod ready;
mod ticks;

use super::entry::{EntryError, EntryGroup};
use super::hard_state::Members;
use super::log::{Appended, Log};
use super::membership::{sorted, Join, Membership};
use super::snapshot::Manifest;
use super::{raft_config, TickJitter};
use crate::config::Limits;
use crate::ids::SegmentId;
use crate::wal::GroupPlace;
use protobuf::Message as _;
use raft::eraftpb::{ConfChangeV2, ConfState, HardState, Message};
use raft::{RawNode, SnapshotStatus, StateRole};
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
    /// Bytes of the entries committed since the commit index last handed
    /// over to be saved (see `COMMIT_SAVE_BYTES`).
    unsaved_commit_bytes: u64,
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

/// A hard state to save, with the configuration and membership record as
/// of its commit index.
type Saved = (HardState, ConfState, Members);

#[derive(Debug)]
pub struct Persist {
    pub number: u64,
    pub appended: Appended,
    /// The hard state to save once the groups are durable, with the
    /// configuration and membership record as of its commit index.
    pub hard: Option<Saved>,
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
            unsaved_commit_bytes: 0,
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

    /// Leading: the transfer of a snapshot's segments to `to` ended (it
    /// copied them all, or the copy failed); raft-rs hears the outcome.
    pub fn snapshot_served(&mut self, to: u64, ok: bool) {
        if self.transfers.remove(&to).is_some() {
            self.raw.report_snapshot(to, if ok { SnapshotStatus::Finish } else { SnapshotStatus::Failure });
            self.pump();
        }
    }

    /// The last index applied (handed out as committed).
    pub fn applied(&self) -> u64 {
        self.raw.raft.raft_log.applied
    }

    /// The hard state to save now, out of raft-rs's `Ready`s (none may be
    /// waiting or in flight): its term and vote, the commit index as far
    /// as it is applied, the configuration and membership as of it.
    pub fn hard_to_save(&mut self) -> (HardState, ConfState, Members) {
        let hs = self.raw.raft.hard_state();
        let commit = hs.commit.min(self.raw.raft.raft_log.applied);
        let saved = self.as_saved(HardState { commit, ..hs });
        self.saved_hard = saved.clone();
        self.unsaved_commit_bytes = 0;
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
}
