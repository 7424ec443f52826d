//! The network between the hosts: raft messages delayed, lost and
//! duplicated, a removed node's word, and partitions.

use super::{Event, Raft};
use crate::rng::Die;
use crate::world::World;
use skippr_core::*;

impl World<Raft> {
    pub(super) fn send(&mut self, m: Box<PeerMessage>) {
        if m.get_msg_type() == PeerMessageType::MsgAppend {
            self.topo.model.on_append_sent(m.from, m.term);
        }
        let c = &self.scenario.cluster;
        let (loss, dup, net) = (c.net_loss, c.net_duplicate, c.net);
        if self.fault(Die::Network, loss) {
            self.stats.messages_lost += 1;
            return;
        }
        if self.fault(Die::Network, dup) {
            self.stats.messages_duplicated += 1;
            self.after_topo(Die::Network, net, Event::Deliver(m.clone()));
        }
        self.after_topo(Die::Network, net, Event::Deliver(m));
    }

    /// A partition for a while: one host cut off from the others, or able
    /// to hear them but not to be heard (asymmetric), or, with five hosts,
    /// the leader cut off together with one other.
    pub(super) fn partition(&mut self) {
        let hosts = self.procs.len() as u64;
        let r = self.dice.roll(Die::ClusterFault);
        let kind = r.range(0, 2);
        let leader = (0..self.procs.len()).find(|&i| self.topo.members[i].leader).map(|i| i as u64 + 1);
        let first = leader.filter(|_| r.chance(0.6)).unwrap_or_else(|| r.range(1, hosts));
        let mut side = vec![first];
        if kind == 2 && hosts >= 5 {
            side.push(first % hosts + 1);
        }
        for &a in &side {
            for b in (1..=hosts).filter(|b| !side.contains(b)) {
                if kind != 1 {
                    self.topo.blocked.insert((b, a));
                }
                self.topo.blocked.insert((a, b));
            }
        }
        self.stats.partitions += 1;
        self.trace.note(self.now(), &format!("partition {side:?} kind {kind}"));
        let span = 30 * self.scenario.cluster.ticks[0].as_micros();
        self.after_topo(Die::ClusterFault, (span / 2, span * 3), Event::Heal);
    }

    /// Node `node` says a removed node's messages are no longer heard.
    pub(super) fn tell_removed(&mut self, node: usize, to: u64) {
        self.stats.removed_told += 1;
        let by = self.topo.members[node].id;
        let net = self.scenario.cluster.net;
        self.after_topo(Die::Network, net, Event::TellRemoved { by, to });
    }

    /// A message reaches its node, unless the link is cut or nobody runs there.
    pub(super) fn deliver(&mut self, m: Box<PeerMessage>) {
        // An id that no host runs (any longer): nobody hears it.
        let Some(&to) = self.topo.slot_of.get(&m.to) else { return };
        let from = self.topo.slot_of.get(&m.from).map_or(0, |&s| s as u64 + 1);
        if !self.topo.blocked.contains(&(from, to as u64 + 1)) && self.procs[to].host.is_some() {
            self.feed(to, Input::Peer(m));
        }
    }

    pub(super) fn deliver_removed(&mut self, by: u64, to: u64) {
        let Some(&slot) = self.topo.slot_of.get(&to) else { return };
        let from = self.topo.slot_of.get(&by).map_or(0, |&s| s as u64 + 1);
        if !self.topo.blocked.contains(&(from, slot as u64 + 1)) && self.procs[slot].host.is_some() {
            self.feed(slot, Input::Removed { by, node: to });
        }
    }
}
