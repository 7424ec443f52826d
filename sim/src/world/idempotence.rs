//! Recovery is idempotent, in every topology: on a copy of a host's WAL
//! device and offsets store, recovering twice gives the same state as
//! recovering once. The copies are driven by a second, small driver: every
//! request is performed at once, without faults, through the same device
//! `perform` as the world's.

use super::{Topology, World};
use crate::checker::invariant;
use crate::device::SimWal;
use crate::plugins::SimOffsets;
use skippr_core::testing::{CommittedState, LogRecord};
use skippr_core::{Host, HostConfig, Input, Instant, IoOp, IoReply, Lsn, Output, StopReason};
use skippr_core::{OffsetsOp, PluginOp, WalOp};
use std::collections::VecDeque;

/// What a recovery found: committed state, the WAL head, and the records
/// held for sinks (count, bytes).
/// The head is the LSN and the offset in the active segment: which segment
/// that is may differ (a first recovery that deleted junk at the end takes
/// the next id for its fence, a second one reuses the freed id), and the
/// fence itself is answered but not kept.
/// A clustered host adds raft's log as restored (see `Host::raft_log`), and
/// counts only the batches some sink has not acknowledged wholly (how many,
/// and the sum of their last positions: `Host::records_unacked`).
type Recovered = Result<(CommittedState, (Lsn, Option<u64>), (usize, u64), Option<RaftLog>), StopReason>;
type RaftLog = ((u64, u64, u64), LogRecord, u64);

/// The generation the copies' requests carry: no engine of the run has it.
const ALONE: u64 = u64::MAX;

impl<T: Topology> World<T> {
    /// Before an engine starts on WAL device `wal` and offsets store
    /// `store`: recovering alone from copies of them twice must give what
    /// recovering once gives. `config` is the engine's, alone: no lease to
    /// wait for, and no writes of its own kept (the fence is answered but
    /// not kept), so the second recovery reads what the first one read,
    /// less what the first one deleted.
    pub fn check_recovery_idempotent(&mut self, config: HostConfig, wal: usize, store: usize) {
        let mut wal = self.wals[wal].clone();
        let mut offsets = self.stores[store].clone();
        let before = (wal.changes(), offsets.read());
        let first = recover_alone(config.clone(), &mut wal, &mut offsets);
        if (wal.changes(), offsets.read()) == before {
            // The first recovery changed nothing it reads: a second one,
            // deterministic, would read and find the same.
            return;
        }
        let second = recover_alone(config, &mut wal, &mut offsets);
        if first != second {
            let detail = format!("first recovery {:?}, second {:?}", summary(&first), summary(&second));
            self.checker.fail(invariant::RECOVERY_NOT_IDEMPOTENT, detail);
        }
    }
}

impl<T: Topology> World<T> {
    /// Before an engine starts on WAL device `wal` (with offsets store
    /// `store`) that holds a stop record: recovering from copies with the
    /// record and without it must find the same committed state and the
    /// same WAL head; a clustered host, the same committed state, records
    /// held and raft log (its WAL head is where raft's log ends, in the
    /// log). A record that does not match the WAL is set aside, so only one
    /// the engine wrongly trusts can differ.
    ///
    /// On a WAL with a rotten bit, a scan that finds the damage where the
    /// start that trusts the record recovers is no difference: that start
    /// checks a group only when it reads it back for a sink, by design
    /// (seed 4387 of version 29: a tap's WAL kept the rotten segment past
    /// a shutdown).
    pub fn check_stop_record(&mut self, config: HostConfig, wal: usize, store: usize) {
        if !self.wals[wal].has_stop_record() {
            return;
        }
        let rotten = self.wals[wal].disk_stats().rot > 0;
        self.stats.stop_records_found += 1;
        let with = recover_alone(config.clone(), &mut self.wals[wal].clone(), &mut self.stores[store].clone());
        let mut without = self.wals[wal].clone();
        without.forget_stop_record();
        let scanned = recover_alone(config, &mut without, &mut self.stores[store].clone());
        let key = |r: &Recovered| {
            r.as_ref()
                .map(|(state, head, held, raft)| match raft {
                    None => (state.clone(), Some(*head), None, None),
                    Some(raft) => (state.clone(), None, Some(*held), Some(raft.clone())),
                })
                .map_err(Clone::clone)
        };
        let rot_found = rotten && with.is_ok() && matches!(scanned, Err(StopReason::Corrupt(_)));
        if key(&with) != key(&scanned) && !rot_found {
            let detail = format!("with the stop record {}, scanning {}", summary(&with), summary(&scanned));
            self.checker.fail(invariant::STOP_RECORD_UNFAITHFUL, detail);
        }
    }
}

fn summary(r: &Recovered) -> String {
    match r {
        Ok((state, (lsn, head), held, raft)) => {
            let raft = raft.as_ref().map(|((term, vote, commit), log, tail)| {
                let last = log.last_index();
                format!(" raft term {term} vote {vote} commit {commit} last {last} tail bytes {tail}")
            });
            let (partitions, raft) = (state.partitions.len(), raft.unwrap_or_default());
            format!("lsn {} head {head:?} partitions {partitions} records held {held:?}{raft}", lsn.0)
        }
        Err(e) => format!("{e:?}"),
    }
}

/// Runs one recovery to the point where sources would resume (a clustered
/// host: to where it waits for raft), performing its WAL and offsets
/// requests at once and without faults.
fn recover_alone(config: HostConfig, wal: &mut SimWal, offsets: &mut SimOffsets) -> Recovered {
    let clustered = config.cluster.is_some();
    let mut host = Host::new(config, Instant::ZERO).expect("valid config");
    let mut queue = VecDeque::new();
    let mut now = Instant::ZERO;
    let mut timeouts = 0;
    loop {
        while let Some(output) = host.poll_output() {
            match output {
                Output::Io { id, op } => queue.push_back((id, op)),
                Output::Recovered(_) => {
                    let (lsn, head) = host.wal_head();
                    return Ok((host.committed().clone(), (lsn, head.map(|h| h.1)), host.records_held(), None));
                }
                Output::Stopped(reason) => return Err(reason),
                Output::LeaseWait { .. } => unreachable!("recovering alone takes no lease"),
                Output::WalFull { .. } | Output::WalRoom { .. } => unreachable!("sources are read only after recovery"),
                Output::Stalled { .. } | Output::Unstalled => unreachable!("the simulator's engines watch no stalls"),
                Output::Skip { .. } | Output::BatchSkip { .. } => unreachable!("a recovery alone is given no skips"),
                Output::Refused { .. } | Output::Split { .. } => unreachable!("recovery sends nothing to sinks"),
                Output::TailCut { .. } => unreachable!("recovery closes no window"),
                // A clustered host alone: nobody hears it, and no peer joins.
                Output::Send(_)
                | Output::TellRemoved { .. }
                | Output::Role { .. }
                | Output::JoinRefused { .. }
                | Output::LogRestored(_) => {}
            }
        }
        let Some((id, op)) = queue.pop_front() else {
            if clustered {
                // A clustered host has restored its log and state from its
                // disk, and waits for raft: as far as it recovers alone.
                let (lsn, head) = host.wal_head();
                let (state, head) = (host.committed().clone(), (lsn, head.map(|h| h.1)));
                return Ok((state, head, host.records_unacked(), host.raft_log()));
            }
            // A retry after a failed read: its backoff passes at once.
            let Some((at, _)) = host.poll_timeout() else { panic!("recovery waits on nothing") };
            now = now.max(at);
            timeouts += 1;
            assert!(timeouts < 1_000, "recovery keeps retrying");
            host.handle(now, Input::Timeout);
            continue;
        };
        let result = match op {
            // The fence, or raft's saves: answered, not kept.
            IoOp::Wal(WalOp::Create { .. } | WalOp::Append { .. } | WalOp::Replicate(_)) => Ok(IoReply::Done),
            IoOp::Wal(op) => wal.perform(ALONE, op, false),
            IoOp::Offsets(OffsetsOp::Read) => Ok(IoReply::Offsets(offsets.read())),
            IoOp::Offsets(OffsetsOp::Write { entries }) => {
                offsets.write(&entries);
                Ok(IoReply::Done)
            }
            // The copies have no sinks: "cannot tell" is a valid answer.
            IoOp::Plugin(PluginOp::SinkProgress { .. }) => Ok(IoReply::SinkProgress(Vec::new())),
            _ => continue,
        };
        host.handle(now, Input::IoDone { id, result });
    }
}
