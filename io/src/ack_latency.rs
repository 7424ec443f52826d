//! How long sources wait for their acks: from a source read that returned
//! records to the first ack that covers them. The engine acks only positions
//! that a committed (visible) group holds, so this is the commit latency a
//! source sees, the wait for the next group commit included, on every WAL
//! backend alike: an `fdatasync` on disk, a put in S3, a majority's
//! `fdatasync` in clustered mode. The driver measures here; nothing is
//! decided.

use hdrhistogram::Histogram;
use skippr_core::{Position, SourceId};
use std::collections::{BTreeMap, VecDeque};
use std::sync::Mutex;
use std::time::{Duration, Instant};

/// Reads not yet acked, per partition, are kept up to this many; an older
/// one is forgotten unmeasured (the engine bounds its in-flight batches far
/// below, so this only matters if acks stop coming).
const PENDING_MAX: usize = 4096;

/// The longest wait recorded as itself; longer ones count as this.
const HIGHEST: Duration = Duration::from_secs(3600);

/// Ack latencies of one run, shared by the driver's request threads.
pub struct AckLatency {
    inner: Mutex<Inner>,
}

/// A batch read and not yet acked: its end, its records, when it was read.
type Unacked = (Position, u64, Instant);

struct Inner {
    /// Per (source, partition): the end of each read batch and when it was
    /// read, oldest first.
    pending: BTreeMap<(SourceId, u32), VecDeque<Unacked>>,
    /// Records of the batches acked so far: committed to the WAL.
    acked_records: u64,
    /// A batch left the bounded queue unacked: `acked_records` is a floor.
    lost_count: bool,
    /// Microseconds, three significant digits.
    waits: Histogram<u64>,
    /// The first read measured and the last ack that measured one: the
    /// window in which sources were served.
    first_read: Option<Instant>,
    last_ack: Option<Instant>,
}

/// The run's figures, for its summary line.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct AckSummary {
    pub acked_batches: u64,
    pub p50: Duration,
    pub p99: Duration,
    pub max: Duration,
    /// From the first read measured to the last ack that covered one.
    pub window: Duration,
}

impl Default for AckLatency {
    fn default() -> AckLatency {
        let waits = Histogram::new_with_bounds(1, HIGHEST.as_micros() as u64, 3).expect("valid bounds");
        let inner = Inner {
            pending: BTreeMap::new(),
            acked_records: 0,
            lost_count: false,
            waits,
            first_read: None,
            last_ack: None,
        };
        AckLatency { inner: Mutex::new(inner) }
    }
}

impl AckLatency {
    /// A read of `source` returned a batch of `partition` ending at `end`.
    pub fn read(&self, source: SourceId, partition: u32, end: Position, records: u64, at: Instant) {
        let mut inner = self.lock();
        inner.first_read.get_or_insert(at);
        let queue = inner.pending.entry((source, partition)).or_default();
        let full = queue.len() == PENDING_MAX;
        if full {
            queue.pop_front();
        }
        queue.push_back((end, records, at));
        inner.lost_count |= full;
    }

    /// `source` is told that everything below `position` in `partition` is
    /// committed: every read batch that ends there or before is acked, and
    /// the time it waited is returned (oldest first) and recorded.
    pub fn acked(&self, source: SourceId, partition: u32, position: Position, at: Instant) -> Vec<Duration> {
        let mut inner = self.lock();
        let Inner { pending, waits, last_ack, acked_records, .. } = &mut *inner;
        let Some(queue) = pending.get_mut(&(source, partition)) else { return Vec::new() };
        let mut acked = Vec::new();
        while let Some(&(end, records, read_at)) = queue.front() {
            if end > position {
                break;
            }
            queue.pop_front();
            *acked_records += records;
            let wait = at.saturating_duration_since(read_at);
            waits.saturating_record((wait.as_micros() as u64).clamp(1, HIGHEST.as_micros() as u64));
            acked.push(wait);
            *last_ack = Some(at);
        }
        acked
    }

    /// An engine stopped: what it read and never acked is forgotten (the next
    /// engine reads it again from the WAL's positions).
    /// Records acknowledged to their sources, that is committed to the WAL,
    /// and whether that is exact (a floor once a queue overflowed).
    pub fn committed_records(&self) -> (u64, bool) {
        let inner = self.lock();
        (inner.acked_records, !inner.lost_count)
    }

    pub fn forget_pending(&self) {
        self.lock().pending.clear();
    }

    /// `None` until a batch was acked.
    pub fn summary(&self) -> Option<AckSummary> {
        let inner = self.lock();
        let w = &inner.waits;
        (!w.is_empty()).then(|| AckSummary {
            acked_batches: w.len(),
            p50: Duration::from_micros(w.value_at_quantile(0.50)),
            p99: Duration::from_micros(w.value_at_quantile(0.99)),
            max: Duration::from_micros(w.max()),
            window: match (inner.first_read, inner.last_ack) {
                (Some(first), Some(last)) => last.saturating_duration_since(first),
                _ => Duration::ZERO,
            },
        })
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Inner> {
        self.inner.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_ack_measures_every_batch_it_covers_and_no_other() {
        let l = AckLatency::default();
        let t0 = Instant::now();
        let ms = Duration::from_millis;
        l.read(SourceId(0), 0, Position(100), 100, t0);
        l.read(SourceId(0), 1, Position(50), 50, t0);
        l.read(SourceId(0), 0, Position(200), 100, t0 + ms(2));
        l.read(SourceId(0), 0, Position(300), 100, t0 + ms(4));
        // Below the second batch's end: only the first is covered.
        assert_eq!(l.acked(SourceId(0), 0, Position(199), t0 + ms(10)), vec![ms(10)]);
        assert_eq!(l.acked(SourceId(0), 0, Position(300), t0 + ms(12)), vec![ms(10), ms(8)]);
        // Another source's ack, or an ack of nothing read, measures nothing.
        assert!(l.acked(SourceId(1), 1, Position(50), t0 + ms(12)).is_empty());
        assert!(l.acked(SourceId(0), 0, Position(400), t0 + ms(12)).is_empty());
        let s = l.summary().unwrap();
        assert_eq!(s.acked_batches, 3);
        assert_eq!(s.p50.as_millis(), 10);
        assert_eq!(s.max.as_millis(), 10);
        assert_eq!(s.window, ms(12));
        // The partition 1 batch was never acked; an engine that stops forgets it.
        l.forget_pending();
        assert!(l.acked(SourceId(0), 1, Position(50), t0 + ms(20)).is_empty());
    }

    #[test]
    fn a_partition_whose_acks_stop_keeps_a_bounded_queue() {
        let l = AckLatency::default();
        let t0 = Instant::now();
        for i in 0..(PENDING_MAX as u64 + 10) {
            l.read(SourceId(0), 0, Position(i + 1), 1, t0);
        }
        assert_eq!(l.lock().pending[&(SourceId(0), 0)].len(), PENDING_MAX);
        assert_eq!(l.acked(SourceId(0), 0, Position(u64::MAX), t0).len(), PENDING_MAX);
        assert_eq!(l.summary().unwrap().acked_batches, PENDING_MAX as u64);
        assert_eq!(l.committed_records(), (PENDING_MAX as u64, false), "a floor, and said to be one");
    }
}
