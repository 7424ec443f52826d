//! Consensus for the clustered WAL (issues #12 and #13): tikv/raft-rs,
//! driven from inside the engine like every other part. This module
//! fixes how raft-rs is configured and shows, with three nodes in memory,
//! that it runs deterministically under the engine's own ticks and seed.
//!
//! raft-rs's only randomness is the election timeout, drawn from
//! `rand::thread_rng()` in `[min_election_tick, max_election_tick)` at every
//! term or role change. With `max = min + 1` that range holds one value, so
//! OS entropy decides nothing. `Raft::set_randomized_election_timeout`
//! asserts the same range, so it cannot add jitter here; the jitter that
//! keeps split votes from repeating comes from the engine instead: after a
//! node's term or role changes, its next ticks are withheld for a number
//! drawn from the engine's seed (`TickJitter::draw`).

use crate::config::Limits;
use crate::ids::{Lsn, SegmentId};
pub use raft::eraftpb::{ConfState, HardState};

pub mod entry;
pub mod hard_state;
pub mod log;
pub mod membership;
pub mod replica;
pub mod snapshot;
pub mod terms;

/// Ticks a follower waits without hearing from a leader before it
/// campaigns; a leader steps down after as many without a quorum.
pub const ELECTION_TICKS: usize = 10;
/// Ticks between a leader's heartbeats.
pub const HEARTBEAT_TICKS: usize = 3;
/// At most this many ticks are withheld after a term or role change.
pub const JITTER_TICKS_MAX: u64 = ELECTION_TICKS as u64;
/// A snapshot's transfer that has not ended after this many ticks of its
/// leader counts as failed: raft-rs hears so (`report_snapshot`), may send
/// another, and the segments it pinned may go.
pub const SNAPSHOT_TICKS: u64 = 10 * ELECTION_TICKS as u64;

/// A hash of the settings every host of a cluster must share: the segment
/// size its identity names, the raft tick, and the election and heartbeat
/// ticks. Peers compare it when they connect and refuse one that differs.
pub fn settings_fingerprint(segment_bytes: u64, tick: crate::Duration) -> u64 {
    let mut b = Vec::with_capacity(32);
    for v in [segment_bytes, tick.as_micros(), ELECTION_TICKS as u64, HEARTBEAT_TICKS as u64] {
        b.extend_from_slice(&v.to_le_bytes());
    }
    xxhash_rust::xxh3::xxh3_64(&b)
}

/// What `wal verify` says of a clustered host's log: the oldest group it
/// still holds, the last one its saved commit index covers, and a digest
/// of the groups `from..=through` (xxh3-64 over each group's LSN, term and
/// bytes, in order). Groups are the same bytes on every host (a follower
/// writes its leader's), so hosts whose digests of one range differ hold
/// different committed logs.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct PrefixDigest {
    pub oldest: Lsn,
    pub committed: Lsn,
    pub from: Lsn,
    pub through: Lsn,
    pub digest: u64,
}

/// The digest of the committed groups `from..=through` (each default: the
/// oldest held, and the saved commit index). Fails naming an LSN outside
/// what this host holds and has committed.
pub fn prefix_digest(
    segments: &[(SegmentId, &[u8])],
    scanned: &[crate::wal::ScannedSegment],
    commit: u64,
    from: Option<Lsn>,
    through: Option<Lsn>,
) -> Result<PrefixDigest, String> {
    let bytes: std::collections::BTreeMap<SegmentId, &[u8]> = segments.iter().copied().collect();
    let groups: Vec<(SegmentId, &crate::wal::ScannedGroup)> = scanned
        .iter()
        .flat_map(|s| s.groups.iter().map(move |g| (s.id, g)))
        .filter(|(_, g)| g.lsn.0 <= commit)
        .collect();
    let (Some(first), Some(last)) = (groups.first(), groups.last()) else {
        return Err(format!("this host holds no committed group (its saved commit index is {commit})"));
    };
    let (oldest, committed) = (first.1.lsn, last.1.lsn);
    let from = from.unwrap_or(oldest);
    let through = through.unwrap_or(committed);
    if from < oldest || through > committed || from > through {
        return Err(format!(
            "this host holds committed groups {}..={} only; ask for a range inside it",
            oldest.0, committed.0
        ));
    }
    let mut h = xxhash_rust::xxh3::Xxh3::new();
    for (segment, g) in groups.iter().filter(|(_, g)| g.lsn >= from && g.lsn <= through) {
        h.update(&g.lsn.0.to_le_bytes());
        h.update(&g.epoch.0.to_le_bytes());
        h.update(&bytes[segment][g.offset as usize..g.end as usize]);
    }
    Ok(PrefixDigest { oldest, committed, from, through, digest: h.digest() })
}

/// raft-rs's configuration for node `id`: pre-vote and check-quorum on, the
/// election timeout pinned to one value, and its buffers capped by the
/// engine's limits (a message carries at most a group's worth of entries,
/// a `Ready` at most four groups, and what is proposed but uncommitted at
/// most what may wait for a commit).
pub fn raft_config(id: u64, limits: &Limits) -> raft::Config {
    raft::Config {
        id,
        election_tick: ELECTION_TICKS,
        heartbeat_tick: HEARTBEAT_TICKS,
        min_election_tick: ELECTION_TICKS,
        max_election_tick: ELECTION_TICKS + 1,
        pre_vote: true,
        check_quorum: true,
        max_size_per_msg: limits.group_bytes_max,
        max_inflight_msgs: 4,
        max_committed_size_per_ready: 4 * limits.group_bytes_max,
        max_uncommitted_size: limits.pending_bytes_max,
        // Followers learn a new commit index from the next append or
        // heartbeat rather than from an empty append per commit: only the
        // leader acts on commits, and each empty append costs every
        // follower a hard-state save.
        skip_bcast_commit: true,
        batch_append: true,
        ..raft::Config::default()
    }
}

/// Ticks to withhold from one node after its term or role changed, drawn
/// from the engine's seed (splitmix64): the only jitter elections get.
#[derive(Clone, Debug)]
pub struct TickJitter {
    state: u64,
}

impl TickJitter {
    pub fn new(seed: u64, node: u64) -> TickJitter {
        TickJitter { state: seed ^ node.wrapping_mul(0x9e37_79b9_7f4a_7c15) }
    }

    /// Ticks to withhold now, in `0..=JITTER_TICKS_MAX`.
    pub fn draw(&mut self) -> u64 {
        self.state = self.state.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.state;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        (z ^ (z >> 31)) % (JITTER_TICKS_MAX + 1)
    }
}

#[cfg(test)]
mod cluster_tests;
#[cfg(test)]
mod tests;
