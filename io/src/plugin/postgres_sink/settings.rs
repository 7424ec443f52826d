//! The PostgreSQL sink's settings: `--postgres-*` flags, keys of `[sink]`,
//! checked here once (the URL, the password file's mode, the TLS files,
//! the schema and the columns) before anything connects.

use super::{asks_for_tls, connection_config, describe, tls_config, Column, ColumnType, PostgresSettings};
use clap::Args;
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

#[derive(Args, Serialize, Deserialize, Debug, Default, Clone, PartialEq)]
pub struct PostgresArgs {
    /// PostgreSQL sink: the database, `postgresql://USER[:PASSWORD]@HOST[:PORT]/DATABASE[?sslmode=require]`
    /// (the password may come from --postgres-password-file or PGPASSWORD
    /// instead; it is never logged).
    #[arg(long = "postgres-url", env = "SKIPPR_POSTGRES_URL", hide_env_values = true, value_name = "URL")]
    pub postgres_url: Option<String>,
    /// PostgreSQL sink: a file holding the password (mode 0600 or stricter).
    #[arg(long = "postgres-password-file", env = "SKIPPR_POSTGRES_PASSWORD_FILE", value_name = "FILE")]
    pub postgres_password_file: Option<PathBuf>,
    /// PostgreSQL sink: the CA certificate(s), PEM, that the server's
    /// certificate must chain to when the URL asks for TLS
    /// (`sslmode=require`, `verify-ca` or `verify-full`: the chain and the
    /// host name are always verified) [default: the system's roots].
    #[arg(long = "postgres-ca-file", env = "SKIPPR_POSTGRES_CA_FILE", value_name = "FILE")]
    pub postgres_ca_file: Option<PathBuf>,
    /// PostgreSQL sink: the schema of its tables [default: public].
    #[arg(long = "postgres-schema", value_name = "NAME")]
    pub postgres_schema: Option<String>,
    /// PostgreSQL sink: top-level fields of each record kept in columns of
    /// their own beside `data`, as `FIELD:TYPE,...` (types text, bigint,
    /// integer, numeric, double, boolean, jsonb), for tables it creates.
    #[arg(long = "postgres-columns", value_name = "LIST")]
    pub postgres_columns: Option<String>,
    /// PostgreSQL sink: keep one row per key, the latest, in tables it
    /// creates: each stream's key is the one its source declares (a Singer
    /// catalog's `key_properties`); for taps that send records again
    /// [default: false].
    #[arg(long = "postgres-upsert", value_name = "BOOL")]
    pub postgres_upsert: Option<bool>,
}

/// The PostgreSQL sink's settings, checked. Its `Debug` leaves the
/// password out.
#[derive(Clone, PartialEq)]
pub struct PostgresConfig {
    pub url: String,
    /// From the password file or PGPASSWORD, when the URL has none.
    pub password: Option<String>,
    pub schema: String,
    pub columns: Vec<Column>,
    pub upsert: bool,
    /// The URL asks for TLS.
    pub tls: bool,
    pub ca_file: Option<PathBuf>,
    /// Tables keep each record's text as written (`json`, not `jsonb`): the
    /// dead-letter destination's, which must hold whatever a sink refused.
    pub verbatim: bool,
}

impl std::fmt::Debug for PostgresConfig {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let database = connection_config(&self.url, None).map(|c| describe(&c)).unwrap_or_default();
        f.debug_struct("PostgresConfig")
            .field("database", &database)
            .field("schema", &self.schema)
            .field("columns", &self.columns)
            .field("upsert", &self.upsert)
            .finish_non_exhaustive()
    }
}

impl PostgresArgs {
    pub fn resolve(&self) -> Result<PostgresConfig, String> {
        let url = self.postgres_url.clone().ok_or(
            "the postgres sink needs its database: --postgres-url postgresql://USER@HOST:PORT/DATABASE, \
             SKIPPR_POSTGRES_URL, or `postgres_url` in [sink]",
        )?;
        let password = match &self.postgres_password_file {
            Some(path) => Some(password_file(path)?),
            None => std::env::var("PGPASSWORD").ok().filter(|p| !p.is_empty()),
        };
        let ca_file = self.postgres_ca_file.clone();
        let tls = asks_for_tls(&connection_config(&url, password.as_deref())?);
        if ca_file.is_some() && !tls {
            return Err(
                "--postgres-ca-file is given but the URL does not ask for TLS: add sslmode=require to it".into()
            );
        }
        if tls {
            // Checked now, so that a bad file stops start-up.
            tls_config(read_ca(ca_file.as_deref())?.as_deref()).map_err(|e| format!("the postgres sink's TLS: {e}"))?;
        }
        let schema = self.postgres_schema.clone().unwrap_or_else(|| "public".into());
        if schema.is_empty() || schema.len() > 63 {
            return Err(format!("--postgres-schema '{schema}' must be 1 to 63 bytes"));
        }
        let columns = match &self.postgres_columns {
            Some(list) => columns(list)?,
            None => Vec::new(),
        };
        let upsert = self.postgres_upsert.unwrap_or(false);
        Ok(PostgresConfig { url, password, schema, columns, upsert, tls, ca_file, verbatim: false })
    }
}

impl PostgresConfig {
    /// The sink's settings, given each stream's key as its source declares
    /// it (empty for sources that declare none).
    pub fn settings(&self, keys: &[(String, Vec<String>)]) -> Result<PostgresSettings, String> {
        let mut upsert = BTreeMap::new();
        if self.upsert {
            if keys.is_empty() {
                return Err("--postgres-upsert needs a source that declares its streams' keys: the singer source \
                            (key_properties in the tap's catalog)"
                    .into());
            }
            for (stream, key) in keys {
                if key.is_empty() {
                    return Err(format!(
                        "--postgres-upsert: the tap's catalog gives the stream '{stream}' no key_properties; \
                         declare them in the tap's settings or catalog (tap-jsonl: primary_keys), \
                         or leave --postgres-upsert off"
                    ));
                }
                upsert.insert(stream.clone(), key.clone());
            }
        }
        let tls = match self.tls {
            false => None,
            true => Some(
                tls_config(read_ca(self.ca_file.as_deref())?.as_deref())
                    .map_err(|e| format!("the postgres sink's TLS: {e}"))?,
            ),
        };
        Ok(PostgresSettings {
            config: connection_config(&self.url, self.password.as_deref())?,
            schema: self.schema.clone(),
            columns: self.columns.clone(),
            keys: upsert,
            tls,
            verbatim: self.verbatim,
        })
    }
}

/// The CA file's certificates, when one is given.
fn read_ca(path: Option<&Path>) -> Result<Option<Vec<u8>>, String> {
    path.map(|p| std::fs::read(p).map_err(|e| format!("--postgres-ca-file {}: cannot read it: {e}", p.display())))
        .transpose()
}

/// `FIELD:TYPE,...` into columns; each field once, none of the sink's own
/// column names.
fn columns(list: &str) -> Result<Vec<Column>, String> {
    let mut columns: Vec<Column> = Vec::new();
    for entry in list.split(',').map(str::trim).filter(|e| !e.is_empty()) {
        let (field, ty) = entry.split_once(':').ok_or_else(|| {
            format!("--postgres-columns: '{entry}' is not FIELD:TYPE (for example id:bigint,name:text)")
        })?;
        let (field, ty) = (field.trim(), ty.trim());
        let sql_type = ColumnType::parse(ty).ok_or_else(|| {
            format!("--postgres-columns: '{ty}' is not a type here; use text, bigint, integer, numeric, double, boolean or jsonb")
        })?;
        if field.is_empty() || field.len() > 63 || ["data", "_skippr_seq", "_skippr_row"].contains(&field) {
            return Err(format!(
                "--postgres-columns: '{field}' cannot name a column (1 to 63 bytes, not data, _skippr_seq or _skippr_row)"
            ));
        }
        if columns.iter().any(|c| c.field == field) {
            return Err(format!("--postgres-columns: '{field}' is named twice"));
        }
        columns.push(Column { field: field.to_string(), sql_type });
    }
    Ok(columns)
}

/// The password in `path`, which must not be readable by group or others.
fn password_file(path: &Path) -> Result<String, String> {
    use std::os::unix::fs::PermissionsExt;
    let meta = std::fs::metadata(path)
        .map_err(|e| format!("cannot read the PostgreSQL password file {}: {e}", path.display()))?;
    if meta.permissions().mode() & 0o077 != 0 {
        return Err(format!(
            "the PostgreSQL password file {} is readable by others (mode {:o}): chmod 600 it",
            path.display(),
            meta.permissions().mode() & 0o777
        ));
    }
    let text = std::fs::read_to_string(path)
        .map_err(|e| format!("cannot read the PostgreSQL password file {}: {e}", path.display()))?;
    Ok(text.trim_end_matches(['\n', '\r']).to_string())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn upserts_need_every_stream_keyed_by_its_source() {
        let pg = PostgresConfig {
            url: "postgresql://u@h/d".into(),
            password: None,
            schema: "public".into(),
            columns: vec![],
            upsert: true,
            tls: false,
            ca_file: None,
            verbatim: false,
        };
        assert!(pg.settings(&[]).err().unwrap().contains("singer source"));
        let keys = vec![("a".to_string(), vec!["id".to_string()]), ("b".to_string(), vec![])];
        assert!(pg.settings(&keys).err().unwrap().contains("'b'"));
        let settings = pg.settings(&keys[..1]).unwrap();
        assert_eq!(settings.keys.get("a"), Some(&vec!["id".to_string()]));
        let off = PostgresConfig { upsert: false, ..pg };
        assert!(off.settings(&keys).unwrap().keys.is_empty(), "keys are ignored unless asked for");
    }
}
