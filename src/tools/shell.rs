//! Quoting of command-line arguments for the shell that will read them.

/// The shells dxdp quotes for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Shell {
    /// POSIX sh and compatibles.
    Sh,
    /// PowerShell.
    PowerShell,
    /// cmd.exe.
    Cmd,
}

impl Shell {
    /// The shell of this platform: PowerShell on Windows, sh elsewhere.
    pub fn native() -> Shell {
        if cfg!(windows) {
            Shell::PowerShell
        } else {
            Shell::Sh
        }
    }
}

/// Whether `arg` reaches the program as one unchanged word without quotes. PowerShell splits a
/// bare word at commas (an array) and treats a leading `@` as splatting, so both need quotes
/// there; sh needs quotes for backslashes.
fn plain(arg: &str, shell: Shell) -> bool {
    !arg.is_empty()
        && arg.chars().all(|c| {
            c.is_ascii_alphanumeric()
                || matches!(c, '_' | '-' | '.' | '/' | ':' | '=' | '+')
                || (matches!(c, ',' | '@') && shell != Shell::PowerShell)
                || (c == '\\' && shell != Shell::Sh)
        })
}

/// `arg` as one word for `shell`.
pub(crate) fn quote(arg: &str, shell: Shell) -> String {
    if plain(arg, shell) {
        return arg.to_string();
    }
    match shell {
        Shell::Sh => format!("'{}'", arg.replace('\'', r"'\''")),
        Shell::PowerShell => format!("'{}'", arg.replace('\'', "''")),
        // cmd passes the line through; the program's C runtime reads \" as a quote.
        Shell::Cmd => format!("\"{}\"", arg.replace('"', "\\\"")),
    }
}

/// Arguments joined into one line for `shell`.
pub fn join(args: &[String], shell: Shell) -> String {
    args.iter()
        .map(|a| quote(a, shell))
        .collect::<Vec<_>>()
        .join(" ")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn quoting_per_shell() {
        let table = [
            ("--device", Shell::Sh, "--device"),
            (
                "vpci-location-path://PCIROOT(0)#PCI(0100)",
                Shell::Sh,
                "'vpci-location-path://PCIROOT(0)#PCI(0100)'",
            ),
            (
                "vpci-location-path://PCIROOT(0)#PCI(0100)",
                Shell::PowerShell,
                "'vpci-location-path://PCIROOT(0)#PCI(0100)'",
            ),
            (
                "vpci-location-path://PCIROOT(0)#PCI(0100)",
                Shell::Cmd,
                "\"vpci-location-path://PCIROOT(0)#PCI(0100)\"",
            ),
            (
                r"C:\Windows\System32\a.dll",
                Shell::PowerShell,
                r"C:\Windows\System32\a.dll",
            ),
            (
                r"C:\Windows\System32\a.dll",
                Shell::Sh,
                r"'C:\Windows\System32\a.dll'",
            ),
            (
                r"C:\Program Files\x.dll",
                Shell::Cmd,
                "\"C:\\Program Files\\x.dll\"",
            ),
            (
                r"C:\Program Files\x.dll",
                Shell::PowerShell,
                r"'C:\Program Files\x.dll'",
            ),
            ("it's", Shell::Sh, r"'it'\''s'"),
            ("it's", Shell::PowerShell, "'it''s'"),
            ("say \"hi\"", Shell::Cmd, r#""say \"hi\"""#),
            // PowerShell would split these at the commas into an array.
            (
                "type=bind,src=C:\\a.dll,dst=C:\\b.dll,options=rbind:ro",
                Shell::PowerShell,
                "'type=bind,src=C:\\a.dll,dst=C:\\b.dll,options=rbind:ro'",
            ),
            (
                "type=bind,src=C:\\a.dll,dst=C:\\b.dll,options=rbind:ro",
                Shell::Cmd,
                "type=bind,src=C:\\a.dll,dst=C:\\b.dll,options=rbind:ro",
            ),
            ("@args", Shell::PowerShell, "'@args'"),
            ("a,b", Shell::Sh, "a,b"),
            ("", Shell::Sh, "''"),
            ("$HOME", Shell::PowerShell, "'$HOME'"),
        ];
        for (arg, shell, expected) in table {
            assert_eq!(quote(arg, shell), expected, "{arg:?} {shell:?}");
        }
    }
}
