//! JSON Schemas that outbox and message rules declare for the payloads of
//! their event types (`schema_files`): the producer shapes those payloads,
//! so walhook checks them, and a payload that does not match is an incident
//! (counted, stored, reconciled), never an event.

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use super::config::{RuleConfig, RuleError};

/// One declared schema, compiled.
struct Declared {
    file: PathBuf,
    validator: jsonschema::Validator,
}

/// A rule's declared schemas, by event type.
#[derive(Default)]
pub struct DeclaredSchemas {
    by_type: HashMap<String, Declared>,
}

impl std::fmt::Debug for DeclaredSchemas {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("DeclaredSchemas")
            .field("types", &self.by_type.keys().collect::<Vec<_>>())
            .finish()
    }
}

impl DeclaredSchemas {
    /// Reads and compiles `rule`'s `schema_files`; `None` when it has none.
    /// A file that cannot be read, is not JSON or is not a valid schema is
    /// the rule's error, naming the file.
    pub fn load(rule: &RuleConfig) -> Result<Option<Arc<Self>>, RuleError> {
        if rule.schema_files.is_empty() {
            return Ok(None);
        }
        let mut by_type = HashMap::new();
        for (event_type, file) in &rule.schema_files {
            let fail = |problem: String| RuleError::new(&rule.name, "schema_files", problem);
            let text = std::fs::read_to_string(file).map_err(|e| {
                fail(format!(
                    "{event_type}: cannot read {}: {e}; give a JSON Schema file (relative to the config file)",
                    file.display()
                ))
            })?;
            let schema: serde_json::Value = serde_json::from_str(&text)
                .map_err(|e| fail(format!("{event_type}: {} is not JSON: {e}", file.display())))?;
            let validator = jsonschema::validator_for(&schema).map_err(|e| {
                fail(format!(
                    "{event_type}: {} is not a valid JSON Schema: {e}",
                    file.display()
                ))
            })?;
            by_type.insert(
                event_type.clone(),
                Declared {
                    file: file.clone(),
                    validator,
                },
            );
        }
        Ok(Some(Arc::new(DeclaredSchemas { by_type })))
    }

    /// Checks the payload `data` (JSON text) of an event of `event_type`;
    /// types without a declared schema pass. `Err` says what is wrong and
    /// where.
    pub fn check(&self, event_type: &str, data: &str) -> Result<(), String> {
        let Some(d) = self.by_type.get(event_type) else {
            return Ok(());
        };
        let value: serde_json::Value =
            serde_json::from_str(data).map_err(|e| format!("the payload is not JSON: {e}"))?;
        d.validator.validate(&value).map_err(|e| {
            let at = e.instance_path().to_string();
            format!(
                "the payload of {event_type} does not match {}: {e}{}",
                file_name(&d.file),
                if at.is_empty() {
                    String::new()
                } else {
                    format!(" (at {at})")
                }
            )
        })
    }
}

fn file_name(p: &Path) -> String {
    p.file_name().map_or_else(
        || p.display().to_string(),
        |n| n.to_string_lossy().into_owned(),
    )
}
