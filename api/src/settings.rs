//! The API's settings: who the operator is, which URLs endpoints may have,
//! and the defaults of secret rotation and test deliveries.

use std::time::Duration;

use walhook_connectors::http::policy::UrlPolicy;

/// The shortest operator token accepted.
pub const MIN_OPERATOR_TOKEN_LEN: usize = 32;

/// The default overlap of a secret rotation: the previous secret keeps
/// signing this long, so receivers can switch without a failed check.
pub const DEFAULT_ROTATION_OVERLAP: Duration = Duration::from_secs(24 * 3600);

/// The longest overlap a rotation may ask for.
pub const MAX_ROTATION_OVERLAP: Duration = Duration::from_secs(7 * 24 * 3600);

/// The API's settings.
#[derive(Clone)]
pub struct ApiSettings {
    /// The operator's bearer token (manages tenants and keys).
    pub operator_token: String,
    /// What endpoint URLs may be.
    pub url_policy: UrlPolicy,
    /// The overlap of a rotation that does not name one.
    pub rotation_overlap: Duration,
    /// When automatic retries of a test delivery stop (the `[retry]`
    /// deadline).
    pub test_delivery_deadline: Duration,
}

impl std::fmt::Debug for ApiSettings {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ApiSettings")
            .field("operator_token", &"***")
            .field("url_policy", &self.url_policy)
            .field("rotation_overlap", &self.rotation_overlap)
            .field("test_delivery_deadline", &self.test_delivery_deadline)
            .finish()
    }
}

impl ApiSettings {
    /// Settings with the defaults and `operator_token`.
    pub fn new(operator_token: impl Into<String>, url_policy: UrlPolicy) -> Self {
        ApiSettings {
            operator_token: operator_token.into(),
            url_policy,
            rotation_overlap: DEFAULT_ROTATION_OVERLAP,
            test_delivery_deadline: Duration::from_secs(24 * 3600),
        }
    }
}
