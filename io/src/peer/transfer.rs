//! A snapshot's segments copied from the leader into the staging area,
//! chunk by chunk over the peer connection. A failed chunk (a broken
//! connection, a lost answer, a restarted leader) is asked for again from
//! where the staged bytes end; the copy gives up only when no chunk has
//! arrived for `patience`.

use super::wire::CHUNK_BYTES;
use super::Peers;
use crate::disk_wal::Staging;
use std::time::Duration;
use tracing::debug;

pub async fn copy(peers: &Peers, from: u64, staging: &Staging, patience: Duration) -> Result<u64, String> {
    let mut progress = tokio::time::Instant::now();
    let mut backoff = Duration::from_millis(20);
    let mut copied = 0u64;
    loop {
        let missing = staging.missing().map_err(|e| format!("the install's staging: {e}"))?;
        let Some(&(segment, have, bytes)) = missing.first() else { return Ok(copied) };
        let len = (bytes - have).min(CHUNK_BYTES as u64) as u32;
        match peers.fetch(from, segment.0, have, len).await {
            Ok(chunk) if chunk.is_empty() => {
                return Err(format!("node {from} holds only {have} bytes of segment {}, not {bytes}", segment.0))
            }
            Ok(chunk) => {
                staging.write(segment, have, &chunk).map_err(|e| format!("the install's staging: {e}"))?;
                copied += chunk.len() as u64;
                progress = tokio::time::Instant::now();
                backoff = Duration::from_millis(20);
            }
            Err(e) if progress.elapsed() >= patience => {
                return Err(format!("no chunk of the snapshot from node {from} for {patience:?}: {e}"))
            }
            Err(e) => {
                debug!(from, segment = segment.0, offset = have, error = %e, "a snapshot chunk failed; asking again");
                tokio::time::sleep(backoff).await;
                backoff = (backoff * 2).min(Duration::from_secs(1));
            }
        }
    }
}
