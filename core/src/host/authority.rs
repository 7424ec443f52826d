//! The writer authority: the one gate every part asks, through the
//! coordinator, before it commits, acks, writes offsets, creates or deletes.
//! On disk the driver's directory lock holds it for the process's life; in
//! S3 mode the writer lease does (`lease.rs`); raft leadership does in
//! clustered mode (`replication.rs`). Owns the lease or the raft node,
//! where there is one.

use super::lease::Lease;
use super::replication::Replication;
use crate::time::Instant;

/// Whatever makes this host the WAL's one writer.
pub(super) enum Authority {
    /// Disk mode: the driver holds the WAL directory's lock.
    DirectoryLock,
    /// S3 mode: the writer lease in the offsets table's service.
    Lease(Lease),
    /// Clustered mode: raft leadership, once a group of the leader's own
    /// term has committed.
    Raft(Box<Replication>),
}

impl Authority {
    /// May this writer commit, acknowledge, write offsets, create or delete
    /// now? Under a lease: only while nobody can have taken it over.
    pub(super) fn may_write(&self, now: Instant) -> bool {
        match self {
            Authority::DirectoryLock => true,
            Authority::Lease(lease) => lease.valid(now),
            Authority::Raft(r) => r.serving(),
        }
    }

    pub(super) fn lease(&mut self) -> Option<&mut Lease> {
        match self {
            Authority::Lease(lease) => Some(lease),
            _ => None,
        }
    }

    pub(super) fn raft(&mut self) -> Option<&mut Replication> {
        match self {
            Authority::Raft(r) => Some(r),
            _ => None,
        }
    }

    pub(super) fn raft_ref(&self) -> Option<&Replication> {
        match self {
            Authority::Raft(r) => Some(r),
            _ => None,
        }
    }

    /// The replication part, where a raft request or answer implies one.
    pub(super) fn held_raft(&mut self) -> &mut Replication {
        self.raft().expect("a raft request implies clustered mode")
    }

    /// The lease, where a lease request or answer implies there is one.
    pub(super) fn held_lease(&mut self) -> &mut Lease {
        self.lease().expect("a lease request implies a lease")
    }

    /// Commits that landed while the lease may have lapsed (none without one).
    pub(super) fn late_commits(&self) -> u64 {
        match self {
            Authority::Lease(lease) => lease.late_commits(),
            _ => 0,
        }
    }

    /// Still waiting for another writer's lease, or following a raft
    /// leader: nothing of ours to drain.
    pub(super) fn waiting(&self) -> bool {
        match self {
            Authority::Lease(lease) => lease.holding().is_none(),
            Authority::Raft(r) => !r.serving(),
            Authority::DirectoryLock => false,
        }
    }

    /// The high half of this writer's epoch: the lease's generation, or one
    /// past the WAL's highest where the directory lock is the authority.
    pub(super) fn writer_generation(&self, wal_generation: u64) -> u64 {
        match self {
            Authority::Lease(lease) => lease.holding().map_or(wal_generation + 1, |row| row.generation),
            Authority::DirectoryLock | Authority::Raft(_) => wal_generation + 1,
        }
    }
}
