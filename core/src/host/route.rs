//! The coordinator's routing: each completion checked against its request
//! once and handed to the part that asked, each due timer fired, and what a
//! lease answer means for the other parts.

use super::*;

impl Host {
    pub(super) fn on_timeout(&mut self) {
        while let Some(what) = self.fx.pop_due() {
            self.fire(what);
        }
        if self.wal.segment_age_deadline(&self.cfg.limits).is_some_and(|at| at <= self.fx.now) {
            self.wal.request_seal();
        }
        if self.drain_deadline.is_some_and(|at| at <= self.fx.now) && self.holds_still() {
            self.stop_unrecorded();
        } else if self.drain_deadline.is_some_and(|at| at <= self.fx.now) {
            let stop = match self.handing_over {
                // Drained already; the handover did not happen in time.
                true => StopReason::Clean,
                false => self.finish_timed_out().unwrap_or(StopReason::DrainTimedOut),
            };
            self.close(stop);
        }
        match self.stall.on_timeout(self.fx.now) {
            StallAction::None => {}
            StallAction::Report { what, for_ } => self.fx.emit(Output::Stalled { what, for_ }),
            StallAction::Stop { what, for_ } => self.stop(StopReason::Stalled { what, for_ }),
        }
        if self.holds_still() {
            return;
        }
        if let Some(r) = self.authority.raft() {
            let news = r.on_timeout(&mut self.fx);
            self.on_raft_news(news);
            self.plan_membership();
        }
    }

    fn fire(&mut self, what: Retry) {
        let fx = &mut self.fx;
        match what {
            Retry::WalSync => {
                fx.io(Pending::WalSync, IoOp::Wal(WalOp::Sync));
            }
            Retry::WalList => {
                fx.io(Pending::WalList, IoOp::Wal(WalOp::List));
            }
            Retry::WalRead(_) => {
                self.startup.send_read(fx);
            }
            Retry::WalCheck(index) => self.startup.resend_check(fx, index),
            Retry::OffsetsRead => {
                fx.io(Pending::OffsetsRead, IoOp::Offsets(OffsetsOp::Read));
            }
            Retry::Commit => self.wal.send_commit(fx),
            Retry::Create => self.wal.retry_create(),
            Retry::Delete => {
                self.wal.retry_delete();
                if self.startup.deleting_junk() {
                    self.delete_next();
                }
            }
            Retry::OffsetsWrite => self.offsets.retry(),
            Retry::SourceOpen(source) => self.sources.open(fx, &self.committed, source),
            Retry::SourceRead(source) => self.sources.retry_read(source),
            Retry::SourceAck(source) => self.sources.retry_ack(source),
            Retry::SinkApply(sink, stream) | Retry::ReadBack(sink, stream) => self.dispatch(sink, stream),
            Retry::SchemaDecide(stream) => self.schemas.ask(fx, stream),
            Retry::LeaseRead => self.authority.held_lease().read(&mut self.fx),
            Retry::LeaseRenew => self.authority.held_lease().renew(&mut self.fx),
            Retry::HardStateRead => {
                fx.io(Pending::HardStateRead, IoOp::Wal(WalOp::ReadHardState));
            }
            Retry::RaftFetch => self.authority.held_raft().retry_fetch(&mut self.fx),
        }
    }

    pub(super) fn on_io(&mut self, id: IoId, pending: Pending, result: Result<IoReply, IoError>) {
        if let Some(lease) = pending.stall_side() {
            if self.stall.on_done(self.fx.now, lease, result.is_ok()) {
                self.fx.emit(Output::Unstalled);
            }
        }
        // Each completion is checked against its request here, once: the
        // parts get the typed answer they asked for.
        macro_rules! answer {
            ($pat:pat => $value:expr) => {
                result.map(|reply| match reply {
                    $pat => $value,
                    other => panic!("{pending:?} answered with {other:?}"),
                })
            };
        }
        let done = |result: Result<IoReply, IoError>| result.map(drop);
        match pending {
            Pending::WalSync => self.on_synced(done(result)),
            Pending::WalList => self.on_listed(answer!(IoReply::Segments(listing) => listing)),
            Pending::WalRead(segment) => self.on_segment_read(segment, answer!(IoReply::SegmentBytes(b) => b)),
            Pending::WalCheck(index) => self.on_check_read(index, answer!(IoReply::SegmentBytes(b) => b)),
            Pending::StopRecordRead => self.on_stop_record_read(answer!(IoReply::StopRecord(b) => b)),
            Pending::StopRecordWrite => self.on_stop_recorded(),
            Pending::OffsetsRead => self.on_offsets_read(answer!(IoReply::Offsets(entries) => entries)),
            Pending::SinkProgress(sink) => {
                // A sink that cannot answer cannot tell: nothing to check.
                let applied = answer!(IoReply::SinkProgress(applied) => applied).unwrap_or_default();
                self.on_sink_progress(sink, applied)
            }
            Pending::WalCreate(segment) => {
                if let Err(stop) = self.wal.on_created(&mut self.fx, segment, done(result)) {
                    self.stop(stop);
                }
            }
            Pending::WalAppend => self.on_append(id, done(result)),
            Pending::WalDelete(segment) => self.on_wal_deleted(segment, result.is_ok()),
            Pending::OffsetsWrite => self.offsets.on_written(&mut self.fx, id, result.is_ok(), &self.committed),
            Pending::OffsetsWriteEarly => {}
            Pending::SourceOpen(source) => self.sources.on_opened(&mut self.fx, source, result.is_ok()),
            Pending::SourceRead(source) => {
                if let Ok(IoReply::SourceRefused { why }) = result {
                    return self.stop(StopReason::SourceRefused { source, why });
                }
                let read = answer!(IoReply::Batches { batches, exhausted } => (batches, exhausted));
                self.on_source_read(source, read)
            }
            Pending::SourceAck(source) => self.sources.on_acked(&mut self.fx, id, source, result.is_ok()),
            Pending::SinkApply(sink, stream) => {
                self.on_sink_applied(id, sink, stream, answer!(IoReply::Sink { outcome, .. } => outcome))
            }
            Pending::DeadLetters(sink, stream) => {
                let outcome = answer!(IoReply::Sink { outcome, .. } => outcome);
                let settled = self.committed.settled.get(&(sink, stream));
                let news = self.compaction.on_letters(&mut self.fx, (id, sink, stream), outcome, settled);
                self.on_sink_news(sink, stream, news);
            }
            Pending::WalReadBack(sink, stream) => {
                self.on_read_back(id, sink, stream, answer!(IoReply::Groups(groups) => groups))
            }
            Pending::SchemaDecide(stream) => {
                self.on_schema_decided(stream, answer!(IoReply::Schema { accept, reason } => (accept, reason)))
            }
            Pending::LeaseRead(sent_at) => {
                let row = answer!(IoReply::Lease(row) => row);
                let news = self.authority.held_lease().on_read(&mut self.fx, sent_at, row);
                self.on_lease_news(news);
            }
            Pending::HardStateRead => self.on_hard_state_read(answer!(IoReply::HardState(b) => b)),
            Pending::WalReplicate(segment) => self.on_replicated(segment, done(result)),
            Pending::RaftFetch => self.on_fetched(answer!(IoReply::Groups(groups) => groups)),
            Pending::LeaseWrite(intent, row, sent_at) => {
                let news = self.authority.held_lease().on_written(&mut self.fx, intent, row, sent_at, done(result));
                self.on_lease_news(news);
            }
        }
    }

    fn on_wal_deleted(&mut self, segment: SegmentId, ok: bool) {
        let deleted = self.wal.on_deleted(&mut self.fx, segment, ok);
        if deleted && self.startup.deleting_junk() {
            self.delete_junk();
        } else if deleted && self.phase == Phase::Running && !self.wal.deletes_queued() && self.wal.is_full() {
            // Reaching the size limit asked for no snapshot while
            // deletions were queued; none is left to ask later.
            self.wal.make_room(&self.committed.acked, self.cfg.sinks.len() as u16);
        }
    }

    fn on_sink_applied(&mut self, id: IoId, sink: SinkId, stream: StreamId, outcome: Result<SinkOutcome, IoError>) {
        let slot = (sink, stream);
        let decided = self.cfg.dead_letters.map(|_| compact::Decided {
            next_letters: self.committed.next_letters.get(&slot).copied().unwrap_or_default(),
            at_ms: self.wall_ms(),
        });
        let chain = compact::Chain::of(&self.committed, slot);
        let bugs = self.letter_bugs();
        let news = self.compaction.on_reply(&mut self.fx, (id, sink, stream), outcome, (chain, decided, bugs));
        self.on_sink_news(sink, stream, news);
    }

    fn on_sink_news(&mut self, sink: SinkId, stream: StreamId, news: SinkNews) {
        match news {
            SinkNews::Quiet => {}
            SinkNews::Done(done) => self.done(done),
            SinkNews::Decided(crate::wal::Frame::Settled(x)) if x.letters.is_some() => {
                // The breaker: refusals stand only within its bound.
                let limits = self.cfg.dead_letters.unwrap_or_default();
                let standing = x.standing(self.committed.refusals_of((sink, stream))).iter();
                let standing = standing.map(|r| r.records.len() as u64).sum::<u64>() + x.quarantined;
                let refused = self.committed.breaker.refused_within(limits.window) + standing;
                if refused > limits.max {
                    let (max, window) = (limits.max, limits.window);
                    return self.stop(StopReason::DeadLetterLimit { sink, stream, refused, max, window });
                }
                self.wal.push(crate::wal::Frame::Settled(x));
            }
            SinkNews::Decided(frame) => self.wal.push(frame),
            SinkNews::Next => self.dispatch(sink, stream),
            SinkNews::Fatal(stop) => self.stop(stop),
        }
    }

    fn on_read_back(&mut self, id: IoId, sink: SinkId, stream: StreamId, bytes: Result<Vec<Vec<u8>>, IoError>) {
        let m = &self.cfg.mutations;
        let bugs = (m.has(Mutation::ReadBackWrongPartition), m.has(Mutation::ReadBackOneGroupOfARun));
        match self.compaction.on_read_back(&mut self.fx, (id, sink, stream), bytes, bugs) {
            ReadNews::Quiet => {}
            ReadNews::Next => self.dispatch(sink, stream),
            ReadNews::Stop(stop) => self.stop(stop),
        }
    }

    fn on_replicated(&mut self, segment: SegmentId, result: Result<(), IoError>) {
        match result {
            Ok(()) => {
                let news = self.authority.held_raft().persisted(&mut self.fx);
                self.on_raft_news(news);
            }
            // What reached the disk is for the next start's scan to judge;
            // raft must not hear of it as durable.
            Err(error) => self.stop(StopReason::WalWriteFailed { segment, error }),
        }
    }

    fn on_fetched(&mut self, groups: Result<Vec<Vec<u8>>, IoError>) {
        match groups {
            Ok(groups) => {
                let news = self.authority.held_raft().fetched(&mut self.fx, groups);
                self.on_raft_news(news);
            }
            Err(_) => self.authority.held_raft().fetch_failed(&mut self.fx),
        }
    }

    /// What a lease answer means for the other parts.
    fn on_lease_news(&mut self, news: LeaseNews) {
        match news {
            LeaseNews::Quiet | LeaseNews::Released => {}
            LeaseNews::Lost(stop) => self.stop(stop),
            LeaseNews::Acquired { renew_now, wait } => {
                match wait {
                    // Recovery starts once what the last holder sent has
                    // landed or failed.
                    Some(wait) => self.fx.schedule(self.fx.now + wait, Retry::WalSync),
                    None => {
                        self.fx.io(Pending::WalSync, IoOp::Wal(WalOp::Sync));
                    }
                }
                if renew_now {
                    self.authority.held_lease().renew(&mut self.fx);
                }
            }
            LeaseNews::Ours { sent_at, commit_verified } => {
                if commit_verified {
                    self.commit_landed();
                }
                match self.startup.resolve_doubt(sent_at) {
                    Doubt::Confirmed(stop) => return self.stop(stop),
                    Doubt::Early => return self.authority.held_lease().read(&mut self.fx),
                    Doubt::None => {}
                }
                self.lease_settled();
            }
            LeaseNews::Renewed => self.lease_settled(),
        }
    }

    /// A renewal or bump is confirmed, or the row read back is ours: carry
    /// on with what waited for it.
    fn lease_settled(&mut self) {
        let bump = self.authority.held_lease().settle(&mut self.fx);
        // Deleting junk during recovery waits for a valid lease.
        if self.startup.deleting_junk() {
            self.delete_next();
        }
        match bump {
            Bump::None => {}
            Bump::Reached => self.after_rebuild(),
            Bump::Pending => self.authority.held_lease().try_bump(&mut self.fx),
        }
    }
}
