//! The S3 sink's settings: `--sink-s3-*` flags, keys of `[sink]`.

use clap::Args;
use serde::{Deserialize, Serialize};

#[derive(Args, Serialize, Deserialize, Debug, Default, Clone, PartialEq)]
pub struct S3SinkArgs {
    /// S3 sink: the bucket batches go to (one object per batch).
    #[arg(long = "sink-s3-bucket", id = "sink_s3_bucket", env = "SKIPPR_SINK_S3_BUCKET", value_name = "BUCKET")]
    pub s3_bucket: Option<String>,
    /// S3 sink: the key prefix, `<prefix><stream>/<tag>.<seq>.jsonl` [default: none].
    #[arg(long = "sink-s3-prefix", id = "sink_s3_prefix", env = "SKIPPR_SINK_S3_PREFIX", value_name = "PREFIX")]
    pub s3_prefix: Option<String>,
    /// S3 sink: gzip each object (`.jsonl.gz`) [default: false].
    #[arg(long = "sink-s3-gzip", id = "sink_s3_gzip", value_name = "BOOL")]
    pub s3_gzip: Option<bool>,
}

/// The S3 sink's settings, checked.
#[derive(Debug, Clone, PartialEq)]
pub struct S3SinkConfig {
    pub bucket: String,
    pub prefix: String,
    pub gzip: bool,
}

impl S3SinkArgs {
    pub fn resolve(&self) -> Result<S3SinkConfig, String> {
        Ok(S3SinkConfig {
            bucket: self.s3_bucket.clone().ok_or(
                "the s3 sink needs its bucket: --sink-s3-bucket BUCKET, SKIPPR_SINK_S3_BUCKET, or `s3_bucket` in [sink]",
            )?,
            prefix: self.s3_prefix.clone().unwrap_or_default(),
            gzip: self.s3_gzip.unwrap_or(false),
        })
    }
}
