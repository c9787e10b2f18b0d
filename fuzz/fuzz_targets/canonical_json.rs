//! Re-serialising embedded JSON never panics and is idempotent.
#![no_main]

use libfuzzer_sys::fuzz_target;
use walhook_pipeline::canonical::JsonWriter;

fuzz_target!(|data: &[u8]| {
    if let Ok(text) = std::str::from_utf8(data) {
        let mut once = Vec::new();
        if JsonWriter::new(&mut once).embedded_json(text).is_ok() {
            let once = String::from_utf8(once).expect("canonical JSON is UTF-8");
            let mut twice = Vec::new();
            JsonWriter::new(&mut twice).embedded_json(&once).expect("canonical JSON re-parses");
            assert_eq!(once.as_bytes(), &twice[..]);
        }
    }
});
