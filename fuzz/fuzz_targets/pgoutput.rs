//! The pgoutput decoder must never panic and never allocate more than the
//! input describes; decoded tuples are then run through value conversion.
#![no_main]

use libfuzzer_sys::fuzz_target;
use walhook_connectors::postgres::pgoutput::{ColumnValue, Message, decode};
use walhook_connectors::postgres::value::write_text_value;
use walhook_pipeline::canonical::JsonWriter;

fuzz_target!(|data: &[u8]| {
    if let Ok(Message::Insert { new, .. }) = decode(data) {
        assert!(new.columns.len() <= data.len());
        for (i, c) in new.columns.iter().enumerate() {
            if let ColumnValue::Text(t) = c {
                let mut out = Vec::new();
                // Cycle through types with their own JSON forms.
                let oid = [16, 17, 20, 114, 700, 1007, 1009, 1184, 1700, 3802][i % 10];
                write_text_value(&mut JsonWriter::new(&mut out), oid, t);
            }
        }
    }
});
