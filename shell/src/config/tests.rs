use super::stores::{operation_timeout, parse_peers};
use super::*;
use skippr_core::LeaseConfig;
use skippr_io::plugin::dir_sink::settings::DirSinkConfig;
use skippr_io::plugin::generator::settings::GeneratorConfig;
use skippr_io::plugin::singer::settings::SingerConfig;

fn run(settings: Settings) -> RunArgs {
    RunArgs { settings, ..RunArgs::default() }
}

fn s3(bucket: Option<&str>, table: Option<&str>) -> RunArgs {
    run(Settings {
        wal: WalArgs { wal_storage: Some("s3".into()), s3_bucket: bucket.map(Into::into), s3_prefix: None },
        table: TableArgs { dynamodb_table: table.map(Into::into) },
        ..Settings::default()
    })
}

fn with_file(text: &str) -> (tempfile::NamedTempFile, RunArgs) {
    let tmp = tempfile::NamedTempFile::new().unwrap();
    std::fs::write(tmp.path(), text).unwrap();
    let args = RunArgs { config: Some(tmp.path().to_path_buf()), ..RunArgs::default() };
    (tmp, args)
}

#[test]
fn the_singer_source_needs_its_tap_and_takes_a_catalog_or_properties_not_both() {
    let singer = |text: &str| {
        let (_tmp, args) = with_file(&format!("[source]\nkind = \"singer\"\n{text}"));
        resolve(&args).map(|c| c.source)
    };
    assert!(singer("").unwrap_err().contains("--singer-command"));
    let c = singer("singer_command = \"tap-x --config t.json\"").unwrap();
    assert_eq!(
        c,
        SourceConfig::Singer(SingerConfig {
            command: "tap-x --config t.json".into(),
            catalog: None,
            properties: None,
            interval: Some(60.0),
        })
    );
    let once = singer("singer_command = \"t\"\nsinger_interval = 0").unwrap();
    assert!(matches!(once, SourceConfig::Singer(SingerConfig { interval: None, .. })));
    assert!(singer("singer_command = \"t\"\nsinger_interval = -1").unwrap_err().contains("--singer-interval"));
    let both = "singer_command = \"t\"\nsinger_catalog = \"c.json\"\nsinger_properties = \"p.json\"";
    assert!(singer(both).unwrap_err().contains("not both"));
    let (_tmp, args) = with_file("[source]\nkind = \"singer\"\nsinger_command = \"t\"");
    let args = RunArgs { skip_input: vec!["items:0:5..6".into()], ..args };
    let refused = resolve(&args).map(|_| ()).unwrap_err();
    assert!(refused.contains("--skip-input does not apply to a Singer tap"), "{refused}");
    let gone = singer("singer_command = \"t\"\nsinger_buffer_bytes = 100").unwrap_err();
    assert!(gone.contains("is gone") && gone.contains("--wal-max-bytes"), "{gone}");
}

#[test]
fn defaults_serve_a_first_run() {
    let c = resolve(&RunArgs::default()).unwrap();
    assert_eq!(c.data_dir, PathBuf::from("./data"));
    assert_eq!(c.sink, SinkConfig::Dir(DirSinkConfig { dir: PathBuf::from("./data/sink"), mode: 0o640 }));
    assert!(matches!(c.source, SourceConfig::Generator(GeneratorConfig { records: 10_000, partitions: 2, .. })));
    assert_eq!((c.wal, c.offsets), (WalConfig::Disk, OffsetsConfig::Disk));
    assert_eq!(c.wal_bytes_per_file, Limits::default().segment_bytes, "core's default");
    assert_eq!((c.lease_seconds, c.drain_timeout_seconds, c.stall_seconds), (10.0, 30.0, 60.0));
}

#[test]
fn the_help_states_the_defaults_core_gives() {
    let cmd = <RunArgs as Args>::augment_args(clap::Command::new("run"));
    let help = |id: &str| {
        let arg = cmd.get_arguments().find(|a| a.get_id() == id).unwrap_or_else(|| panic!("no argument {id}"));
        arg.get_help().map(|h| h.to_string()).unwrap_or_default()
    };
    let limits = Limits::default();
    let cases = [
        ("wal_bytes_per_file", limits.segment_bytes.to_string()),
        ("wal_max_delay_seconds", secs(limits.segment_age_max).to_string()),
        ("wal_max_bytes", limits.wal_bytes_max.to_string()),
        ("record_cache_bytes", limits.record_cache_bytes.to_string()),
        ("record_bytes_max", skippr_core::rules::RECORD_BYTES_MAX_DEFAULT.to_string()),
        ("drain_timeout", secs(limits.drain_timeout).to_string()),
        ("stall_seconds", secs(limits.stall_report_after.unwrap()).to_string()),
        ("lease_seconds", secs(LeaseConfig::default().steal_after).to_string()),
        ("stall_exit_seconds", STALL_EXIT_SECONDS.to_string()),
        ("plugin_timeout", PLUGIN_TIMEOUT_SECONDS.to_string()),
    ];
    for (id, default) in cases {
        assert!(help(id).contains(&format!("[default: {default}]")), "--{id}: {}", help(id));
    }
}

#[test]
fn the_sdk_timeout_stays_below_half_the_lease_span() {
    for span in [0.2, 0.5, 1.0, 1.5, 2.0, 3.9, 4.0, 10.0, 200.0, 1e6] {
        let timeout = operation_timeout(span).as_secs_f64();
        assert!(timeout > 0.0 && timeout < span / 2.0, "span {span} s: timeout {timeout} s");
    }
    let args = |lease: f64| {
        let mut args = s3(Some("b"), Some("skipprd"));
        args.settings.lease_seconds = Some(lease);
        args
    };
    let c = resolve(&args(3.0)).unwrap();
    assert!(c.aws.operation_timeout.unwrap().as_secs_f64() < 1.5);
    let e = resolve(&args(0.1)).unwrap_err();
    assert!(e.contains("at least 0.2"), "{e}");
    assert!(resolve(&args(-1.0)).unwrap_err().contains("positive"));
}

#[test]
fn s3_mode_keeps_offsets_in_dynamodb_unless_told() {
    let mut args = s3(Some("wal-bucket"), Some("skipprd"));
    let c = resolve(&args).unwrap();
    assert_eq!(c.wal, WalConfig::S3 { bucket: "wal-bucket".into(), prefix: "skipprd/wal/".into() });
    assert_eq!(c.offsets, OffsetsConfig::Dynamodb { table: "skipprd".into() });
    assert_eq!(c.lease_table.as_deref(), Some("skipprd"));
    args.settings.offsets.offset_store = Some("disk".into());
    assert_eq!(resolve(&args).unwrap().offsets, OffsetsConfig::Disk);
}

#[test]
fn flags_win_over_the_file() {
    let (_tmp, mut args) = with_file("data_dir = \"/from-file\"\npipeline = \"p\"\n[source]\nrecords = 7\n");
    args.settings.data_dir = Some("/from-flag".into());
    let c = resolve(&args).unwrap();
    assert_eq!(c.data_dir, PathBuf::from("/from-flag"));
    assert_eq!(c.pipeline, "p");
    assert!(matches!(c.source, SourceConfig::Generator(GeneratorConfig { records: 7, .. })));
    // Inside a plugin's table too: a flag wins, the file's other keys stay.
    let (_tmp, mut args) = with_file("[source]\nrecords = 7\npartitions = 3\n[sink]\nkind = \"stdout\"\n");
    args.settings.source.generator.records = Some(9);
    let c = resolve(&args).unwrap();
    assert!(matches!(c.source, SourceConfig::Generator(GeneratorConfig { records: 9, partitions: 3, .. })));
    assert_eq!(c.sink, SinkConfig::Stdout);
}

#[test]
fn every_group_of_settings_is_read_from_the_file() {
    let text = "wal_storage = \"s3\"\ns3_bucket = \"b\"\ns3_prefix = \"p/\"\ndynamodb_table = \"tbl\"\n\
                aws_endpoint = \"http://127.0.0.1:1\"\ndrain_timeout_seconds = 5.0\n\
                plugin_timeout_seconds = 2.0\n[sink]\nkind = \"stdout\"\n";
    let (_tmp, args) = with_file(text);
    let c = resolve(&args).unwrap();
    assert_eq!(c.wal, WalConfig::S3 { bucket: "b".into(), prefix: "p/".into() });
    assert_eq!(c.offsets, OffsetsConfig::Dynamodb { table: "tbl".into() });
    assert_eq!(c.aws.endpoint.as_deref(), Some("http://127.0.0.1:1"));
    assert_eq!((c.drain_timeout_seconds, c.plugin_timeout_seconds), (5.0, 2.0));
    assert_eq!(c.sink, SinkConfig::Stdout);
    let (_tmp, mut args) = with_file(text);
    args.settings.wal.s3_prefix = Some("flag/".into());
    assert_eq!(resolve(&args).unwrap().wal, WalConfig::S3 { bucket: "b".into(), prefix: "flag/".into() });
}

#[test]
fn bad_values_say_what_is_wrong() {
    let args = run(Settings {
        wal: WalArgs { wal_storage: Some("tape".into()), ..WalArgs::default() },
        ..Settings::default()
    });
    assert_eq!(resolve(&args).unwrap_err(), "unknown WAL_STORAGE 'tape': use one of disk, s3, clustered");
    assert!(resolve(&s3(None, None)).unwrap_err().contains("SKIPPR_WAL_S3_BUCKET"));
    assert!(resolve(&s3(Some("b"), None)).unwrap_err().contains("skipprd offsets init-table"));
    let offsets = OffsetsArgs { offset_store: Some("dynamodb".into()) };
    let args = run(Settings { offsets, ..Settings::default() });
    assert!(resolve(&args).unwrap_err().contains("SKIPPR_OFFSET_DYNAMODB_TABLE"));
    let (_tmp, args) = with_file("data_dirr = 1\n");
    assert!(resolve(&args).unwrap_err().contains("unknown field `data_dirr`"));
    let (_tmp, args) = with_file("[source]\nrecordz = 1\n");
    assert!(resolve(&args).unwrap_err().contains("unknown field `recordz` in `[source]`"));
    let (_tmp, args) = with_file("[sink]\nkind = \"dir\"\ndir_mod = \"0600\"\n");
    assert!(resolve(&args).unwrap_err().contains("unknown field `dir_mod` in `[sink]`"));
    let (_tmp, args) = with_file("[source]\nrecords = \"many\"\n");
    assert!(resolve(&args).unwrap_err().contains("invalid type"), "a value of the wrong type");
    let (_tmp, args) = with_file("once = true\n");
    assert!(resolve(&args).unwrap_err().contains("unknown field `once`"), "a flag only");
}

fn clustered(node: Option<u64>, peers: Option<&str>, tls: bool) -> RunArgs {
    let file = |name: &str| tls.then(|| PathBuf::from(name));
    run(Settings {
        wal: WalArgs { wal_storage: Some("clustered".into()), ..WalArgs::default() },
        cluster: ClusterArgs {
            cluster_node_id: node,
            cluster_peers: peers.map(Into::into),
            cluster_ca: file("ca.pem"),
            cluster_cert: file("node.pem"),
            cluster_key: file("node-key.pem"),
        },
        ..Settings::default()
    })
}

const PEERS: &str = "1=127.0.0.1:7001, 2=127.0.0.1:7002,3=127.0.0.1:7003";

#[test]
fn a_clustered_host_names_itself_its_peers_and_its_tls_files() {
    let c = resolve(&clustered(Some(2), Some(PEERS), true)).unwrap();
    let WalConfig::Clustered(s) = c.wal else { panic!("{:?}", c.wal) };
    assert_eq!(s.node, 2);
    assert_eq!(s.peers.get(&3).map(String::as_str), Some("127.0.0.1:7003"));
    assert_eq!(s.tls.key, PathBuf::from("node-key.pem"));
    assert_eq!((c.offsets, c.lease_table), (OffsetsConfig::Disk, None), "no AWS unless asked for");
    let err = |args: RunArgs| resolve(&args).unwrap_err();
    assert!(err(clustered(None, Some(PEERS), true)).contains("SKIPPR_CLUSTER_NODE_ID"));
    assert!(err(clustered(Some(4), Some(PEERS), true)).contains("has no entry for node 4"));
    assert!(err(clustered(Some(1), None, true)).contains("SKIPPR_CLUSTER_PEERS"));
    assert!(err(clustered(Some(1), Some(PEERS), false)).contains("SKIPPR_CLUSTER_CA"));
    let mut stdout = clustered(Some(1), Some(PEERS), true);
    stdout.settings.sink.kind = Some("stdout".into());
    assert!(err(stdout).contains("stdout sink cannot be used in clustered mode"));
}

#[test]
fn a_bad_peer_list_is_named() {
    let err = |list: &str| parse_peers(list).unwrap_err();
    assert!(err("1=127.0.0.1:7001,2=127.0.0.1:7001").contains("nodes 1 and 2 the same address 127.0.0.1:7001"));
    assert!(err("1=a:1,1=b:2").contains("names node 1 twice"));
    assert!(err("0=a:1").contains("no positive node id"));
    assert!(err("x=a:1").contains("no positive node id"));
    assert!(err("1=a").contains("no HOST:PORT"));
    assert!(err("1=:7001").contains("no HOST:PORT"));
    assert!(err("1 127.0.0.1:7001").contains("has no '='"));
    assert!(err(" , ").contains("empty"));
    assert_eq!(parse_peers("1=db-1:7001,2=[::1]:7002").unwrap().len(), 2);
}

#[test]
fn dead_letters_are_off_by_default_and_go_to_a_directory_under_the_data_dir_when_asked() {
    assert_eq!(resolve(&run(Settings::default())).unwrap().dead_letter, None);
    let dir = |kind: &str| Settings { dead_letter: Some(kind.into()), ..Settings::default() };
    let limits = skippr_core::DeadLetters { max: 100, window: 10_000 };
    assert_eq!(
        resolve(&run(dir("dir"))).unwrap().dead_letter,
        Some(DeadLetterConfig { to: DeadLetterTo::Dir(PathBuf::from("./data/dead-letters")), limits })
    );
    let (_tmp, args) = with_file(
        "dead_letter = \"dir\"\ndead_letter_dir = \"/var/letters\"\ndead_letter_max = 5\ndead_letter_window = 50\n",
    );
    let limits = skippr_core::DeadLetters { max: 5, window: 50 };
    let to = DeadLetterTo::Dir(PathBuf::from("/var/letters"));
    assert_eq!(resolve(&args).unwrap().dead_letter, Some(DeadLetterConfig { to, limits }));
    let zero = Settings { dead_letter_window: Some(0), ..dir("dir") };
    assert!(resolve(&run(zero)).unwrap_err().contains("dead_letter_window (the configuration file) is 0"));
    assert_eq!(
        resolve(&run(dir("kafka"))).unwrap_err(),
        "unknown dead-letter destination 'kafka': use off, dir, postgres or s3"
    );
}

#[test]
fn postgres_dead_letters_use_the_sinks_database_in_a_schema_of_their_own() {
    let letters = |url: Option<&str>, sink: Option<&str>, schemas: (Option<&str>, Option<&str>)| {
        let mut s = Settings {
            dead_letter: Some("postgres".into()),
            dead_letter_schema: schemas.1.map(Into::into),
            ..Settings::default()
        };
        s.sink.kind = sink.map(Into::into);
        s.sink.postgres.postgres_url = url.map(Into::into);
        s.sink.postgres.postgres_schema = schemas.0.map(Into::into);
        s.sink.postgres.postgres_columns = Some("amount:bigint".into());
        resolve(&run(s)).map(|c| c.dead_letter.unwrap().to)
    };
    let db = "postgresql://app@db:5432/warehouse";
    let url = Some(db);
    let Ok(DeadLetterTo::Postgres(p)) = letters(url, Some("postgres"), (None, None)) else { panic!() };
    assert_eq!((p.url.as_str(), p.schema.as_str(), p.columns.len()), (db, "skippr_dead_letters", 0));
    let Ok(DeadLetterTo::Postgres(p)) = letters(url, None, (None, Some("letters"))) else { panic!() };
    assert_eq!(p.schema, "letters", "any sink, the database of --postgres-url");
    assert!(letters(None, None, (None, None)).unwrap_err().contains("--postgres-url"));
    let same = letters(url, Some("postgres"), (Some("app"), Some("app"))).unwrap_err();
    assert!(same.contains("--dead-letter-schema 'app' is the postgres sink's schema too"), "{same}");
}

#[test]
fn s3_dead_letters_default_to_the_sinks_bucket_under_a_prefix_of_their_own() {
    let letters = |sink: Option<(&str, &str)>, own: (Option<&str>, Option<&str>)| {
        let mut s = Settings {
            dead_letter: Some("s3".into()),
            dead_letter_s3_bucket: own.0.map(Into::into),
            dead_letter_s3_prefix: own.1.map(Into::into),
            ..Settings::default()
        };
        if let Some((bucket, prefix)) = sink {
            s.sink.kind = Some("s3".into());
            s.sink.s3.s3_bucket = Some(bucket.into());
            s.sink.s3.s3_prefix = Some(prefix.into());
        }
        resolve(&run(s)).map(|c| c.dead_letter.unwrap().to)
    };
    let Ok(DeadLetterTo::S3(t)) = letters(Some(("lake", "")), (None, None)) else { panic!() };
    assert_eq!((t.bucket.as_str(), t.prefix.as_str(), t.gzip), ("lake", "dead-letters/", false));
    let Ok(DeadLetterTo::S3(t)) = letters(None, (Some("letters"), Some("x"))) else { panic!() };
    assert_eq!((t.bucket.as_str(), t.prefix.as_str()), ("letters", "x"));
    assert!(letters(None, (None, None)).unwrap_err().contains("--dead-letter-s3-bucket"));
    let same = letters(Some(("lake", "out")), (None, Some("out/"))).unwrap_err();
    assert!(same.contains("is the S3 sink's too"), "{same}");
}
