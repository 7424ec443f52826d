//! What the S3 WAL and the DynamoDB stores share: where the services are and
//! how the SDK is configured. Credentials come from the SDK's standard
//! provider chain (environment, profile files, web identity, container and
//! instance metadata) and are never logged.

use aws_config::retry::RetryConfig;
use aws_config::timeout::TimeoutConfig;
use aws_config::{BehaviorVersion, Region, SdkConfig};
use std::time::Duration;

#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct AwsSettings {
    /// The region; without it, the SDK's chain (`AWS_REGION`, profile).
    pub region: Option<String>,
    /// A service endpoint such as `http://127.0.0.1:5000` for a local
    /// server; S3 is then addressed path-style.
    pub endpoint: Option<String>,
    /// How long one request may take, retries included, before its outcome
    /// counts as unknown [default: 60 s]. Under a writer lease it is kept
    /// below half the steal span, so a delete or create sent while the lease
    /// was valid cannot land long after another writer took over.
    pub operation_timeout: Option<Duration>,
}

impl AwsSettings {
    /// Loads the SDK configuration. Requests time out (an unknown outcome
    /// for the engine) rather than hang.
    pub async fn load(&self) -> Result<SdkConfig, String> {
        let operation = self.operation_timeout.unwrap_or(Duration::from_secs(60));
        let mut loader = aws_config::defaults(BehaviorVersion::latest())
            .timeout_config(
                TimeoutConfig::builder()
                    .connect_timeout(Duration::from_secs(5).min(operation))
                    .operation_attempt_timeout(Duration::from_secs(20).min(operation))
                    .operation_timeout(operation)
                    .build(),
            )
            .retry_config(RetryConfig::standard().with_max_attempts(4));
        if let Some(region) = &self.region {
            loader = loader.region(Region::new(region.clone()));
        }
        if let Some(endpoint) = &self.endpoint {
            loader = loader.endpoint_url(endpoint);
        }
        let config = loader.load().await;
        if config.region().is_none() {
            return Err("no AWS region is configured: set SKIPPR_AWS_REGION (or AWS_REGION)".into());
        }
        Ok(config)
    }
}

/// What one try of a start-up check found.
pub enum Check<T> {
    Ready(T),
    /// An answer that trying again will not change (a missing bucket, a
    /// denied access): the message to stop with.
    Refused(String),
    /// It failed; the cause as `describe` names it.
    Failed(String),
}

/// A start-up check (does the bucket or table answer?), tried four times
/// with a short backoff by hand, on a client without SDK retries: the SDK's
/// own retries can run into the operation timeout, whose error no longer
/// says what failed (a refused connection would read as "no answer in
/// time"). Returns the last failure's cause.
pub async fn start_up_check<T, F, Fut>(mut attempt: F) -> Result<T, Result<String, String>>
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = Check<T>>,
{
    let mut last = String::new();
    for n in 0..4u32 {
        if n > 0 {
            tokio::time::sleep(Duration::from_millis(200 << n)).await;
        }
        match attempt().await {
            Check::Ready(t) => return Ok(t),
            Check::Refused(message) => return Err(Ok(message)),
            Check::Failed(cause) => last = cause,
        }
    }
    Err(Err(last))
}

/// The S3 endpoint the SDK will use, when it is not AWS's own: the shared
/// setting (`SKIPPR_AWS_ENDPOINT`, `AWS_ENDPOINT_URL`) or the SDK's
/// per-service variable `AWS_ENDPOINT_URL_S3`. Any such endpoint is
/// addressed path-style: a local or self-hosted server rarely answers for
/// `<bucket>.<host>` names.
pub fn s3_endpoint(sdk: &SdkConfig) -> Option<String> {
    service_endpoint(sdk, "AWS_ENDPOINT_URL_S3")
}

/// The DynamoDB endpoint when it is not AWS's own (`AWS_ENDPOINT_URL_DYNAMODB`
/// or the shared setting).
pub fn dynamodb_endpoint(sdk: &SdkConfig) -> Option<String> {
    service_endpoint(sdk, "AWS_ENDPOINT_URL_DYNAMODB")
}

fn service_endpoint(sdk: &SdkConfig, variable: &str) -> Option<String> {
    std::env::var(variable).ok().filter(|v| !v.is_empty()).or_else(|| sdk.endpoint_url().map(str::to_string))
}

/// Where requests go, for log lines and messages.
pub fn endpoint_label(endpoint: Option<String>, sdk: &SdkConfig) -> String {
    endpoint.unwrap_or_else(|| {
        let region = sdk.region().map(|r| r.to_string()).unwrap_or_default();
        format!("AWS ({region})")
    })
}

/// An SDK error as one line an operator can act on: the service's own code
/// and message, or the cause as one would name it (connection refused, no
/// answer in time, the host name does not resolve, no credentials). The
/// whole error, with its cause chain, goes to the debug log (it never holds
/// credentials).
pub fn describe<E>(e: &E) -> String
where
    E: std::error::Error + aws_sdk_s3::error::ProvideErrorMetadata + 'static,
{
    tracing::debug!(error = %aws_sdk_s3::error::DisplayErrorContext(e), "the AWS SDK's error in full");
    if let Some(code) = e.code() {
        let message = e.message().unwrap_or("").lines().next().unwrap_or("");
        return match code {
            "AccessDenied" | "AccessDeniedException" | "Forbidden" => format!("access denied ({message})"),
            "ValidationException" => format!("the request was refused as invalid: {message}"),
            "InvalidAccessKeyId" | "SignatureDoesNotMatch" | "UnrecognizedClientException" => {
                format!("the credentials were refused ({code}): check the access key and secret")
            }
            _ if message.is_empty() => code.to_string(),
            _ => format!("{code}: {message}"),
        };
    }
    cause(e)
}

/// The cause of a failure that carries no service error code.
fn cause(e: &(dyn std::error::Error + 'static)) -> String {
    let mut chain = Vec::new();
    let mut next: Option<&(dyn std::error::Error + 'static)> = Some(e);
    while let Some(err) = next {
        if let Some(io) = err.downcast_ref::<std::io::Error>() {
            match io.kind() {
                std::io::ErrorKind::ConnectionRefused => return "connection refused".into(),
                std::io::ErrorKind::TimedOut => return "timed out".into(),
                std::io::ErrorKind::ConnectionReset => return "the connection was reset".into(),
                _ => {}
            }
        }
        chain.push(err.to_string());
        next = err.source();
    }
    let text = chain.join(": ").to_lowercase();
    if text.contains("credential") {
        "no usable AWS credentials: set AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY, a profile, or a role".into()
    } else if text.contains("dns error") || text.contains("failed to lookup address") {
        "the endpoint's host name does not resolve".into()
    } else if text.contains("connection refused") {
        "connection refused".into()
    } else if text.contains("timed out") || text.contains("timeout") {
        "no answer in time (the endpoint may be down or unreachable)".into()
    } else {
        // The innermost cause, which names the problem; never the raw
        // response (the debug log has everything).
        chain.last().cloned().unwrap_or_default().lines().next().unwrap_or("").to_string()
    }
}
