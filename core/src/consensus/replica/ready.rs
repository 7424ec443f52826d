//! How part `Replica` handles raft-rs's `Ready`s: each one's messages,
//! committed entries (membership changes applied), appended groups and
//! hard state become outputs, a persisting request, and the messages that
//! wait for it; a snapshot from the leader becomes an install request;
//! entries raft-rs wanted that memory no longer holds are read back.

use super::super::entry::EntryError;
use super::super::log::Appended;
use super::super::membership::sorted;
use super::super::snapshot::Manifest;
use super::super::SNAPSHOT_TICKS;
use super::{CommittedGroup, Persist, Replica, ReplicaOutput, Saved};
use protobuf::Message as _;
use raft::eraftpb::{ConfChangeV2, Entry, EntryType, HardState, Message, MessageType};
use raft::ProgressState;

/// A new commit index alone is saved lazily, but never more than this many
/// bytes of committed entries behind: a restart holds the groups past the
/// saved commit index in memory, as raft's entries, until raft commits them
/// again. Without the bound a leader whose `Ready`s carried commits but no
/// new entries (a sink lagging, the WAL full) saved none, and restarted
/// with its whole log in memory (990 MB of a 1 GiB WAL, `bench recovery`).
pub(super) const COMMIT_SAVE_BYTES: u64 = 4 << 20;

impl Replica {
    /// Handles every `Ready` raft-rs has, then asks for entries it wanted.
    pub(super) fn pump(&mut self) {
        loop {
            self.observe();
            if !self.raw.has_ready() {
                break;
            }
            let rd = self.raw.ready();
            if let Err(e) = self.on_ready(rd) {
                self.out.push_back(ReplicaOutput::Failed(e));
                return;
            }
        }
        let prs = self.raw.raft.prs();
        self.transfers.retain(|id, _| prs.get(*id).is_some_and(|p| p.state == ProgressState::Snapshot));
        self.want_reads();
    }

    fn on_ready(&mut self, mut rd: raft::Ready) -> Result<(), EntryError> {
        for m in rd.messages().iter().filter(|m| m.get_msg_type() == MessageType::MsgSnapshot) {
            // The transfer starts when the follower asks for the
            // segments; it must end within this many ticks.
            self.transfers.insert(m.to, SNAPSHOT_TICKS);
        }
        if !rd.snapshot().is_empty() {
            return self.install(rd);
        }
        self.out.extend(rd.take_messages().into_iter().map(ReplicaOutput::Send));
        for _ in rd.take_read_states() {
            self.out.push_back(ReplicaOutput::LeaderConfirmed);
        }
        let committed = rd.take_committed_entries();
        let conf_changed = self.apply_changes(&committed)?;
        let entries = rd.take_entries();
        let appended = self.raw.mut_store().append(&entries)?;
        let persisted = rd.take_persisted_messages();
        let nothing_else = entries.is_empty() && persisted.is_empty() && !conf_changed;
        let hard = self.hard_to_persist(rd.hs(), &committed, conf_changed, nothing_else);
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
        self.persist(number, appended, hard, persisted);
        let durable = self.raw.raft.raft_log.persisted.min(self.raw.raft.raft_log.applied);
        self.raw.mut_store().release_through(durable);
        self.raw.mut_store().set_durable(durable);
        Ok(())
    }

    /// Applies the committed membership changes among `committed`; whether
    /// there was one.
    fn apply_changes(&mut self, committed: &[Entry]) -> Result<bool, EntryError> {
        let mut conf_changed = false;
        for e in committed.iter().filter(|e| e.get_entry_type() == EntryType::EntryConfChangeV2) {
            conf_changed = true;
            self.apply_change(e.index, &e.data).map_err(|what| EntryError { index: e.index, what })?;
        }
        Ok(conf_changed)
    }

    /// The hard state a `Ready` saves (`hs`, raft-rs's, or after a
    /// membership change the log's), with the configuration and membership
    /// record as of its commit index; none when only the commit index moved
    /// and `nothing_else` is to be written.
    fn hard_to_persist(
        &mut self,
        hs: Option<&HardState>,
        committed: &[Entry],
        conf_changed: bool,
        nothing_else: bool,
    ) -> Option<Saved> {
        // The configuration saved goes with the commit index saved: never
        // past what this host applied (a restart applies from there, and
        // so applies again any change not yet in the saved configuration).
        let applied = committed.last().map_or(self.raw.raft.raft_log.applied, |e| e.index);
        if let Some(hs) = hs {
            self.raw.mut_store().set_hard_state(hs.clone());
        }
        self.unsaved_commit_bytes += committed.iter().map(|e| (e.data.len() + e.context.len()) as u64).sum::<u64>();
        let overdue = self.unsaved_commit_bytes >= COMMIT_SAVE_BYTES;
        let changed = hs.cloned().or_else(|| conf_changed.then(|| self.log().hard_state().clone()));
        let mut hard = changed.or_else(|| overdue.then(|| self.raw.raft.hard_state())).map(|hs| {
            let commit = hs.commit.min(applied);
            let saved = self.as_saved(HardState { commit, ..hs });
            (saved, self.log().conf_state().clone(), self.membership.members().clone())
        });
        // A new commit index alone need not be durable at once (raft
        // recovers it from its leader): it rides the next save, and a
        // restart before that rebuilds state through the older index.
        let commit_only = |h: &HardState| h.term == self.saved_hard.term && h.vote == self.saved_hard.vote;
        if nothing_else && !overdue && hard.as_ref().is_some_and(|(h, _, _)| commit_only(h)) {
            hard = None;
        }
        if let Some((h, _, _)) = &hard {
            self.saved_hard = h.clone();
            self.unsaved_commit_bytes = 0;
        }
        hard
    }

    /// Ready `number`'s groups and hard state go out as a request, its
    /// persisted messages waiting for it; with nothing to write, they wait
    /// only for the requests before it.
    fn persist(&mut self, number: u64, appended: Appended, hard: Option<Saved>, persisted: Vec<Message>) {
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
            return;
        }
        if self.ack_early {
            self.out.extend(persisted.into_iter().map(ReplicaOutput::Send));
            self.persisting.push_back((number, Vec::new(), number));
        } else {
            self.persisting.push_back((number, persisted, number));
        }
        self.out.push_back(ReplicaOutput::Persist(Persist { number, appended, hard, install: None }));
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
        self.unsaved_commit_bytes = 0;
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
        // The lowest range wanted is read; a send whose range it does not
        // cover asks again when it resumes, and is read next.
        let low = wanted.iter().map(|w| w.0).min().expect("not empty");
        let high = wanted.iter().filter(|w| w.0 == low).map(|w| w.1).max().expect("the lowest is wanted");
        let places = (low..high).map(|i| self.log().place(i)).collect();
        self.fetching = Some((low, wanted.into_iter().map(|w| w.2).collect()));
        self.out.push_back(ReplicaOutput::Fetch(places));
    }
}
