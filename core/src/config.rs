//! `HostConfig`: names, limits and the seed. Validated once, at construction.

use crate::mutation::Mutations;
use crate::time::Duration;
use crate::wal::{COMMIT_FRAME_BYTES, FRAME_HEADER_BYTES, GROUP_BYTES_LIMIT, SEGMENT_HEADER_BYTES};
use std::fmt;

#[derive(Clone, Debug)]
pub struct HostConfig {
    /// Seeds the engine's only randomness (retry jitter).
    pub seed: u64,
    pub sources: Vec<String>,
    pub sinks: Vec<String>,
    pub streams: Vec<String>,
    pub limits: Limits,
    /// Drain and stop once every source has said it is exhausted (`--once`).
    pub stop_when_exhausted: bool,
    /// A schema plugin decides new schemas; without one, every schema is
    /// accepted (and the decision still committed).
    pub schema_plugin: bool,
    /// A writer lease guards the WAL (S3 mode); `None` where the driver
    /// guarantees one writer itself (the disk mode's directory lock).
    pub lease: Option<LeaseConfig>,
    /// Clustered mode: this host's raft node and its peers; `None` in the
    /// disk and S3 modes.
    pub cluster: Option<ClusterConfig>,
    pub mutations: Mutations,
    /// Input an operator gives up (`run --skip-input`), recorded in the WAL
    /// at the start of the run.
    pub skips: Vec<SkipRequest>,
    /// Open plans an operator gives up (`run --skip-batch`), recorded in
    /// the WAL at the end of recovery, before they are sent again.
    pub batch_skips: Vec<BatchSkipRequest>,
    /// Records a sink refuses go to a dead-letter destination (`run
    /// --dead-letter`), within the breaker's bound; `None`: a refusal
    /// stops the engine.
    pub dead_letters: Option<DeadLetters>,
    /// The Unix time, in milliseconds, of the engine's `Instant::ZERO`: the
    /// time a refusal is decided is this plus `now` (the daemon's wall
    /// clock at start; a fixed value in the simulator).
    pub wall_origin_ms: u64,
}

/// The input of one partition from `at` (included) to `next` (not
/// included), given up by an operator's command, and why: typically the
/// one record a source sent that the intake rules refuse.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SkipRequest {
    pub key: crate::ids::PartitionKey,
    pub stream: crate::ids::StreamId,
    pub at: crate::ids::Position,
    pub next: crate::ids::Position,
    pub reason: String,
}

/// Batch `seq` of (sink, stream), given up by an operator's command, and
/// why: typically one its sink answers `fatal` and no fix of the
/// destination will take.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct BatchSkipRequest {
    pub sink: crate::ids::SinkId,
    pub stream: crate::ids::StreamId,
    pub seq: crate::ids::CompactionSeq,
    pub reason: String,
}

/// The dead-letter breaker: the engine stops (`StopReason::DeadLetterLimit`)
/// rather than let more than `max` records be refused among the last
/// `window` decided (held by the sink or refused), counted from the WAL.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct DeadLetters {
    pub max: u64,
    pub window: u64,
}

impl Default for DeadLetters {
    fn default() -> Self {
        DeadLetters { max: 100, window: 10_000 }
    }
}

/// The longest reason a skip may carry, in bytes.
pub const SKIP_REASON_BYTES_MAX: usize = 1024;

/// Clustered mode: which raft node this host is, the voters, and how often
/// raft ticks (an election after `consensus::ELECTION_TICKS` ticks
/// without a leader).
#[derive(Clone, Debug)]
pub struct ClusterConfig {
    pub node: u64,
    /// The cluster's first voters, as `cluster init` was given them (the
    /// membership itself lives in each host's hard-state file).
    pub voters: Vec<u64>,
    pub tick: Duration,
    /// The offsets store is one every host shares (DynamoDB, its keys
    /// scoped to the cluster's id): only a leader serving its own term
    /// writes it, each value conditional on its raft index. Otherwise each
    /// host keeps its own (redb) and writes what its committed log holds.
    pub shared_offsets: bool,
}

/// The writer lease's timing, all in this host's monotonic time. A holder's
/// row may be taken over once it has stayed unchanged for `steal_after`; the
/// holder renews every `renew_every` and stops committing and acknowledging
/// when it has not renewed for `steal_after`.
#[derive(Clone, Debug)]
pub struct LeaseConfig {
    pub steal_after: Duration,
    pub renew_every: Duration,
    /// How often a waiting writer looks at the holder's row again.
    pub poll: Duration,
    /// Every request a writer sends under the lease ends (takes effect or
    /// fails) within this: the drivers' operation timeout. A writer that took
    /// the lease over from another holder waits this long before recovery
    /// reads, so nothing the old holder sent while its lease was valid (a
    /// delete above all) can land under the new writer's reads.
    pub requests_within: Duration,
}

impl LeaseConfig {
    /// The lease's timing from its steal span: the holder renews five times
    /// within it, a waiting writer looks ten times, and every request ends
    /// within 45 % of it (at most 60 s; derived, never raised to a floor, so
    /// a request sent while the lease was valid ends before half a span has
    /// passed). Every driver (the daemon, the simulator) derives it here.
    pub fn from_span(steal_after: Duration) -> LeaseConfig {
        let span = steal_after.as_micros();
        LeaseConfig {
            steal_after,
            renew_every: Duration::from_micros(span / 5),
            poll: Duration::from_micros((span / 10).max(1)),
            requests_within: Duration::from_micros((span * 45 / 100).min(60_000_000)),
        }
    }
}

impl Default for LeaseConfig {
    fn default() -> Self {
        LeaseConfig::from_span(Duration::from_secs(10))
    }
}

/// A bound on every queue and buffer the engine keeps.
#[derive(Clone, Debug)]
pub struct Limits {
    /// Size of a segment file; a segment is sealed before it would overflow.
    pub segment_bytes: u64,
    /// Largest commit group, frames and commit record included.
    pub group_bytes_max: u64,
    /// A segment with data is sealed once it is this old.
    pub segment_age_max: Duration,
    /// Segments created ahead of need.
    pub spare_segments: u32,
    /// Records asked of a source in one read.
    pub source_read_records_max: u32,
    /// Bytes waiting for a commit; sources are not read beyond it.
    pub pending_bytes_max: u64,
    /// The WAL's size limit: sources are not read while the segments that
    /// hold committed groups take this many bytes, each counted at the
    /// segment size (backpressure, reported by `Output::WalFull`). At least
    /// two segments.
    pub wal_bytes_max: u64,
    /// Committed record bytes kept in memory for the sinks; the rest are read
    /// back from the WAL when a compaction needs them.
    pub record_cache_bytes: u64,
    /// Bytes recovery asks for in one WAL read: it holds one window and the
    /// commit group it is in, never a whole segment.
    pub read_window_bytes: usize,
    /// Records in one destination batch.
    pub compaction_records_max: u32,
    /// Delay before re-reading a source that had nothing to give.
    pub source_poll: Duration,
    /// Retry backoff: doubles from the minimum up to the maximum, with jitter.
    pub retry_min: Duration,
    pub retry_max: Duration,
    /// How long a clean shutdown may take before it counts as failed.
    pub drain_timeout: Duration,
    /// WAL (or lease) requests failing this long without one success are
    /// reported as a stall (`Output::Stalled`); `None` never reports.
    pub stall_report_after: Option<Duration>,
    /// ...and stop the engine (`StopReason::Stalled`) after this long;
    /// `None` retries for ever (retrying is always safe).
    pub stall_stop_after: Option<Duration>,
}

impl Limits {
    /// The limits for segments of `segment_bytes`: a commit group may fill
    /// an eighth of one (between 1 KiB and 1 MiB), so a segment always holds
    /// several; everything else at its default. Every driver derives the
    /// group size here.
    pub fn for_segment_bytes(segment_bytes: u64) -> Limits {
        Limits { segment_bytes, group_bytes_max: (segment_bytes / 8).clamp(1024, 1 << 20), ..Limits::default() }
    }

    /// What the record store keeps in memory, and how it folds the rest.
    pub fn records(&self) -> crate::records::RecordLimits {
        crate::records::RecordLimits {
            cache_bytes: self.record_cache_bytes,
            run_records: self.compaction_records_max as u64,
        }
    }
}

impl Default for Limits {
    fn default() -> Self {
        Limits {
            segment_bytes: 64 << 20,
            // What `for_segment_bytes` derives for 64 MiB segments.
            group_bytes_max: 1 << 20,
            segment_age_max: Duration::from_secs(60),
            spare_segments: 1,
            source_read_records_max: 1_000,
            pending_bytes_max: 4 << 20,
            wal_bytes_max: 1 << 30,
            record_cache_bytes: 8 << 20,
            read_window_bytes: 4 << 20,
            compaction_records_max: 10_000,
            source_poll: Duration::from_millis(50),
            retry_min: Duration::from_millis(10),
            retry_max: Duration::from_secs(5),
            drain_timeout: Duration::from_secs(30),
            stall_report_after: Some(Duration::from_secs(60)),
            stall_stop_after: None,
        }
    }
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ConfigError(pub String);

impl fmt::Display for ConfigError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

impl std::error::Error for ConfigError {}

/// Bytes a group must leave free so that a seal group always fits.
pub(crate) const SEAL_RESERVE: u64 = (FRAME_HEADER_BYTES + COMMIT_FRAME_BYTES) as u64;

impl HostConfig {
    pub fn validate(&self) -> Result<(), ConfigError> {
        if self.sources.is_empty() || self.sinks.is_empty() || self.streams.is_empty() {
            return Err(ConfigError("at least one source, one sink and one stream are required".into()));
        }
        if self.sources.len() > u16::MAX as usize || self.sinks.len() > u16::MAX as usize {
            return Err(ConfigError("too many sources or sinks (at most 65535)".into()));
        }
        self.limits.validate()?;
        if let Some(lease) = &self.lease {
            lease.validate()?;
        }
        for skip in &self.skips {
            if skip.at >= skip.next {
                let what = format!("a skip must end after it starts ({}..{})", skip.at.0, skip.next.0);
                return Err(ConfigError(what));
            }
            if skip.key.source.0 as usize >= self.sources.len() || skip.stream.0 as usize >= self.streams.len() {
                return Err(ConfigError("a skip names a source or stream the configuration does not have".into()));
            }
            if skip.reason.len() > SKIP_REASON_BYTES_MAX {
                return Err(ConfigError(format!("a skip's reason is longer than {SKIP_REASON_BYTES_MAX} bytes")));
            }
        }
        match &self.cluster {
            Some(_) if self.lease.is_some() => {
                Err(ConfigError("clustered mode takes no writer lease: raft leadership is the writer authority".into()))
            }
            Some(c) => c.validate(),
            None => Ok(()),
        }
    }
}

impl Limits {
    fn validate(&self) -> Result<(), ConfigError> {
        let l = self;
        let err = |s: String| Err(ConfigError(s));
        if l.group_bytes_max < 1024 || l.group_bytes_max > GROUP_BYTES_LIMIT as u64 {
            return err(format!(
                "group_bytes_max is {}; it must be between 1024 and {GROUP_BYTES_LIMIT}",
                l.group_bytes_max
            ));
        }
        let segment_min = SEGMENT_HEADER_BYTES as u64 + 4 * (l.group_bytes_max + SEAL_RESERVE);
        if l.segment_bytes < segment_min {
            return err(format!(
                "segment size {} is too small: it must hold at least four groups of group_bytes_max ({}), \
                 so at least {segment_min} bytes",
                l.segment_bytes, l.group_bytes_max
            ));
        }
        if l.read_window_bytes < 64 {
            return err(format!("read_window_bytes is {}; it must be at least 64", l.read_window_bytes));
        }
        if l.pending_bytes_max < l.group_bytes_max {
            return err("pending_bytes_max must be at least group_bytes_max".into());
        }
        if l.wal_bytes_max < 2 * l.segment_bytes {
            return err(format!(
                "the WAL size limit {} is too small: it must hold at least two segments of {} bytes, so at least {}",
                l.wal_bytes_max,
                l.segment_bytes,
                2 * l.segment_bytes
            ));
        }
        if l.source_read_records_max == 0 || l.compaction_records_max == 0 || l.spare_segments == 0 {
            return err("source_read_records_max, compaction_records_max and spare_segments must be positive".into());
        }
        if l.retry_min.as_micros() == 0 || l.retry_max < l.retry_min {
            return err("retry_min must be positive and at most retry_max".into());
        }
        Ok(())
    }
}

impl LeaseConfig {
    fn validate(&self) -> Result<(), ConfigError> {
        let err = |s: String| Err(ConfigError(s));
        if self.renew_every.as_micros() == 0 || self.poll.as_micros() == 0 {
            return err("lease renewal and poll intervals must be positive".into());
        }
        if self.requests_within.as_micros().saturating_mul(2) >= self.steal_after.as_micros() {
            return err("every request under the lease must end within less than half its steal span".into());
        }
        if self.renew_every.as_micros().saturating_mul(3) > self.steal_after.as_micros() {
            return err(format!(
                "the lease steal span ({} ms) must be at least three renewal intervals ({} ms each)",
                self.steal_after.as_micros() / 1000,
                self.renew_every.as_micros() / 1000
            ));
        }
        Ok(())
    }
}

impl ClusterConfig {
    fn validate(&self) -> Result<(), ConfigError> {
        let err = |s: &str| Err(ConfigError(s.into()));
        let mut voters = self.voters.clone();
        voters.sort_unstable();
        voters.dedup();
        if voters.len() != self.voters.len() || voters.contains(&0) {
            return err("cluster node ids must be distinct and positive");
        }
        if self.node == 0 {
            return err("this host's node id must be positive");
        }
        if self.tick.as_micros() == 0 {
            return err("the raft tick must be positive");
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_defaults_are_what_the_derivations_give() {
        let derived = Limits::for_segment_bytes(Limits::default().segment_bytes);
        assert_eq!(derived.group_bytes_max, Limits::default().group_bytes_max);
        assert_eq!(Limits::for_segment_bytes(4096).group_bytes_max, 1024, "never below 1 KiB");
        assert_eq!(Limits::for_segment_bytes(80 << 10).group_bytes_max, 10 << 10);
        let lease = LeaseConfig::from_span(Duration::from_secs(10));
        assert_eq!((lease.renew_every, lease.poll), (Duration::from_secs(2), Duration::from_secs(1)));
        assert_eq!(LeaseConfig::from_span(Duration::from_micros(5)).poll, Duration::from_micros(1), "never zero");
    }

    fn valid() -> HostConfig {
        HostConfig {
            seed: 1,
            sources: vec!["s".into()],
            sinks: vec!["k".into()],
            streams: vec!["t".into()],
            limits: Limits::for_segment_bytes(64 << 10),
            stop_when_exhausted: false,
            schema_plugin: false,
            lease: Some(LeaseConfig::default()),
            cluster: None,
            mutations: Mutations::NONE,
            skips: Vec::new(),
            batch_skips: Vec::new(),
            dead_letters: None,
            wall_origin_ms: 0,
        }
    }

    /// The message `change` makes `validate` give, or "ok".
    fn verdict(change: impl FnOnce(&mut HostConfig)) -> String {
        let mut cfg = valid();
        change(&mut cfg);
        cfg.validate().map_or_else(|e| e.0, |()| "ok".into())
    }

    #[test]
    fn every_validation_rule_refuses_what_it_names_and_admits_its_bound() {
        assert_eq!(verdict(|_| {}), "ok");
        assert!(verdict(|c| c.sources.clear()).contains("at least one source"));
        assert!(verdict(|c| c.sinks.clear()).contains("one sink"));
        assert!(verdict(|c| c.streams.clear()).contains("one stream"));
        assert!(verdict(|c| c.sinks = vec!["k".into(); 65_536]).contains("at most 65535"));
        assert_eq!(verdict(|c| c.sinks = vec!["k".into(); 65_535]), "ok");
        assert!(verdict(|c| c.sources = vec!["s".into(); 65_536]).contains("at most 65535"));
        assert_eq!(verdict(|c| c.sources = vec!["s".into(); 65_535]), "ok");
        assert!(verdict(|c| c.limits.group_bytes_max = 1023).contains("between 1024"));
        assert_eq!(verdict(|c| c.limits.group_bytes_max = 1024), "ok");
        let too_big = GROUP_BYTES_LIMIT as u64 + 1;
        assert!(verdict(|c| c.limits.group_bytes_max = too_big).contains("between 1024"));
        let largest = |c: &mut HostConfig| {
            c.limits.group_bytes_max = GROUP_BYTES_LIMIT as u64;
            c.limits.pending_bytes_max = GROUP_BYTES_LIMIT as u64 + 1;
            c.limits.segment_bytes = 1 << 40;
            c.limits.wal_bytes_max = 2 << 40;
        };
        assert_eq!(verdict(|c| largest(c)), "ok", "the largest group the format allows");
        assert!(verdict(|c| {
            largest(c);
            c.limits.group_bytes_max += 1;
        })
        .contains("between 1024"));
        let min = SEGMENT_HEADER_BYTES as u64 + 4 * (valid().limits.group_bytes_max + SEAL_RESERVE);
        assert!(verdict(|c| c.limits.segment_bytes = min - 1).contains("at least four groups"));
        assert_eq!(verdict(|c| c.limits.segment_bytes = min), "ok");
        let group = valid().limits.group_bytes_max;
        assert!(verdict(|c| c.limits.pending_bytes_max = group - 1).contains("pending_bytes_max"));
        assert_eq!(verdict(|c| c.limits.pending_bytes_max = group), "ok");
        let two_segments = 2 * valid().limits.segment_bytes;
        assert!(verdict(|c| c.limits.wal_bytes_max = two_segments - 1).contains("at least two segments"));
        assert_eq!(verdict(|c| c.limits.wal_bytes_max = two_segments), "ok");
        assert!(verdict(|c| c.limits.source_read_records_max = 0).contains("must be positive"));
        assert!(verdict(|c| c.limits.compaction_records_max = 0).contains("must be positive"));
        assert!(verdict(|c| c.limits.spare_segments = 0).contains("must be positive"));
        let lease = |f: fn(&mut LeaseConfig)| verdict(move |c| f(c.lease.as_mut().expect("set in valid()")));
        assert!(lease(|l| l.renew_every = Duration::from_micros(0)).contains("intervals must be positive"));
        assert!(lease(|l| l.poll = Duration::from_micros(0)).contains("intervals must be positive"));
        assert!(lease(|l| l.requests_within = Duration::from_secs(5)).contains("less than half"));
        assert_eq!(lease(|l| l.requests_within = Duration::from_micros(4_999_999)), "ok");
        assert!(lease(|l| l.renew_every = Duration::from_micros(3_333_334)).contains("three renewal intervals"));
        assert_eq!(lease(|l| l.renew_every = Duration::from_micros(3_333_333)), "ok");
        let exactly_three = |l: &mut LeaseConfig| {
            l.steal_after = Duration::from_secs(9);
            l.requests_within = Duration::from_secs(4);
            l.renew_every = Duration::from_secs(3);
        };
        assert_eq!(lease(exactly_three), "ok", "a span of exactly three renewal intervals is enough");
        assert_eq!(verdict(|c| c.lease = None), "ok", "no lease, no lease rules");
        assert!(verdict(|c| c.limits.retry_min = Duration::from_micros(0)).contains("retry_min"));
        assert!(verdict(|c| c.limits.retry_max = Duration::from_micros(1)).contains("retry_min"));
        assert_eq!(verdict(|c| c.limits.retry_max = c.limits.retry_min), "ok");
        // What an operator reads is the message itself.
        assert_eq!(ConfigError("segment size 1 is too small".into()).to_string(), "segment size 1 is too small");
    }
}
