//! The coordinator's clustered-mode sequences (owns no state): reading the
//! hard state at start, restoring the log and the committed state through
//! raft's commit index, routing what raft decides, applying groups other
//! hosts' leaders committed, and serving once this host leads a term in
//! which its own group has committed.
//!
//! Losing leadership stops the engine (`StopReason::Deposed`): everything
//! only a leader holds (accepted positions, planned but uncommitted work,
//! acks in flight) goes with it, and the next start follows the new leader
//! from the disk. A crash-only step, so that no leader-only state can
//! outlive the leadership it depended on.

use super::replication::RaftNews;
use super::*;
use crate::consensus::entry::EntryGroup;
use crate::consensus::log::{Log, RestoreError};
use crate::consensus::membership::Join;
use crate::recovery::{rebuild, RecoveredWal, WalDamage};
use crate::wal::{check_group, Frame};

impl Host {
    pub(super) fn on_hard_state_read(&mut self, result: Result<Vec<u8>, IoError>) {
        let Ok(file) = result else { return self.fx.retry_later(Retry::HardStateRead) };
        self.fx.succeeded(Retry::HardStateRead);
        let segment_bytes = self.cfg.limits.segment_bytes;
        if let Err(stop) = self.authority.held_raft().on_hard_state(&file, segment_bytes) {
            return self.stop(stop);
        }
        self.fx.io(Pending::WalList, IoOp::Wal(WalOp::List));
    }

    /// Recovery in clustered mode, once the streaming scan has read every
    /// segment: raft's log built from every group, the committed state
    /// rebuilt only through raft's commit index (later groups wait for
    /// raft), no fence (raft's own entry at a new term is one) and no
    /// plugins until this host serves.
    pub(super) fn restore_cluster(
        &mut self,
        scanned: Result<RecoveredWal, WalDamage>,
        log: Result<Option<Log>, RestoreError>,
    ) {
        let now = self.fx.now;
        let restored = self.authority.held_raft().restore(&mut self.fx, log, &self.cfg.limits, now);
        let (genesis, segment_bytes) = match restored {
            Ok(restored) => restored,
            Err(stop) => return self.stop(stop),
        };
        // Segment size comes from the log, not from this host's setting.
        self.cfg.limits.segment_bytes = segment_bytes;
        if let Err(e) = self.cfg.validate() {
            let what = format!("the cluster's segment size {segment_bytes} does not fit this host's limits: {e}");
            return self.stop(StopReason::ClusterLog { what });
        }
        // A first start's WAL is the genesis group alone.
        let recovered = match genesis {
            Some(genesis) => rebuild(genesis, true),
            None => scanned,
        };
        let mut wal = match recovered {
            Ok(wal) => wal,
            Err(WalDamage::Corrupt(c)) => return self.stop(StopReason::Corrupt(c)),
            Err(WalDamage::Missing(m)) => return self.stop(StopReason::WalIncomplete(m)),
        };
        if let Some(stop) = recover::names_changed(&wal.state.names, &self.names) {
            return self.stop(stop);
        }
        self.wal.set_replicated();
        self.wal.restore(&mut wal, now);
        self.committed = wal.state;
        // Every host's store holds what its committed log says, also what
        // it recovered without applying (a snapshot installed, a crash
        // before the last write): written again, the store keeps the newer.
        for (key, p) in &self.committed.partitions {
            self.offsets.committed(*key, p, false);
        }
        self.records = wal.records;
        self.records.set_limits(self.cfg.limits.records());
        if self.cfg.mutations.has(Mutation::DeleteDuringRecovery) {
            // The planted bug: the oldest sealed segment goes at once,
            // without raft's log moving past it.
            self.wal.delete_oldest_now();
            self.wal.delete_next(&mut self.fx, true);
        }
        let (commit, last_index, uncommitted_bytes) = self.authority.held_raft().restored();
        let (scanned_bytes, scan_time) = self.startup.read();
        self.fx.emit(Output::LogRestored(LogRestored {
            scanned_bytes,
            scan_time,
            commit,
            last_index,
            uncommitted_bytes,
            stop_record: self.startup.stop_record(),
        }));
    }

    /// Routes what raft decided, in order.
    pub(super) fn on_raft_news(&mut self, news: Vec<RaftNews>) {
        for n in news {
            if self.phase == Phase::Stopped {
                return;
            }
            match n {
                RaftNews::Committed(c) => {
                    if self.wal.replicated_commit(c.group.place.lsn) {
                        self.commit_landed();
                    } else {
                        self.apply_replicated(&c.group);
                    }
                }
                RaftNews::Serving { term } => self.serve(term),
                // A handover at a SIGTERM deposes this host, as planned: it
                // follows (its vote may be needed) until the successor leads.
                RaftNews::Deposed { .. } if self.handing_over => {}
                // Asked to stop and deposed on the way (the last hosts of a
                // cluster stopped one by one lose their majority): what it
                // did not finish, its successor or its next start replays.
                RaftNews::Deposed { .. } if self.asked_to_stop => self.seal(StopReason::Clean),
                RaftNews::Deposed { term } => self.stop(StopReason::Deposed { term }),
                RaftNews::LeaderConfirmed => {
                    if let startup::Doubt::Confirmed(stop) = self.startup.resolve_doubt(self.fx.now) {
                        self.stop(stop);
                    }
                }
                // Draining (asked to stop, or `--once` and the run's end
                // learnt): the drain deadline ends the wait, with what it
                // means; a stall stop would hide it.
                RaftNews::Stop(StopReason::Stalled { .. }) if self.drain_deadline.is_some() => {}
                RaftNews::Stop(stop) => self.stop(stop),
            }
        }
    }

    /// A group some leader committed (another host's, or this one's from
    /// before it served): its frames change the committed state and the
    /// records held for sinks, and nothing else.
    fn apply_replicated(&mut self, group: &EntryGroup) {
        let place = group.place;
        let Some((scanned, _)) = check_group(place.segment, place.lsn, &group.bytes) else {
            let what = format!("the committed group at LSN {} does not decode", place.lsn.0);
            return self.stop(StopReason::ClusterLog { what });
        };
        self.wal.note_replicated(place, &scanned.frames);
        let snapshot = scanned.frames.iter().any(|f| matches!(f, Frame::Snapshot(_)));
        for frame in scanned.frames {
            self.committed.apply(place.lsn, &frame);
            match frame {
                Frame::SourceBatch(b) if b.provisional => self.records.push_provisional(b.key, place, b.records),
                Frame::SourceBatch(b) => {
                    // Every host materializes offsets from its committed log
                    // into its own store.
                    self.offsets.committed(b.key, &self.committed.partitions[&b.key], false);
                    self.records.push(b.key, place, b.records);
                }
                Frame::Window(x) => self.window_ended(&x),
                Frame::Skipped(k) => {
                    if let Some(p) = self.committed.partitions.get(&k.key).filter(|p| p.lsn == place.lsn) {
                        self.offsets.committed(k.key, p, false);
                    }
                }
                Frame::CompactionDone(done) => self.prune_acked(done.stream),
                Frame::BatchSkipped(k) => self.prune_acked(k.stream),
                _ => {}
            }
        }
        if snapshot {
            // The deletion rule, with the acknowledgements committed through
            // this group (the leader's own rule uses those committed when it
            // built the snapshot, which may only be behind).
            let sinks = self.cfg.sinks.len() as u16;
            self.wal.plan_deletions(place.lsn, &self.committed.acked, sinks, false);
        }
    }

    /// A group of this leader's own term committed, so everything committed
    /// before is applied: the writer takes the term as its epoch and the
    /// log's end as its place, and recovery's leader half runs (the offsets
    /// store and sinks checked, open compactions replayed with their ids,
    /// sources resumed from committed positions).
    fn serve(&mut self, term: u64) {
        if self.phase != Phase::Recovering {
            // Leading again after its handover deposed it (a SIGTERM's
            // drain): what it holds is its old term's, and its writer's
            // epoch too. It was asked to stop: it stops, never writing
            // under the old epoch (seed 18193 of simulator version 23).
            if self.handing_over {
                self.seal(StopReason::Clean);
            }
            return;
        }
        self.wal.set_epoch(Epoch(term));
        let end = self.authority.held_raft().log_end();
        self.wal.follow_log(&end, self.fx.now);
        self.fenced();
    }

    /// Clustered mode: a host that does not serve still writes the offsets
    /// its committed log holds into its own store (`pump` writes them for
    /// one that serves); a store all hosts share is the leader's alone.
    pub(super) fn materialize_offsets(&mut self) {
        if self.authority.raft_ref().is_some_and(|r| !r.serving() && !r.shared_offsets()) {
            self.offsets.write(&mut self.fx, &self.committed);
        }
    }

    /// Clustered mode: the writer's next group goes where the log ends, and
    /// a group it built is proposed.
    pub(super) fn propose_next(&mut self) {
        let Some(r) = self.authority.raft() else { return };
        if !r.serving() {
            return;
        }
        let end = r.log_end();
        self.wal.follow_log(&end, self.fx.now);
    }

    pub(super) fn send_proposal(&mut self) {
        let Some((segment, offset, bytes, change)) = self.wal.take_proposal() else { return };
        let segment_bytes = self.cfg.limits.segment_bytes;
        let news = self.authority.held_raft().propose(&mut self.fx, segment, offset, &bytes, segment_bytes, change);
        self.on_raft_news(news);
    }

    /// A serving leader's next membership change rides the WAL writer's
    /// next group, as one of its frames.
    pub(super) fn plan_membership(&mut self) {
        let Some(r) = self.authority.raft() else { return };
        if let Some(change) = r.next_change() {
            self.wal.push(Frame::Membership(change));
        }
    }

    pub(super) fn on_join(&mut self, node: u64, replaces: u64) {
        match self.authority.raft() {
            Some(r) => r.ask_join(&mut self.fx, Join { node, replaces }),
            None => {
                self.fx.emit(Output::JoinRefused { node, why: crate::consensus::membership::JoinRefusal::NotClustered })
            }
        }
    }
}
