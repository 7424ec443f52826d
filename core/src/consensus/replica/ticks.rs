//! Time in part `Replica`: raft-rs's ticks, the ticks withheld after a
//! term or role change (the jitter that keeps split votes from repeating),
//! ticks that only count counted without their work, and open snapshot
//! transfers timing out.

use super::{Replica, ReplicaOutput};
use raft::{SnapshotStatus, StateRole};

impl Replica {
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

    /// After a term or role change the next ticks are withheld (the jitter
    /// that keeps split votes from repeating), and the engine hears of it.
    pub(super) fn observe(&mut self) {
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
