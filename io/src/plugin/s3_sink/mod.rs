//! The built-in `s3` sink: one object per destination batch, keyed by its
//! scope and sequence number, `<prefix><stream>/<scope tag>.<seq, 20
//! digits>.jsonl` (or `.jsonl.gz`), one record per line as emitted, the
//! batch's `compaction_id` and digest in the object's metadata
//! (`skippr-compaction-id`, `skippr-digest`). The scope tag (the pipeline
//! and a hash of it with the WAL identity) lets two pipelines, or two WALs,
//! share a prefix.
//!
//! Every object is created with `If-None-Match: *` on a client without SDK
//! retries (a silent retry of a put that succeeded would come back 412),
//! so a number holds one object for good. A 412 means the number is taken:
//! the object is read back and judged by core's sink ledger: the same id
//! with the same records (after decompressing) is `already_applied`;
//! another id or other records are `fatal`. A 409 (a concurrent
//! conditional write), throttling, 5xx and timeouts are retried. So two
//! daemons applying the same batch at once (a deposed clustered leader and
//! its successor) leave one object.
//!
//! Objects written before keys carried a scope (`<stream>/<seq>.jsonl`)
//! belong to the first scope that finds them after the upgrade: it claims
//! them in `<prefix>.skippr/legacy-owner` (created with `If-None-Match`),
//! and a batch of its whose number one of them holds is judged against it.

pub mod settings;

use super::{PluginError, Sink};
use crate::aws::describe;
use crate::s3_wal::{check_bucket, definite_refusal, error_code, normalize_prefix, status};
use aws_sdk_s3::primitives::ByteStream;
use aws_sdk_s3::Client;
use skippr_core::ledger::{conflict_message, judge, Digest, Entry, Scope, Verdict};
use skippr_core::{CompactionId, Records, SinkOutcome};
use std::collections::BTreeMap;
use std::io::{Read, Write};
use tokio::runtime::Handle;
use tracing::{error, info, warn};

/// The metadata key that carries the batch's id.
pub const ID_METADATA: &str = "skippr-compaction-id";
/// The metadata key that carries the digest of the batch's records.
pub const DIGEST_METADATA: &str = "skippr-digest";
/// Under the prefix: names the scope that owns the objects of before the
/// upgrade (in a folder of the sink's own, holding no `*.jsonl`).
pub const LEGACY_OWNER: &str = ".skippr/legacy-owner";

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
        match check_bucket(&target.puts, bucket, "the sink's S3 bucket", "--sink-s3-bucket").await {
            Ok(()) => Ok(target),
            Err(Ok(message)) => Err(message),
            Err(Err(cause)) => Err(format!("cannot use the sink's S3 bucket '{bucket}': {cause}")),
        }
    }

    /// A batch's key.
    pub fn key(&self, tag: &str, stream: &str, seq: u64) -> String {
        format!("{}{stream}/{tag}.{seq:020}.{}", self.prefix, self.ext())
    }

    /// A batch's key as written before keys carried a scope.
    pub fn unscoped_key(&self, stream: &str, seq: u64) -> String {
        format!("{}{stream}/{seq:020}.{}", self.prefix, self.ext())
    }

    fn ext(&self) -> &'static str {
        if self.gzip {
            "jsonl.gz"
        } else {
            "jsonl"
        }
    }
}

/// What one listing of a stream's prefix found: this scope's highest
/// number, and the highest of the objects of before the upgrade.
#[derive(Clone, Copy, Default)]
struct Survey {
    ours: Option<u64>,
    unscoped: Option<u64>,
}

/// An object's name under its stream: a scope tag (none for an object of
/// before the upgrade) and a number.
impl S3SinkTarget {
    /// Every object of `scope` under the prefix, as (stream, number, bytes)
    /// in stream and number order (gunzipped when the target gzips): what
    /// `skipprd dead-letters list` reads of the `s3` destination.
    pub async fn read_scope(&self, scope: &Scope) -> Result<Vec<crate::plugin::dir_sink::HeldBatch>, String> {
        let tag = scope.tag();
        let mut out = Vec::new();
        let mut pages = self.client.list_objects_v2().bucket(&self.bucket).prefix(&self.prefix).into_paginator().send();
        while let Some(page) = pages.next().await {
            let page = page.map_err(|e| format!("listing s3://{}/{}: {}", self.bucket, self.prefix, describe(&e)))?;
            for object in page.contents() {
                let key = object.key().unwrap_or_default();
                let Some((stream, name)) = key.strip_prefix(&self.prefix).and_then(|k| k.split_once('/')) else {
                    continue;
                };
                let Some((Some(t), seq)) = parse_key(name) else { continue };
                if t != tag {
                    continue;
                }
                let got = self.client.get_object().bucket(&self.bucket).key(key).send().await;
                let got = got.map_err(|e| format!("reading s3://{}/{key}: {}", self.bucket, describe(&e)))?;
                let body = got.body.collect().await.map_err(|e| format!("reading s3://{}/{key}: {e}", self.bucket))?;
                let bytes = body.into_bytes().to_vec();
                let bytes = if self.gzip { gunzip(&bytes).unwrap_or(bytes) } else { bytes };
                out.push((stream.to_string(), seq, bytes));
            }
        }
        out.sort_by(|a, b| (&a.0, a.1).cmp(&(&b.0, b.1)));
        Ok(out)
    }
}

fn parse_key(name: &str) -> Option<(Option<&str>, u64)> {
    let (first, rest) = name.split_once('.')?;
    let (tag, number) = match rest.split_once('.') {
        Some((number, ext)) if ext.starts_with("jsonl") => (Some(first), number),
        _ if rest.starts_with("jsonl") => (None, first),
        _ => return None,
    };
    if number.len() != 20 || tag.is_some_and(|t| t.is_empty()) {
        return None;
    }
    Some((tag, number.parse().ok()?))
}

/// The sink: a target and the runtime its requests run on (the daemon's;
/// sinks are called on its blocking threads).
pub struct S3Sink {
    target: S3SinkTarget,
    runtime: Handle,
    /// This pipeline's and WAL's tag in every key.
    tag: String,
    /// Whether the objects of before the upgrade are this scope's, once a
    /// listing has found some.
    legacy: Option<bool>,
    /// Per stream, what its one listing found.
    surveys: BTreeMap<String, Survey>,
}

impl S3Sink {
    pub fn new(target: S3SinkTarget, scope: &Scope, runtime: Handle) -> S3Sink {
        S3Sink { target, runtime, tag: scope.tag(), legacy: None, surveys: BTreeMap::new() }
    }

    /// Lists a stream's prefix once: this scope's highest number, and,
    /// where objects of before the upgrade are this scope's, their highest.
    async fn survey(&mut self, stream: &str) -> Result<Survey, PluginError> {
        if let Some(s) = self.surveys.get(stream) {
            return Ok(*s);
        }
        let t = &self.target;
        let prefix = format!("{}{stream}/", t.prefix);
        let mut survey = Survey::default();
        let mut pages = t.client.list_objects_v2().bucket(&t.bucket).prefix(&prefix).into_paginator().send();
        while let Some(page) = pages.next().await {
            let page = page.map_err(|e| PluginError(format!("s3 sink: listing {prefix}: {}", describe(&e))))?;
            for object in page.contents() {
                let name = object.key().unwrap_or_default().strip_prefix(&prefix).unwrap_or_default();
                match parse_key(name) {
                    Some((Some(tag), seq)) if tag == self.tag => survey.ours = survey.ours.max(Some(seq)),
                    Some((None, seq)) => survey.unscoped = survey.unscoped.max(Some(seq)),
                    _ => {}
                }
            }
        }
        if survey.unscoped.is_some() && !self.adopt_legacy().await? {
            survey.unscoped = None;
        }
        self.surveys.insert(stream.to_string(), survey);
        Ok(survey)
    }

    /// Claims the objects of before the upgrade for this scope unless
    /// another scope has: one conditional put decides.
    async fn adopt_legacy(&mut self) -> Result<bool, PluginError> {
        if let Some(ours) = self.legacy {
            return Ok(ours);
        }
        let t = &self.target;
        let key = format!("{}{LEGACY_OWNER}", t.prefix);
        let sent = t
            .puts
            .put_object()
            .bucket(&t.bucket)
            .key(&key)
            .if_none_match("*")
            .body(ByteStream::from(format!("{}\n", self.tag).into_bytes()))
            .send()
            .await;
        match sent {
            Ok(_) => {}
            Err(e) if matches!(status(&e), Some(412) | Some(409)) => {}
            Err(e) => return Err(PluginError(format!("s3 sink: put {key}: {}", describe(&e)))),
        }
        let Some((_, bytes)) = self.read(&key).await? else {
            return Err(PluginError(format!("s3 sink: {key} was made, then gone when read back; retrying")));
        };
        let ours = String::from_utf8_lossy(&bytes).trim() == self.tag;
        if ours {
            info!(key, tag = %self.tag, "s3 sink: the objects written before keys carried a pipeline are this pipeline's");
        }
        self.legacy = Some(ours);
        Ok(ours)
    }

    async fn apply_async(
        &mut self,
        stream: &str,
        seq: u64,
        id: CompactionId,
        body: &[u8],
    ) -> Result<SinkOutcome, PluginError> {
        let claim = Entry { id, digest: Some(Digest::of_lines(body)) };
        let survey = self.survey(stream).await?;
        if survey.unscoped.is_some_and(|highest| seq <= highest) {
            let key = self.target.unscoped_key(stream, seq);
            if let Some(held) = self.held(&key).await? {
                return Ok(self.refuse(&key, stream, seq, id, judge(claim, Some(held))));
            }
        }
        let t = &self.target;
        let key = t.key(&self.tag, stream, seq);
        let object = if t.gzip { gzip(body) } else { body.to_vec() };
        let sent = t
            .puts
            .put_object()
            .bucket(&t.bucket)
            .key(&key)
            .if_none_match("*")
            .metadata(ID_METADATA, id.to_string())
            .metadata(DIGEST_METADATA, claim.digest.expect("set above").to_string())
            .content_type("application/x-ndjson")
            .body(ByteStream::from(object))
            .send()
            .await;
        let e = match sent {
            Ok(_) => return Ok(SinkOutcome::Applied),
            Err(e) => e,
        };
        match status(&e) {
            // The number is taken: by this batch (a replay), or by another.
            Some(412) => match self.held(&key).await? {
                Some(held) => Ok(self.refuse(&key, stream, seq, id, judge(claim, Some(held)))),
                None => Err(PluginError(format!("s3 sink: {key} was taken, then gone when read back; retrying"))),
            },
            Some(s) if definite_refusal(s, error_code(&e)) => {
                error!(key, error = %describe(&e), "s3 sink: S3 refused the batch's object");
                Ok(SinkOutcome::Fatal)
            }
            // A 409 (a concurrent conditional write), throttling, 5xx,
            // timeouts: retried with the same bytes.
            _ => Err(PluginError(format!("s3 sink: put {key}: {}", describe(&e)))),
        }
    }

    /// An object's body and the id in its metadata ("" without one);
    /// `None` when there is no such object.
    async fn read(&self, key: &str) -> Result<Option<(String, Vec<u8>)>, PluginError> {
        let t = &self.target;
        let got = match t.client.get_object().bucket(&t.bucket).key(key).send().await {
            Ok(got) => got,
            Err(e) if status(&e) == Some(404) => return Ok(None),
            Err(e) => return Err(PluginError(format!("s3 sink: reading back {key}: {}", describe(&e)))),
        };
        let id = got.metadata().and_then(|m| m.get(ID_METADATA)).cloned().unwrap_or_default();
        let body = got.body.collect().await.map_err(|e| PluginError(format!("s3 sink: reading back {key}: {e}")))?;
        Ok(Some((id, body.into_bytes().to_vec())))
    }

    /// What an object holds, for the rule: its id, and the digest of its
    /// records; `None` when there is no such object.
    async fn held(&self, key: &str) -> Result<Option<Entry>, PluginError> {
        let Some((found_id, bytes)) = self.read(key).await? else { return Ok(None) };
        let records = if self.target.gzip { gunzip(&bytes) } else { Some(bytes) };
        // An id that does not parse, or bytes that do not decompress, are
        // another batch's: never this one's.
        let id = u64::from_str_radix(&found_id, 16).map(CompactionId).unwrap_or(CompactionId(!0));
        let digest = Digest::of_lines(records.as_deref().unwrap_or(b"\0not a batch"));
        Ok(Some(Entry { id, digest: Some(digest) }))
    }

    fn refuse(&self, key: &str, stream: &str, seq: u64, id: CompactionId, verdict: Verdict) -> SinkOutcome {
        if let Verdict::Conflict(c) = verdict {
            error!(key, "s3 sink: {}", conflict_message(stream, seq, id, c));
        }
        verdict.outcome()
    }

    async fn progress_async(&mut self, streams: &[String]) -> Result<Vec<(String, u64)>, PluginError> {
        let mut out = Vec::new();
        for stream in streams {
            // Listed now, not as an apply found it.
            self.surveys.remove(stream);
            let survey = self.survey(stream).await?;
            if let Some(seq) = survey.ours.max(survey.unscoped) {
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

    /// The highest number of this scope under each stream's prefix (the
    /// objects of before the upgrade included, where they are its): one
    /// listing of it, at recovery.
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
    fn keys_carry_the_scope_and_old_keys_parse_without_one() {
        assert_eq!(
            parse_key("main-0123456789abcdef.00000000000000000007.jsonl"),
            Some((Some("main-0123456789abcdef"), 7))
        );
        assert_eq!(
            parse_key("main-0123456789abcdef.00000000000000000007.jsonl.gz"),
            Some((Some("main-0123456789abcdef"), 7))
        );
        assert_eq!(parse_key("00000000000000000007.jsonl"), Some((None, 7)));
        assert_eq!(parse_key("00000000000000000007.jsonl.gz"), Some((None, 7)));
        assert_eq!(parse_key("notes.txt"), None);
        assert_eq!(parse_key("7.jsonl"), None);
    }

    #[test]
    fn gzip_round_trips_and_garbage_is_not_a_batch() {
        let body = b"{\"a\":1}\n{\"a\":2}\n";
        assert_eq!(gunzip(&gzip(body)).unwrap(), body);
        assert!(gunzip(b"not gzip").is_none());
        assert_eq!(normalize_prefix("/out/x/"), "out/x/");
        assert_eq!(normalize_prefix(""), "");
    }
}
