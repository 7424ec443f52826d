//! The offsets store and the writer lease in DynamoDB.
//!
//! One table, created by `skipprd offsets init-table`: a string partition
//! key `pk` and a string sort key `sk`, billed per request.
//!
//! - Offsets: `pk = offsets#<WAL identity>#<pipeline>#<source>`,
//!   `sk = <partition:010>` (the WAL's identity is part of the key, so two
//!   WALs sharing a table never touch each other's offsets: see
//!   `wal_identity`, and `disk_wal::wal_identity` for a disk WAL);
//!   `value` holds the engine's exact 24-byte value (binary), `lsn` the same
//!   LSN as a Number, and `checkpoint` the source's opaque checkpoint. A
//!   write replaces the item whole, only under
//!   `attribute_not_exists(lsn) OR lsn < :lsn`: the condition is on the
//!   Number, because binary attributes compare byte by byte and
//!   little-endian integers do not sort. A failed condition means the store
//!   already holds a newer value, which is what the engine wants. Reads are
//!   consistent.
//! - The lease: `pk = lease#<WAL location>`, `sk = lease`, with Numbers
//!   `generation`, `holder` and `version`; written only if `version` is
//!   still what the writer last saw.

use crate::aws::{describe, start_up_check, Check};
use crate::offsets_db::StoredOffset;
use aws_sdk_dynamodb::error::SdkError;
use aws_sdk_dynamodb::types::{
    AttributeDefinition, AttributeValue, BillingMode, KeySchemaElement, KeyType, ScalarAttributeType,
};
use aws_sdk_dynamodb::Client;
use skippr_core::{IoError, IoReply, LeaseOp, LeaseRow, OffsetEntry, OffsetRow, OffsetsOp, PartitionKey, SourceId};
use std::collections::HashMap;
use tracing::warn;

pub struct Dynamo {
    client: Client,
    table: String,
    pipeline: String,
    /// Source names by `SourceId`: what the store keeps.
    sources: Vec<String>,
    lease_pk: String,
    /// The WAL's identity, in every offsets key.
    wal: String,
}

/// What names a WAL in the offsets and lease keys: `s3://bucket/prefix/` for
/// an S3 WAL; for a WAL on a local disk, the name derived from this host and
/// the WAL directory (`disk_wal::derived_identity`), which the daemon uses
/// only until it has made `DATA_DIR/wal-identity` (`disk_wal::wal_identity`,
/// which moves with the WAL); `offsets show` falls back on it where no such
/// file was made yet.
pub fn wal_identity(s3: Option<(&str, &str)>, wal_dir: &std::path::Path) -> String {
    match s3 {
        Some((bucket, prefix)) => crate::s3_wal::location(bucket, prefix),
        None => crate::disk_wal::derived_identity(wal_dir),
    }
}

/// DynamoDB's rule for table names (3 to 255 of `a-z A-Z 0-9 _ - .`),
/// checked before any request so a typo is named as such.
pub fn check_table_name(table: &str) -> Result<(), String> {
    let ok_chars = table.chars().all(|c| c.is_ascii_alphanumeric() || matches!(c, '_' | '-' | '.'));
    if (3..=255).contains(&table.len()) && ok_chars {
        Ok(())
    } else {
        Err(format!("'{table}' is not a valid DynamoDB table name: use 3 to 255 letters, digits, '_', '-' or '.'"))
    }
}

impl Dynamo {
    /// Connects and checks that the table exists; says how to create it when
    /// it does not.
    pub async fn connect(
        sdk: &aws_config::SdkConfig,
        table: &str,
        pipeline: &str,
        sources: Vec<String>,
        wal_location: &str,
    ) -> Result<Dynamo, String> {
        let client = Client::new(sdk);
        let d = Dynamo {
            client,
            table: table.to_string(),
            pipeline: pipeline.to_string(),
            sources,
            lease_pk: format!("lease#{wal_location}"),
            wal: wal_location.to_string(),
        };
        // On a client without SDK retries (see `start_up_check`).
        let check = Client::from_conf(
            aws_sdk_dynamodb::config::Builder::from(sdk)
                .retry_config(aws_config::retry::RetryConfig::disabled())
                .build(),
        );
        let checked = start_up_check(|| async {
            match check.describe_table().table_name(table).send().await {
                Ok(_) => Check::Ready(()),
                Err(e) if e.as_service_error().is_some_and(|s| s.is_resource_not_found_exception()) => {
                    Check::Refused(format!(
                        "the DynamoDB table '{table}' does not exist: create it with `skipprd offsets init-table` \
                         (same table, region and endpoint settings)"
                    ))
                }
                Err(e) => Check::Failed(describe(&e)),
            }
        })
        .await;
        match checked {
            Ok(()) => Ok(d),
            Err(Ok(message)) => Err(message),
            Err(Err(cause)) => {
                let endpoint = crate::aws::endpoint_label(crate::aws::dynamodb_endpoint(sdk), sdk);
                Err(format!("cannot use the DynamoDB table '{table}' at {endpoint}: {cause}"))
            }
        }
    }

    /// Creates the table (offsets and lease) and waits until it is active.
    /// An existing table is left as it is.
    pub async fn create_table(sdk: &aws_config::SdkConfig, table: &str) -> Result<bool, String> {
        let client = Client::new(sdk);
        let key = |name: &str, kind| KeySchemaElement::builder().attribute_name(name).key_type(kind).build();
        let attr = |name: &str| {
            AttributeDefinition::builder().attribute_name(name).attribute_type(ScalarAttributeType::S).build()
        };
        let created = client
            .create_table()
            .table_name(table)
            .key_schema(key("pk", KeyType::Hash).map_err(|e| e.to_string())?)
            .key_schema(key("sk", KeyType::Range).map_err(|e| e.to_string())?)
            .attribute_definitions(attr("pk").map_err(|e| e.to_string())?)
            .attribute_definitions(attr("sk").map_err(|e| e.to_string())?)
            .billing_mode(BillingMode::PayPerRequest)
            .send()
            .await;
        let fresh = match created {
            Ok(_) => true,
            Err(e) if e.as_service_error().is_some_and(|s| s.is_resource_in_use_exception()) => false,
            Err(e) => return Err(format!("cannot create the DynamoDB table '{table}': {}", describe(&e))),
        };
        for _ in 0..120 {
            let out = client.describe_table().table_name(table).send().await.map_err(|e| describe(&e))?;
            let status = out.table().and_then(|t| t.table_status()).map(|s| s.as_str().to_string());
            if status.as_deref() == Some("ACTIVE") {
                return Ok(fresh);
            }
            tokio::time::sleep(std::time::Duration::from_secs(1)).await;
        }
        Err(format!("the DynamoDB table '{table}' did not become active within two minutes"))
    }

    fn offsets_pk(&self, source: &str) -> String {
        format!("offsets#{}#{}#{source}", self.wal, self.pipeline)
    }

    /// Every offsets item of this pipeline's configured sources, read
    /// consistently.
    /// Performs one offsets request of the engine's.
    pub async fn perform_offsets(&self, op: OffsetsOp) -> Result<IoReply, IoError> {
        match op {
            OffsetsOp::Read => self.read().await.map(IoReply::Offsets),
            OffsetsOp::Write { entries } => self.write(&entries).await.map(|()| IoReply::Done),
        }
    }

    /// Performs one lease request of the engine's.
    pub async fn perform_lease(&self, op: LeaseOp) -> Result<IoReply, IoError> {
        match op {
            LeaseOp::Read => self.lease_read().await.map(IoReply::Lease),
            LeaseOp::Write { expected, row } => self.lease_write(expected, row).await.map(|()| IoReply::Done),
        }
    }

    pub async fn read(&self) -> Result<Vec<OffsetRow>, IoError> {
        let mut rows = Vec::new();
        for (i, name) in self.sources.iter().enumerate() {
            for item in self.query(&self.offsets_pk(name)).await? {
                let Some(partition) = string(&item, "sk").and_then(|s| s.parse::<u32>().ok()) else {
                    warn!(source = name, "ignoring an offsets item whose sort key is not a partition number");
                    continue;
                };
                let value = binary(&item, "value").unwrap_or_default();
                let key = PartitionKey { source: SourceId(i as u16), partition };
                rows.push((key, value, binary(&item, "checkpoint")));
            }
        }
        Ok(rows)
    }

    /// Every offsets item, for `skipprd offsets show`.
    pub async fn show(&self) -> Result<Vec<StoredOffset>, IoError> {
        let rows = self.read().await?;
        Ok(rows
            .into_iter()
            .map(|(key, value, checkpoint)| StoredOffset {
                pipeline: self.pipeline.clone(),
                source: self.sources[key.source.0 as usize].clone(),
                partition: key.partition,
                value,
                checkpoint,
            })
            .collect())
    }

    async fn query(&self, pk: &str) -> Result<Vec<HashMap<String, AttributeValue>>, IoError> {
        let mut pages = self
            .client
            .query()
            .table_name(&self.table)
            .key_condition_expression("pk = :pk")
            .expression_attribute_values(":pk", AttributeValue::S(pk.to_string()))
            .consistent_read(true)
            .into_paginator()
            .send();
        let mut items = Vec::new();
        while let Some(page) = pages.next().await {
            let page = page.map_err(|e| {
                warn!(error = %describe(&e), "reading offsets from DynamoDB failed");
                IoError::Failed
            })?;
            items.extend(page.items().iter().cloned());
        }
        Ok(items)
    }

    /// Writes each entry whose LSN is higher than the stored one.
    pub async fn write(&self, entries: &[OffsetEntry]) -> Result<(), IoError> {
        for e in entries {
            let source = &self.sources[e.key.source.0 as usize];
            let v = e.value;
            let mut put = self
                .client
                .put_item()
                .table_name(&self.table)
                .item("pk", AttributeValue::S(self.offsets_pk(source)))
                .item("sk", AttributeValue::S(format!("{:010}", e.key.partition)))
                .item("value", AttributeValue::B(v.encode().to_vec().into()))
                .item("lsn", AttributeValue::N(v.lsn.0.to_string()))
                .item("position", AttributeValue::N(v.position.0.to_string()))
                .condition_expression("attribute_not_exists(lsn) OR lsn < :lsn")
                .expression_attribute_values(":lsn", AttributeValue::N(v.lsn.0.to_string()));
            if let Some(c) = &e.checkpoint {
                put = put.item("checkpoint", AttributeValue::B(c.clone().into()));
            }
            match put.send().await {
                Ok(_) => {}
                Err(err) if conditional_failed(&err) => {}
                Err(err) => {
                    warn!(error = %describe(&err), "writing offsets to DynamoDB failed");
                    return Err(unknown_or_failed(&err));
                }
            }
        }
        Ok(())
    }

    /// Deletes this pipeline's offsets items (`skipprd offsets reset`).
    pub async fn reset(&self) -> Result<usize, IoError> {
        let mut deleted = 0;
        for name in &self.sources {
            let pk = self.offsets_pk(name);
            for item in self.query(&pk).await? {
                let Some(sk) = string(&item, "sk") else { continue };
                self.client
                    .delete_item()
                    .table_name(&self.table)
                    .key("pk", AttributeValue::S(pk.clone()))
                    .key("sk", AttributeValue::S(sk))
                    .send()
                    .await
                    .map_err(|e| {
                        warn!(error = %describe(&e), "deleting an offsets item failed");
                        IoError::Failed
                    })?;
                deleted += 1;
            }
        }
        Ok(deleted)
    }

    pub async fn lease_read(&self) -> Result<Option<LeaseRow>, IoError> {
        let out = self
            .client
            .get_item()
            .table_name(&self.table)
            .key("pk", AttributeValue::S(self.lease_pk.clone()))
            .key("sk", AttributeValue::S("lease".into()))
            .consistent_read(true)
            .send()
            .await
            .map_err(|e| {
                warn!(error = %describe(&e), "reading the writer lease failed");
                IoError::Failed
            })?;
        let Some(item) = out.item() else { return Ok(None) };
        let n = |name| number(item, name).ok_or(IoError::Failed);
        Ok(Some(LeaseRow { generation: n("generation")?, holder: n("holder")?, version: n("version")? }))
    }

    pub async fn lease_write(&self, expected: Option<u64>, row: LeaseRow) -> Result<(), IoError> {
        let put = self
            .client
            .put_item()
            .table_name(&self.table)
            .item("pk", AttributeValue::S(self.lease_pk.clone()))
            .item("sk", AttributeValue::S("lease".into()))
            .item("generation", AttributeValue::N(row.generation.to_string()))
            .item("holder", AttributeValue::N(row.holder.to_string()))
            .item("version", AttributeValue::N(row.version.to_string()));
        let put = match expected {
            None => put.condition_expression("attribute_not_exists(version)"),
            Some(v) => put
                .condition_expression("version = :v")
                .expression_attribute_values(":v", AttributeValue::N(v.to_string())),
        };
        match put.send().await {
            Ok(_) => Ok(()),
            Err(e) if conditional_failed(&e) => Err(IoError::Conflict),
            Err(e) => {
                warn!(error = %describe(&e), "writing the writer lease failed");
                Err(unknown_or_failed(&e))
            }
        }
    }
}

fn conditional_failed<R>(e: &SdkError<aws_sdk_dynamodb::operation::put_item::PutItemError, R>) -> bool {
    e.as_service_error().is_some_and(|s| s.is_conditional_check_failed_exception())
}

/// A request that may have been applied (timeouts, dropped connections,
/// 5xx) is ambiguous; one the service refused outright failed.
fn unknown_or_failed<E>(e: &SdkError<E, aws_sdk_dynamodb::config::http::HttpResponse>) -> IoError {
    match e {
        SdkError::ServiceError(s) if s.raw().status().as_u16() < 500 => IoError::Failed,
        _ => IoError::Ambiguous,
    }
}

fn string(item: &HashMap<String, AttributeValue>, name: &str) -> Option<String> {
    item.get(name).and_then(|v| v.as_s().ok()).cloned()
}

fn number(item: &HashMap<String, AttributeValue>, name: &str) -> Option<u64> {
    item.get(name).and_then(|v| v.as_n().ok()).and_then(|n| n.parse().ok())
}

fn binary(item: &HashMap<String, AttributeValue>, name: &str) -> Option<Vec<u8>> {
    item.get(name).and_then(|v| v.as_b().ok()).map(|b| b.as_ref().to_vec())
}
