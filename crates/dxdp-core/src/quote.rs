//! Bounded quoting of untrusted input in messages.
//!
//! Device IDs come from the kubelet, paths and names from the host or a snapshot, values from
//! configuration files and the environment: any of them can be megabytes long or full of control
//! characters. Every message (gRPC error, log line, warning) that echoes such a value goes through
//! this module, so it quotes at most a bounded prefix and says how long the whole value was.

/// Escapes control and bidirectional-override characters so that facts from the host cannot
/// break lines or rewrite the terminal (for output to people; unbounded, unlike the quotes).
pub fn clean(text: &str) -> String {
    use std::fmt::Write;
    let mut out = String::with_capacity(text.len());
    for ch in text.chars() {
        let bidi = matches!(ch, '\u{200E}' | '\u{200F}' | '\u{202A}'..='\u{202E}' | '\u{2066}'..='\u{2069}');
        if ch.is_control() || bidi {
            let _ = write!(out, "\\u{{{:04x}}}", u32::from(ch));
        } else {
            out.push(ch);
        }
    }
    out
}

/// How many bytes of a value messages quote by default.
pub const MAX_QUOTED: usize = 120;

/// The longest prefix of `s` of at most `max` bytes that ends on a character boundary.
fn prefix(s: &str, max: usize) -> &str {
    let mut end = max.min(s.len());
    while !s.is_char_boundary(end) {
        end -= 1;
    }
    &s[..end]
}

/// `s` in double quotes with Rust escapes (`"a\n"`), cut after `max` bytes of the original:
/// `"abc…" (100000 bytes)`. At most about `10 * max + 30` bytes whatever `s` is.
pub fn quote_prefix(s: &str, max: usize) -> String {
    if s.len() <= max {
        format!("{s:?}")
    } else {
        let head = format!("{:?}", prefix(s, max));
        let inner = &head[1..head.len() - 1];
        format!("\"{inner}…\" ({} bytes)", s.len())
    }
}

/// [`quote_prefix`] with [`MAX_QUOTED`].
pub fn quote(s: &str) -> String {
    quote_prefix(s, MAX_QUOTED)
}

/// `s` as is for messages that show it without quotes (descriptions, paths), with control
/// characters escaped and, when longer than `max` bytes, cut to a prefix: `abc… (100000 bytes)`.
/// Short, printable values are unchanged.
pub fn bounded_prefix(s: &str, max: usize) -> String {
    let head = if s.len() <= max { s } else { prefix(s, max) };
    let mut out = String::with_capacity(head.len() + 24);
    for ch in head.chars() {
        if ch.is_control() {
            out.extend(ch.escape_debug());
        } else {
            out.push(ch);
        }
    }
    if s.len() > max {
        out.push_str(&format!("… ({} bytes)", s.len()));
    }
    out
}

/// [`bounded_prefix`] with [`MAX_QUOTED`].
pub fn bounded(s: &str) -> String {
    bounded_prefix(s, MAX_QUOTED)
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn quoting_table() {
        let table = [
            ("abc", 10, "\"abc\""),
            ("abcdef", 3, "\"abc…\" (6 bytes)"),
            ("", 3, "\"\""),
            ("a\nb", 10, "\"a\\nb\""),
            // `é` is two bytes: a cut inside it backs off to the boundary.
            ("aéb", 2, "\"a…\" (4 bytes)"),
            ("abc", 0, "\"…\" (3 bytes)"),
        ];
        for (input, max, expected) in table {
            assert_eq!(quote_prefix(input, max), expected, "{input:?} {max}");
        }
    }

    #[test]
    fn bounded_table() {
        let table = [
            (r"C:\Windows\x", 40, r"C:\Windows\x"),
            ("NVIDIA A10", 4, "NVID… (10 bytes)"),
            ("a\u{1b}[31mb", 40, "a\\u{1b}[31mb"),
            ("a\r\nb", 40, "a\\r\\nb"),
            ("ü", 1, "… (2 bytes)"),
        ];
        for (input, max, expected) in table {
            assert_eq!(bounded_prefix(input, max), expected, "{input:?} {max}");
        }
    }

    #[test]
    fn huge_values_give_short_messages() {
        let id = "x".repeat(3 << 20);
        let q = quote(&id);
        assert!(q.len() < MAX_QUOTED + 40, "{}", q.len());
        assert!(q.ends_with(&format!("({} bytes)", 3 << 20)));
        assert!(bounded(&id).len() < MAX_QUOTED + 40);
    }

    proptest! {
        #[test]
        fn output_is_bounded_and_starts_with_the_input(s in "\\PC{0,300}|[\\x00-\\x7f]{0,300}", max in 0usize..200) {
            let q = quote_prefix(&s, max);
            prop_assert!(q.len() <= 10 * max + 40, "{} for max {}", q.len(), max);
            let b = bounded_prefix(&s, max);
            prop_assert!(b.len() <= 10 * max + 40);
            prop_assert!(!b.chars().any(char::is_control));
            prop_assert!(!q.chars().any(char::is_control));
            if s.len() <= max {
                prop_assert_eq!(q, format!("{s:?}"));
            } else {
                let suffix = format!("({} bytes)", s.len());
                prop_assert!(q.ends_with(&suffix));
                prop_assert!(b.ends_with(&suffix));
            }
        }
    }
}
