//! A logical message (and an outbox payload) with any bytes either becomes
//! an event whose body is valid JSON within the size limit and whose
//! identifiers are storable, or an incident whose texts are bounded and
//! clean; it never panics.
#![no_main]

use libfuzzer_sys::fuzz_target;
use walhook_connectors::postgres::RuleConfig;
use walhook_connectors::postgres::rules::{MessageRule, Outcome, TxContext};
use walhook_pipeline::canonical::JsonWriter;
use walhook_pipeline::event::check_object_id;
use walhook_pipeline::ids::Lsn;
use walhook_pipeline::sanitize::{Lines, is_clean};
use walhook_pipeline::time::Timestamp;

const MAX: usize = 4096;

fuzz_target!(|data: &[u8]| {
    let rule: RuleConfig =
        toml::from_str("name = \"m\"\nkind = \"message\"\nprefix = \"app\"").unwrap();
    let tx = TxContext {
        source: "main",
        commit_lsn: Lsn(0x100),
        commit_time: Timestamp(0),
        max_event_bytes: MAX,
    };
    match MessageRule::new(&rule).apply(data, &tx, 0) {
        Outcome::Event(e) => {
            // The body is canonical JSON: re-canonicalising it changes
            // nothing (numbers keep their digits, so a parser that reads
            // them into floats would refuse some valid bodies).
            let body = std::str::from_utf8(&e.payload).expect("an event body is UTF-8");
            let mut again = Vec::new();
            JsonWriter::new(&mut again)
                .embedded_json(body)
                .expect("an event body is JSON");
            assert_eq!(again, e.payload.as_ref());
            assert!(e.payload.len() <= MAX);
            if let Some(id) = &e.object_id {
                check_object_id(id).expect("a checked object id");
            }
            assert!(is_clean(e.tenant_id.as_str(), Lines::Escape));
        }
        Outcome::Incident(i) => {
            let i = i.bounded();
            assert!(i.detail.len() <= walhook_pipeline::incident::MAX_DETAIL_BYTES);
            assert!(is_clean(&i.detail, Lines::Escape));
        }
        Outcome::Skip => {}
    }
    // The outbox payload reader: canonical JSON (a fixed point) or an
    // error, never a panic.
    if let Ok(text) = std::str::from_utf8(data) {
        let mut out = Vec::new();
        if JsonWriter::new(&mut out).embedded_json(text).is_ok() {
            let once = String::from_utf8(out).expect("canonical JSON is UTF-8");
            let mut twice = Vec::new();
            JsonWriter::new(&mut twice)
                .embedded_json(&once)
                .expect("canonical JSON re-parses");
            assert_eq!(once.as_bytes(), &twice[..]);
        }
    }
});
