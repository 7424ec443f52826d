//! The writer authority: the one gate every part asks, through the
//! coordinator, before it commits, acks, writes offsets, creates or deletes.
//! On disk the driver's directory lock holds it for the process's life; in
//! S3 mode the writer lease does (`lease.rs`); raft leadership will in
//! clustered mode, as one more variant. Owns the lease, where there is one.

use super::lease::Lease;
use crate::time::Instant;

/// Whatever makes this host the WAL's one writer.
pub(super) enum Authority {
    /// Disk mode: the driver holds the WAL directory's lock.
    DirectoryLock,
    /// S3 mode: the writer lease in the offsets table's service.
    Lease(Lease),
}

impl Authority {
    /// May this writer commit, acknowledge, write offsets, create or delete
    /// now? Under a lease: only while nobody can have taken it over.
    pub(super) fn may_write(&self, now: Instant) -> bool {
        match self {
            Authority::DirectoryLock => true,
            Authority::Lease(lease) => lease.valid(now),
        }
    }

    pub(super) fn lease(&mut self) -> Option<&mut Lease> {
        match self {
            Authority::DirectoryLock => None,
            Authority::Lease(lease) => Some(lease),
        }
    }

    /// The lease, where a lease request or answer implies there is one.
    pub(super) fn held_lease(&mut self) -> &mut Lease {
        self.lease().expect("a lease request implies a lease")
    }

    /// Commits that landed while the lease may have lapsed (none without one).
    pub(super) fn late_commits(&self) -> u64 {
        match self {
            Authority::DirectoryLock => 0,
            Authority::Lease(lease) => lease.late_commits(),
        }
    }

    /// Still waiting for another writer's lease: nothing of ours to drain.
    pub(super) fn waiting(&self) -> bool {
        matches!(self, Authority::Lease(lease) if lease.holding().is_none())
    }

    /// The high half of this writer's epoch: the lease's generation, or one
    /// past the WAL's highest where the directory lock is the authority.
    pub(super) fn writer_generation(&self, wal_generation: u64) -> u64 {
        match self {
            Authority::Lease(lease) => lease.holding().map_or(wal_generation + 1, |row| row.generation),
            Authority::DirectoryLock => wal_generation + 1,
        }
    }
}
