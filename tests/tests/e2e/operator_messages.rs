//! What an operator sees when the setup is wrong: one line that names what
//! failed, where, and the cause as one would name it; tools that end quietly
//! when their reader goes away; settings refused before they can break the
//! lease's safety argument.

use skippr_tests::aws;
use skippr_tests::*;
use std::io::Read;
use std::os::unix::process::ExitStatusExt;
use std::process::{Command, Stdio};

/// A table and a bucket on the local server.
fn setup(name: &str) -> (String, String) {
    aws::bucket_and_table(name)
}

fn s3_run(bucket: &str, table: &str, data: &std::path::Path) -> Command {
    let mut c = Command::new(skipprd_bin());
    c.args(["run", "--once", "--generator-records", "100", "--data-dir", data.to_str().unwrap()])
        .envs(aws::env())
        .env("WAL_STORAGE", "s3")
        .env("SKIPPR_WAL_S3_BUCKET", bucket)
        .env("SKIPPR_OFFSET_DYNAMODB_TABLE", table);
    c
}

/// An endpoint on loopback that refuses connections, and the socket that
/// holds its port: bound but not listening, so no other test can start
/// listening there meanwhile (a port freed again could be taken by a server
/// that never answers, which reads as a timeout).
fn refusing_endpoint() -> (std::os::fd::OwnedFd, String) {
    use nix::sys::socket::{bind, getsockname, socket, AddressFamily, SockFlag, SockType, SockaddrIn};
    use std::os::fd::AsRawFd;
    let held = socket(AddressFamily::Inet, SockType::Stream, SockFlag::empty(), None).unwrap();
    bind(held.as_raw_fd(), &SockaddrIn::new(127, 0, 0, 1, 0)).unwrap();
    let port = getsockname::<SockaddrIn>(held.as_raw_fd()).unwrap().port();
    (held, format!("http://127.0.0.1:{port}"))
}

/// The error line, and that nothing of the SDK's debug dump came with it.
fn one_line_error(out: &std::process::Output, code: i32) -> String {
    let log = stderr(out);
    assert_eq!(out.status.code(), Some(code), "{log}");
    let line = log.lines().find(|l| l.starts_with("skipprd ")).unwrap_or_else(|| panic!("no error line: {log}"));
    for dump in ["DispatchFailure", "ConnectorError", "SdkError", "raw:", "headers"] {
        assert!(!log.contains(dump), "an SDK dump reached the operator ({dump}): {log}");
    }
    assert!(line.len() < 300, "one short line: {line}");
    line.to_string()
}

#[test]
fn the_sdks_per_service_endpoint_variables_work_with_a_host_name() {
    let (bucket, table) = setup("per-service");
    let tmp = tempfile::tempdir().unwrap();
    // `localhost`, not an IP: addressed virtual-host style, the bucket
    // would be looked up as `<bucket>.localhost`.
    let endpoint = aws::endpoint().replace("127.0.0.1", "localhost");
    let out = s3_run(&bucket, &table, tmp.path())
        .env_remove("SKIPPR_AWS_ENDPOINT")
        .env("AWS_ENDPOINT_URL_S3", &endpoint)
        .env("AWS_ENDPOINT_URL_DYNAMODB", &endpoint)
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    assert!(stdout(&out).starts_with("records: 200,"), "{}", stdout(&out));
    let log = stderr(&out);
    let starting = log.lines().find(|l| l.contains("starting")).unwrap();
    assert!(starting.contains(&format!("s3 {endpoint}")), "the starting line names the endpoint: {starting}");
}

#[test]
fn a_refused_connection_is_named_as_such_with_its_endpoint() {
    let (bucket, table) = setup("refused");
    let tmp = tempfile::tempdir().unwrap();
    let (_held, dead) = refusing_endpoint();
    let out = s3_run(&bucket, &table, tmp.path()).env("SKIPPR_AWS_ENDPOINT", &dead).output().unwrap();
    let line = one_line_error(&out, 13);
    assert!(line.contains("connection refused") && line.contains(&dead), "{line}");
    assert!(!line.contains("timed out"), "{line}");
}

#[test]
fn missing_credentials_are_named_as_such() {
    let (bucket, table) = setup("nocreds");
    let tmp = tempfile::tempdir().unwrap();
    let out = s3_run(&bucket, &table, tmp.path())
        .env_remove("AWS_ACCESS_KEY_ID")
        .env_remove("AWS_SECRET_ACCESS_KEY")
        .env("AWS_CONFIG_FILE", tmp.path().join("none"))
        .env("AWS_SHARED_CREDENTIALS_FILE", tmp.path().join("none"))
        .output()
        .unwrap();
    let line = one_line_error(&out, 13);
    assert!(line.contains("no usable AWS credentials"), "{line}");
}

#[test]
fn a_bad_table_name_is_a_configuration_error() {
    let tmp = tempfile::tempdir().unwrap();
    let out = s3_run("some-bucket", "ab", tmp.path()).output().unwrap();
    let line = one_line_error(&out, 3);
    assert!(line.contains("'ab' is not a valid DynamoDB table name"), "{line}");
    assert!(line.contains("(SKIPPR_OFFSET_DYNAMODB_TABLE)"), "named as it was set: {line}");
    // Set by the flag, the message names the flag.
    let out = s3_run("some-bucket", "ab", tmp.path())
        .env_remove("SKIPPR_OFFSET_DYNAMODB_TABLE")
        .args(["--dynamodb-table", "xy"])
        .output()
        .unwrap();
    let line = one_line_error(&out, 3);
    assert!(line.contains("'xy' is not a valid DynamoDB table name") && line.contains("(--dynamodb-table)"), "{line}");
    let out = Command::new(skipprd_bin())
        .args(["run", "--lease-seconds", "0.1", "--data-dir", tmp.path().join("d").to_str().unwrap()])
        .output()
        .unwrap();
    let line = one_line_error(&out, 3);
    assert!(
        line.contains("--lease-seconds must be at least 0.2") && line.contains("within 45 % of the span"),
        "{line}"
    );
    let out = Command::new(skipprd_bin())
        .args(["offsets", "init-table", "--dynamodb-table", "no spaces"])
        .envs(aws::env())
        .output()
        .unwrap();
    assert!(one_line_error(&out, 3).contains("not a valid DynamoDB table name"));
}

#[test]
fn lease_spans_that_break_the_timeout_rule_are_refused() {
    let tmp = tempfile::tempdir().unwrap();
    for (span, says) in [("-1", "must be a positive number"), ("0.1", "must be at least 0.2")] {
        let out = s3_run("b-b-b", "t-t-t", tmp.path()).args(["--lease-seconds", span]).output().unwrap();
        let line = one_line_error(&out, 3);
        assert!(line.contains(says), "--lease-seconds {span}: {line}");
    }
}

#[test]
fn a_tool_whose_reader_goes_away_ends_quietly() {
    let tmp = tempfile::tempdir().unwrap();
    let data = tmp.path().join("data");
    let run = skipprd(&["run", "--once", "--data-dir", data.to_str().unwrap()]);
    assert_eq!(run.status.code(), Some(0), "{}", stderr(&run));
    for args in [vec!["wal", "verify", data.to_str().unwrap()], vec!["sim", "--seed", "1", "--trace"]] {
        let mut child =
            Command::new(skipprd_bin()).args(&args).stdout(Stdio::piped()).stderr(Stdio::piped()).spawn().unwrap();
        drop(child.stdout.take());
        let mut err = String::new();
        child.stderr.take().unwrap().read_to_string(&mut err).unwrap();
        let status = child.wait().unwrap();
        assert!(!err.contains("panicked") && !err.contains("Broken pipe"), "{args:?}: {err}");
        assert_eq!(status.signal(), Some(13), "{args:?} ends by SIGPIPE, like other Unix tools: {status:?}");
    }
}

#[test]
fn a_refused_dynamodb_connection_is_named_as_such_with_its_endpoint() {
    let (bucket, table) = setup("refused-ddb");
    let tmp = tempfile::tempdir().unwrap();
    // S3 answers (moto); DynamoDB's own endpoint refuses.
    let (_held, dead) = refusing_endpoint();
    let out = s3_run(&bucket, &table, tmp.path())
        .env_remove("SKIPPR_AWS_ENDPOINT")
        .env("AWS_ENDPOINT_URL_S3", aws::endpoint())
        .env("AWS_ENDPOINT_URL_DYNAMODB", &dead)
        .output()
        .unwrap();
    let line = one_line_error(&out, 13);
    assert!(line.contains("DynamoDB") && line.contains("connection refused") && line.contains(&dead), "{line}");
}
