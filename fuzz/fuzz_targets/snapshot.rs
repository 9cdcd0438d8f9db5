//! The host snapshot parser: any text gives facts or an error naming where it is wrong; facts it
//! accepts are written and read back unchanged.
#![no_main]

use dxdp_core::snapshot;
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let Ok(text) = std::str::from_utf8(data) else {
        return;
    };
    let Ok(facts) = snapshot::parse(text, "fuzz.yaml") else {
        return;
    };
    for format in [snapshot::Format::Yaml, snapshot::Format::Json] {
        let written = snapshot::write(&facts, format).expect("accepted facts can be written");
        let again = snapshot::parse(&written, "written").expect("written facts parse");
        assert_eq!(again, facts, "round trip through {format:?}");
    }
});
