//! The platform's endpoints in memory, as the directory reads them
//! ([`EndpointSource`]): every tenant of an endpoint counts as registered
//! and enabled.

use std::collections::HashMap;
use std::sync::Arc;

use parking_lot::Mutex;

use crate::endpoint::{EndpointConfig, EndpointSource, Loaded};
use crate::store::StoreError;

/// Endpoints and their config epoch; [`MemoryEndpoints::set`] changes
/// them as a write through the API would.
#[derive(Debug, Default)]
pub struct MemoryEndpoints(Mutex<(i64, Vec<EndpointConfig>)>);

impl MemoryEndpoints {
    /// `endpoints` at config epoch `epoch`.
    pub fn new(epoch: i64, endpoints: Vec<EndpointConfig>) -> Self {
        MemoryEndpoints(Mutex::new((epoch, endpoints)))
    }

    /// Replaces the endpoints; the next read sees them at `epoch`.
    pub fn set(&self, epoch: i64, endpoints: Vec<EndpointConfig>) {
        *self.0.lock() = (epoch, endpoints);
    }
}

impl EndpointSource for MemoryEndpoints {
    async fn config_epoch(&self) -> Result<i64, StoreError> {
        Ok(self.0.lock().0)
    }

    async fn load_endpoints(&self) -> Result<Loaded, StoreError> {
        let endpoints = self.0.lock().1.clone();
        let mut tenants: Vec<_> = endpoints
            .iter()
            .map(|e| (e.tenant_id.clone(), true))
            .collect();
        tenants.sort();
        tenants.dedup();
        Ok(Loaded {
            tenants,
            weights: HashMap::new(),
            budgets: HashMap::new(),
            endpoints,
            missing_keys: vec![],
        })
    }

    async fn quarantine_sync(&self, _: &[Arc<EndpointConfig>]) -> Result<(), StoreError> {
        Ok(())
    }
}
