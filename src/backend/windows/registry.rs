//! Registry reading: every value of a key, any size and type, recorded as it is.

use windows::core::{PCWSTR, PWSTR};
use windows::Win32::Foundation::{
    ERROR_FILE_NOT_FOUND, ERROR_MORE_DATA, ERROR_NO_MORE_ITEMS, ERROR_SUCCESS,
};
use windows::Win32::System::Registry::{
    RegCloseKey, RegEnumValueW, RegOpenKeyExW, RegQueryInfoKeyW, RegQueryValueExW, HKEY, KEY_READ,
    REG_VALUE_TYPE,
};

use super::error::WinError;
use crate::backend::winparse::{self, wide};
use dxdp_core::facts::{RegData, RegistryValue};

/// An open key, closed on drop.
struct Key(HKEY);

impl Drop for Key {
    fn drop(&mut self) {
        // SAFETY: the handle was opened by `open` and is closed once.
        let _ = unsafe { RegCloseKey(self.0) };
    }
}

fn open(root: HKEY, path: &str) -> Result<Option<Key>, WinError> {
    let wide_path = wide(path);
    let mut key = HKEY::default();
    // SAFETY: valid NUL-terminated path and out pointer.
    let rc = unsafe { RegOpenKeyExW(root, PCWSTR(wide_path.as_ptr()), None, KEY_READ, &mut key) };
    if rc == ERROR_FILE_NOT_FOUND {
        return Ok(None);
    }
    if rc != ERROR_SUCCESS {
        return Err(WinError::win32(format!("RegOpenKeyExW({path})"), rc.0));
    }
    Ok(Some(Key(key)))
}

/// Every value of `root\path`, or `None` when the key does not exist.
pub(crate) fn read_values(root: HKEY, path: &str) -> Result<Option<Vec<RegistryValue>>, WinError> {
    let Some(key) = open(root, path)? else {
        return Ok(None);
    };
    let (mut name_cap, mut data_cap) = (0u32, 0u32);
    // SAFETY: out pointers are valid for the call.
    let rc = unsafe {
        RegQueryInfoKeyW(
            key.0,
            None,
            None,
            None,
            None,
            None,
            None,
            None,
            Some(&mut name_cap),
            Some(&mut data_cap),
            None,
            None,
        )
    };
    if rc != ERROR_SUCCESS {
        return Err(WinError::win32(format!("RegQueryInfoKeyW({path})"), rc.0));
    }
    let mut values = Vec::new();
    let mut index = 0u32;
    let mut retries = 0;
    loop {
        let mut name = vec![0u16; name_cap as usize + 1];
        let mut name_len = name.len() as u32;
        let mut data = vec![0u8; data_cap as usize + 2];
        let mut data_len = data.len() as u32;
        let mut kind = 0u32;
        // SAFETY: buffers and lengths match; the key is open.
        let rc = unsafe {
            RegEnumValueW(
                key.0,
                index,
                Some(PWSTR(name.as_mut_ptr())),
                &mut name_len,
                None,
                Some(&mut kind),
                Some(data.as_mut_ptr()),
                Some(&mut data_len),
            )
        };
        if rc == ERROR_NO_MORE_ITEMS {
            break;
        }
        if rc == ERROR_MORE_DATA && retries < 8 {
            // A value grew (or the key info was stale): grow both buffers and retry this index.
            retries += 1;
            name_cap = (name_cap.max(255)).saturating_mul(2);
            data_cap = data_cap.max(data_len).max(1024).saturating_mul(2);
            continue;
        }
        if rc != ERROR_SUCCESS {
            return Err(WinError::win32(
                format!("RegEnumValueW({path}, #{index})"),
                rc.0,
            ));
        }
        retries = 0;
        let name = String::from_utf16_lossy(&name[..(name_len as usize).min(name.len())]);
        let data = &data[..(data_len as usize).min(data.len())];
        let (kind, data) = winparse::reg_value(kind, data);
        values.push(RegistryValue { name, kind, data });
        index += 1;
    }
    Ok(Some(values))
}

/// One value of `root\path`, or `None` when the key or value does not exist.
pub(crate) fn read_value(root: HKEY, path: &str, name: &str) -> Result<Option<RegData>, WinError> {
    let Some(key) = open(root, path)? else {
        return Ok(None);
    };
    let wide_name = wide(name);
    let mut cap = 256u32;
    for _ in 0..8 {
        let mut data = vec![0u8; cap as usize + 2];
        let mut len = cap;
        let mut kind = REG_VALUE_TYPE(0);
        // SAFETY: buffers and lengths match; the key is open.
        let rc = unsafe {
            RegQueryValueExW(
                key.0,
                PCWSTR(wide_name.as_ptr()),
                None,
                Some(&mut kind),
                Some(data.as_mut_ptr()),
                Some(&mut len),
            )
        };
        if rc == ERROR_FILE_NOT_FOUND {
            return Ok(None);
        }
        if rc == ERROR_MORE_DATA {
            cap = len.max(cap.saturating_mul(2));
            continue;
        }
        if rc != ERROR_SUCCESS {
            return Err(WinError::win32(
                format!("RegQueryValueExW({path}\\{name})"),
                rc.0,
            ));
        }
        let (_, value) = winparse::reg_value(kind.0, &data[..(len as usize).min(data.len())]);
        return Ok(Some(value));
    }
    Err(WinError::other(
        format!("RegQueryValueExW({path}\\{name})"),
        "the value kept growing",
    ))
}

#[cfg(test)]
mod tests {
    use super::*;
    use dxdp_core::facts::RegType;
    use windows::Win32::System::Registry::{
        RegDeleteKeyW, RegDeleteTreeW, RegSetKeyValueW, HKEY_CURRENT_USER, REG_BINARY, REG_DWORD,
        REG_MULTI_SZ, REG_QWORD, REG_SZ,
    };

    fn utf16le(s: &str) -> Vec<u8> {
        s.encode_utf16().flat_map(|u| u.to_le_bytes()).collect()
    }

    /// A scratch key under HKCU, deleted on drop.
    struct Scratch(String);

    impl Scratch {
        fn new(name: &str) -> Self {
            Scratch(format!(r"Software\dxdp-test-{}-{name}", std::process::id()))
        }

        fn set(&self, sub: &str, name: &str, kind: REG_VALUE_TYPE, data: &[u8]) {
            let path = wide(&format!(r"{}\{sub}", self.0));
            let wide_name = wide(name);
            // SAFETY: valid strings and data for the call; creates the key when missing.
            let rc = unsafe {
                RegSetKeyValueW(
                    HKEY_CURRENT_USER,
                    PCWSTR(path.as_ptr()),
                    PCWSTR(wide_name.as_ptr()),
                    kind.0,
                    Some(data.as_ptr().cast()),
                    data.len() as u32,
                )
            };
            assert_eq!(rc, ERROR_SUCCESS);
        }
    }

    impl Drop for Scratch {
        fn drop(&mut self) {
            let path = wide(&self.0);
            unsafe {
                let _ = RegDeleteTreeW(HKEY_CURRENT_USER, PCWSTR(path.as_ptr()));
                let _ = RegDeleteKeyW(HKEY_CURRENT_USER, PCWSTR(path.as_ptr()));
            }
        }
    }

    #[test]
    fn reads_every_value_shape_through_the_backend_code_path() {
        let scratch = Scratch::new("values");
        let sub = "CopyToVmOverwrite";
        let big = "x".repeat(40_000) + ".dll";
        scratch.set(
            sub,
            "nvcuda",
            REG_MULTI_SZ,
            &utf16le("nvcuda_loader64.dll\0nvcuda.dll\0\0"),
        );
        scratch.set(sub, "opencl", REG_SZ, &utf16le("OpenCL64.dll\0"));
        scratch.set(sub, "flags", REG_DWORD, &7u32.to_le_bytes());
        scratch.set(sub, "q", REG_QWORD, &u64::MAX.to_le_bytes());
        scratch.set(sub, "bin", REG_BINARY, &[0xde, 0xad]);
        scratch.set(sub, "big", REG_SZ, &utf16le(&format!("{big}\0")));
        scratch.set(
            sub,
            "ünï 日本",
            REG_MULTI_SZ,
            &utf16le("a.dll\0b.dll\0c.dll\0\0"),
        );
        scratch.set(sub, "", REG_SZ, &utf16le("default.dll\0"));
        let mut values = read_values(HKEY_CURRENT_USER, &format!(r"{}\{sub}", scratch.0))
            .unwrap()
            .unwrap();
        values.sort_by(|a, b| a.name.cmp(&b.name));
        let got: Vec<(&str, RegType, &RegData)> = values
            .iter()
            .map(|v| (v.name.as_str(), v.kind, &v.data))
            .collect();
        let strings = |l: &[&str]| RegData::Strings(l.iter().map(|s| s.to_string()).collect());
        let expected = [
            ("", RegType::REG_SZ, RegData::String("default.dll".into())),
            ("big", RegType::REG_SZ, RegData::String(big.clone())),
            ("bin", RegType::REG_BINARY, RegData::String("dead".into())),
            ("flags", RegType::REG_DWORD, RegData::Integer(7)),
            (
                "nvcuda",
                RegType::REG_MULTI_SZ,
                strings(&["nvcuda_loader64.dll", "nvcuda.dll"]),
            ),
            (
                "opencl",
                RegType::REG_SZ,
                RegData::String("OpenCL64.dll".into()),
            ),
            ("q", RegType::REG_QWORD, RegData::Integer(u64::MAX)),
            (
                "ünï 日本",
                RegType::REG_MULTI_SZ,
                strings(&["a.dll", "b.dll", "c.dll"]),
            ),
        ];
        let expected: Vec<(&str, RegType, &RegData)> =
            expected.iter().map(|(n, t, d)| (*n, *t, d)).collect();
        assert_eq!(got, expected);
        assert_eq!(
            read_value(
                HKEY_CURRENT_USER,
                &format!(r"{}\{sub}", scratch.0),
                "opencl"
            )
            .unwrap(),
            Some(RegData::String("OpenCL64.dll".into()))
        );
        assert_eq!(
            read_value(HKEY_CURRENT_USER, &format!(r"{}\{sub}", scratch.0), "big").unwrap(),
            Some(RegData::String(big))
        );
    }

    #[test]
    fn missing_keys_and_values_are_none() {
        let scratch = Scratch::new("missing");
        assert_eq!(
            read_values(HKEY_CURRENT_USER, &format!(r"{}\nope", scratch.0)).unwrap(),
            None
        );
        scratch.set("k", "a", REG_SZ, &utf16le("x\0"));
        let path = format!(r"{}\k", scratch.0);
        assert_eq!(read_value(HKEY_CURRENT_USER, &path, "nope").unwrap(), None);
        assert_eq!(
            read_values(HKEY_CURRENT_USER, &path)
                .unwrap()
                .map(|v| v.len()),
            Some(1)
        );
    }
}
