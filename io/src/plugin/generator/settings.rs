//! The generator's settings: `--generator-*` flags, keys of `[source]`.

use clap::Args;
use serde::{Deserialize, Serialize};
use skippr_core::rules::check_stream_name;

/// It keeps a position per partition in memory: these bound it.
const STREAMS_MAX: usize = 1024;
const PARTITIONS_MAX: u32 = 65_536;

#[derive(Args, Serialize, Deserialize, Debug, Default, Clone, PartialEq)]
pub struct GeneratorArgs {
    /// Generator: stream names, comma-separated [default: events].
    #[arg(long = "generator-streams", value_name = "LIST", value_delimiter = ',')]
    pub streams: Option<Vec<String>>,
    /// Generator: partitions per stream [default: 2].
    #[arg(long = "generator-partitions", value_name = "N")]
    pub partitions: Option<u32>,
    /// Generator: records per partition, 0 for endless [default: 10000].
    #[arg(long = "generator-records", value_name = "N")]
    pub records: Option<u64>,
    /// Generator: seed of the record contents [default: 1].
    #[arg(long = "generator-seed", value_name = "N")]
    pub seed: Option<u64>,
    /// Generator: records per second over all partitions, 0 for no limit
    /// [default: 0].
    #[arg(long = "generator-rate", value_name = "N")]
    pub rate: Option<u64>,
}

/// The generator's settings, checked.
#[derive(Debug, Clone, PartialEq)]
pub struct GeneratorConfig {
    pub streams: Vec<String>,
    pub partitions: u32,
    pub records: u64,
    pub seed: u64,
    pub rate: u64,
}

impl GeneratorArgs {
    pub fn resolve(&self) -> Result<GeneratorConfig, String> {
        let streams = self.streams.clone().unwrap_or_else(|| vec!["events".into()]);
        let partitions = self.partitions.unwrap_or(2);
        if streams.is_empty() || partitions == 0 {
            return Err("the generator needs at least one stream and one partition".into());
        }
        if streams.len() > STREAMS_MAX || partitions > PARTITIONS_MAX {
            return Err(format!(
                "the generator takes at most {STREAMS_MAX} streams and {PARTITIONS_MAX} partitions per stream"
            ));
        }
        for stream in &streams {
            check_stream_name(stream).map_err(|why| format!("the generator's streams: {why}"))?;
        }
        Ok(GeneratorConfig {
            streams,
            partitions,
            records: self.records.unwrap_or(10_000),
            seed: self.seed.unwrap_or(1),
            rate: self.rate.unwrap_or(0),
        })
    }
}

impl super::Generator {
    /// The generator its settings describe.
    pub fn from_config(c: &GeneratorConfig) -> super::Generator {
        super::Generator::new(c.streams.clone(), c.partitions, c.records, c.seed).with_rate(c.rate)
    }
}
