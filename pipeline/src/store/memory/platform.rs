//! The rest of the platform store in the twin, so that a whole process
//! runs on it: capture's incidents, ledger and checkpoints (kept by a
//! [`MemoryLedgerStore`]) and the endpoints the directory loads (a
//! [`super::MemoryEndpoints`]).

use std::future::Future;
use std::sync::Arc;

use super::MemoryStore;
use crate::capture::ledger::LedgerPart;
use crate::capture::ledger::memory::MemoryLedgerStore;
use crate::capture::{CaptureIncidentStore, CaptureLedgerStore, Incident};
use crate::endpoint::{EndpointConfig, EndpointSource, Loaded};
use crate::ids::Lsn;
use crate::runtime::CheckpointStore;
use crate::store::StoreError;

impl MemoryStore {
    /// Capture's side of the store (incidents, ledger, checkpoints).
    pub fn capture(&self) -> &MemoryLedgerStore {
        &self.capture
    }

    /// Replaces the endpoints; the directory's next read sees them at
    /// `epoch`.
    pub fn set_endpoints(&self, epoch: i64, endpoints: Vec<EndpointConfig>) {
        self.endpoints.set(epoch, endpoints);
    }
}

impl CaptureIncidentStore for MemoryStore {
    fn record_capture_incidents(
        &self,
        source: &str,
        incidents: &[Incident],
    ) -> impl Future<Output = Result<(), StoreError>> + Send {
        self.capture.record_capture_incidents(source, incidents)
    }
}

impl CaptureLedgerStore for MemoryStore {
    fn record_ledger_parts(
        &self,
        source: &str,
        parts: &[LedgerPart],
    ) -> impl Future<Output = Result<usize, StoreError>> + Send {
        self.capture.record_ledger_parts(source, parts)
    }
}

impl CheckpointStore for MemoryStore {
    fn save_checkpoint(
        &self,
        source: &str,
        slot: &str,
        lsn: Lsn,
        lag_bytes: Option<i64>,
    ) -> impl Future<Output = Result<(), StoreError>> + Send {
        self.capture.save_checkpoint(source, slot, lsn, lag_bytes)
    }
}

impl EndpointSource for MemoryStore {
    fn config_epoch(&self) -> impl Future<Output = Result<i64, StoreError>> + Send {
        self.endpoints.config_epoch()
    }

    fn load_endpoints(&self) -> impl Future<Output = Result<Loaded, StoreError>> + Send {
        self.endpoints.load_endpoints()
    }

    fn quarantine_sync(
        &self,
        quarantined: &[Arc<EndpointConfig>],
    ) -> impl Future<Output = Result<(), StoreError>> + Send {
        self.endpoints.quarantine_sync(quarantined)
    }
}
