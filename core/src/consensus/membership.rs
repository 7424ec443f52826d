//! Part `Membership`: who may take part in the cluster and how its members
//! change. It owns this host's `Members` record (cluster id, node id, the
//! ids removed for good, the learners that replace lost voters) and, on a
//! leader, the join asked for last. raft-rs owns the configuration itself
//! (`ConfState`); this part decides which change comes next and records
//! what raft-rs does not.
//!
//! A host whose data is gone comes back only under a new id, as a learner
//! (`cluster join`): the leader adds it with one simple change that names
//! the voter it replaces, and once the learner's log matches the leader's
//! commit index, one joint change promotes it and removes the old id; the
//! leader then leaves the joint configuration. One replacement at a time;
//! a removed id is refused forever (its messages are dropped, and it may
//! never join again).

use super::hard_state::Members;
use raft::eraftpb::{ConfChangeSingle, ConfChangeTransition, ConfChangeType, ConfChangeV2, ConfState};

/// Why a join is refused (`Output::JoinRefused`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum JoinRefusal {
    /// Asked of a host that does not lead: a joining host asks every peer,
    /// and only the leader acts.
    NotLeader,
    /// Asked of an engine that is not clustered.
    NotClustered,
    /// The id was removed from the cluster, for good.
    Removed,
    AlreadyMember,
    /// The node to replace is not a voter.
    NotAVoter,
    /// Another membership change is under way.
    ChangeUnderWay,
}

impl JoinRefusal {
    /// What the joining host is told.
    pub fn as_str(self) -> &'static str {
        match self {
            JoinRefusal::NotLeader => "this host does not lead the cluster: ask the leader",
            JoinRefusal::NotClustered => "this host is not in clustered mode",
            JoinRefusal::Removed => {
                "that node id was removed from the cluster and is refused forever: join under a new id"
            }
            JoinRefusal::AlreadyMember => "that node id is already a member",
            JoinRefusal::NotAVoter => "the node to replace is not a voter of the cluster",
            JoinRefusal::ChangeUnderWay => "another membership change is under way: ask again when it is done",
        }
    }
}

impl std::fmt::Display for JoinRefusal {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

/// A host asks to join in place of a lost voter.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Join {
    pub node: u64,
    pub replaces: u64,
}

pub struct Membership {
    members: Members,
    /// On a leader: the join asked for and not yet proposed.
    asked: Option<Join>,
}

/// Every id in `conf` (voters and learners, incoming and outgoing), ascending.
pub(super) fn all_ids(conf: &ConfState) -> Vec<u64> {
    let mut ids: Vec<u64> = [&conf.voters, &conf.learners, &conf.voters_outgoing, &conf.learners_next]
        .into_iter()
        .flatten()
        .copied()
        .collect();
    ids.sort_unstable();
    ids.dedup();
    ids
}

/// `conf` with every id list in ascending order (raft-rs builds them from
/// hash sets): the form saved and compared.
pub fn sorted(mut conf: ConfState) -> ConfState {
    for ids in [&mut conf.voters, &mut conf.learners, &mut conf.voters_outgoing, &mut conf.learners_next] {
        ids.sort_unstable();
    }
    conf
}

fn single(change_type: ConfChangeType, node_id: u64) -> ConfChangeSingle {
    let mut c = ConfChangeSingle::default();
    c.set_change_type(change_type);
    c.node_id = node_id;
    c
}

impl Membership {
    pub fn new(members: Members) -> Membership {
        Membership { members, asked: None }
    }

    pub fn members(&self) -> &Members {
        &self.members
    }

    /// Messages from a removed id are dropped.
    pub fn refuses(&self, from: u64) -> bool {
        self.members.removed.binary_search(&from).is_ok()
    }

    /// A leader is asked to let `join.node` replace `join.replaces`.
    pub fn ask(&mut self, join: Join, conf: &ConfState) -> Result<(), JoinRefusal> {
        if self.refuses(join.node) {
            return Err(JoinRefusal::Removed);
        }
        if all_ids(conf).contains(&join.node) {
            return Err(JoinRefusal::AlreadyMember);
        }
        if !conf.voters.contains(&join.replaces) {
            return Err(JoinRefusal::NotAVoter);
        }
        if !self.members.replacing.is_empty() || !conf.voters_outgoing.is_empty() || !conf.learners.is_empty() {
            return Err(JoinRefusal::ChangeUnderWay);
        }
        self.asked = Some(join);
        Ok(())
    }

    /// The change a leader makes next, if any (raft-rs allows one pending
    /// change at a time; the caller asks only when none is): leave a joint
    /// configuration; promote a learner that caught up, removing the voter
    /// it replaces; or add the learner asked for.
    pub fn next_change(&mut self, conf: &ConfState, caught_up: impl Fn(u64) -> bool) -> Option<ConfChangeV2> {
        if !conf.voters_outgoing.is_empty() {
            return Some(ConfChangeV2::default());
        }
        if let Some(&(learner, old)) = self.members.replacing.iter().find(|(l, _)| caught_up(*l)) {
            if conf.learners.contains(&learner) && conf.voters.contains(&old) {
                let mut cc = ConfChangeV2::default();
                cc.set_transition(ConfChangeTransition::Explicit);
                cc.changes =
                    vec![single(ConfChangeType::AddNode, learner), single(ConfChangeType::RemoveNode, old)].into();
                return Some(cc);
            }
        }
        let join = self.asked.take()?;
        if all_ids(conf).contains(&join.node) || self.refuses(join.node) || !conf.voters.contains(&join.replaces) {
            return None;
        }
        Some(ConfChangeV2 {
            changes: vec![single(ConfChangeType::AddLearnerNode, join.node)].into(),
            context: join.replaces.to_le_bytes().to_vec().into(),
            ..ConfChangeV2::default()
        })
    }

    /// A committed change was applied (`before` → `after`): a learner added
    /// in place of a voter is remembered until it is a voter, and every id
    /// that left the configuration is removed for good.
    pub fn applied(&mut self, cc: &ConfChangeV2, before: &ConfState, after: &ConfState) {
        if let ([c], Ok(old)) = (cc.changes.as_slice(), <[u8; 8]>::try_from(cc.context.as_ref())) {
            if c.get_change_type() == ConfChangeType::AddLearnerNode {
                self.members.replacing.push((c.node_id, u64::from_le_bytes(old)));
                self.members.replacing.sort_unstable();
            }
        }
        self.members.replacing.retain(|(learner, _)| after.learners.contains(learner));
        let now = all_ids(after);
        for id in all_ids(before) {
            if !now.contains(&id) && !self.refuses(id) {
                self.members.removed.push(id);
            }
        }
        self.members.removed.sort_unstable();
    }

    /// This host's own id was removed.
    pub fn self_removed(&self) -> bool {
        self.refuses(self.members.node)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn conf(voters: &[u64], learners: &[u64]) -> ConfState {
        ConfState::from((voters.to_vec(), learners.to_vec()))
    }

    /// raft-rs's own configuration machinery applies each change, as a
    /// raft node does when the entry commits.
    fn apply(raw: &mut raft::RawNode<raft::storage::MemStorage>, m: &mut Membership, cc: &ConfChangeV2) {
        let before = sorted(raw.raft.prs().conf().to_conf_state());
        let after = sorted(raw.apply_conf_change(cc).unwrap());
        m.applied(cc, &before, &after);
    }

    #[test]
    fn a_replacement_is_a_learner_then_one_joint_change_then_a_leave() {
        let storage = raft::storage::MemStorage::new_with_conf_state(conf(&[1, 2, 3], &[]));
        let config = raft::Config { id: 1, ..Default::default() };
        let mut raw = raft::RawNode::new(&config, storage, &slog::Logger::root(slog::Discard, slog::o!())).unwrap();
        let mut m = Membership::new(Members { node: 1, ..Members::default() });
        let c = |raw: &raft::RawNode<_>| sorted(raw.raft.prs().conf().to_conf_state());
        assert_eq!(m.next_change(&c(&raw), |_| true), None, "nothing asked");
        assert_eq!(m.ask(Join { node: 4, replaces: 7 }, &c(&raw)), Err(JoinRefusal::NotAVoter));
        assert_eq!(m.ask(Join { node: 3, replaces: 2 }, &c(&raw)), Err(JoinRefusal::AlreadyMember));
        m.ask(Join { node: 4, replaces: 2 }, &c(&raw)).unwrap();
        let add = m.next_change(&c(&raw), |_| false).unwrap();
        apply(&mut raw, &mut m, &add);
        assert_eq!((c(&raw).voters, c(&raw).learners), (vec![1, 2, 3], vec![4]));
        assert_eq!(m.members().replacing, vec![(4, 2)]);
        assert!(m.ask(Join { node: 5, replaces: 3 }, &c(&raw)).is_err(), "one replacement at a time");
        assert_eq!(m.next_change(&c(&raw), |_| false), None, "the learner has not caught up");
        let promote = m.next_change(&c(&raw), |id| id == 4).unwrap();
        apply(&mut raw, &mut m, &promote);
        let joint = c(&raw);
        assert_eq!((joint.voters, joint.voters_outgoing), (vec![1, 3, 4], vec![1, 2, 3]));
        assert!(m.members().replacing.is_empty() && m.members().removed.is_empty());
        let leave = m.next_change(&c(&raw), |_| true).unwrap();
        apply(&mut raw, &mut m, &leave);
        assert_eq!((c(&raw).voters, c(&raw).voters_outgoing), (vec![1, 3, 4], vec![]));
        assert_eq!(m.members().removed, vec![2]);
        assert!(m.refuses(2) && !m.refuses(4));
        let e = m.ask(Join { node: 2, replaces: 3 }, &c(&raw)).unwrap_err();
        assert_eq!(e, JoinRefusal::Removed);
        assert!(e.as_str().contains("refused forever"), "{e}");
        assert_eq!(m.next_change(&c(&raw), |_| true), None, "nothing left to do");
    }
}
