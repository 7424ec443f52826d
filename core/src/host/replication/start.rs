//! Start-up of part `Replication`: the hard-state file read (whose
//! identity this host must match), then the log restored from the segments
//! read at start (or, on a host's first start, the genesis group written)
//! and the raft node started.

use super::{cluster_log, Node, Phase, Replication, Role};
use crate::config::Limits;
use crate::consensus::entry::{genesis, EntryGroup, Opening};
use crate::consensus::hard_state::{decode_file, Members};
use crate::consensus::log::Log;
use crate::consensus::replica::Replica;
use crate::consensus::{ConfState, HardState};
use crate::host::effects::Effects;
use crate::ids::*;
use crate::io::StopReason;
use crate::mutation::Mutation;
use crate::time::Instant;
use crate::wal::{GroupPlace, ScannedSegment, SEGMENT_HEADER_BYTES};

impl Replication {
    /// The hard-state file's bytes at start. `cluster init` or `cluster
    /// join` wrote its first state; a file that holds none (missing, or
    /// zeros) means this DATA_DIR has no cluster identity: never
    /// initialized, or wiped. Such a host takes no part, since a voter that
    /// forgot what it acknowledged could elect a log that lacks it; if its
    /// data was lost it comes back under a new id with `cluster join`.
    pub(in crate::host) fn on_hard_state(&mut self, file: &[u8], segment_bytes: u64) -> Result<(), StopReason> {
        let not_member = |what: String| StopReason::NotMember { what };
        let saved = decode_file(file).map_err(cluster_log)?;
        let node = self.config.node;
        let loaded = match saved {
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
                self.saves.read_at_start(s.seq);
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
        };
        self.phase = Phase::Loaded(Box::new(loaded));
        Ok(())
    }

    /// Restores the log from the segments read at start and starts the raft
    /// node, having applied what the hard state says is committed. Returns
    /// the scan cut at the commit index (what this host may rebuild its
    /// state from; later groups wait for raft) and the log's segment size.
    pub(in crate::host) fn restore(
        &mut self,
        fx: &mut Effects,
        segments: &[(SegmentId, &[u8])],
        limits: &Limits,
        now: Instant,
    ) -> Result<(Vec<ScannedSegment>, u64), StopReason> {
        let Phase::Loaded(loaded) = std::mem::replace(&mut self.phase, Phase::Unread) else {
            panic!("the hard state is read before the segments")
        };
        let (hard, conf, members) = *loaded;
        let empty = || crate::wal::scan(segments, false).is_ok_and(|s| s.iter().all(|s| s.groups.is_empty()));
        let (log, mut scanned) = if hard == HardState::default() && empty() {
            // A host's first start (or a retry of one whose first write
            // failed): its WAL begins with the genesis group, written
            // before anything raft does.
            self.saves.genesis(fx, genesis_group(members.segment_bytes));
            let (end, first) = genesis(members.segment_bytes);
            let scanned = crate::wal::scan(&[(SegmentId(0), &first)], false).expect("the genesis group scans");
            (Log::new(hard, conf, (0, 0), end), scanned)
        } else {
            Log::restore(hard, conf, segments).map_err(cluster_log)?
        };
        let segment_bytes = log.end().segment_bytes;
        let commit = log.hard_state().commit;
        self.saves.restored(commit);
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
        let next_tick = now + self.config.tick;
        self.phase = Phase::Running(Box::new(Node { replica, role: Role::Following, next_tick }));
        for seg in &mut scanned {
            let before = seg.groups.len();
            seg.groups.retain(|g| g.lsn.0 <= commit);
            if seg.groups.len() != before {
                seg.sealed = false;
            }
        }
        Ok((scanned, segment_bytes))
    }
}

/// Segment 0's genesis group, the first thing a new host's WAL holds.
fn genesis_group(segment_bytes: u64) -> EntryGroup {
    let (end, first) = genesis(segment_bytes);
    let offset = SEGMENT_HEADER_BYTES as u64;
    EntryGroup {
        place: GroupPlace { lsn: Lsn(0), segment: SegmentId(0), offset, len: end.end - offset },
        opens: Some(Opening { epoch: Epoch(0), segment_bytes }),
        sealed: false,
        bytes: first[offset as usize..].to_vec().into(),
    }
}
