//! The built-in `generator` source.

pub mod settings;

use super::{Batch, PluginError, Source};
use skippr_core::format::Record;
use skippr_core::{Position, ResumePoint};

/// The built-in generator: `partitions` partitions per stream, each a run of
/// JSON records `{"stream","partition","seq","value"}` with `seq` from 0 and
/// no gaps. Finite with `records` per partition, endless with 0. It can replay
/// from any position, so it needs no acks. Partition `p` of stream `s` is the
/// source partition `s * partitions + p`.
pub struct Generator {
    streams: Vec<String>,
    partitions: u32,
    records: u64,
    seed: u64,
    next: Vec<u64>,
    turn: usize,
    /// Records per second over all partitions; 0 for as fast as asked.
    rate: u64,
    /// Since `open`: when, and how many records were produced.
    opened: std::time::Instant,
    produced: u64,
}

impl Generator {
    pub fn new(streams: Vec<String>, partitions: u32, records: u64, seed: u64) -> Generator {
        let n = streams.len() * partitions as usize;
        let opened = std::time::Instant::now();
        Generator { streams, partitions, records, seed, next: vec![0; n], turn: 0, rate: 0, opened, produced: 0 }
    }

    /// Produces at most `rate` records per second (0: no limit).
    pub fn with_rate(mut self, rate: u64) -> Generator {
        self.rate = rate;
        self
    }

    /// The record at `seq` of a partition: a pure function of seed and place.
    pub fn record(&self, stream: &str, partition: u32, seq: u64) -> Vec<u8> {
        let mut x = self.seed ^ (partition as u64) << 40 ^ seq.wrapping_mul(0x9e37_79b9_7f4a_7c15);
        for b in stream.bytes() {
            x = (x ^ b as u64).wrapping_mul(0x100_0000_01b3);
        }
        format!(r#"{{"stream":"{stream}","partition":{partition},"seq":{seq},"value":"{x:016x}"}}"#).into_bytes()
    }

    fn place(&self, i: usize) -> (&str, u32) {
        (&self.streams[i / self.partitions as usize], i as u32 % self.partitions)
    }
}

impl Source for Generator {
    fn streams(&self) -> Vec<String> {
        self.streams.clone()
    }

    fn open(&mut self, resume: &[ResumePoint]) -> Result<(), PluginError> {
        self.opened = std::time::Instant::now();
        self.produced = 0;
        self.next.iter_mut().for_each(|n| *n = 0);
        for r in resume {
            if let Some(n) = self.next.get_mut(r.partition as usize) {
                *n = r.position.0;
            }
        }
        Ok(())
    }

    fn read(&mut self, records_max: u32) -> Result<(Vec<Batch>, bool), PluginError> {
        let mut batches = Vec::new();
        let mut budget = records_max as u64;
        if self.rate > 0 {
            let allowed = (self.opened.elapsed().as_secs_f64() * self.rate as f64) as u64;
            budget = budget.min(allowed.saturating_sub(self.produced));
        }
        let n = self.next.len();
        for k in 0..n {
            let i = (self.turn + k) % n;
            let from = self.next[i];
            let to = if self.records == 0 { from + budget } else { self.records.min(from + budget) };
            if to <= from || budget == 0 {
                continue;
            }
            let (stream, partition) = self.place(i);
            let records = (from..to)
                .map(|seq| Record { position: Position(seq), bytes: self.record(stream, partition, seq) })
                .collect();
            batches.push(Batch {
                partition: i as u32,
                stream: stream.to_string(),
                records,
                end: Position(to),
                checkpoint: None,
                schema: None,
                window: skippr_core::Window::None,
                keys: Vec::new(),
            });
            budget -= to - from;
            self.produced += to - from;
            self.next[i] = to;
        }
        self.turn = (self.turn + 1) % n.max(1);
        let exhausted = self.records != 0 && self.next.iter().all(|&n| n >= self.records);
        Ok((batches, exhausted))
    }

    fn ack(&mut self, _acks: &[(u32, Position)]) -> Result<(), PluginError> {
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::BTreeMap;

    #[test]
    fn the_generator_is_finite_gapless_and_resumes() {
        let mut g = Generator::new(vec!["a".into(), "b".into()], 2, 5, 7);
        let mut got: BTreeMap<u32, Vec<u64>> = BTreeMap::new();
        loop {
            let (batches, done) = g.read(3).unwrap();
            for b in batches {
                got.entry(b.partition).or_default().extend(b.records.iter().map(|r| r.position.0));
            }
            if done {
                break;
            }
        }
        assert_eq!(got.len(), 4);
        assert!(got.values().all(|seqs| *seqs == vec![0, 1, 2, 3, 4]));
        let rec = String::from_utf8(g.record("b", 1, 4)).unwrap();
        assert!(rec.starts_with(r#"{"stream":"b","partition":1,"seq":4,"value":""#), "{rec}");
        g.open(&[ResumePoint { partition: 3, position: Position(4), checkpoint: None }]).unwrap();
        let (batches, _) = g.read(100).unwrap();
        let p3: Vec<_> = batches.iter().filter(|b| b.partition == 3).flat_map(|b| &b.records).collect();
        assert_eq!(p3.len(), 1);
        assert_eq!(p3[0].bytes, g.record("b", 1, 4));
    }
}
