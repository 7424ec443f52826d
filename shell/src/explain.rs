//! What the engine's stops mean to an operator, beside the exit codes
//! (`exit.rs`) they map to: one line naming the cause and what to do, and
//! where the WAL is, for those lines.

use skippr_core::{Stall, StopReason};

/// Where the WAL is, for messages.
#[derive(Clone, Debug)]
pub enum WalPlace {
    Dir(std::path::PathBuf),
    /// `s3://bucket/prefix/`
    S3(String),
}

impl WalPlace {
    pub fn segment(&self, segment: skippr_core::SegmentId) -> String {
        match self {
            WalPlace::Dir(dir) => dir.join(format!("{:020}.seg", segment.0)).display().to_string(),
            WalPlace::S3(location) => format!("{location}{:020}/", segment.0),
        }
    }

    pub fn root(&self) -> String {
        match self {
            WalPlace::Dir(dir) => dir.display().to_string(),
            WalPlace::S3(location) => location.clone(),
        }
    }
}

/// One sentence on committed WAL that is not there, for the daemon's stop
/// and for `skipprd wal verify`; `name` says where a segment lives.
pub fn missing_message(m: &skippr_core::format::Missing, name: impl Fn(skippr_core::SegmentId) -> String) -> String {
    use skippr_core::format::Missing;
    match m {
        Missing::Gap { after, before, lsns } => {
            let range = lsns.map(|(a, b)| format!(", which held LSNs {} to {},", a.0, b.0)).unwrap_or_default();
            let what = if before.0 == after.0 + 2 {
                format!("segment {}{range} is missing", name(skippr_core::SegmentId(after.0 + 1)))
            } else {
                format!("the segments between {} and {}{range} are missing", name(*after), name(*before))
            };
            format!("the WAL is not whole: {what}; every segment after it continues from those LSNs")
        }
        Missing::Head { first, first_lsn, sink_name, key, source_name, acked, needed_to, .. } => format!(
            "the WAL is not whole: its oldest segment {} starts at LSN {}, but the segments before it were still \
             needed: sink '{sink_name}' has acknowledged source '{source_name}' partition {} only below position {}, \
             and the missing segments held its records up to position {}",
            name(*first),
            first_lsn.0,
            key.partition,
            acked.0,
            needed_to.0
        ),
    }
}

/// What an engine stop means to an operator: one line naming the cause and
/// what to do.
pub fn explain(reason: &StopReason, wal: &WalPlace) -> String {
    match reason {
        StopReason::Clean => "stopped cleanly".into(),
        StopReason::FinishedUnconfirmed { index, nodes } if nodes.is_empty() => format!(
            "the run is finished (its terminal entry committed at index {index}); this host lost its leader before \
             hearing that every member had learnt so, and stopped after the drain timeout"
        ),
        StopReason::FinishedUnconfirmed { index, nodes } => {
            let nodes: Vec<String> = nodes.iter().map(u64::to_string).collect();
            format!(
                "the run is finished (its terminal entry committed at index {index}), but node {} had not learnt so \
                 within the drain timeout. Such a node, started with --once, waits for a majority: start one other \
                 host without --once beside it, and stop that one with SIGTERM once the lagging node has exited",
                nodes.join(", node ")
            )
        }
        StopReason::DrainTimedOut => {
            "the shutdown drain timed out; the next start recovers from the WAL (raise --drain-timeout if sinks are slow)"
                .into()
        }
        StopReason::Corrupt(c) => format!(
            "committed WAL data is corrupt: {} at byte {}: {}. Nothing past it was delivered. Keep a copy of {} for \
             diagnosis; `skipprd wal verify` shows the damage. Restoring the segment from a replica or backup is \
             the only way to keep its records",
            wal.segment(c.segment),
            c.offset,
            c.what,
            wal.root()
        ),
        StopReason::WalIncomplete(m) => format!(
            "{}. Nothing was delivered from this WAL. Put the missing segments back (from the backup or copy they \
             came from) and start again; starting over from an empty DATA_DIR (or WAL prefix) re-reads the sources \
             into a fresh sink destination",
            missing_message(m, |id| wal.segment(id))
        ),
        StopReason::OffsetsAheadOfWal { key, store, wal } => format!(
            "the offsets store holds position {} for source {} partition {}, but the WAL only reaches {}: committed \
             WAL data is missing (a wiped or wrong data directory?). If that is deliberate, run `skipprd offsets reset` \
             and sources will resume from what the WAL holds",
            store.0, key.source.0, key.partition, wal.0
        ),
        StopReason::SinkAheadOfWal { sink, stream, applied, wal_next } => format!(
            "sink {} has applied batch {} of stream {}, but the WAL has planned batches only below {}: the WAL is \
             older than what the sink holds (a data directory restored from an older backup, or a new WAL beside \
             a destination an older one wrote). Nothing was delivered. Restore the newer WAL, or point the sink \
             at a fresh destination to start over",
            sink.0, applied.0, stream.0, wal_next.0
        ),
        StopReason::OffsetsMalformed { key, len } => format!(
            "the offsets store holds a {len}-byte value for source {} partition {} (expected 24): it is damaged or \
             not ours; `skipprd offsets reset` rebuilds it from the WAL",
            key.source.0, key.partition
        ),
        StopReason::WalReadFailed { segment } => format!(
            "WAL segment {} could not be read, even after retries (see the warnings above): recovery cannot \
             trust or skip it. Check the disk (or bucket) and its permissions, then start again",
            wal.segment(*segment)
        ),
        StopReason::WalWriteFailed { segment, error } => format!(
            "writing WAL segment {} failed ({error:?}); nothing unacknowledged was reported durable. Check the disk \
             and start again: recovery decides what the WAL holds",
            segment.0
        ),
        StopReason::Fenced { segment, offset } => format!(
            "another writer committed at {} byte {offset}, where this one was about to: a newer writer took \
             over this WAL (or raced this one). Nothing of this writer's that was not committed was acknowledged; \
             run only one daemon per WAL, and start this one again only if the other is gone",
            wal.segment(*segment)
        ),
        StopReason::LeaseLost { holder: 0, generation } => format!(
            "the WAL's writer lease passed to another writer while this one ran (it was paused or cut off for \
             longer than SKIPPR_LEASE_SECONDS), and that writer has since released it: no daemon holds the lease \
             of {} now (generation {generation}). Stopped without acknowledging anything more; the next start \
             takes the lease again",
            wal.root()
        ),
        StopReason::LeaseLost { holder, generation } => format!(
            "the WAL's writer lease was taken over (holder {holder:016x}, generation {generation}) while this \
             writer ran: another daemon is writing {}. Stopped without acknowledging anything more",
            wal.root()
        ),
        StopReason::SinkFatal { sink, stream, id, seq } => format!(
            "sink {} refused compaction {id} (batch {}) of stream {} as fatal; that stream is stopped. Fix the sink or \
             its destination, then start again: the batch is replayed with the same id",
            sink.0, seq.0, stream.0
        ),
        StopReason::SinkRefused { sink, stream, id, key, position, reason, refused } => format!(
            "sink {} refused {refused} record(s) of compaction {id} of stream {}, the first at partition {} position \
             {}: {reason}. Nothing of the batch took effect. Fix the record's destination (a column type, a \
             constraint), or start with --dead-letter dir (or postgres) to send such records to the dead letters (exactly once, \
             the decision kept in the WAL) and the rest on to the sink",
            sink.0, stream.0, key.partition, position.0
        ),
        StopReason::SinkProtocol { sink, stream, what } => format!(
            "sink {} broke the runtime protocol answering a batch of stream {}: {what}. Nothing of the batch is \
             counted as done; fix the sink, then start again",
            sink.0, stream.0
        ),
        StopReason::DeadLettersOff { sink, stream, seq } => format!(
            "batch {} of stream {} (sink {}) holds records refused (by the sink, or at intake) while dead letters \
             were on, and the decision is in the WAL: they can only go to the dead letters. Nothing of the batch \
             was sent. Start again with the --dead-letter settings of that run",
            seq.0, stream.0, sink.0
        ),
        StopReason::DeadLettersFatal { sink, stream, letters } => format!(
            "the dead-letter destination answered `fatal` for dead-letter batch {} (sink {}, stream {}): it holds \
             other bytes under that number (another pipeline or WAL writing the same place?). Nothing is lost: the \
             refusal is in the WAL and the batch is sent again at the next start. Fix the destination, then start \
             again",
            letters.0, sink.0, stream.0
        ),
        StopReason::DeadLetterLimit { sink, stream, refused, max, window } => format!(
            "records of stream {1} for sink {0} were refused (by the sink, or at intake) past the dead-letter \
             breaker: {refused} would be refused among the last {window} decided, and --dead-letter-max allows \
             {max}. Nothing of the batch is done (the next start asks the sink again). A destination that refuses \
             this much is likely misconfigured (a column type, a table), and a source whose records are refused \
             this much at intake likely sends something else than JSON lines: fix it, or raise --dead-letter-max \
             (or narrow --dead-letter-window) if these records really belong in the dead letters",
            sink.0, stream.0
        ),
        StopReason::SourceProtocol { source, partition, what } => {
            format!("source {} partition {partition} broke the protocol: {what}", source.0)
        }
        StopReason::SourceRefused { source, why } => format!(
            "source {} cannot go on: {why}. Nothing committed is lost",
            source.0
        ),
        StopReason::WindowTooLarge { source, limit } => format!(
            "source {}'s open window (the records a Singer tap sent since its last STATE) holds more than half \
             of the WAL's limit of {limit} bytes with the WAL full: its records stay in the WAL until the STATE \
             that closes the window, and a window may take at most half of it. Raise --wal-max-bytes \
             (WAL_MAX_BYTES) above twice the largest window, or make the tap send STATE more often. Nothing \
             committed is lost; the next start sends the window again",
            source.0
        ),
        StopReason::BatchSkipNotOpen { stream, seq, next, settled: false, .. } => format!(
            "--skip-batch names batch {} of stream {}, but the WAL has planned that stream's batches only up to {} \
             (the first not planned): only a batch the sink was sent can be given up. Nothing was skipped; copy \
             the option from the message of the stop that named the batch",
            seq.0,
            stream.0,
            next.0.saturating_sub(1)
        ),
        StopReason::BatchSkipNotOpen { stream, seq, settled: true, .. } => format!(
            "--skip-batch names batch {} of stream {}, which its sink holds already (the WAL settled it) and whose \
             dead letters are still to be delivered: it cannot be given up. Nothing was skipped; fix the dead-letter \
             destination instead",
            seq.0, stream.0
        ),
        StopReason::SkipNotNext { key, at, next, position } => format!(
            "--skip-input names positions {}..{} of partition {}, but the WAL has committed that partition up to \
             position {} (inside that span): a skip must start at or after what is committed, so this one would \
             give up input that is already delivered. Nothing was skipped; copy the option from the latest refusal \
             message",
            at.0, next.0, key.partition, position.0
        ),
        StopReason::NamesChanged { kind, index, wal, config } => format!(
            "the WAL knows {kind} #{index} as '{wal}', but the configuration calls it '{config}': {kind}s are \
             identified by their place in the configuration, so keep existing ones in order and add new ones at \
             the end (or start a new DATA_DIR)"
        ),
        StopReason::SchemaRejected { stream, fingerprint, reason } => format!(
            "the schema plugin refused schema {fingerprint:016x} of stream {}: {reason}. Nothing under it was \
             committed; fix the source or the schema plugin and start again (or, with --dead-letter on, the records \
             under a refused schema go to the dead letters instead)",
            stream.0
        ),
        StopReason::Stalled { what: what @ (Stall::RaftNoPeer | Stall::RaftQuorum), for_ } => format!(
            "no raft leader with a majority for {:.0} s ({}), and --once gives up after \
             SKIPPR_STALL_EXIT_SECONDS. If the other hosts finished this --once run and exited, this host has \
             nothing left to do: they hold every record committed. Otherwise start the other hosts, or check \
             SKIPPR_CLUSTER_PEERS and the network between them; nothing committed is lost, and the next start \
             recovers from the WAL ({})",
            for_.as_micros() as f64 / 1e6,
            match what {
                Stall::RaftNoPeer => "no peer sent this host a single message",
                _ => "peers answered, but no majority formed",
            },
            wal.root()
        ),
        StopReason::Stalled { what, for_ } => format!(
            "the {what} made no progress for {:.0} s (every request failed; the last warning above names the \
             cause), and --once gives up after SKIPPR_STALL_EXIT_SECONDS. Nothing committed is lost: fix the \
             endpoint or disk, then start again and recovery carries on from the WAL ({})",
            for_.as_micros() as f64 / 1e6,
            wal.root()
        ),
        StopReason::SegmentTooSmall { needed } => {
            format!("WAL_BYTES_PER_FILE is too small for the engine's snapshot: use at least {needed} bytes")
        }
        StopReason::Deposed { term } => format!(
            "this host led raft term {term} and another host leads now; it acknowledged nothing that a majority \
             had not made durable, and the next start follows the new leader"
        ),
        StopReason::ClusterLog { what } => {
            format!(
                "this host's clustered WAL cannot be trusted, so it will not vote: {what} ({}); the others hold \
                 what was committed: bring this host back on an empty DATA_DIR under a new node id with \
                 `skipprd cluster join --replaces <this node's id>`",
                wal.root()
            )
        }
        StopReason::NotMember { what } => format!("this host takes no part in the cluster: {what} ({})", wal.root()),
        StopReason::SnapshotInstalled { index } => format!(
            "this host was too far behind its leader and installed the leader's segments through LSN {index}; \
             the next start recovers from them ({})",
            wal.root()
        ),
    }
}
