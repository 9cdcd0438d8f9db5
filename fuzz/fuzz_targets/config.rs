//! The configuration file parser (`src/config/parse.rs`, `file.rs`, `values.rs`): any text gives a configuration or an
//! error that names the file.
#![no_main]

use dxdp_fuzz::file::ConfigFile;
use dxdp_fuzz::parse::parse;
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let Ok(text) = std::str::from_utf8(data) else {
        return;
    };
    if let Err(e) = parse::<ConfigFile>(text, "fuzz.yaml") {
        assert!(e.to_string().starts_with("fuzz.yaml"), "{e}");
    }
});
