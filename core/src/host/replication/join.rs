//! Part `Replication`'s membership changes: a joining host asks the
//! leader, which proposes the next change as a conf-change entry, one at a
//! time.

use super::*;

impl Replication {
    /// A leader is asked to let a host join (`Input::Join`).
    pub(in crate::host) fn ask_join(&mut self, fx: &mut Effects, join: Join) {
        let serving = self.node().is_some_and(|n| n.role.serving());
        let result = match self.replica_mut() {
            Some(r) if serving => r.ask_join(join),
            _ => Err(crate::consensus::membership::JoinRefusal::NotLeader),
        };
        if let Err(why) = result {
            fx.emit(Output::JoinRefused { node: join.node, why });
        }
    }

    /// The membership change a serving leader should make next, as the
    /// bytes of the frame that carries it, if one is due and none is queued
    /// or pending.
    pub(in crate::host) fn next_change(&mut self) -> Option<Vec<u8>> {
        if !self.serving() || self.change_queued {
            return None;
        }
        use protobuf::Message as _;
        let cc = self.replica_mut()?.next_change()?;
        self.change_queued = true;
        Some(cc.write_to_bytes().expect("a conf change encodes"))
    }
}
