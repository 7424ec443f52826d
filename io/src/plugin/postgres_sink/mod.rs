//! The built-in `postgres` sink: each destination batch lands in one
//! transaction together with its progress row, so a replay is harmless.
//!
//! Tables (in the configured schema, `public` by default):
//! - `skippr_progress`: one row per applied batch, keyed by (pipeline, WAL
//!   identity, stream, sequence number), holding the batch's
//!   `compaction_id` and the digest of its records (`digest`, added to a
//!   table of before it). Two pipelines, or two WALs, may share a database.
//! - `skippr_tables`: the (pipeline, WAL identity) each stream's table
//!   belongs to, claimed when the sink first prepares it: another
//!   pipeline's sink refuses to write into it. A table of before this rule
//!   belongs to the one pipeline its progress rows name.
//! - one table per stream, named after it: `_skippr_seq` (the batch's
//!   sequence number), `_skippr_row` (the record's place in the batch),
//!   `data` (`jsonb`), and optionally columns computed by the server from
//!   top-level fields of `data` (`--postgres-columns`).
//!
//! A batch's progress row is inserted first (`ON CONFLICT DO NOTHING`): if
//! its number is already there, the row is read back and judged by core's
//! sink ledger: `already_applied` (same id and records; the data is not
//! touched) or `fatal` (another id, or other records; a row of before
//! digests were kept compares the id alone). Two daemons applying the same batch at once (a deposed clustered
//! leader and its successor) meet at that row: the second waits for the
//! first's transaction and then reads its row back. Connection loss (a
//! session the server ended, a server restart in the middle of a COPY),
//! serialization failures and a race to create a table are retried on a new
//! connection; a server host that vanishes without a reset is noticed by TCP
//! keepalives and the user timeout in about a minute.
//!
//! A record the stream's table cannot hold (SQLSTATE class 22: a value its
//! column's type cannot take, JSON the server does not take; class 23 on
//! the stream's table: the upsert key missing, a constraint) is refused,
//! not the batch: the batch is written under a savepoint inside the
//! transaction that holds its progress row, and when it fails on a record
//! the bad ones are found by halving, then everything is rolled back and
//! the answer names them with their SQLSTATE and message (runtime protocol
//! version 2's `refused`: the host decides, sends the rest under the same
//! number, and the refused records to the dead letters, or stops).
//! Other errors (a missing privilege, a batch that fails only as a whole)
//! are `fatal` with the server's message.
//!
//! Streams with a key (`PostgresSettings::keys`) are upserted: a unique
//! index on the key fields, the batch through a temporary table, the last
//! record of each key kept. With `sslmode=require` the sink speaks TLS
//! (rustls), verifying the server's chain and host name; a handshake that
//! refuses the server is `fatal` when connecting, never retried.

pub mod settings;

use super::{PluginError, Sink};
use postgres::error::SqlState;
use postgres::{Client, Config, NoTls};
use rustls::ClientConfig;
use skippr_core::ledger::{conflict_message, judge, Digest, Entry, Verdict};
use skippr_core::{CompactionId, Records, RefusedIndex, SinkOutcome};
use std::collections::{BTreeMap, BTreeSet};
use std::io::Write;
use std::sync::Arc;
use std::time::Duration;
use tokio_postgres_rustls::MakeRustlsConnect;
use tracing::{error, info, warn};

/// How the sink reaches its database and shapes its tables.
#[derive(Clone)]
pub struct PostgresSettings {
    /// The connection (host, port, user, database, TLS mode); its password
    /// never reaches a log.
    pub config: Config,
    /// The schema the tables live in.
    pub schema: String,
    /// Top-level fields of each record turned into columns, in order.
    pub columns: Vec<Column>,
    /// Streams whose rows are upserted by these top-level fields (a Singer
    /// stream's `key_properties`): one row per key, the latest batch's.
    pub keys: BTreeMap<String, Vec<String>>,
    /// TLS, for a URL with `sslmode=require`: the server's certificate is
    /// verified against these roots, its host name included.
    pub tls: Option<Arc<rustls::ClientConfig>>,
    /// Tables it makes keep `data` as `json`, the text as written, instead
    /// of `jsonb` (the dead-letter destination's: `jsonb` refuses a string
    /// holding `\u0000`, and gives text back reordered and respaced).
    pub verbatim: bool,
}

impl PostgresSettings {
    /// Plain JSON rows in `schema`: no columns, no keys, no TLS.
    pub fn plain(config: Config, schema: &str) -> PostgresSettings {
        PostgresSettings {
            config,
            schema: schema.to_string(),
            columns: Vec::new(),
            keys: BTreeMap::new(),
            tls: None,
            verbatim: false,
        }
    }
}

/// A top-level field of the records, kept in a column of the given type
/// (computed by the server from `data`, so a value of the wrong type is a
/// data error that names the column).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Column {
    pub field: String,
    pub sql_type: ColumnType,
}

/// The column types a field may take.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ColumnType {
    Text,
    Bigint,
    Integer,
    Numeric,
    Double,
    Boolean,
    Jsonb,
}

impl ColumnType {
    pub fn parse(s: &str) -> Option<ColumnType> {
        Some(match s {
            "text" => ColumnType::Text,
            "bigint" => ColumnType::Bigint,
            "integer" | "int" => ColumnType::Integer,
            "numeric" => ColumnType::Numeric,
            "double" | "double precision" => ColumnType::Double,
            "boolean" | "bool" => ColumnType::Boolean,
            "jsonb" => ColumnType::Jsonb,
            _ => return None,
        })
    }

    fn sql(self) -> &'static str {
        match self {
            ColumnType::Text => "text",
            ColumnType::Bigint => "bigint",
            ColumnType::Integer => "integer",
            ColumnType::Numeric => "numeric",
            ColumnType::Double => "double precision",
            ColumnType::Boolean => "boolean",
            ColumnType::Jsonb => "jsonb",
        }
    }
}

/// What went wrong with a request to the database.
enum Failure {
    /// Worth retrying: the connection, the server or a race.
    Transient(String),
    /// In the data or the destination: only an operator can fix it.
    Fatal(String),
}

/// Settings the server refuses for good (a wrong password, a database that
/// does not exist): start-up stops with this message.
#[derive(Debug)]
pub struct Refused(pub String);

pub struct PostgresSink {
    settings: PostgresSettings,
    pipeline: String,
    /// The WAL's identity (a directory, a bucket and prefix, a cluster).
    wal: String,
    streams: Vec<String>,
    client: Option<Client>,
    /// Tables known to exist on this connection.
    ready: BTreeSet<String>,
}

impl PostgresSink {
    /// Connects once to check what only the server can: the credentials,
    /// the database, the right to create tables. A server that cannot be
    /// reached is not a refusal: the sink connects again at its first batch
    /// (meanwhile the WAL holds what sources send). It blocks: call it on a
    /// thread that is not driving an async runtime (the client runs its own).
    pub fn open(
        settings: PostgresSettings,
        pipeline: &str,
        wal: &str,
        streams: &[String],
    ) -> Result<PostgresSink, Refused> {
        for s in streams {
            if s.len() > 63 {
                return Err(Refused(format!(
                    "stream '{s}' is longer than PostgreSQL's 63-byte table names; rename the stream"
                )));
            }
        }
        let mut sink = PostgresSink {
            settings,
            pipeline: pipeline.to_string(),
            wal: wal.to_string(),
            streams: streams.to_vec(),
            client: None,
            ready: BTreeSet::new(),
        };
        match sink.prepare() {
            Ok(()) => info!(database = %sink.describe(), "postgres sink connected; tables ready"),
            Err(Failure::Fatal(why)) => return Err(Refused(format!("postgres sink {}: {why}", sink.describe()))),
            Err(Failure::Transient(why)) => {
                warn!(database = %sink.describe(), error = %why, "postgres sink: cannot reach the database yet; retrying at the first batch")
            }
        }
        Ok(sink)
    }

    /// The connection without its password: `user@host:port/database`.
    pub fn describe(&self) -> String {
        describe(&self.settings.config)
    }

    /// A connection with every table in place.
    fn prepare(&mut self) -> Result<(), Failure> {
        if self.client.as_ref().is_some_and(|c| c.is_closed()) {
            self.client = None;
        }
        if self.client.is_none() {
            self.ready.clear();
            let client = connect(&self.settings).map_err(|e| classify_connect(&e))?;
            self.client = Some(client);
        }
        let wanted: Vec<String> = std::iter::once(PROGRESS.to_string()).chain(self.streams.iter().cloned()).collect();
        for table in wanted {
            if self.ready.contains(&table) {
                continue;
            }
            let ddl = if table == PROGRESS { self.progress_ddl()? } else { self.stream_ddl(&table) };
            if table != PROGRESS {
                self.claim_table(&table)?;
            }
            let client = self.client.as_mut().expect("connected above");
            client.batch_execute(&ddl).map_err(|e| self.fail(&e))?;
            if table == PROGRESS {
                self.add_digest_column()?;
            }
            self.ready.insert(table);
        }
        Ok(())
    }

    /// The progress table, and first the schema where it does not exist
    /// yet: creating a schema needs `CREATE` on the database, which a role
    /// given a schema of its own need not have.
    fn progress_ddl(&mut self) -> Result<String, Failure> {
        let client = self.client.as_mut().expect("connected");
        let exists = client
            .query_opt("SELECT 1 FROM pg_namespace WHERE nspname = $1", &[&self.settings.schema])
            .map_err(|e| classify(&e))?
            .is_some();
        let schema = quote(&self.settings.schema);
        let create_schema = if exists { String::new() } else { format!("CREATE SCHEMA IF NOT EXISTS {schema}; ") };
        Ok(format!(
            "{create_schema}CREATE TABLE IF NOT EXISTS {schema}.{PROGRESS} (
                pipeline text NOT NULL, wal text NOT NULL, stream text NOT NULL, seq bigint NOT NULL,
                compaction_id text NOT NULL, records bigint NOT NULL,
                applied_at timestamptz NOT NULL DEFAULT now(), digest text,
                PRIMARY KEY (pipeline, wal, stream, seq));
             CREATE TABLE IF NOT EXISTS {schema}.{TABLES} (
                table_name text PRIMARY KEY, pipeline text NOT NULL, wal text NOT NULL)"
        ))
    }

    /// A progress table created before digests were kept gets the column;
    /// its rows keep a null digest, compared by id alone.
    fn add_digest_column(&mut self) -> Result<(), Failure> {
        let client = self.client.as_mut().expect("connected");
        let missing = client
            .query_opt(
                "SELECT 1 FROM information_schema.tables t WHERE t.table_schema = $1 AND t.table_name = $2 \
                 AND NOT EXISTS (SELECT 1 FROM information_schema.columns c WHERE c.table_schema = $1 \
                 AND c.table_name = $2 AND c.column_name = 'digest')",
                &[&self.settings.schema, &PROGRESS],
            )
            .map_err(|e| classify(&e))?
            .is_some();
        if missing {
            let schema = quote(&self.settings.schema);
            let sql = format!("ALTER TABLE {schema}.{PROGRESS} ADD COLUMN IF NOT EXISTS digest text");
            client.batch_execute(&sql).map_err(|e| match classify(&e) {
                Failure::Fatal(why) => Failure::Fatal(format!(
                    "{why}; the progress table of an earlier version needs a digest column: run `{sql}` as its owner"
                )),
                transient => transient,
            })?;
            info!(schema = %self.settings.schema, "postgres sink: added the digest column to {PROGRESS}");
        }
        Ok(())
    }

    /// Claims a stream's table for this pipeline and WAL, or refuses it when
    /// another's: the first claim stands. A table that exists without a
    /// claim (made before tables were claimed) belongs to the one pipeline
    /// and WAL its progress rows name, or to this one if none do.
    fn claim_table(&mut self, table: &str) -> Result<(), Failure> {
        let schema = quote(&self.settings.schema);
        let (pipeline, wal) = (self.pipeline.clone(), self.wal.clone());
        let settings_schema = self.settings.schema.clone();
        let client = self.client.as_mut().expect("connected");
        let owner = |client: &mut Client| -> Result<Option<(String, String)>, postgres::Error> {
            let row = client
                .query_opt(&format!("SELECT pipeline, wal FROM {schema}.{TABLES} WHERE table_name = $1"), &[&table])?;
            Ok(row.map(|r| (r.get(0), r.get(1))))
        };
        let mut held = owner(client).map_err(|e| classify(&e))?;
        if held.is_none() {
            let exists = client
                .query_opt(
                    "SELECT 1 FROM pg_tables WHERE schemaname = $1 AND tablename = $2",
                    &[&settings_schema, &table],
                )
                .map_err(|e| classify(&e))?
                .is_some();
            let mut claimant = (pipeline.clone(), wal.clone());
            if exists {
                let writers = client
                    .query(
                        &format!("SELECT DISTINCT pipeline, wal FROM {schema}.{PROGRESS} WHERE stream = $1 LIMIT 2"),
                        &[&table],
                    )
                    .map_err(|e| classify(&e))?;
                match writers.as_slice() {
                    [] => {}
                    [one] => claimant = (one.get(0), one.get(1)),
                    _ => {
                        return Err(Failure::Fatal(format!(
                            "table {}.{} holds the batches of several pipelines (written before tables were \
                             claimed); name its owner with INSERT INTO {}.{TABLES} (table_name, pipeline, wal), or \
                             give this pipeline another --postgres-schema",
                            self.settings.schema, table, self.settings.schema
                        )))
                    }
                }
            }
            client
                .execute(
                    &format!(
                        "INSERT INTO {schema}.{TABLES} (table_name, pipeline, wal) VALUES ($1, $2, $3) \
                         ON CONFLICT DO NOTHING"
                    ),
                    &[&table, &claimant.0, &claimant.1],
                )
                .map_err(|e| classify(&e))?;
            held = owner(client).map_err(|e| classify(&e))?;
        }
        match held {
            Some((p, w)) if p == pipeline && w == wal => Ok(()),
            Some((p, w)) => Err(Failure::Fatal(format!(
                "table {}.{table} belongs to pipeline '{p}' of the WAL {w}; this is pipeline '{pipeline}' of the WAL \
                 {wal}, which may not write into it: give this pipeline another --postgres-schema",
                self.settings.schema
            ))),
            None => Err(Failure::Transient(format!("the claim on table {table} vanished; retrying"))),
        }
    }

    fn stream_ddl(&self, stream: &str) -> String {
        let mut columns = String::new();
        for c in &self.settings.columns {
            let value = match c.sql_type {
                ColumnType::Jsonb => format!("(data -> {})", literal(&c.field)),
                ColumnType::Text => format!("(data ->> {})", literal(&c.field)),
                // Casts from text that do not depend on session settings
                // (a timestamp's would: its time zone), as a generated
                // column's expression must not.
                t => format!("((data ->> {})::{})", literal(&c.field), t.sql()),
            };
            columns.push_str(&format!(", {} {} GENERATED ALWAYS AS {value} STORED", quote(&c.field), c.sql_type.sql()));
        }
        let mut ddl = format!(
            "CREATE TABLE IF NOT EXISTS {}.{} (_skippr_seq bigint NOT NULL, _skippr_row integer NOT NULL, \
             data {} NOT NULL{columns}",
            quote(&self.settings.schema),
            quote(stream),
            if self.settings.verbatim { "json" } else { "jsonb" }
        );
        match self.settings.keys.get(stream) {
            None => ddl.push(')'),
            Some(keys) => {
                let not_null: Vec<String> =
                    keys.iter().map(|k| format!("(data ->> {}) IS NOT NULL", literal(k))).collect();
                ddl.push_str(&format!(
                    ", CONSTRAINT skippr_key_present CHECK ({})); \
                     CREATE UNIQUE INDEX IF NOT EXISTS {} ON {}.{} ({})",
                    not_null.join(" AND "),
                    // From the name's hash: two long names sharing their
                    // first 63 bytes must not share an index.
                    quote(&format!("skippr_key_{:08x}", crate::plugin::FileSource::partition_of(stream))),
                    quote(&self.settings.schema),
                    quote(stream),
                    key_exprs(keys)
                ));
            }
        }
        ddl
    }

    /// One batch in one transaction with its progress row.
    fn try_apply(
        &mut self,
        stream: &str,
        seq: u64,
        id: CompactionId,
        records: &Records,
    ) -> Result<SinkOutcome, Failure> {
        self.prepare()?;
        let schema = quote(&self.settings.schema);
        let (pipeline, wal) = (self.pipeline.clone(), self.wal.clone());
        let id_text = id.to_string();
        let digest = Digest::of_records(records);
        let digest_text = digest.to_string();
        let seq_i = i64::try_from(seq).map_err(|_| Failure::Fatal(format!("sequence number {seq} exceeds bigint")))?;
        let client = self.client.as_mut().expect("prepared");
        let result = (|| -> Result<SinkOutcome, postgres::Error> {
            let mut tx = client.transaction()?;
            let inserted = tx.execute(
                &format!(
                    "INSERT INTO {schema}.{PROGRESS} (pipeline, wal, stream, seq, compaction_id, records, digest) \
                     VALUES ($1, $2, $3, $4, $5, $6, $7) ON CONFLICT DO NOTHING"
                ),
                &[&pipeline, &wal, &stream, &seq_i, &id_text, &(records.len() as i64), &digest_text],
            )?;
            if inserted == 0 {
                let row = tx.query_one(
                    &format!(
                        "SELECT compaction_id, digest FROM {schema}.{PROGRESS} \
                         WHERE pipeline = $1 AND wal = $2 AND stream = $3 AND seq = $4"
                    ),
                    &[&pipeline, &wal, &stream, &seq_i],
                )?;
                let (held_id, held_digest): (String, Option<String>) = (row.get(0), row.get(1));
                tx.rollback()?;
                // An id that does not parse is another batch's.
                let held = Entry {
                    id: u64::from_str_radix(&held_id, 16).map(CompactionId).unwrap_or(CompactionId(!id.0)),
                    // A row of before digests were kept: the id alone.
                    digest: held_digest.map(|d| Digest::parse(&d).unwrap_or(Digest(!digest.0))),
                };
                let verdict = judge(Entry { id, digest: Some(digest) }, Some(held));
                if let Verdict::Conflict(c) = verdict {
                    error!(stream, seq, "postgres sink: {}", conflict_message(stream, seq, id, c));
                }
                return Ok(verdict.outcome());
            }
            let keys = self.settings.keys.get(stream).map(Vec::as_slice);
            let table = Table { schema: &schema, stream, keys, seq };
            let rows: Vec<(u32, &[u8])> = (0u32..).zip(records.iter()).collect();
            // Under a savepoint, so that a record the table cannot hold
            // leaves the transaction (and its progress row, which holds the
            // number against any other writer) usable for finding it.
            let mut batch = tx.savepoint("skippr_batch")?;
            match table.write(&mut batch, &rows) {
                Ok(()) => batch.commit()?,
                Err(e) if row_error(&e) => {
                    batch.rollback()?;
                    let mut refused = Vec::new();
                    table.find_refused(&mut tx, &rows, &mut refused)?;
                    tx.rollback()?;
                    if refused.is_empty() {
                        // Only the batch as a whole fails: not a record's fault.
                        return Err(e);
                    }
                    return Ok(SinkOutcome::Refused(refused));
                }
                Err(e) => return Err(e),
            }
            tx.commit()?;
            Ok(SinkOutcome::Applied)
        })();
        result.map_err(|e| self.fail(&e))
    }

    /// Classifies an error. After one worth retrying, the next try starts
    /// on a new connection, with its tables checked again (a server that
    /// terminated the session may not have closed the socket yet; a table
    /// dropped under the sink is created again).
    fn fail(&mut self, e: &postgres::Error) -> Failure {
        let failure = classify(e);
        if matches!(failure, Failure::Transient(_)) {
            self.client = None;
        }
        failure
    }
}

/// The client runs its own small runtime, which may be neither started nor
/// dropped on a thread that drives the daemon's: the last reference to a
/// sink may go on one, so the connection is closed on a thread of its own.
impl Drop for PostgresSink {
    fn drop(&mut self) {
        if let Some(client) = self.client.take() {
            std::thread::spawn(move || drop(client));
        }
    }
}

impl Sink for PostgresSink {
    fn apply(
        &mut self,
        stream: &str,
        seq: u64,
        id: CompactionId,
        records: &Records,
    ) -> Result<SinkOutcome, PluginError> {
        match self.try_apply(stream, seq, id, records) {
            Ok(outcome) => Ok(outcome),
            Err(Failure::Transient(why)) => Err(PluginError(format!("postgres sink {}: {why}", self.describe()))),
            Err(Failure::Fatal(why)) => {
                error!(stream, seq, compaction_id = %id, "postgres sink refused batch {seq} of stream {stream}: {why}");
                Ok(SinkOutcome::Fatal)
            }
        }
    }

    fn progress(&mut self, streams: &[String]) -> Result<Vec<(String, u64)>, PluginError> {
        // Either class is an error here: recovery asks again.
        let describe = self.describe();
        let error = |f: Failure| match f {
            Failure::Transient(why) | Failure::Fatal(why) => PluginError(format!("postgres sink {describe}: {why}")),
        };
        self.prepare().map_err(error)?;
        let schema = quote(&self.settings.schema);
        let (pipeline, wal) = (self.pipeline.clone(), self.wal.clone());
        let client = self.client.as_mut().expect("prepared");
        let rows = client.query(
            &format!(
                "SELECT stream, max(seq) FROM {schema}.{PROGRESS} WHERE pipeline = $1 AND wal = $2 GROUP BY stream"
            ),
            &[&pipeline, &wal],
        );
        let rows = match rows {
            Ok(rows) => rows,
            Err(e) => return Err(error(self.fail(&e))),
        };
        Ok(rows
            .iter()
            .filter_map(|r| {
                let (stream, seq): (String, i64) = (r.get(0), r.get(1));
                streams.contains(&stream).then_some((stream, seq as u64))
            })
            .collect())
    }
}

/// A stream's table, as one batch writes into it.
struct Table<'a> {
    /// The schema, quoted.
    schema: &'a str,
    stream: &'a str,
    /// The upsert key's fields, for a stream that has one.
    keys: Option<&'a [String]>,
    seq: u64,
}

impl Table<'_> {
    /// Writes these records (each with its place in the batch): a COPY,
    /// through a temporary table and an upsert for a stream with a key.
    fn write(&self, tx: &mut postgres::Transaction<'_>, rows: &[(u32, &[u8])]) -> Result<(), postgres::Error> {
        let (schema, seq) = (self.schema, self.seq);
        let target = match self.keys {
            None => format!("{schema}.{}", quote(self.stream)),
            Some(_) => {
                // Emptied first: a search for refused records writes a
                // batch in parts within one transaction.
                tx.batch_execute(
                    "CREATE TEMP TABLE IF NOT EXISTS skippr_upsert \
                     (_skippr_seq bigint, _skippr_row integer, data jsonb) ON COMMIT DELETE ROWS; \
                     DELETE FROM skippr_upsert",
                )?;
                "skippr_upsert".to_string()
            }
        };
        let mut copy = tx.copy_in(&format!("COPY {target} (_skippr_seq, _skippr_row, data) FROM STDIN"))?;
        let mut line = Vec::new();
        for &(row, record) in rows {
            line.clear();
            write!(line, "{seq}\t{row}\t").expect("a Vec takes writes");
            escape_copy_text(record, &mut line);
            line.push(b'\n');
            if copy.write_all(&line).is_err() {
                // The server ended the copy: its error comes from finish.
                break;
            }
        }
        copy.finish()?;
        if let Some(keys) = self.keys {
            // One row per key: the batch's last record of each key, then
            // over what an earlier batch left.
            let k = key_exprs(keys);
            tx.batch_execute(&format!(
                "INSERT INTO {schema}.{table} (_skippr_seq, _skippr_row, data) \
                 SELECT DISTINCT ON ({k}) _skippr_seq, _skippr_row, data FROM skippr_upsert \
                 ORDER BY {k}, _skippr_row DESC \
                 ON CONFLICT ({k}) DO UPDATE SET _skippr_seq = EXCLUDED._skippr_seq, \
                 _skippr_row = EXCLUDED._skippr_row, data = EXCLUDED.data",
                table = quote(self.stream)
            ))?;
        }
        Ok(())
    }

    /// The records of `rows` the table cannot hold, each with the server's
    /// reason, found by halving: a part that writes is kept (so the parts
    /// after it meet its rows, as the whole batch would), a part that fails
    /// on a record is rolled back and split, down to single records. A
    /// batch with k bad records of n costs about 2k·log2(n) writes; the
    /// caller rolls everything back.
    fn find_refused(
        &self,
        tx: &mut postgres::Transaction<'_>,
        rows: &[(u32, &[u8])],
        refused: &mut Vec<RefusedIndex>,
    ) -> Result<(), postgres::Error> {
        if rows.is_empty() {
            return Ok(());
        }
        let mut part = tx.transaction()?;
        match self.write(&mut part, rows) {
            Ok(()) => part.commit(),
            Err(e) if row_error(&e) => {
                part.rollback()?;
                if let [(index, _)] = rows {
                    refused.push(RefusedIndex { index: *index, reason: refusal_reason(&e) });
                    return Ok(());
                }
                let (first, second) = rows.split_at(rows.len() / 2);
                self.find_refused(tx, first, refused)?;
                self.find_refused(tx, second, refused)
            }
            Err(e) => Err(e),
        }
    }
}

/// An error in a record's data rather than in the destination: a value the
/// table cannot hold (SQLSTATE class 22: a cast, a range, JSON the server
/// does not take) or a constraint of the stream's table it breaks (class
/// 23: the upsert key's presence, a unique index, a check an operator
/// added). The sink's own tables are never a record's fault.
fn row_error(e: &postgres::Error) -> bool {
    let (Some(code), Some(db)) = (e.code(), e.as_db_error()) else { return false };
    let class = &code.code()[..2];
    class == "22" || (class == "23" && !matches!(db.table(), Some(PROGRESS | TABLES)))
}

/// A refused record's reason: its SQLSTATE first, the class the dead-letter
/// metric counts by, then the server's message and detail.
fn refusal_reason(e: &postgres::Error) -> String {
    match (e.code(), e.as_db_error()) {
        (Some(code), Some(db)) => format!(
            "SQLSTATE {}: {}{}",
            code.code(),
            db.message(),
            db.detail().map(|d| format!(" ({d})")).unwrap_or_default()
        ),
        _ => format!("SQLSTATE unknown: {e}"),
    }
}

/// A new connection, over TLS where the settings ask for it.
fn connect(settings: &PostgresSettings) -> Result<Client, postgres::Error> {
    match &settings.tls {
        Some(tls) => settings.config.connect(MakeRustlsConnect::new(ClientConfig::clone(tls))),
        None => settings.config.connect(NoTls),
    }
}

/// Every batch the tables of `settings.schema` that `pipeline` and `wal`
/// claimed hold, as (stream, number, its rows' `data` as lines), in stream
/// and number order: what `skipprd dead-letters list` reads of the
/// `postgres` destination. A schema the sink never made holds none. It
/// blocks, as the sink does.
pub fn read_schema(
    settings: &PostgresSettings,
    pipeline: &str,
    wal: &str,
) -> Result<Vec<crate::plugin::dir_sink::HeldBatch>, String> {
    let mut client = connect(settings).map_err(|e| with_causes(&e))?;
    let schema = quote(&settings.schema);
    let claimed = client.query(
        &format!("SELECT table_name FROM {schema}.{TABLES} WHERE pipeline = $1 AND wal = $2 ORDER BY 1"),
        &[&pipeline, &wal],
    );
    let tables: Vec<String> = match claimed {
        Ok(rows) => rows.iter().map(|r| r.get(0)).collect(),
        Err(e) if e.code() == Some(&SqlState::UNDEFINED_TABLE) => return Ok(Vec::new()),
        Err(e) => return Err(with_causes(&e)),
    };
    let mut out: Vec<crate::plugin::dir_sink::HeldBatch> = Vec::new();
    for table in tables {
        let rows = client
            .query(
                &format!(
                    "SELECT _skippr_seq, data::text FROM {schema}.{} ORDER BY _skippr_seq, _skippr_row",
                    quote(&table)
                ),
                &[],
            )
            .map_err(|e| with_causes(&e))?;
        for row in rows {
            let (seq, data): (i64, String) = (row.get(0), row.get(1));
            match out.last_mut() {
                Some((s, q, bytes)) if *s == table && *q == seq as u64 => {
                    bytes.extend_from_slice(data.as_bytes());
                    bytes.push(b'\n');
                }
                _ => out.push((table.clone(), seq as u64, format!("{data}\n").into_bytes())),
            }
        }
    }
    Ok(out)
}

/// The progress table's name.
const PROGRESS: &str = "skippr_progress";
/// The table that names each stream table's pipeline and WAL.
const TABLES: &str = "skippr_tables";

/// `user@host:port/database`, never the password.
pub fn describe(config: &Config) -> String {
    let host = match config.get_hosts().first() {
        Some(postgres::config::Host::Tcp(h)) => h.clone(),
        Some(postgres::config::Host::Unix(p)) => p.display().to_string(),
        None => "localhost".into(),
    };
    let port = config.get_ports().first().copied().unwrap_or(5432);
    format!(
        "{}@{host}:{port}/{}",
        config.get_user().unwrap_or("?"),
        config.get_dbname().or(config.get_user()).unwrap_or("?")
    )
}

/// A connection's settings from a `postgresql://` URL (or key=value
/// string), with the password from the URL, else `password`, and a connect
/// timeout and TCP keepalives unless the URL sets them: a server host that
/// vanishes mid-batch (no reset ever comes) fails the batch, retried, in
/// about a minute instead of the system's two hours.
pub fn connection_config(url: &str, password: Option<&str>) -> Result<Config, String> {
    // libpq's verifying modes: this sink's `require` verifies the chain and
    // the host name whenever it speaks TLS.
    let url = match url.split_once('?') {
        Some((base, query)) => {
            let query: Vec<&str> = query
                .split('&')
                .map(|kv| if kv == "sslmode=verify-full" || kv == "sslmode=verify-ca" { "sslmode=require" } else { kv })
                .collect();
            format!("{base}?{}", query.join("&"))
        }
        None => url.to_string(),
    };
    let mut config: Config = url.parse().map_err(|e| {
        format!("the PostgreSQL URL is not valid ({e}); it looks like postgresql://USER@HOST:PORT/DATABASE")
    })?;
    if config.get_user().is_none() {
        return Err("the PostgreSQL URL names no user: postgresql://USER@HOST:PORT/DATABASE".into());
    }
    if config.get_password().is_none() {
        if let Some(p) = password {
            config.password(p);
        }
    }
    if config.get_connect_timeout().is_none() {
        config.connect_timeout(Duration::from_secs(10));
    }
    if config.get_keepalives() && config.get_keepalives_idle() == Duration::from_secs(2 * 60 * 60) {
        config.keepalives_idle(Duration::from_secs(30));
    }
    if config.get_keepalives_interval().is_none() {
        config.keepalives_interval(Duration::from_secs(10));
    }
    if config.get_keepalives_retries().is_none() {
        config.keepalives_retries(3);
    }
    if config.get_tcp_user_timeout().is_none() {
        config.tcp_user_timeout(Duration::from_secs(60));
    }
    config.application_name("skipprd");
    Ok(config)
}

/// The URL asks for TLS (`sslmode=require`, or libpq's verifying modes).
pub fn asks_for_tls(config: &Config) -> bool {
    config.get_ssl_mode() == postgres::config::SslMode::Require
}

/// TLS settings for the sink: the server's certificate must chain to a
/// certificate of `ca_pem` (PEM), else to the system's roots, and name the
/// host the URL names.
pub fn tls_config(ca_pem: Option<&[u8]>) -> Result<Arc<ClientConfig>, String> {
    let roots = match ca_pem {
        Some(pem) => crate::peer::tls::roots_from_pem(pem)?,
        None => {
            let mut roots = rustls::RootCertStore::empty();
            roots.add_parsable_certificates(rustls_native_certs::load_native_certs().certs);
            if roots.is_empty() {
                return Err("the system has no CA certificates to verify the server with: give the server's CA \
                            with --postgres-ca-file"
                    .into());
            }
            roots
        }
    };
    let provider = Arc::new(rustls::crypto::aws_lc_rs::default_provider());
    let config = ClientConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .map_err(|e| e.to_string())?
        .with_root_certificates(roots)
        .with_no_client_auth();
    Ok(Arc::new(config))
}

/// The TLS handshake refused the server (its certificate, its name, its
/// protocol): no retry can fix that.
fn tls_refusal(e: &postgres::Error) -> Option<String> {
    let mut cause: Option<&(dyn std::error::Error + 'static)> = std::error::Error::source(e);
    while let Some(c) = cause {
        let inner = c.downcast_ref::<std::io::Error>().and_then(|io| io.get_ref()).map(|i| i as &dyn std::error::Error);
        if let Some(r) = inner.and_then(|i| i.downcast_ref::<rustls::Error>()).or_else(|| c.downcast_ref()) {
            return Some(format!("TLS refused the server: {r}"));
        }
        cause = c.source();
    }
    None
}

/// A key's fields as the expressions its unique index is on.
fn key_exprs(keys: &[String]) -> String {
    keys.iter().map(|k| format!("(data ->> {})", literal(k))).collect::<Vec<_>>().join(", ")
}

/// A failed connection: a TLS handshake that refused the server, or a
/// server that does not speak TLS to a URL that asks for it, is `fatal`
/// (no retry fixes it); the rest as any error. Mid-session TLS errors (an
/// alert, a reset) are not looked at this way: a new connection may do.
fn classify_connect(e: &postgres::Error) -> Failure {
    if let Some(refused) = tls_refusal(e) {
        return Failure::Fatal(refused);
    }
    if e.to_string().contains("server does not support TLS") {
        return Failure::Fatal("the URL asks for TLS (sslmode=require) but the server does not speak it".into());
    }
    classify(e)
}

fn classify(e: &postgres::Error) -> Failure {
    let Some(code) = e.code() else {
        // No SQLSTATE: the connection itself (refused, reset, timed out),
        // named down to its cause.
        return Failure::Transient(with_causes(e));
    };
    let message = match e.as_db_error() {
        Some(db) => {
            format!("{} ({}){}", db.message(), code.code(), db.detail().map(|d| format!(": {d}")).unwrap_or_default())
        }
        None => e.to_string(),
    };
    let c = code.code();
    let transient = c.starts_with("08") // connection exception
        || c.starts_with("40") // serialization failure, deadlock
        || c.starts_with("53") // insufficient resources
        || c.starts_with("57") // admin shutdown, cannot connect now
        || c.starts_with("58") // system error (I/O)
        || *code == SqlState::LOCK_NOT_AVAILABLE
        // Two daemons creating the same table: the loser retries.
        || *code == SqlState::DUPLICATE_TABLE
        || *code == SqlState::DUPLICATE_SCHEMA
        || (*code == SqlState::UNIQUE_VIOLATION
            && e.as_db_error().and_then(|d| d.constraint()).is_some_and(|c| c.starts_with("pg_")))
        || *code == SqlState::UNDEFINED_TABLE;
    if transient {
        Failure::Transient(message)
    } else {
        Failure::Fatal(message)
    }
}

/// An error and every cause under it: `error connecting to server:
/// Connection refused (os error 111)`, not the first part alone.
fn with_causes(e: &dyn std::error::Error) -> String {
    let mut text = e.to_string();
    let mut cause = e.source();
    while let Some(c) = cause {
        let more = c.to_string();
        if !text.contains(&more) {
            text = format!("{text}: {more}");
        }
        cause = c.source();
    }
    text
}

/// A record's bytes in COPY's text format: backslash, tab, newline and
/// carriage return escaped.
fn escape_copy_text(record: &[u8], out: &mut Vec<u8>) {
    for &b in record {
        match b {
            b'\\' => out.extend_from_slice(b"\\\\"),
            b'\t' => out.extend_from_slice(b"\\t"),
            b'\n' => out.extend_from_slice(b"\\n"),
            b'\r' => out.extend_from_slice(b"\\r"),
            _ => out.push(b),
        }
    }
}

/// An identifier, quoted.
fn quote(name: &str) -> String {
    format!("\"{}\"", name.replace('"', "\"\""))
}

/// A string literal, quoted.
fn literal(s: &str) -> String {
    format!("'{}'", s.replace('\'', "''"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn copy_text_escapes_what_copy_would_read_as_structure() {
        let mut out = Vec::new();
        escape_copy_text(b"{\"a\":\"x\\\\y\"}\t\r\n", &mut out);
        assert_eq!(out, b"{\"a\":\"x\\\\\\\\y\"}\\t\\r\\n");
    }

    #[test]
    fn names_are_quoted_and_the_password_never_described() {
        assert_eq!(quote("we\"ird"), "\"we\"\"ird\"");
        assert_eq!(literal("it's"), "'it''s'");
        let c = connection_config("postgresql://app:hunter2@db.example:6543/warehouse", None).unwrap();
        assert_eq!(describe(&c), "app@db.example:6543/warehouse");
        assert_eq!(c.get_password(), Some(&b"hunter2"[..]));
        let c = connection_config("postgresql://app@db.example/warehouse", Some("from-file")).unwrap();
        assert_eq!(c.get_password(), Some(&b"from-file"[..]));
        assert!(connection_config("postgresql://db.example/warehouse", None).unwrap_err().contains("no user"));
        assert!(connection_config("not a url at all ===", None).is_err());
        let c = connection_config("postgresql://a@h/d?sslmode=verify-full", None).unwrap();
        assert_eq!(c.get_ssl_mode(), postgres::config::SslMode::Require, "libpq's verifying mode is ours");
        let c = connection_config("postgresql://a:x%20sslmode=verify-ca@h/d", None).unwrap();
        assert_eq!(c.get_password(), Some(&b"x sslmode=verify-ca"[..]), "only the query is rewritten");
    }

    #[test]
    fn a_dead_peer_is_noticed_in_about_a_minute_unless_the_url_says_otherwise() {
        let c = connection_config("postgresql://app@db.example/warehouse", None).unwrap();
        assert_eq!(c.get_keepalives_idle(), Duration::from_secs(30));
        assert_eq!(c.get_keepalives_interval(), Some(Duration::from_secs(10)));
        assert_eq!(c.get_keepalives_retries(), Some(3));
        assert_eq!(c.get_tcp_user_timeout(), Some(&Duration::from_secs(60)));
        let c = connection_config(
            "postgresql://app@db.example/warehouse?keepalives_idle=600&tcp_user_timeout=5&connect_timeout=3",
            None,
        )
        .unwrap();
        assert_eq!(c.get_keepalives_idle(), Duration::from_secs(600));
        // Seconds in this client, where libpq reads milliseconds.
        assert_eq!(c.get_tcp_user_timeout(), Some(&Duration::from_secs(5)));
        assert_eq!(c.get_connect_timeout(), Some(&Duration::from_secs(3)));
    }
}
