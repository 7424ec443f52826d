//! The built-in `s3` sink: one object per destination batch, keyed by its
//! sequence number alone, `<prefix><stream>/<seq, 20 digits>.jsonl` (or
//! `.jsonl.gz`), one record per line as emitted, the batch's
//! `compaction_id` in the object's metadata (`skippr-compaction-id`).
//!
//! Every object is created with `If-None-Match: *` on a client without SDK
//! retries (a silent retry of a put that succeeded would come back 412),
//! so a number holds one object for good. A 412 means the number is taken:
//! the object is read back, and the same id with the same records (after
//! decompressing) is `already_applied`; another id or other records are
//! `fatal`. A 409 (a concurrent conditional write), throttling, 5xx and
//! timeouts are retried. So two daemons applying the same batch at once (a
//! deposed clustered leader and its successor) leave one object.

use super::{PluginError, Sink};
use crate::aws::describe;
use crate::s3_wal::{definite_refusal, error_code, normalize_prefix, status};
use aws_sdk_s3::primitives::ByteStream;
use aws_sdk_s3::Client;
use skippr_core::{CompactionId, Records, SinkOutcome};
use std::io::{Read, Write};
use tokio::runtime::Handle;
use tracing::{error, warn};

/// The metadata key that carries the batch's id.
pub const ID_METADATA: &str = "skippr-compaction-id";

/// Where batches go.
#[derive(Clone)]
pub struct S3SinkTarget {
    /// Without SDK retries, for the conditional puts.
    puts: Client,
    /// With them, for reads and listings.
    client: Client,
    bucket: String,
    /// "" or ending in one '/'.
    prefix: String,
    gzip: bool,
}

impl S3SinkTarget {
    /// Checks that the bucket answers; a missing bucket or denied access is
    /// the message to stop with.
    pub async fn connect(
        sdk: &aws_config::SdkConfig,
        bucket: &str,
        prefix: &str,
        gzip: bool,
    ) -> Result<S3SinkTarget, String> {
        let custom = crate::aws::s3_endpoint(sdk);
        let base = aws_sdk_s3::config::Builder::from(sdk).force_path_style(custom.is_some());
        let puts = Client::from_conf(base.clone().retry_config(aws_config::retry::RetryConfig::disabled()).build());
        let client = Client::from_conf(base.build());
        let target = S3SinkTarget { puts, client, bucket: bucket.to_string(), prefix: normalize_prefix(prefix), gzip };
        match target.client.head_bucket().bucket(bucket).send().await {
            Ok(_) => Ok(target),
            Err(e) => Err(match status(&e) {
                Some(404) => {
                    format!("the sink's S3 bucket '{bucket}' does not exist: create it, or fix --sink-s3-bucket")
                }
                Some(403) => {
                    format!("access to the sink's S3 bucket '{bucket}' is denied: check the credentials and policy")
                }
                _ => format!("cannot use the sink's S3 bucket '{bucket}': {}", describe(&e)),
            }),
        }
    }

    /// A batch's key.
    pub fn key(&self, stream: &str, seq: u64) -> String {
        let ext = if self.gzip { "jsonl.gz" } else { "jsonl" };
        format!("{}{stream}/{seq:020}.{ext}", self.prefix)
    }
}

/// The sink: a target and the runtime its requests run on (the daemon's;
/// sinks are called on its blocking threads).
pub struct S3Sink {
    target: S3SinkTarget,
    runtime: Handle,
}

impl S3Sink {
    pub fn new(target: S3SinkTarget, runtime: Handle) -> S3Sink {
        S3Sink { target, runtime }
    }

    async fn apply_async(
        &self,
        stream: &str,
        seq: u64,
        id: CompactionId,
        body: &[u8],
    ) -> Result<SinkOutcome, PluginError> {
        let t = &self.target;
        let key = t.key(stream, seq);
        let object = if t.gzip { gzip(body) } else { body.to_vec() };
        let sent = t
            .puts
            .put_object()
            .bucket(&t.bucket)
            .key(&key)
            .if_none_match("*")
            .metadata(ID_METADATA, id.to_string())
            .content_type("application/x-ndjson")
            .body(ByteStream::from(object))
            .send()
            .await;
        let e = match sent {
            Ok(_) => return Ok(SinkOutcome::Applied),
            Err(e) => e,
        };
        match status(&e) {
            Some(412) => self.compare(&key, id, body).await,
            Some(s) if definite_refusal(s, error_code(&e)) => {
                error!(key, error = %describe(&e), "s3 sink: S3 refused the batch's object");
                Ok(SinkOutcome::Fatal)
            }
            // A 409 (a concurrent conditional write), throttling, 5xx,
            // timeouts: retried with the same bytes.
            _ => Err(PluginError(format!("s3 sink: put {key}: {}", describe(&e)))),
        }
    }

    /// The number is taken: by this batch (a replay), or by another.
    async fn compare(&self, key: &str, id: CompactionId, body: &[u8]) -> Result<SinkOutcome, PluginError> {
        let t = &self.target;
        let got = t
            .client
            .get_object()
            .bucket(&t.bucket)
            .key(key)
            .send()
            .await
            .map_err(|e| PluginError(format!("s3 sink: reading back {key}: {}", describe(&e))))?;
        let found_id = got.metadata().and_then(|m| m.get(ID_METADATA)).cloned().unwrap_or_default();
        let bytes = got
            .body
            .collect()
            .await
            .map_err(|e| PluginError(format!("s3 sink: reading back {key}: {e}")))?
            .into_bytes();
        let records = if t.gzip { gunzip(&bytes) } else { Some(bytes.to_vec()) };
        if found_id == id.to_string() && records.as_deref() == Some(body) {
            return Ok(SinkOutcome::AlreadyApplied);
        }
        error!(
            key,
            compaction_id = %id,
            found = %found_id,
            "s3 sink: another batch holds this number (another id, or other records): two WALs write under this \
             prefix, or the bucket was restored from elsewhere"
        );
        Ok(SinkOutcome::Fatal)
    }

    async fn progress_async(&self, streams: &[String]) -> Result<Vec<(String, u64)>, PluginError> {
        let t = &self.target;
        let mut out = Vec::new();
        for stream in streams {
            let prefix = format!("{}{stream}/", t.prefix);
            let mut highest = None;
            let mut pages = t.client.list_objects_v2().bucket(&t.bucket).prefix(&prefix).into_paginator().send();
            while let Some(page) = pages.next().await {
                let page = page.map_err(|e| PluginError(format!("s3 sink: listing {prefix}: {}", describe(&e))))?;
                for object in page.contents() {
                    let name = object.key().unwrap_or_default().strip_prefix(&prefix).unwrap_or_default();
                    let seq = name.split_once('.').and_then(|(n, _)| n.parse::<u64>().ok());
                    highest = highest.max(seq);
                }
            }
            if let Some(seq) = highest {
                out.push((stream.clone(), seq));
            }
        }
        Ok(out)
    }
}

impl Sink for S3Sink {
    fn apply(
        &mut self,
        stream: &str,
        seq: u64,
        id: CompactionId,
        records: &Records,
    ) -> Result<SinkOutcome, PluginError> {
        let body = super::json_lines(records);
        let runtime = self.runtime.clone();
        runtime.block_on(self.apply_async(stream, seq, id, &body)).inspect_err(|e| warn!(error = %e, "s3 sink"))
    }

    /// The highest number under each stream's prefix: one listing of it,
    /// at recovery.
    fn progress(&mut self, streams: &[String]) -> Result<Vec<(String, u64)>, PluginError> {
        let runtime = self.runtime.clone();
        runtime.block_on(self.progress_async(streams))
    }
}

fn gzip(body: &[u8]) -> Vec<u8> {
    let mut e = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::default());
    e.write_all(body).expect("a Vec takes writes");
    e.finish().expect("a Vec takes writes")
}

fn gunzip(bytes: &[u8]) -> Option<Vec<u8>> {
    let mut out = Vec::new();
    flate2::read::GzDecoder::new(bytes).read_to_end(&mut out).ok()?;
    Some(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn gzip_round_trips_and_garbage_is_not_a_batch() {
        let body = b"{\"a\":1}\n{\"a\":2}\n";
        assert_eq!(gunzip(&gzip(body)).unwrap(), body);
        assert!(gunzip(b"not gzip").is_none());
        assert_eq!(normalize_prefix("/out/x/"), "out/x/");
        assert_eq!(normalize_prefix(""), "");
    }
}
