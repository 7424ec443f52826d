//! Seeded randomness. One `u64` seed makes a ChaCha8 generator per component
//! and per fault kind (a separate stream of the same key: `Stream` for the
//! scenario, the disk, crashes, the operator and the engine's optional paths,
//! `Die` for every fault model and every component's latencies), so a new
//! draw in one never shifts the numbers another sees.

use rand::{Rng as _, SeedableRng};
use rand_chacha::ChaCha8Rng;

/// The components, each on its own stream.
#[derive(Clone, Copy)]
pub enum Stream {
    Scenario = 1,
    Disk = 3,
    Crashes = 7,
    /// What an operator does between runs (a segment deleted by hand).
    Operator = 8,
    /// Which optional paths of the engine a run takes (a schema plugin,
    /// stopping once the sources are exhausted).
    Paths = 9,
    /// Swarm weights: which rare combination a seed leans on.
    Swarm = 10,
    /// How much of the records the engine keeps in memory, and how often
    /// reading the rest back from the WAL fails.
    Memory = 11,
    /// Clustered mode: hosts, ticks, the network and its faults.
    Cluster = 12,
    /// How a frozen process's requests fare.
    Frozen = 13,
    /// Records sinks refuse, and the dead-letter destination's faults.
    Letters = 14,
    /// Records no batch can carry to a sink, whose batches an operator
    /// gives up.
    Poison = 15,
    /// Whether dead letters are sent back through the pipeline.
    Replay = 16,
    /// Whether a source is a Singer-like tap, and how it behaves.
    Tap = 17,
}

#[derive(Clone)]
pub struct Rng(ChaCha8Rng);

impl Rng {
    pub fn new(seed: u64, stream: Stream) -> Rng {
        let mut r = ChaCha8Rng::seed_from_u64(seed);
        r.set_stream(stream as u64);
        Rng(r)
    }

    /// A uniform integer in `lo..=hi`.
    pub fn range(&mut self, lo: u64, hi: u64) -> u64 {
        self.0.gen_range(lo..=hi)
    }

    /// True with probability `p`.
    pub fn chance(&mut self, p: f64) -> bool {
        p > 0.0 && self.0.gen_bool(p.min(1.0))
    }

    /// A probability drawn for swarm testing: zero with probability `off`,
    /// otherwise uniform in `lo..hi`.
    pub fn rate(&mut self, off: f64, lo: f64, hi: f64) -> f64 {
        if self.chance(off) {
            0.0
        } else {
            self.0.gen_range(lo..hi)
        }
    }

    pub fn u64(&mut self) -> u64 {
        self.0.gen()
    }
}

/// Each fault kind and each component's latencies, on its own stream.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub enum Die {
    /// Latencies of disk WAL requests.
    DiskLatency,
    /// Latencies of S3 requests.
    S3Latency,
    /// Latencies of DynamoDB requests: offsets and the lease.
    OffsetsLatency,
    /// Latencies of source, schema and sink-progress requests.
    PluginLatency,
    /// Latencies of sink applies and their replies.
    SinkLatency,
    /// How long a restart takes.
    Restart,
    /// When a frozen writer's replies reach it after it wakes.
    Frozen,
    /// What a dead process's requests in flight still do.
    InFlight,
    S3Slow,
    S3Throttle,
    /// A put with an unknown outcome, and what becomes of it.
    S3Ambiguous,
    /// A writer cut off by a lost reply.
    Pause,
    NoSpace,
    FsyncFail,
    LeaseAmbiguous,
    OffsetsAmbiguous,
    SourceFail,
    SinkRetryable,
    SinkLostReply,
    /// A group read back from the WAL for a sink fails.
    ReadFail,
    /// Clustered mode: message latency, loss and duplication.
    Network,
    /// Clustered mode: partitions, freezes, which host a fault hits.
    ClusterFault,
    /// Clustered mode: a crash in the middle of a truncation, and where.
    Truncation,
    /// Which records a sink refuses the first time, and the dead-letter
    /// destination's faults.
    Letters,
    /// A sink request that lingers on its way (seeds with poison and dead
    /// letters on).
    Linger,
}

impl Die {
    pub const ALL: [Die; 25] = [
        Die::DiskLatency,
        Die::S3Latency,
        Die::OffsetsLatency,
        Die::PluginLatency,
        Die::SinkLatency,
        Die::Restart,
        Die::Frozen,
        Die::InFlight,
        Die::S3Slow,
        Die::S3Throttle,
        Die::S3Ambiguous,
        Die::Pause,
        Die::NoSpace,
        Die::FsyncFail,
        Die::LeaseAmbiguous,
        Die::OffsetsAmbiguous,
        Die::SourceFail,
        Die::SinkRetryable,
        Die::SinkLostReply,
        Die::ReadFail,
        Die::Network,
        Die::ClusterFault,
        Die::Truncation,
        Die::Letters,
        Die::Linger,
    ];
}

/// The run's dice: one generator per `Die`, each a stream of its own
/// (numbered after the components of `Stream`), so a draw added to one
/// fault model or one component's latencies leaves every other sequence as
/// it was.
#[derive(Clone)]
pub struct Dice(Vec<Rng>);

impl Dice {
    pub fn new(seed: u64) -> Dice {
        Dice(
            Die::ALL
                .iter()
                .map(|&die| {
                    let mut r = ChaCha8Rng::seed_from_u64(seed);
                    r.set_stream(100 + die as u64);
                    Rng(r)
                })
                .collect(),
        )
    }

    pub fn roll(&mut self, die: Die) -> &mut Rng {
        &mut self.0[die as usize]
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_die_rolls_its_own_sequence_whatever_the_others_do() {
        let mut a = Dice::new(7);
        let mut b = Dice::new(7);
        for _ in 0..100 {
            b.roll(Die::SinkLostReply).u64();
        }
        let seq = |d: &mut Dice| (0..10).map(|_| d.roll(Die::DiskLatency).u64()).collect::<Vec<_>>();
        assert_eq!(seq(&mut a), seq(&mut b), "draws of one die do not move another");
        let first: Vec<u64> = Die::ALL.iter().map(|&d| Dice::new(7).roll(d).u64()).collect();
        let mut unique = first.clone();
        unique.sort_unstable();
        unique.dedup();
        assert_eq!(unique.len(), first.len(), "no two dice share a stream");
    }
}
