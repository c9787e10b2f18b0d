//! The OpenAPI document, generated from the handlers' annotations.
//!
//! Served at `/openapi.json` and committed as `api/openapi.json`; a test
//! fails when the two differ, so API changes show in review. Regenerate the
//! file with `WALHOOK_UPDATE_OPENAPI=1 cargo nextest run -p walhook-api openapi`.

use utoipa::openapi::security::{Http, HttpAuthScheme, SecurityScheme};
use utoipa::{Modify, OpenApi};

use crate::routes::{catalog, deliveries, endpoints, ops, reconciliations, sent, tenants};

/// The document's definition.
#[derive(OpenApi)]
#[openapi(
    info(
        title = "walhook control plane",
        description = "Tenants and API keys (operator token); webhook endpoints, deliveries, \
                       replays, the event-type catalog and the audit log (tenant API keys). \
                       Errors are RFC 9457 problem documents naming the field at fault. \
                       POSTs honour `Idempotency-Key`. Any route may answer 429 with \
                       `Retry-After` after too many failed authentications from the client's \
                       address or with the token sent, and 408 when a body does not arrive \
                       within `[api].body_read_timeout`.",
        license(name = "Apache-2.0"),
    ),
    paths(
        ops::healthz, ops::readyz, ops::metrics,
        tenants::create_tenant, tenants::list_tenants, tenants::get_tenant, tenants::patch_tenant,
        tenants::create_api_key, tenants::list_api_keys, tenants::revoke_api_key,
        endpoints::create_endpoint, endpoints::list_endpoints, endpoints::get_endpoint,
        endpoints::patch_endpoint, endpoints::delete_endpoint, endpoints::endpoint_versions, endpoints::endpoint_stats,
        endpoints::rotate_secret, endpoints::verify_endpoint, endpoints::recover_endpoint, endpoints::test_endpoint,
        deliveries::list_deliveries, deliveries::get_delivery, deliveries::replay_delivery,
        deliveries::cancel_delivery, sent::sent_requests,
        catalog::list_event_types, catalog::get_event_type, catalog::list_audit,
        reconciliations::list_reconciliations, reconciliations::get_reconciliation,
        reconciliations::reconciliation_html,
    ),
    modifiers(&Security),
    tags(
        (name = "tenants", description = "Operator: tenants and their API keys"),
        (name = "endpoints", description = "Webhook endpoints: configuration, secrets, recovery, tests"),
        (name = "deliveries", description = "Delivery history, attempts and replays"),
        (name = "catalog", description = "Event types and the audit log"),
        (name = "reconciliation", description = "Reconciliation runs: every stage compared, gaps classified"),
        (name = "operations", description = "Health, readiness and metrics"),
    ),
)]
pub struct ApiDoc;

struct Security;

impl Modify for Security {
    fn modify(&self, openapi: &mut utoipa::openapi::OpenApi) {
        let components = openapi.components.get_or_insert_with(Default::default);
        let bearer = |description: &str| {
            let mut http = Http::new(HttpAuthScheme::Bearer);
            http.description = Some(description.to_owned());
            SecurityScheme::Http(http)
        };
        components.add_security_scheme(
            "operator",
            bearer("The operator token from the config ([api].operator_token or WALHOOK_API_OPERATOR_TOKEN)"),
        );
        components.add_security_scheme(
            "metrics_token",
            bearer(
                "The token that reads /metrics ([api].metrics_token or WALHOOK_API_METRICS_TOKEN)",
            ),
        );
        components.add_security_scheme(
            "tenant_key",
            bearer("A tenant API key (`whk_…`), issued by POST /v1/tenants/{tenant_id}/api-keys"),
        );
    }
}

/// The document.
pub fn document() -> utoipa::openapi::OpenApi {
    let mut doc = ApiDoc::openapi();
    doc.info.version = env!("CARGO_PKG_VERSION").to_owned();
    doc
}

/// The document as pretty JSON with a final newline (the committed form).
pub fn document_json() -> String {
    let mut text = document()
        .to_pretty_json()
        .expect("the OpenAPI document serialises");
    text.push('\n');
    text
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The committed `api/openapi.json` is the generated document.
    #[test]
    fn openapi_json_is_committed_and_current() {
        // The runner's value, not the compile-time one: a build reused from
        // another checkout of the same commit must still read this checkout.
        let dir = std::env::var("CARGO_MANIFEST_DIR")
            .unwrap_or_else(|_| env!("CARGO_MANIFEST_DIR").to_owned());
        let path = std::path::Path::new(&dir).join("openapi.json");
        let generated = document_json();
        if std::env::var_os("WALHOOK_UPDATE_OPENAPI").is_some() {
            std::fs::write(&path, &generated).unwrap();
        }
        let committed = std::fs::read_to_string(&path).unwrap_or_default();
        assert!(
            committed == generated,
            "api/openapi.json differs from the document the code generates; regenerate it with \
             `WALHOOK_UPDATE_OPENAPI=1 cargo nextest run -p walhook-api openapi` and commit it"
        );
    }

    #[test]
    fn every_operation_documents_problems_and_security() {
        let doc = serde_json::to_value(document()).unwrap();
        for (path, item) in doc["paths"].as_object().unwrap() {
            for (method, op) in item.as_object().unwrap() {
                if path.starts_with("/v1/") {
                    assert!(op["responses"]["422"].is_object(), "{method} {path}");
                    assert!(op["security"].is_array(), "{method} {path}");
                }
            }
        }
    }
}
