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

/// An SDK error as one line, with its cause chain (no credentials are in it).
pub fn describe<E: std::error::Error>(e: &E) -> String {
    aws_sdk_s3::error::DisplayErrorContext(e).to_string()
}
