//! The Windows API output parsers (`src/backend/winparse.rs`) on arbitrary buffers: registry value
//! data of every type (including invalid UTF-16), multi-strings, the D3DKMT registry query struct
//! and the HCS properties JSON. Registry values always come out as data the snapshot accepts.
#![no_main]

use dxdp_core::facts::check_data_shape;
use dxdp_fuzz::winparse;
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let Some((&head, rest)) = data.split_first() else {
        return;
    };
    match head % 4 {
        0 => {
            let (kind, value) = winparse::reg_value(u32::from(head >> 2), rest);
            check_data_shape(kind, &value).expect("registry data fits its type");
        }
        1 => {
            let units = winparse::u16s_from_bytes(rest);
            let _ = winparse::utf16_to_string(&units);
            for s in winparse::parse_multi_sz(&units) {
                assert!(!s.is_empty() && !s.contains('\0'));
            }
        }
        2 => {
            let _ = winparse::parse_query_registry(rest);
            if let Some(raw) = winparse::u64_le(rest) {
                let _ = winparse::driver_version(raw);
                let (low, high) = winparse::luid_from_i64(raw as i64);
                assert_eq!(winparse::luid_to_i64(low, high), raw as i64);
            }
        }
        _ => {
            if let Ok(text) = std::str::from_utf8(rest) {
                let _ = winparse::hcs_schema_versions(text);
                let _ = winparse::os_build(Some(10), None, Some(text), Some(1));
            }
        }
    }
});
