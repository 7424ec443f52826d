//! Part `Replication`'s reads for a lagging follower: raft-rs asks for
//! groups this leader no longer holds in memory; they are read back from
//! its disk, and each is checked at its place before raft sends it.

use super::*;

/// What a group read back for a follower says when it is not the group
/// committed there.
const FETCH_INVALID: &str = "a group read back for a lagging follower fails validation";

impl Replication {
    /// Groups read back for a lagging follower arrived: each is checked
    /// as the group its place holds before raft sends it, so a flipped bit
    /// on this host's disk stops this host, not the followers it reaches.
    pub(in crate::host) fn fetched(&mut self, fx: &mut Effects, groups: Vec<Vec<u8>>) -> Vec<RaftNews> {
        fx.succeeded(Retry::RaftFetch);
        let places = self.fetching.take().expect("an answer implies a fetch");
        let damaged = places.iter().zip(&groups).find(|(p, bytes)| check_group(p.segment, p.lsn, bytes).is_none());
        if let Some((p, _)) = damaged {
            let what = FETCH_INVALID;
            return vec![RaftNews::Stop(StopReason::Corrupt(Corruption {
                segment: p.segment,
                offset: p.offset,
                what,
            }))];
        }
        self.replica_mut().expect("a fetch implies a replica").fetched(groups);
        self.drain(fx)
    }

    /// A read for a lagging follower failed: it goes again after a backoff.
    pub(in crate::host) fn fetch_failed(&mut self, fx: &mut Effects) {
        fx.retry_later(Retry::RaftFetch);
    }

    pub(in crate::host) fn retry_fetch(&mut self, fx: &mut Effects) {
        let places = self.fetching.clone().expect("a fetch retry implies a fetch");
        fx.io(Pending::RaftFetch, IoOp::Wal(WalOp::ReadGroups { places }));
    }
}
