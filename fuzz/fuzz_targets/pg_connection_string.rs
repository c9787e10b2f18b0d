//! Reading a Postgres connection string and its TLS parameters (operator
//! input) never panics, and showing it never panics either.
#![no_main]

use libfuzzer_sys::fuzz_target;
use walhook_pgtls::{ConnectOptions, TlsFields};
use walhook_pgtls::DatabaseUrl;

fuzz_target!(|data: &[u8]| {
    if let Ok(text) = std::str::from_utf8(data) {
        let url = DatabaseUrl::new(text);
        let _ = url.masked();
        match ConnectOptions::parse(&url, "[fuzz]", &TlsFields::default()) {
            Ok(options) => {
                let _ = format!("{options:?}");
            }
            Err(e) => {
                let _ = e.to_string();
            }
        }
    }
});
