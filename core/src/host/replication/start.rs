//! Start-up of part `Replication`: the hard-state file read (whose
//! identity this host must match), then the log restored from the segments
//! read at start (or, on a host's first start, the genesis group written)
//! and the raft node started.

use super::{cluster_log, Node, Phase, Replication, Role};
use crate::config::Limits;
use crate::consensus::entry::{genesis, EntryGroup, Opening};
use crate::consensus::hard_state::{decode_file, Members};
use crate::consensus::log::{Log, LogBuilder, LogRecord, RestoreError};
use crate::consensus::replica::Replica;
use crate::consensus::{ConfState, HardState};
use crate::host::effects::Effects;
use crate::ids::*;
use crate::io::StopReason;
use crate::mutation::Mutation;
use crate::time::Instant;
use crate::wal::{GroupPlace, ScannedSegment, SEGMENT_HEADER_BYTES};
use std::collections::BTreeMap;

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

    /// What recovery's scan builds the log with: the hard state and
    /// membership read at start, and each listed segment file's size.
    pub(in crate::host) fn log_builder(&self, sizes: BTreeMap<SegmentId, u64>) -> LogBuilder {
        let Phase::Loaded(loaded) = &self.phase else { panic!("the hard state is read before the segments") };
        LogBuilder::new(loaded.0.clone(), loaded.1.clone(), sizes)
    }

    /// The commit index the hard-state file read at start holds.
    pub(in crate::host) fn saved_commit_at_start(&self) -> u64 {
        let Phase::Loaded(loaded) = &self.phase else { panic!("the hard state is read before the segments") };
        loaded.0.commit
    }

    /// Raft's log as the last run's stop record kept it, under the hard
    /// state and membership read at start, its groups past the commit
    /// index made entries from `tail`, their bytes read back.
    pub(in crate::host) fn recorded_log(
        &self,
        record: LogRecord,
        tail: Vec<(u64, Vec<u8>)>,
    ) -> Result<Log, RestoreError> {
        let Phase::Loaded(loaded) = &self.phase else { panic!("the hard state is read before the segments") };
        Log::recorded(loaded.0.clone(), loaded.1.clone(), record).finish_restore(tail)
    }

    /// Starts the raft node on the log recovery's scan built from this
    /// host's segments. Returns the log's segment size, and on a host's
    /// first start the genesis group's scan (the state to rebuild from; a
    /// restart rebuilt its own through the commit index, later groups
    /// waiting for raft).
    pub(in crate::host) fn restore(
        &mut self,
        fx: &mut Effects,
        built: Result<Option<Log>, RestoreError>,
        limits: &Limits,
        now: Instant,
    ) -> Result<(Option<Vec<ScannedSegment>>, u64), StopReason> {
        let Phase::Loaded(loaded) = std::mem::replace(&mut self.phase, Phase::Unread) else {
            panic!("the hard state is read before the segments")
        };
        let (hard, conf, members) = *loaded;
        let (log, genesis_scan) = match built.map_err(cluster_log)? {
            Some(log) => (log, None),
            None => {
                // A host's first start (or a retry of one whose first write
                // failed): its WAL begins with the genesis group, written
                // before anything raft does.
                self.saves.genesis(fx, genesis_group(members.segment_bytes));
                let (end, first) = genesis(members.segment_bytes);
                let scanned = crate::wal::scan(&[(SegmentId(0), &first)], false).expect("the genesis group scans");
                (Log::new(hard, conf, (0, 0), end), Some(scanned))
            }
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
        Ok((genesis_scan, segment_bytes))
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
