//! Windows path rules as pure string functions, so they behave the same on every OS.
//!
//! Host paths are Windows paths even when dxdp runs on Linux (simulated hosts), so nothing here
//! uses `std::path`.

/// Expands a leading `\SystemRoot` or `%SystemRoot%` (any case) to `system_root`.
pub fn expand_system_root(path: &str, system_root: &str) -> String {
    for prefix in [r"\SystemRoot", "%SystemRoot%"] {
        if let Some(head) = path.get(..prefix.len()) {
            if head.eq_ignore_ascii_case(prefix) {
                let rest = &path[prefix.len()..];
                if rest.is_empty() || rest.starts_with(['\\', '/']) {
                    return format!("{}{}", system_root.trim_end_matches(['\\', '/']), rest);
                }
            }
        }
    }
    path.to_string()
}

/// Joins a directory and a relative path with one `\`.
pub fn join(dir: &str, relative: &str) -> String {
    format!("{}\\{}", dir.trim_end_matches(['\\', '/']), relative)
}

/// A key for comparing host paths as Windows does: case-insensitive, `/` equal to `\`,
/// repeated separators and a trailing separator ignored.
pub fn compare_key(path: &str) -> String {
    let mut out = String::with_capacity(path.len());
    let mut last_sep = false;
    for ch in path.chars() {
        let ch = if ch == '/' { '\\' } else { ch };
        if ch == '\\' {
            if last_sep {
                continue;
            }
            last_sep = true;
        } else {
            last_sep = false;
        }
        out.extend(ch.to_lowercase());
    }
    while out.ends_with('\\') && out.len() > 1 {
        out.pop();
    }
    out
}

/// Checks a runtime-file source (relative to the driver store) and normalises it to `\`
/// separators without empty or `.` components. The error says what is wrong.
pub fn normalize_source(source: &str) -> Result<String, &'static str> {
    if source.chars().any(char::is_control) {
        return Err("contains control characters");
    }
    if source.starts_with(['\\', '/']) {
        return Err("is absolute or a UNC path; it must be relative to the driver store");
    }
    if source.contains(':') {
        return Err(
            "is drive-qualified or names a stream; it must be relative to the driver store",
        );
    }
    let mut parts = Vec::new();
    for part in source.split(['\\', '/']) {
        match part {
            "" | "." => {}
            ".." => return Err("has a `..` component; it must stay inside the driver store"),
            p if p.trim_end_matches([' ', '.']).is_empty() => {
                return Err("has a component of only dots or spaces")
            }
            p => parts.push(p),
        }
    }
    if parts.is_empty() {
        return Err("is empty");
    }
    Ok(parts.join("\\"))
}

/// The last component of a normalised source.
pub fn file_name(normalized_source: &str) -> &str {
    normalized_source
        .rsplit('\\')
        .next()
        .unwrap_or(normalized_source)
}

const RESERVED_NAMES: [&str; 22] = [
    "CON", "PRN", "AUX", "NUL", "COM1", "COM2", "COM3", "COM4", "COM5", "COM6", "COM7", "COM8",
    "COM9", "LPT1", "LPT2", "LPT3", "LPT4", "LPT5", "LPT6", "LPT7", "LPT8", "LPT9",
];

/// Checks that `name` is a bare file name that stays in its target directory.
pub fn check_destination(name: &str) -> Result<(), &'static str> {
    if name.is_empty() {
        return Err("is empty");
    }
    if name.chars().any(char::is_control) {
        return Err("contains control characters");
    }
    if name.contains(['\\', '/']) {
        return Err("contains a path separator; it must be a bare file name");
    }
    if name.contains(':') {
        return Err("contains `:`; it must be a bare file name");
    }
    if name.contains(['<', '>', '"', '|', '?', '*']) {
        return Err("contains a character Windows does not allow in file names");
    }
    if name == "." || name == ".." {
        return Err("is `.` or `..`");
    }
    if name.ends_with(['.', ' ']) {
        return Err("ends with a dot or space, which Windows strips");
    }
    let stem = name.split('.').next().unwrap_or(name).trim_end();
    if RESERVED_NAMES.iter().any(|r| r.eq_ignore_ascii_case(stem)) {
        return Err("is a reserved device name");
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn system_root_expansion() {
        let table = [
            (
                r"\SystemRoot\System32\DriverStore\X",
                r"C:\Windows\System32\DriverStore\X",
            ),
            (r"\systemroot\System32", r"C:\Windows\System32"),
            (r"%SystemRoot%\System32", r"C:\Windows\System32"),
            (r"\SystemRoot", r"C:\Windows"),
            (r"\SystemRootX\System32", r"\SystemRootX\System32"),
            (r"C:\Windows\System32", r"C:\Windows\System32"),
            (r"\\?\C:\x", r"\\?\C:\x"),
            ("", ""),
            ("é", "é"),
        ];
        for (input, expected) in table {
            assert_eq!(
                expand_system_root(input, r"C:\Windows\"),
                expected,
                "{input}"
            );
        }
    }

    #[test]
    fn source_rules() {
        let table: [(&str, Result<&str, ()>); 16] = [
            ("nvcuda.dll", Ok("nvcuda.dll")),
            (r"lib\x64\a.dll", Ok(r"lib\x64\a.dll")),
            ("lib/x64/a.dll", Ok(r"lib\x64\a.dll")),
            (r".\a.dll", Ok("a.dll")),
            (r"lib\\a.dll", Ok(r"lib\a.dll")),
            (r"..\a.dll", Err(())),
            (r"lib\..\..\a.dll", Err(())),
            (r"\Windows\a.dll", Err(())),
            (r"\\server\share\a.dll", Err(())),
            (r"C:\a.dll", Err(())),
            ("C:a.dll", Err(())),
            ("a.dll:stream", Err(())),
            ("a\u{0}.dll", Err(())),
            ("", Err(())),
            (r".\.", Err(())),
            (r"lib\...\a.dll", Err(())),
        ];
        for (input, expected) in table {
            let got = normalize_source(input);
            match expected {
                Ok(want) => assert_eq!(got.as_deref(), Ok(want), "{input:?}"),
                Err(()) => assert!(got.is_err(), "{input:?} should be rejected, got {got:?}"),
            }
        }
    }

    #[test]
    fn destination_rules() {
        let table = [
            ("nvcuda.dll", true),
            ("vulkaninfo.exe", true),
            ("a b.dll", true),
            ("", false),
            (".", false),
            ("..", false),
            (r"x\y.dll", false),
            ("x/y.dll", false),
            ("C:y.dll", false),
            ("a\n.dll", false),
            ("a.dll.", false),
            ("a.dll ", false),
            ("nul", false),
            ("CON.dll", false),
            ("con1.dll", true),
            ("a*.dll", false),
        ];
        for (name, ok) in table {
            assert_eq!(check_destination(name).is_ok(), ok, "{name:?}");
        }
    }

    #[test]
    fn compare_keys_fold_case_and_separators() {
        assert_eq!(compare_key(r"C:\A//b\"), compare_key(r"c:\a\B"));
        assert_ne!(compare_key(r"C:\a\b"), compare_key(r"C:\a\c"));
    }

    #[test]
    fn join_and_file_name() {
        assert_eq!(join(r"C:\x\", r"a\b.dll"), r"C:\x\a\b.dll");
        assert_eq!(file_name(r"a\b.dll"), "b.dll");
        assert_eq!(file_name("b.dll"), "b.dll");
    }
}
