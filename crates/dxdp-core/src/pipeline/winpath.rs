//! Windows path rules as pure string functions, so they behave the same on every OS.
//!
//! Host paths are Windows paths even when dxdp runs on Linux (simulated hosts), so nothing here
//! uses `std::path`.

/// The rest of `path` after a leading `\SystemRoot` or `%SystemRoot%` (any case) that is followed
/// by a separator or nothing; `None` when the path does not start with one.
pub fn system_root_relative(path: &str) -> Option<&str> {
    for prefix in [r"\SystemRoot", "%SystemRoot%"] {
        if let Some(head) = path.get(..prefix.len()) {
            if head.eq_ignore_ascii_case(prefix) {
                let rest = &path[prefix.len()..];
                if rest.is_empty() || rest.starts_with(['\\', '/']) {
                    return Some(rest);
                }
            }
        }
    }
    None
}

/// Expands a leading `\SystemRoot` or `%SystemRoot%` (any case) to `system_root`.
pub fn expand_system_root(path: &str, system_root: &str) -> String {
    match system_root_relative(path) {
        Some(rest) => format!("{}{}", system_root.trim_end_matches(['\\', '/']), rest),
        None => path.to_string(),
    }
}

/// Checks that `path` is an absolute local path: a drive letter, `:` and a separator
/// (`C:\...`), then components that are not `..` (or only dots and spaces), without a further
/// `:` (alternate data streams), wildcards or control characters. UNC paths (`\\host\share`),
/// device and NT prefixes (`\\?\`, `\\.\`, `\??\`), paths relative to the current drive
/// (`\x`) or directory (`x`, `C:x`) and a bare `C:` are rejected. The error says what is wrong.
pub fn check_local_absolute(path: &str) -> Result<(), &'static str> {
    if path.is_empty() {
        return Err("is empty");
    }
    if path.chars().any(char::is_control) {
        return Err("contains control characters");
    }
    let is_sep = |c: char| c == '\\' || c == '/';
    let mut chars = path.chars();
    let (first, second, third) = (chars.next(), chars.next(), chars.next());
    match (first, second, third) {
        (Some(a), Some(b), _) if is_sep(a) && is_sep(b) => {
            return Err("is a UNC or device path (\\\\server\\share, \\\\?\\, \\\\.\\); it must be a local path such as C:\\...")
        }
        (Some(a), Some('?'), Some('?')) if is_sep(a) => {
            return Err("has the NT object prefix \\??\\; it must be a plain local path such as C:\\...")
        }
        (Some(a), _, _) if is_sep(a) => {
            return Err("is relative to the current drive; it must start with a drive letter (C:\\...)")
        }
        (Some(d), Some(':'), None) if d.is_ascii_alphabetic() => {
            return Err("is a bare drive; it must name a directory (C:\\...)")
        }
        (Some(d), Some(':'), Some(s)) if d.is_ascii_alphabetic() && is_sep(s) => {}
        (Some(d), Some(':'), Some(_)) if d.is_ascii_alphabetic() => {
            return Err("is relative to the current directory of its drive (C:x); it must be C:\\...")
        }
        _ => return Err("is relative; it must be an absolute local path such as C:\\..."),
    }
    let rest = &path[3..];
    if rest.contains(':') {
        return Err("contains `:` after the drive (an alternate data stream?)");
    }
    if rest.contains(['<', '>', '"', '|', '?', '*']) {
        return Err("contains a character Windows does not allow in paths");
    }
    for part in rest.split(is_sep) {
        if part == ".." {
            return Err("has a `..` component");
        }
        if !part.is_empty() && part.trim_end_matches(['.', ' ']).is_empty() {
            return Err("has a component of only dots or spaces");
        }
    }
    Ok(())
}

/// Whether `path` is strictly inside the directory `dir` (compared as Windows does).
pub fn is_within(path: &str, dir: &str) -> bool {
    let dir = compare_key(dir);
    compare_key(path)
        .strip_prefix(dir.as_str())
        .is_some_and(|rest| rest.len() > 1 && rest.starts_with('\\'))
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
        // ASCII (nearly every path) without the Unicode tables: the same lower case.
        if ch.is_ascii() {
            out.push(ch.to_ascii_lowercase());
        } else {
            out.extend(ch.to_lowercase());
        }
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

/// Names Windows opens as devices whatever the directory, extension or case (`¹²³` are the
/// superscript digits Windows also accepts after `COM` and `LPT`).
const RESERVED_NAMES: [&str; 33] = [
    "CON", "PRN", "AUX", "NUL", "CONIN$", "CONOUT$", "CLOCK$", "COM0", "COM1", "COM2", "COM3",
    "COM4", "COM5", "COM6", "COM7", "COM8", "COM9", "COM¹", "COM²", "COM³", "LPT0", "LPT1", "LPT2",
    "LPT3", "LPT4", "LPT5", "LPT6", "LPT7", "LPT8", "LPT9", "LPT¹", "LPT²", "LPT³",
];

/// Whether Windows treats the file name `name` as a device (`CON`, `com1.dll`, `LPT¹`,
/// `CONOUT$`, `nul .txt`, `AUX.`): the part before the first dot, without trailing spaces and
/// dots, is a reserved name in any case.
pub fn is_reserved_device_name(name: &str) -> bool {
    let trimmed = name.trim_end_matches(['.', ' ']);
    let stem = trimmed
        .split('.')
        .next()
        .unwrap_or(trimmed)
        .trim_end_matches(' ');
    RESERVED_NAMES.iter().any(|r| r.eq_ignore_ascii_case(stem))
}

/// Checks that `name` is a bare file name that stays in its target directory and is not a
/// Windows device name.
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
    if is_reserved_device_name(name) {
        return Err("is a Windows device name (CON, PRN, AUX, NUL, COM0-9, LPT0-9, CONIN$, CONOUT$, CLOCK$); mounting over it would break the container");
    }
    if name.ends_with(['.', ' ']) {
        return Err("ends with a dot or space, which Windows strips");
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
            ("COM\u{b9}", false),
            ("COM\u{b2}.dll", false),
            ("LPT\u{b9}.dll", false),
            ("lpt\u{b3}", false),
            ("CONIN$", false),
            ("conout$.dll", false),
            ("CLOCK$", false),
            ("COM0", false),
            ("lpt0.dll", false),
            ("Nul .txt", false),
            ("aux.", false),
            ("PRN.tar.gz", false),
            ("COM10.dll", true),
            ("COM\u{b9}0.dll", true),
            ("LPT\u{2074}.dll", true),
            ("CONIN.dll", true),
            ("xCON.dll", true),
            ("CLOCK.dll", true),
            (" con.dll", true),
        ];
        for (name, ok) in table {
            assert_eq!(check_destination(name).is_ok(), ok, "{name:?}");
        }
    }

    #[test]
    fn local_absolute_rules() {
        let table = [
            (r"C:\Windows\System32\DriverStore\FileRepository\x", true),
            (r"c:/Windows/System32", true),
            (r"D:\", true),
            (r"C:\a\.\b", false),
            (r"C:\a\..\b", false),
            (r"C:\a\...\b", false),
            (r"C:\a\..", false),
            (r"\\host\share\store", false),
            (r"//host/share/store", false),
            (r"\/host\share", false),
            (r"\\?\C:\Windows", false),
            (r"\\.\C:\Windows", false),
            (r"\??\C:\Windows", false),
            (r"\Windows\System32", false),
            (r"Windows\System32", false),
            (r"..\x", false),
            ("C:", false),
            ("C:x", false),
            (r"C:\x:stream", false),
            (r"C:\x*", false),
            ("C:\\x\u{0}", false),
            (r"1:\x", false),
            ("", false),
            (r"\SystemRoot\System32", false),
        ];
        for (path, ok) in table {
            assert_eq!(
                check_local_absolute(path).is_ok(),
                ok,
                "{path:?}: {:?}",
                check_local_absolute(path)
            );
        }
    }

    #[test]
    fn within_rules() {
        let dir = r"C:\Windows\System32\DriverStore";
        let table = [
            (r"C:\Windows\System32\DriverStore\FileRepository\x", true),
            (r"c:\windows\system32\driverstore\x", true),
            (r"C:\Windows\System32\DriverStore", false),
            (r"C:\Windows\System32\DriverStore\", false),
            (r"C:\Windows\System32\DriverStoreX\x", false),
            (r"C:\Windows\System32\HostDriverStore\x", false),
            (r"D:\DriverStore\x", false),
        ];
        for (path, inside) in table {
            assert_eq!(is_within(path, dir), inside, "{path}");
        }
    }

    #[test]
    fn system_root_relative_rest() {
        assert_eq!(system_root_relative(r"\SYSTEMROOT\x"), Some(r"\x"));
        assert_eq!(system_root_relative("%systemroot%"), Some(""));
        assert_eq!(system_root_relative(r"\SystemRootX\x"), None);
        assert_eq!(system_root_relative(r"C:\x"), None);
    }

    #[test]
    fn compare_keys_fold_case_and_separators() {
        assert_eq!(compare_key(r"C:\A//b\"), compare_key(r"c:\a\B"));
        assert_ne!(compare_key(r"C:\a\b"), compare_key(r"C:\a\c"));
        // Letters beyond ASCII fold too (Unicode lower case).
        assert_eq!(
            compare_key(r"C:/Pilotes//ÉCRAN\Ärger\"),
            r"c:\pilotes\écran\ärger"
        );
    }

    #[test]
    fn join_and_file_name() {
        assert_eq!(join(r"C:\x\", r"a\b.dll"), r"C:\x\a\b.dll");
        assert_eq!(file_name(r"a\b.dll"), "b.dll");
        assert_eq!(file_name("b.dll"), "b.dll");
    }

    mod properties {
        use super::super::*;
        use proptest::prelude::*;

        fn any_case(s: &str, mask: u64) -> String {
            s.chars()
                .enumerate()
                .map(|(i, c)| {
                    if mask >> (i % 64) & 1 == 1 {
                        c.to_ascii_lowercase()
                    } else {
                        c
                    }
                })
                .collect()
        }

        proptest! {
            #[test]
            fn device_names_are_rejected_in_every_spelling(
                index in 0usize..RESERVED_NAMES.len(),
                mask in any::<u64>(),
                spaces in " {0,2}",
                extension in prop::option::of("\\.[a-zA-Z0-9]{0,4}(\\.[a-z]{1,3})?"),
                trailing in "[. ]{0,3}",
            ) {
                let name = format!(
                    "{}{spaces}{}{trailing}",
                    any_case(RESERVED_NAMES[index], mask),
                    extension.unwrap_or_default()
                );
                prop_assert!(is_reserved_device_name(&name), "{:?}", name);
                prop_assert!(check_destination(&name).is_err(), "{:?}", name);
            }

            #[test]
            fn accepted_destinations_are_plain_names(name in "\\PC{1,12}") {
                if check_destination(&name).is_ok() {
                    prop_assert!(!name.contains(['\\', '/', ':']));
                    prop_assert!(!is_reserved_device_name(&name));
                    prop_assert!(!name.ends_with(['.', ' ']));
                }
            }

            #[test]
            fn accepted_local_paths_are_drive_qualified_without_dot_dot(
                path in "([A-Za-z]:|[\\\\/?.]{0,3}|%SystemRoot%)([\\\\/]([a-zA-Z. ]{0,4}|\\.\\.)){0,5}",
            ) {
                if check_local_absolute(&path).is_ok() {
                    let b = path.as_bytes();
                    prop_assert!(b[0].is_ascii_alphabetic() && b[1] == b':' && (b[2] == b'\\' || b[2] == b'/'), "{}", path);
                    prop_assert!(!path.split(['\\', '/']).any(|c| c == ".." || c == "."), "{}", path);
                }
            }

            #[test]
            fn unc_and_device_prefixes_are_rejected(
                prefix in prop_oneof![Just(r"\\"), Just("//"), Just(r"\\?\"), Just(r"\\.\"), Just(r"\??\"), Just(r"\"), Just("")],
                rest in "[A-Za-z]:?[\\\\a-z]{0,10}",
            ) {
                let path = format!("{prefix}{rest}");
                if !prefix.is_empty() {
                    prop_assert!(check_local_absolute(&path).is_err(), "{}", path);
                }
            }
        }
    }
}
