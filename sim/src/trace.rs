//! The run's trace: every input to and output from the engine, with its
//! simulated time, folded into one hash (and printed with `--trace`). Two runs
//! of the same seed must give the same hash.

use skippr_core::Instant;
use skippr_core::{Input, IoOp, IoReply, Output, SinkOutcome, WalListing};
use skippr_core::{LeaseOp, OffsetsOp, PluginOp, WalOp};
use std::fmt::Write as _;
use xxhash_rust::xxh3::{xxh3_64, Xxh3};

const PENDING_MAX: usize = 4096;

pub struct Trace {
    hasher: Xxh3,
    /// Bytes not yet fed to the hasher: it is fed in large pieces, which
    /// gives the same hash as feeding each value on its own, faster.
    pending: Vec<u8>,
    print: bool,
    pub lines: Vec<String>,
}

impl Trace {
    pub fn new(print: bool) -> Trace {
        Trace { hasher: Xxh3::new(), pending: Vec::with_capacity(PENDING_MAX + 256), print, lines: Vec::new() }
    }

    pub fn hash(&self) -> u64 {
        let mut hasher = self.hasher.clone();
        hasher.update(&self.pending);
        hasher.digest()
    }

    fn update(&mut self, bytes: &[u8]) {
        self.pending.extend_from_slice(bytes);
        if self.pending.len() >= PENDING_MAX {
            self.hasher.update(&self.pending);
            self.pending.clear();
        }
    }

    pub fn note(&mut self, now: Instant, what: &str) {
        self.u64(now.as_micros());
        self.update(what.as_bytes());
        if self.print {
            self.lines.push(format!("{now} -- {what}"));
        }
    }

    /// Which host of a cluster the next input goes to (no text is made
    /// unless the trace is printed).
    pub fn host(&mut self, now: Instant, node: usize) {
        self.u64(now.as_micros());
        self.u64(0x686f_7374_0000_0000 | node as u64);
        if self.print {
            self.lines.push(format!("{now} -- h{}", node + 1));
        }
    }

    pub fn input(&mut self, now: Instant, input: &Input) {
        self.u64(now.as_micros());
        match input {
            Input::IoDone { id, result } => {
                self.u64(1);
                self.u64(id.0);
                match result {
                    Ok(reply) => self.reply(reply),
                    Err(e) => self.u64(100 + *e as u64),
                }
            }
            Input::Timeout => self.u64(2),
            Input::Shutdown => self.u64(3),
            Input::Peer(m) => {
                self.u64(4);
                self.message(m);
            }
            Input::Join { node, replaces } => {
                self.u64(5);
                self.u64(*node);
                self.u64(*replaces);
            }
            Input::SnapshotServed { to, ok } => {
                self.u64(6);
                self.u64(*to);
                self.u64(*ok as u64);
            }
            Input::Removed { by, node } => {
                self.u64(7);
                self.u64(*by);
                self.u64(*node);
            }
        }
        if self.print {
            self.lines.push(format!("{now} -> {}", describe_input(input)));
        }
    }

    pub fn output(&mut self, now: Instant, output: &Output) {
        self.u64(now.as_micros());
        match output {
            Output::Io { id, op } => {
                self.u64(10);
                self.u64(id.0);
                self.op(op);
            }
            Output::Recovered(s) => {
                self.u64(11);
                self.u64(s.next_lsn.0);
                self.u64(matches!(s.stop_record, skippr_core::StopRecordUse::Used) as u64);
            }
            Output::LogRestored(r) => {
                self.u64(26);
                self.u64(r.commit);
                self.u64(r.last_index);
                self.u64(matches!(r.stop_record, skippr_core::StopRecordUse::Used) as u64);
            }
            Output::Stopped(r) => {
                self.u64(12);
                self.update(format!("{r:?}").as_bytes());
            }
            Output::Stalled { for_, .. } => {
                self.u64(14);
                self.u64(for_.as_micros());
            }
            Output::Unstalled => self.u64(15),
            Output::WalFull { bytes, .. } => {
                self.u64(16);
                self.u64(*bytes);
            }
            Output::Refused { seq, letters, reasons, .. } => {
                self.u64(62);
                self.u64(seq.0);
                self.u64(letters.0);
                self.u64(reasons.len() as u64);
            }
            Output::TailCut { source, partition, kept } => {
                self.u64(64);
                self.u64(source.0 as u64);
                self.u64(*partition as u64);
                self.u64(*kept as u64);
            }
            Output::Split { seq, id, .. } => {
                self.u64(63);
                self.u64(seq.0);
                self.u64(id.0);
            }
            Output::WalRoom { bytes } => {
                self.u64(17);
                self.u64(*bytes);
            }
            Output::LeaseWait { holder, generation } => {
                self.u64(13);
                self.u64(*holder);
                self.u64(*generation);
            }
            Output::Send(m) => {
                self.u64(18);
                self.message(m);
            }
            Output::Role { term, leader, is_leader } => {
                self.u64(19);
                self.u64(*term);
                self.u64(*leader ^ (*is_leader as u64) << 63);
            }
            Output::TellRemoved { to } => {
                self.u64(22);
                self.u64(*to);
            }
            Output::JoinRefused { node, why } => {
                self.u64(20);
                self.u64(*node);
                self.update(why.as_str().as_bytes());
            }
            Output::Skip { key, at, next, position, recorded } => {
                self.u64(21);
                self.u64((key.source.0 as u64) << 32 | key.partition as u64);
                self.u64(at.0);
                self.u64(next.0);
                self.u64(position.0 ^ (*recorded as u64) << 63);
            }
            Output::BatchSkip { sink, stream, seq, recorded } => {
                self.u64(22);
                self.u64((sink.0 as u64) << 16 | stream.0 as u64);
                self.u64(seq.0 ^ (*recorded as u64) << 63);
            }
        }
        if self.print {
            self.lines.push(format!("{now} <- {}", describe_output(output)));
        }
    }

    fn u64(&mut self, v: u64) {
        self.update(&v.to_le_bytes());
    }

    /// A raft message: its kind, ends, term, position and entries (each
    /// entry's index, term and length: its bytes are the WAL's groups, and
    /// every host's requests that write them hash them).
    fn message(&mut self, m: &skippr_core::PeerMessage) {
        self.u64(m.get_msg_type() as u64 ^ m.from << 8 ^ m.to << 36);
        self.u64(m.term);
        self.u64(m.index ^ m.log_term << 40);
        self.u64(m.commit ^ (m.reject as u64) << 63);
        for e in &m.entries {
            self.u64(e.index ^ (e.data.len() as u64) << 40);
            self.u64(e.term);
        }
    }

    fn reply(&mut self, reply: &IoReply) {
        match reply {
            IoReply::Done => self.u64(20),
            IoReply::Segments(WalListing::Files(s)) => {
                self.u64(21);
                // The ids only: the sizes follow from the device's bytes.
                s.iter().for_each(|(id, _)| self.u64(id.0));
            }
            IoReply::Segments(WalListing::Objects(s)) => {
                self.u64(47);
                for (id, offsets) in s {
                    self.u64(id.0);
                    offsets.iter().for_each(|o| self.u64(*o));
                }
            }
            IoReply::SegmentBytes(b) => {
                self.u64(22);
                self.u64(xxh3_64(b));
            }
            IoReply::StopRecord(b) => {
                self.u64(25);
                self.u64(b.as_ref().map_or(0, |b| xxh3_64(b) | 1));
            }
            // What the groups hold is the WAL's (its appends are hashed):
            // how many and how long is enough.
            IoReply::Groups(groups) => {
                self.u64(49);
                groups.iter().for_each(|g| self.u64(g.len() as u64));
            }
            IoReply::Offsets(e) => {
                self.u64(23);
                for (k, v, _) in e {
                    self.u64(k.partition as u64);
                    self.update(v);
                }
            }
            // The simulator's sources never refuse; hashed all the same.
            IoReply::SourceRefused { why } => {
                self.u64(54);
                self.u64(xxh3_64(why.as_bytes()));
            }
            IoReply::Batches { batches, exhausted } => {
                self.u64(24 + *exhausted as u64);
                for b in batches {
                    self.u64(b.partition as u64);
                    self.u64(b.end.0);
                    self.u64(b.records.len() as u64);
                }
            }
            IoReply::Sink { outcome, rows } => {
                let code = match outcome {
                    SinkOutcome::Applied => 0,
                    SinkOutcome::AlreadyApplied => 1,
                    SinkOutcome::Retryable => 2,
                    SinkOutcome::Fatal => 3,
                    SinkOutcome::FatalUnnamed => 5,
                    SinkOutcome::Refused(list) => {
                        for r in list {
                            self.u64(r.index as u64);
                        }
                        4
                    }
                };
                self.u64(26 + code);
                self.u64(*rows);
            }
            IoReply::Schema { accept, .. } => self.u64(40 + *accept as u64),
            IoReply::Lease(row) => {
                self.u64(44);
                if let Some(row) = row {
                    self.lease(row);
                }
            }
            IoReply::HardState(b) => {
                self.u64(50);
                self.u64(xxh3_64(b));
            }
            IoReply::SinkProgress(applied) => {
                self.u64(46);
                for (stream, seq) in applied {
                    self.u64(stream.0 as u64 ^ seq.0 << 16);
                }
            }
        }
    }

    fn op(&mut self, op: &IoOp) {
        match op {
            IoOp::Wal(WalOp::Append { segment, offset, lsn, bytes }) => {
                self.u64(segment.0);
                self.u64(*offset);
                self.u64(lsn.0);
                self.u64(xxh3_64(bytes));
            }
            IoOp::Plugin(PluginOp::SinkApply(a) | PluginOp::DeadLetters(a)) => {
                if matches!(op, IoOp::Plugin(PluginOp::DeadLetters(_))) {
                    self.u64(61);
                }
                self.u64(a.id.0);
                self.u64(a.seq.0);
                // One-shot hashes: many small updates would copy every
                // record through the streaming hasher's buffer.
                let mut h = 0u64;
                for r in &a.records {
                    h = h.rotate_left(17) ^ xxh3_64(r);
                }
                self.u64(h);
            }
            IoOp::Wal(WalOp::Sync) => self.u64(30),
            IoOp::Wal(WalOp::ReadStopRecord) => self.u64(55),
            IoOp::Wal(WalOp::WriteStopRecord(b)) => {
                self.u64(56);
                self.u64(xxh3_64(b));
            }
            IoOp::Wal(WalOp::List) => self.u64(31),
            IoOp::Wal(WalOp::ReadAt { segment, offset, len }) => {
                self.u64(32 ^ segment.0 << 8);
                self.u64(*offset);
                self.u64(*len as u64)
            }
            IoOp::Wal(WalOp::ReadGroups { places }) => {
                self.u64(48);
                for place in places {
                    self.u64(place.segment.0);
                    self.u64(place.offset);
                }
            }
            IoOp::Wal(WalOp::Create { segment, header, size }) => {
                self.u64(33 ^ segment.0 << 8);
                self.u64(*size);
                self.update(header);
            }
            IoOp::Wal(WalOp::Delete { segment }) => self.u64(34 ^ segment.0 << 8),
            IoOp::Wal(WalOp::ReadHardState) => self.u64(51),
            IoOp::Wal(WalOp::InstallSnapshot(i)) => {
                self.u64(53);
                self.u64(i.from);
                self.update(&i.manifest.encode());
                self.u64(i.hard_state.0);
                self.update(&i.hard_state.1);
            }
            IoOp::Wal(WalOp::Replicate(r)) => {
                self.u64(52);
                r.remove.iter().for_each(|s| self.u64(s.0));
                for p in &r.zero {
                    self.u64(p.segment.0);
                    self.u64(p.offset);
                }
                for g in &r.groups {
                    self.u64(g.place.segment.0);
                    self.u64(g.place.offset);
                    self.u64(xxh3_64(&g.bytes));
                }
                if let Some((at, slot)) = &r.hard_state {
                    self.u64(*at);
                    self.u64(xxh3_64(slot));
                }
            }
            IoOp::Offsets(OffsetsOp::Read) => self.u64(35),
            IoOp::Offsets(OffsetsOp::Write { entries }) => {
                self.u64(36);
                for e in entries {
                    self.update(&e.value.encode());
                }
            }
            IoOp::Plugin(PluginOp::SourceOpen { source, resume, .. }) => {
                self.u64(37 ^ (source.0 as u64) << 8);
                for r in resume {
                    self.u64(r.position.0);
                }
            }
            IoOp::Plugin(PluginOp::SourceRead { source, records_max }) => {
                self.u64(38 ^ (source.0 as u64) << 8 ^ (*records_max as u64) << 32)
            }
            IoOp::Plugin(PluginOp::SourceAck { source, acks }) => {
                self.u64(39 ^ (source.0 as u64) << 8);
                for (p, pos) in acks {
                    self.u64(*p as u64 ^ pos.0 << 16);
                }
            }
            IoOp::Plugin(PluginOp::SchemaDecide { stream, fingerprint, .. }) => {
                self.u64(41 ^ (stream.0 as u64) << 8);
                self.u64(*fingerprint);
            }
            IoOp::Lease(LeaseOp::Read) => self.u64(42),
            IoOp::Plugin(PluginOp::SinkProgress { sink }) => self.u64(45 ^ (sink.0 as u64) << 8),
            IoOp::Lease(LeaseOp::Write { expected, row }) => {
                self.u64(43);
                self.u64(expected.map_or(u64::MAX, |v| v));
                self.lease(row);
            }
        }
    }

    fn lease(&mut self, row: &skippr_core::LeaseRow) {
        self.u64(row.generation);
        self.u64(row.holder);
        self.u64(row.version);
    }
}

pub fn describe_input(input: &Input) -> String {
    match input {
        Input::IoDone { id, result: Ok(reply) } => format!("done io{} {}", id.0, describe_reply(reply)),
        Input::IoDone { id, result: Err(e) } => format!("done io{} error {e:?}", id.0),
        Input::Timeout => "timeout".into(),
        Input::Shutdown => "shutdown".into(),
        Input::Peer(m) => format!("peer {}", describe_message(m)),
        Input::Join { node, replaces } => format!("join node {node} in place of {replaces}"),
        Input::Removed { by, node } => format!("node {by} says node {node} was removed"),
        Input::SnapshotServed { to, ok } => {
            format!("snapshot served to node {to}: {}", if *ok { "done" } else { "failed" })
        }
    }
}

fn describe_message(m: &skippr_core::PeerMessage) -> String {
    format!(
        "{:?} {}->{} term={} index={} log_term={} commit={} entries={}{}",
        m.get_msg_type(),
        m.from,
        m.to,
        m.term,
        m.index,
        m.log_term,
        m.commit,
        m.entries.len(),
        if m.reject { " reject" } else { "" }
    )
}

fn describe_reply(reply: &IoReply) -> String {
    match reply {
        IoReply::Done => "ok".into(),
        IoReply::Segments(WalListing::Files(s)) => {
            format!("segments {:?}", s.iter().map(|s| s.0 .0).collect::<Vec<_>>())
        }
        IoReply::Segments(WalListing::Objects(s)) => {
            let s: Vec<String> = s.iter().map(|(id, o)| format!("{}{:?}", id.0, o)).collect();
            format!("segments {}", s.join(" "))
        }
        IoReply::SegmentBytes(b) => format!("{} bytes", b.len()),
        IoReply::StopRecord(None) => "no stop record".into(),
        IoReply::StopRecord(Some(b)) => format!("stop record of {} bytes", b.len()),
        IoReply::Groups(groups) => {
            format!("{} groups, {} bytes", groups.len(), groups.iter().map(Vec::len).sum::<usize>())
        }
        IoReply::Offsets(e) => format!("{} offsets", e.len()),
        IoReply::SinkProgress(applied) => {
            let applied: Vec<String> = applied.iter().map(|(s, q)| format!("stream {}: {}", s.0, q.0)).collect();
            format!("sink progress [{}]", applied.join(", "))
        }
        IoReply::SourceRefused { why } => format!("refused: {why}"),
        IoReply::Batches { batches, exhausted } => {
            let mut s = String::from("batches");
            for b in batches {
                let _ = write!(s, " p{}:{}..{}", b.partition, b.records.first().map_or(0, |r| r.position.0), b.end.0);
            }
            if *exhausted {
                s.push_str(" exhausted");
            }
            s
        }
        IoReply::Sink { outcome, rows } => format!("{outcome:?} rows={rows}"),
        IoReply::Schema { accept, reason } => format!("schema accept={accept} {reason}"),
        IoReply::Lease(row) => format!("lease {row:?}"),
        IoReply::HardState(b) => format!("hard state, {} bytes", b.len()),
    }
}

pub fn describe_output(output: &Output) -> String {
    match output {
        Output::Io { id, op } => format!("io{} {}", id.0, describe_op(op)),
        Output::Recovered(s) => format!("recovered {s:?}"),
        Output::LogRestored(r) => format!("restored raft's log {r:?}"),
        Output::Stopped(r) => format!("stopped {r:?}"),
        Output::LeaseWait { holder, generation } => format!("lease held by {holder:x} (generation {generation})"),
        Output::Stalled { what, for_ } => format!("stalled: {what} failing for {for_:?}"),
        Output::Unstalled => "stall over".into(),
        Output::WalFull { bytes, limit } => format!("WAL full: {bytes} B of {limit}"),
        Output::WalRoom { bytes } => format!("WAL has room: {bytes} B"),
        Output::Refused { sink, stream, seq, letters, reasons } => format!(
            "refused by sink {} of stream {}, batch {}: {} records to dead-letter batch {} ({})",
            sink.0,
            stream.0,
            seq.0,
            reasons.len(),
            letters.0,
            reasons.first().map(String::as_str).unwrap_or_default()
        ),
        Output::Split { sink, stream, seq, id } => {
            format!("split by sink {} of stream {}, batch {}: its first half sent as {id}", sink.0, stream.0, seq.0)
        }
        Output::TailCut { source, partition, kept } => {
            format!("tail cut: source {} partition {partition} keeps {kept} digests", source.0)
        }
        Output::Skip { key, at, next, position, recorded } => {
            format!("skip {key:?} {}..{} at {} recorded {recorded}", at.0, next.0, position.0)
        }
        Output::BatchSkip { sink, stream, seq, recorded } => {
            format!("batch skip sink {} stream {} seq {} recorded {recorded}", sink.0, stream.0, seq.0)
        }
        Output::Send(m) => format!("send {}", describe_message(m)),
        Output::Role { term, leader, is_leader } => {
            format!("role term={term} leader={leader}{}", if *is_leader { " (this host)" } else { "" })
        }
        Output::TellRemoved { to } => format!("tell node {to} it was removed"),
        Output::JoinRefused { node, why } => format!("join of node {node} refused: {why}"),
    }
}

pub fn describe_op(op: &IoOp) -> String {
    match op {
        IoOp::Wal(WalOp::Sync) => "wal-sync".into(),
        IoOp::Wal(WalOp::List) => "wal-list".into(),
        IoOp::Wal(WalOp::ReadStopRecord) => "wal-read-stop-record".into(),
        IoOp::Wal(WalOp::WriteStopRecord(b)) => format!("wal-write-stop-record {} bytes", b.len()),
        IoOp::Wal(WalOp::ReadAt { segment, offset, len }) => format!("wal-read {} {offset}+{len}", segment.0),
        IoOp::Wal(WalOp::ReadGroups { places }) => {
            let at: Vec<String> = places.iter().map(|p| format!("{}@{}", p.segment.0, p.offset)).collect();
            format!("wal-read-groups {}", at.join(","))
        }
        IoOp::Wal(WalOp::Create { segment, .. }) => format!("wal-create {}", segment.0),
        IoOp::Wal(WalOp::Append { segment, offset, lsn, bytes }) => {
            format!("wal-append seg={} off={} lsn={} {}B", segment.0, offset, lsn.0, bytes.len())
        }
        IoOp::Wal(WalOp::Delete { segment }) => format!("wal-delete {}", segment.0),
        IoOp::Wal(WalOp::ReadHardState) => "wal-read-hard-state".into(),
        IoOp::Wal(WalOp::InstallSnapshot(i)) => format!(
            "wal-install-snapshot from={} index={} term={} segments={:?}",
            i.from,
            i.manifest.index,
            i.manifest.term,
            i.manifest.segments.iter().map(|s| s.id.0).collect::<Vec<_>>()
        ),
        IoOp::Wal(WalOp::Replicate(r)) => {
            let groups: Vec<String> = r
                .groups
                .iter()
                .map(|g| format!("{}@{}:{}", g.place.lsn.0, g.place.segment.0, g.place.offset))
                .collect();
            format!(
                "wal-replicate remove={:?} zero={} groups=[{}]{}",
                r.remove.iter().map(|s| s.0).collect::<Vec<_>>(),
                r.zero.len(),
                groups.join(" "),
                if r.hard_state.is_some() { " +hard-state" } else { "" }
            )
        }
        IoOp::Offsets(OffsetsOp::Read) => "offsets-read".into(),
        IoOp::Offsets(OffsetsOp::Write { entries }) => {
            let mut s = String::from("offsets-write");
            for e in entries {
                let _ = write!(s, " {}={}@{}", e.key, e.value.position.0, e.value.lsn.0);
            }
            s
        }
        IoOp::Plugin(PluginOp::SourceOpen { source, resume, .. }) => {
            let mut s = format!("source-open {}", source.0);
            for r in resume {
                let _ = write!(s, " p{}={}", r.partition, r.position.0);
            }
            s
        }
        IoOp::Plugin(PluginOp::SourceRead { source, records_max }) => {
            format!("source-read {} max={records_max}", source.0)
        }
        IoOp::Plugin(PluginOp::SourceAck { source, acks }) => {
            let mut s = format!("source-ack {}", source.0);
            for (p, pos) in acks {
                let _ = write!(s, " p{p}={}", pos.0);
            }
            s
        }
        IoOp::Plugin(PluginOp::SchemaDecide { stream, fingerprint, .. }) => {
            format!("schema-decide stream={} fingerprint={fingerprint:016x}", stream.0)
        }
        IoOp::Lease(LeaseOp::Read) => "lease-read".into(),
        IoOp::Plugin(PluginOp::SinkProgress { sink }) => format!("sink-progress {}", sink.0),
        IoOp::Lease(LeaseOp::Write { expected, row }) => format!(
            "lease-write if-version={expected:?} gen={} holder={:x} version={}",
            row.generation, row.holder, row.version
        ),
        IoOp::Plugin(PluginOp::DeadLetters(a)) => format!(
            "dead-letters sink={} stream={} id={} seq={} records={}",
            a.sink.0,
            a.stream.0,
            a.id,
            a.seq.0,
            a.records.len()
        ),
        IoOp::Plugin(PluginOp::SinkApply(a)) => format!(
            "sink-apply sink={} stream={} id={} seq={} records={}",
            a.sink.0,
            a.stream.0,
            a.id,
            a.seq.0,
            a.records.len()
        ),
    }
}
