//! This host's role as the engine sees it: following, or leading a term,
//! and serving once a group of that term has committed. Each transition
//! pushes the news the coordinator acts on.

use super::RaftNews;
use crate::consensus::replica::CommittedGroup;

pub(super) enum Role {
    Following,
    /// This host leads `term` (it has seen itself become leader); `serving`
    /// once a group of that term has committed. Only then may it commit,
    /// acknowledge, write offsets or run plugins.
    Leading {
        term: u64,
        serving: bool,
    },
}

impl Role {
    pub(super) fn serving(&self) -> bool {
        matches!(self, Role::Leading { serving: true, .. })
    }

    /// The term this host leads.
    pub(super) fn led(&self) -> Option<u64> {
        match self {
            Role::Leading { term, .. } => Some(*term),
            Role::Following => None,
        }
    }

    /// raft-rs reports a term or role change. A leader of another term, or
    /// no leader, is deposed. `serve_early`: the planted bug
    /// `serve-before-term-commit`, serving as soon as it leads.
    pub(super) fn changed(&mut self, term: u64, is_leader: bool, serve_early: bool, news: &mut Vec<RaftNews>) {
        if let Some(led) = self.led() {
            if !is_leader || term != led {
                news.push(RaftNews::Deposed { term: led });
                *self = Role::Following;
            }
        }
        if is_leader {
            let mut serving = self.serving();
            if serve_early && !serving {
                serving = true;
                news.push(RaftNews::Serving { term });
            }
            *self = Role::Leading { term, serving };
        }
    }

    /// A group is committed: it is news, and when it is the first of this
    /// leader's own term, this host starts serving.
    pub(super) fn committed(&mut self, c: CommittedGroup, news: &mut Vec<RaftNews>) {
        let term = c.term;
        let own = self.led() == Some(term) && !self.serving();
        news.push(RaftNews::Committed(c));
        if own {
            *self = Role::Leading { term, serving: true };
            news.push(RaftNews::Serving { term });
        }
    }
}
