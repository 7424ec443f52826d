//! The WAL on S3 (`WAL_STORAGE=s3`).
//!
//! A segment is a run of immutable objects under `PREFIX<segment:020>/`: the
//! segment header at `00000000000000000000`, then one object per commit group
//! at the group's byte offset, zero-padded to 20 digits. The keys of a
//! segment are dense: each group starts where the one before it ends, so the
//! listing alone shows a gap or an overlap, and a read lays the objects out
//! as the disk backend's file would be (zeros in any gap), for the engine's
//! scan to admit the contiguous prefix of complete, checksum-valid groups.
//! Recovery reads a window at a time: a segment's objects are listed when
//! its first window is asked for, and each window fetches the objects it
//! covers (the one it ends inside is kept for the next).
//!
//! Every object is created with `If-None-Match: *` and SDK retries off, one
//! put in flight. A put whose outcome is unknown (timeout, reset, 5xx,
//! throttling, a 409 from a concurrent conditional write) is reported as
//! `Ambiguous` and retried by the engine with the identical bytes. A 412
//! means the key exists: the object is read back and compared, so the same
//! bytes are a success and different bytes a `Conflict` (another writer got
//! there first). Nothing is ever overwritten.
//!
//! Deleting a segment removes its header first, then its groups. A listing
//! only lists: it reports every segment with the offsets of its objects, and
//! the engine decides what below the WAL is a leftover (the groups of a
//! delete a crash interrupted, a header that a late copy of a creation put
//! brought back) and deletes it under its writer-authority check. The
//! layout rules (`skippr_core::format::objects`) are shared with the simulator.

use crate::aws::{describe, start_up_check, Check};
use aws_sdk_s3::error::SdkError;
use aws_sdk_s3::primitives::ByteStream;
use aws_sdk_s3::types::{Delete, ObjectIdentifier};
use aws_sdk_s3::Client;
use skippr_core::format::{first_overlap, split_leftovers, taken_key, GroupPlace};
use skippr_core::{IoError, IoReply, SegmentId, WalListing, WalOp};
use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};
use tracing::{info, warn};

/// Objects fetched at once when a segment is read.
const READ_CONCURRENCY: usize = 16;

pub struct S3Wal {
    /// For puts: no SDK retries, so a put that succeeded is never silently
    /// sent again (it would come back 412 and look like a conflict).
    puts: Client,
    /// For reads, listings and deletes, which are safe to retry.
    client: Client,
    bucket: String,
    prefix: String,
    /// The segments recovery is reading a window at a time (a stop
    /// record's checks read several at once), each with its listing.
    reading: Mutex<BTreeMap<SegmentId, Reading>>,
}

/// A segment's objects (offset and size) as listed for its first window,
/// and the object the last window ended inside, fetched.
struct Reading {
    objects: BTreeMap<u64, u64>,
    kept: Option<(u64, Vec<u8>)>,
}

/// One object of a segment: its offset and size.
type Listed = BTreeMap<SegmentId, BTreeMap<u64, i64>>;

impl S3Wal {
    /// Listings kept for `read_at` at most (the oldest segment's goes first).
    const READINGS_KEPT: usize = 16;

    /// Connects and checks that the bucket answers.
    pub async fn connect(sdk: &aws_config::SdkConfig, bucket: &str, prefix: &str) -> Result<S3Wal, String> {
        let custom = crate::aws::s3_endpoint(sdk);
        let base = aws_sdk_s3::config::Builder::from(sdk).force_path_style(custom.is_some());
        let endpoint = crate::aws::endpoint_label(custom, sdk);
        let puts = Client::from_conf(base.clone().retry_config(aws_config::retry::RetryConfig::disabled()).build());
        let client = Client::from_conf(base.build());
        let prefix = normalize_prefix(prefix);
        let wal = S3Wal { puts, client, bucket: bucket.to_string(), prefix, reading: Mutex::new(BTreeMap::new()) };
        match check_bucket(&wal.puts, bucket, "the S3 bucket", "SKIPPR_WAL_S3_BUCKET").await {
            Ok(()) => Ok(wal),
            Err(Ok(message)) => Err(message),
            Err(Err(cause)) => Err(format!("cannot use the S3 bucket '{bucket}' at {endpoint}: {cause}")),
        }
    }

    /// `s3://bucket/prefix`, for messages and the lease's name.
    pub fn location(&self) -> String {
        location(&self.bucket, &self.prefix)
    }

    pub fn key(&self, segment: SegmentId, offset: u64) -> String {
        format!("{}{:020}/{offset:020}", self.prefix, segment.0)
    }

    /// Makes the object at `(segment, offset)` hold `bytes`: created, or
    /// found already holding exactly these bytes.
    /// Performs one WAL request of the engine's. Writes are durable once
    /// visible, so a sync is nothing to do; a creation is its header object.
    pub async fn perform(&self, op: WalOp) -> Result<IoReply, IoError> {
        match op {
            WalOp::Replicate(_) | WalOp::ReadHardState | WalOp::InstallSnapshot(_) => {
                unreachable!("clustered mode keeps its WAL on local disks")
            }
            WalOp::Sync => Ok(IoReply::Done),
            WalOp::ReadStopRecord => self.read_stop_record().await.map(IoReply::StopRecord),
            WalOp::WriteStopRecord(bytes) => self.write_stop_record(bytes).await.map(|()| IoReply::Done),
            WalOp::List => self.list().await.map(IoReply::Segments),
            WalOp::ReadAt { segment, offset, len } => {
                self.read_at(segment, offset, len).await.map(|b| IoReply::SegmentBytes(b.into()))
            }
            WalOp::ReadGroups { places } => {
                let mut groups = Vec::with_capacity(places.len());
                for place in places {
                    groups.push(self.read_group(place).await?);
                }
                Ok(IoReply::Groups(groups))
            }
            WalOp::Create { segment, header, .. } => self.put(segment, 0, &header).await.map(|()| IoReply::Done),
            WalOp::Append { segment, offset, bytes, .. } => {
                self.put(segment, offset, &bytes).await.map(|()| IoReply::Done)
            }
            WalOp::Delete { segment } => self.delete(segment).await.map(|()| IoReply::Done),
        }
    }

    /// Committed groups: the object at the place's key and those after it
    /// (each group's object is keyed by where the one before it ends),
    /// until they make the place's length (the engine verifies the bytes).
    pub async fn read_group(&self, place: GroupPlace) -> Result<Vec<u8>, IoError> {
        let end = place.offset + place.len;
        let mut bytes = self.get(&self.key(place.segment, place.offset)).await?;
        while (bytes.len() as u64) < place.len {
            let key = self.key(place.segment, place.offset + bytes.len() as u64);
            let next = self.get(&key).await?;
            if next.is_empty() {
                break;
            }
            bytes.extend_from_slice(&next);
        }
        if place.offset + bytes.len() as u64 != end {
            let (key, len) = (self.key(place.segment, place.offset), bytes.len());
            warn!(key, len, expected = place.len, "committed WAL objects have another length");
        }
        Ok(bytes)
    }

    pub async fn put(&self, segment: SegmentId, offset: u64, bytes: &[u8]) -> Result<(), IoError> {
        let key = self.key(segment, offset);
        let sent = self
            .puts
            .put_object()
            .bucket(&self.bucket)
            .key(&key)
            .if_none_match("*")
            .body(ByteStream::from(bytes.to_vec()))
            .send()
            .await;
        let e = match sent {
            Ok(_) => return Ok(()),
            Err(e) => e,
        };
        match status(&e) {
            Some(412) => self.compare(&key, bytes).await,
            Some(s) if definite_refusal(s, error_code(&e)) => {
                warn!(key, error = %describe(&e), "S3 refused the put");
                Err(IoError::Failed)
            }
            // Timeouts, resets, 5xx, throttling, a racing conditional write
            // (409), an expired token or a skewed clock: the object may or
            // may not be there.
            _ => {
                warn!(key, error = %describe(&e), "the outcome of a put is unknown; it is sent again unchanged");
                Err(IoError::Ambiguous)
            }
        }
    }

    /// The key exists: is it our bytes, or another writer's? A read that
    /// fails leaves the question open, and the put is sent again.
    async fn compare(&self, key: &str, bytes: &[u8]) -> Result<(), IoError> {
        let found = self.get(key).await.map_err(|_| IoError::Ambiguous)?;
        taken_key(&found, bytes).inspect_err(|_| warn!(key, "another writer's object is at this key"))
    }

    /// Checks that the store honours `If-None-Match: *`: a second create of
    /// the same key must be refused with 412. Without that, writers cannot be
    /// fenced, and the daemon refuses to start. The probe key sits beside
    /// the WAL's prefix, not under it, and is deleted afterwards. Each put is
    /// tried up to four times (`start_up_check`) while its failure may pass
    /// (no answer in time, a 5xx, throttling): one slow request must not stop
    /// a start. A first create answered 412 was one of ours that landed
    /// unseen (the key is this run's own).
    pub async fn probe_conditional_puts(&self, nonce: u64) -> Result<(), String> {
        let key = format!("{}.skipprd-probe-{nonce:016x}", self.prefix.trim_end_matches('/'));
        let put = || {
            self.puts
                .put_object()
                .bucket(&self.bucket)
                .key(&key)
                .if_none_match("*")
                .body(ByteStream::from_static(b"probe"))
                .send()
        };
        // One create: `true` when refused as taken (412).
        let create = || async {
            match put().await {
                Ok(_) => Check::Ready(false),
                Err(e) if status(&e) == Some(412) => Check::Ready(true),
                Err(e) if status(&e).is_some_and(|s| definite_refusal(s, error_code(&e))) => {
                    Check::Refused(describe(&e))
                }
                Err(e) => Check::Failed(describe(&e)),
            }
        };
        if let Err(Ok(cause) | Err(cause)) = start_up_check(create).await {
            return Err(format!("cannot write the probe object {key}: {cause}"));
        }
        let second = start_up_check(create).await;
        let _ = self.client.delete_object().bucket(&self.bucket).key(&key).send().await;
        match second {
            Ok(true) => Ok(()),
            Ok(false) => Err(format!(
                "this S3 endpoint ignores If-None-Match (a second create of {key} succeeded): skipprd cannot fence \
                 writers on it, so it will not write a WAL there"
            )),
            Err(Ok(cause) | Err(cause)) => Err(format!("the conditional-write probe at {key} failed: {cause}")),
        }
    }

    /// The stop record's key: beside the WAL's prefix, not under it.
    pub fn stop_record_key(&self) -> String {
        format!("{}.stop-record", self.prefix.trim_end_matches('/'))
    }

    async fn read_stop_record(&self) -> Result<Option<Vec<u8>>, IoError> {
        let key = self.stop_record_key();
        match self.client.get_object().bucket(&self.bucket).key(&key).send().await {
            Ok(out) => match out.body.collect().await {
                Ok(body) => Ok(Some(body.into_bytes().to_vec())),
                Err(e) => {
                    warn!(key, error = %e, "reading the stop record's body failed");
                    Err(IoError::Failed)
                }
            },
            Err(e) if e.as_service_error().is_some_and(|s| s.is_no_such_key()) => Ok(None),
            Err(e) => {
                warn!(key, error = %describe(&e), "reading the stop record failed");
                Err(IoError::Failed)
            }
        }
    }

    /// Replaces the stop record (a put is atomic: the old or the new).
    async fn write_stop_record(&self, bytes: Vec<u8>) -> Result<(), IoError> {
        let (key, len) = (self.stop_record_key(), bytes.len());
        let put = self.puts.put_object().bucket(&self.bucket).key(&key).body(ByteStream::from(bytes));
        put.send().await.map_err(|e| {
            warn!(key, error = %describe(&e), "writing the stop record failed");
            IoError::Failed
        })?;
        info!(key, bytes = len, "wrote the stop record: the next start need not scan the WAL");
        Ok(())
    }

    async fn get(&self, key: &str) -> Result<Vec<u8>, IoError> {
        fetch(&self.client, &self.bucket, key).await
    }

    /// Every object under `prefix`, paginated, by segment and offset. Keys
    /// that are not the WAL's are named in a warning and left alone.
    async fn list_objects(&self, prefix: &str) -> Result<Listed, IoError> {
        let mut listed = Listed::new();
        let mut pages = self.client.list_objects_v2().bucket(&self.bucket).prefix(prefix).into_paginator().send();
        while let Some(page) = pages.next().await {
            let page = page.map_err(|e| {
                warn!(prefix, error = %describe(&e), "listing the WAL failed; a partial listing is not trusted");
                IoError::Failed
            })?;
            for object in page.contents() {
                let key = object.key().unwrap_or_default();
                if key == self.stop_record_key() {
                    continue;
                }
                match self.parse_key(key) {
                    Some((segment, offset)) => {
                        listed.entry(segment).or_default().insert(offset, object.size().unwrap_or(-1));
                    }
                    None => warn!(key, "ignoring an object under the WAL prefix that is not a WAL object"),
                }
            }
        }
        Ok(listed)
    }

    fn parse_key(&self, key: &str) -> Option<(SegmentId, u64)> {
        let rest = key.strip_prefix(&self.prefix)?;
        let (segment, offset) = rest.split_once('/')?;
        let digits = |s: &str| s.len() == 20 && s.bytes().all(|b| b.is_ascii_digit());
        if !digits(segment) || !digits(offset) {
            return None;
        }
        Some((SegmentId(segment.parse().ok()?), offset.parse().ok()?))
    }

    /// Every segment, with the offsets of its objects. Nothing is deleted
    /// here: the engine decides which segments are leftovers.
    pub async fn list(&self) -> Result<WalListing, IoError> {
        let listed = self.list_objects(&self.prefix).await?;
        Ok(WalListing::Objects(offsets(&listed)))
    }

    /// The segments that still belong to the WAL (the engine's rule): for
    /// tools that only read.
    pub async fn list_segments(&self) -> Result<Vec<SegmentId>, IoError> {
        let listed = self.list_objects(&self.prefix).await?;
        Ok(split_leftovers(&offsets(&listed)).1)
    }

    /// A segment's bytes, each object at its offset and zeros in any gap.
    /// Objects that overlap cannot be laid out: the read fails, naming them.
    pub async fn read(&self, segment: SegmentId) -> Result<Vec<u8>, IoError> {
        self.read_at(segment, 0, usize::MAX).await
    }

    /// `len` bytes of a segment from `offset`, laid out as `read` lays out
    /// the whole, fewer where its last listed object ends. The first window
    /// (offset 0) lists the segment's objects; later ones fetch only the
    /// objects they cover.
    pub async fn read_at(&self, segment: SegmentId, offset: u64, len: usize) -> Result<Vec<u8>, IoError> {
        let held = self.reading.lock().expect("not poisoned").remove(&segment).filter(|_| offset > 0);
        let mut reading = match held {
            Some(reading) => reading,
            None => self.list_segment(segment).await?,
        };
        let end = offset.saturating_add(len as u64).min(reading.objects.iter().next_back().map_or(0, |(o, s)| o + s));
        if end <= offset {
            return Ok(Vec::new());
        }
        let covered: Vec<u64> = reading
            .objects
            .range(..end)
            .filter(|(o, size)| *o + *size > offset && **size > 0)
            .map(|(o, _)| *o)
            .collect();
        let kept = reading.kept.take().filter(|(o, _)| covered.contains(o));
        let keys = covered.iter().filter(|o| kept.as_ref().is_none_or(|(k, _)| k != *o));
        let mut fetched = self.get_many(keys.map(|&o| (o, self.key(segment, o))).collect()).await?;
        fetched.extend(kept);
        fetched.sort_by_key(|(o, _)| *o);
        let mut out = vec![0u8; (end - offset) as usize];
        for (o, bytes) in &fetched {
            let (from, to) = ((*o).max(offset), (o + bytes.len() as u64).min(end));
            if from < to {
                out[(from - offset) as usize..(to - offset) as usize]
                    .copy_from_slice(&bytes[(from - o) as usize..(to - o) as usize]);
            }
        }
        reading.kept = fetched.into_iter().last().filter(|(o, b)| o + b.len() as u64 > end);
        let mut held = self.reading.lock().expect("not poisoned");
        held.insert(segment, reading);
        while held.len() > Self::READINGS_KEPT {
            held.pop_first();
        }
        Ok(out)
    }

    /// Lists one segment's objects for `read_at`; overlapping objects (two
    /// writers wrote the segment) or a size the listing lacks make it
    /// unreadable.
    async fn list_segment(&self, segment: SegmentId) -> Result<Reading, IoError> {
        let listed = self.list_objects(&format!("{}{:020}/", self.prefix, segment.0)).await?;
        let listed = listed.get(&segment).cloned().unwrap_or_default();
        if let Some((&offset, _)) = listed.iter().find(|(_, size)| **size < 0) {
            warn!(key = self.key(segment, offset), "the listing gives no size for a WAL object; it cannot be read");
            return Err(IoError::Failed);
        }
        let objects: BTreeMap<u64, u64> = listed.into_iter().map(|(o, size)| (o, size as u64)).collect();
        if let Some(offset) = first_overlap(objects.iter().map(|(&o, &size)| (o, size))) {
            warn!(
                key = self.key(segment, offset),
                "WAL objects overlap: two writers wrote this segment; it cannot be read"
            );
            return Err(IoError::Failed);
        }
        Ok(Reading { objects, kept: None })
    }

    async fn get_many(&self, keys: Vec<(u64, String)>) -> Result<Vec<(u64, Vec<u8>)>, IoError> {
        let semaphore = Arc::new(tokio::sync::Semaphore::new(READ_CONCURRENCY));
        let mut tasks = tokio::task::JoinSet::new();
        for (offset, key) in keys {
            let permit = Arc::clone(&semaphore).acquire_owned().await.expect("never closed");
            let (client, bucket) = (self.client.clone(), self.bucket.clone());
            tasks.spawn(async move {
                let _permit = permit;
                fetch(&client, &bucket, &key).await.map(|bytes| (offset, bytes))
            });
        }
        let mut out = Vec::new();
        while let Some(done) = tasks.join_next().await {
            out.push(done.map_err(|_| IoError::Failed)??);
        }
        out.sort_by_key(|(offset, _)| *offset);
        Ok(out)
    }

    /// Deletes a segment: its header first (after which it is being deleted
    /// whatever happens), then its groups.
    pub async fn delete(&self, segment: SegmentId) -> Result<(), IoError> {
        let header = self.key(segment, 0);
        self.client.delete_object().bucket(&self.bucket).key(&header).send().await.map_err(|e| {
            warn!(key = header, error = %describe(&e), "deleting a WAL segment's header failed");
            IoError::Failed
        })?;
        let listed = self.list_objects(&format!("{}{:020}/", self.prefix, segment.0)).await?;
        let keys = listed.get(&segment).map(|o| o.keys().map(|&off| self.key(segment, off)).collect());
        self.delete_objects(keys.unwrap_or_default()).await
    }

    async fn delete_objects(&self, keys: Vec<String>) -> Result<(), IoError> {
        for chunk in keys.chunks(1000) {
            let objects: Vec<ObjectIdentifier> =
                chunk.iter().filter_map(|k| ObjectIdentifier::builder().key(k).build().ok()).collect();
            let delete =
                Delete::builder().set_objects(Some(objects)).quiet(true).build().map_err(|_| IoError::Failed)?;
            let out = self.client.delete_objects().bucket(&self.bucket).delete(delete).send().await.map_err(|e| {
                warn!(error = %describe(&e), "deleting WAL objects failed");
                IoError::Failed
            })?;
            if let Some(e) = out.errors().first() {
                warn!(
                    key = e.key().unwrap_or_default(),
                    error = e.message().unwrap_or_default(),
                    "deleting a WAL object failed"
                );
                return Err(IoError::Failed);
            }
        }
        Ok(())
    }
}

/// Each listed segment with the offsets of its objects.
fn offsets(listed: &Listed) -> BTreeMap<SegmentId, Vec<u64>> {
    listed.iter().map(|(s, objects)| (*s, objects.keys().copied().collect())).collect()
}

async fn fetch(client: &Client, bucket: &str, key: &str) -> Result<Vec<u8>, IoError> {
    let out = client.get_object().bucket(bucket).key(key).send().await.map_err(|e| {
        warn!(key, error = %describe(&e), "reading a WAL object failed");
        IoError::Failed
    })?;
    let body = out.body.collect().await.map_err(|e| {
        warn!(key, error = %e, "reading a WAL object's body failed");
        IoError::Failed
    })?;
    Ok(body.into_bytes().to_vec())
}

/// "" or a prefix ending in one '/'.
/// `s3://bucket/prefix/`, as a WAL at that bucket and prefix calls itself.
pub fn location(bucket: &str, prefix: &str) -> String {
    format!("s3://{bucket}/{}", normalize_prefix(prefix))
}

pub fn normalize_prefix(prefix: &str) -> String {
    let p = prefix.trim_matches('/');
    if p.is_empty() {
        String::new()
    } else {
        format!("{p}/")
    }
}

pub(crate) fn status<E>(e: &SdkError<E, aws_sdk_s3::config::http::HttpResponse>) -> Option<u16> {
    e.raw_response().map(|r| r.status().as_u16())
}

/// A start-up check that `bucket` answers, on a client without SDK retries
/// (`start_up_check`: four tries while the failure may pass). `whose` and
/// `fix` name the bucket and the setting in the messages: a missing bucket
/// or denied access is the message to stop with (`Err(Ok)`), anything else
/// the last failure's cause (`Err(Err)`).
pub(crate) async fn check_bucket(
    client: &Client,
    bucket: &str,
    whose: &str,
    fix: &str,
) -> Result<(), Result<String, String>> {
    start_up_check(|| async {
        let Err(e) = client.head_bucket().bucket(bucket).send().await else { return Check::Ready(()) };
        match status(&e) {
            Some(404) => Check::Refused(format!("{whose} '{bucket}' does not exist: create it, or fix {fix}")),
            Some(403) => {
                Check::Refused(format!("access to {whose} '{bucket}' is denied: check the credentials and policy"))
            }
            _ => Check::Failed(describe(&e)),
        }
    })
    .await
}

/// A 4xx that means the request was refused and will be refused again
/// (permissions, a missing bucket, a malformed request), not one that a
/// retry can get past (a timeout, throttling, a racing conditional write,
/// an expired token during credential rotation, a skewed clock).
pub(crate) fn definite_refusal(status: u16, code: Option<&str>) -> bool {
    let transient = matches!(
        code,
        Some(
            "RequestTimeout"
                | "ExpiredToken"
                | "TokenRefreshRequired"
                | "RequestTimeTooSkewed"
                | "SlowDown"
                | "OperationAborted"
                | "ConditionalRequestConflict"
        )
    );
    (400..500).contains(&status) && !matches!(status, 408 | 409 | 412 | 429) && !transient
}

pub(crate) fn error_code<E: aws_sdk_s3::error::ProvideErrorMetadata, R>(e: &SdkError<E, R>) -> Option<&str> {
    e.as_service_error().and_then(|s| s.code())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn prefixes_end_in_one_slash() {
        assert_eq!(normalize_prefix(""), "");
        assert_eq!(normalize_prefix("/"), "");
        assert_eq!(normalize_prefix("a/b"), "a/b/");
        assert_eq!(normalize_prefix("/a/b//"), "a/b/");
    }

    #[test]
    fn refusals_are_told_from_outcomes_that_are_unknown() {
        assert!(definite_refusal(403, Some("AccessDenied")));
        assert!(definite_refusal(404, Some("NoSuchBucket")));
        assert!(definite_refusal(400, Some("InvalidArgument")));
        assert!(!definite_refusal(400, Some("RequestTimeout")));
        assert!(!definite_refusal(400, Some("ExpiredToken")));
        assert!(!definite_refusal(403, Some("RequestTimeTooSkewed")));
        assert!(!definite_refusal(409, None));
        assert!(!definite_refusal(412, None));
        assert!(!definite_refusal(429, None));
        assert!(!definite_refusal(503, Some("SlowDown")));
        assert!(!definite_refusal(500, None));
    }
}
