//! Reading a configuration document: the YAML parser's errors in an operator's words, with the
//! file, line and column, and every error of a file at once (`dxdp config check`).

use dxdp_core::quote::quote;

/// Why a configuration file is not valid: `file:line:column: what is wrong`.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{origin}{}: {message}", location.map(|(l, c)| format!(":{l}:{c}")).unwrap_or_default())]
pub struct FileError {
    /// The file.
    pub(crate) origin: String,
    /// Line and column.
    pub(crate) location: Option<(u64, u64)>,
    /// What is wrong and what is allowed.
    pub(crate) message: String,
}

/// What is at `line:column` of `text`, for "got …" in errors: a quoted scalar (bounded), or
/// "a list" / "a mapping".
fn found_at(text: &str, location: Option<(u64, u64)>) -> String {
    let Some((line, column)) = location else {
        return "something else".into();
    };
    let line_text = text
        .lines()
        .nth(line.saturating_sub(1) as usize)
        .unwrap_or_default();
    let rest: String = line_text
        .chars()
        .skip(column.saturating_sub(1) as usize)
        .collect();
    let rest = rest.trim_start();
    if rest.starts_with('-') && rest[1..].starts_with([' ', '\t']) || rest.starts_with('[') {
        return "a list".into();
    }
    if rest.starts_with('{') {
        return "a mapping".into();
    }
    let end = rest
        .find([',', '}', ']'])
        .into_iter()
        .chain(rest.find(" #"))
        .min()
        .unwrap_or(rest.len());
    let token = rest[..end].trim();
    if token.is_empty() {
        return "nothing".into();
    }
    if token.ends_with(':') || token.contains(": ") {
        return "a mapping".into();
    }
    quote(token.trim_matches(['\'', '"']))
}

/// A parser message in the words an operator uses: "expected a whole number, got \"two\"",
/// "the file must be a mapping of keys, not a list", "unknown key …: the keys allowed here are …".
fn operator_words(message: &str, text: &str, location: Option<(u64, u64)>) -> String {
    let got = || found_at(text, location);
    let m = message;
    if m == "invalid boolean" {
        return format!("expected true or false, got {}", got());
    }
    if m.starts_with("invalid u") || m.starts_with("invalid i") {
        let got = got();
        return if got.starts_with("\"-") {
            format!("expected a whole number of at least 0, got {got}")
        } else {
            format!("expected a whole number, got {got}")
        };
    }
    if m.starts_with("invalid f") {
        return format!("expected a number, got {}", got());
    }
    if m == "expected mapping start" {
        let got = got();
        return if location == Some((1, 1)) {
            format!(
                "the file must be a mapping of keys (key: value), not {}",
                if got == "a list" {
                    got
                } else {
                    format!("the single value {got}")
                }
            )
        } else {
            format!("expected a mapping of keys (key: value) here, got {got}")
        };
    }
    if m == "expected sequence start" {
        return format!(
            "expected a list here ([a, b], or one item per line starting with '- '), got {}",
            got()
        );
    }
    if let Some(rest) = m.strip_prefix("duplicate mapping key: ") {
        let key = rest
            .split(", set DuplicateKeyPolicy")
            .next()
            .unwrap_or(rest);
        return format!("key {key} appears twice in the same mapping: keep one");
    }
    if let Some(rest) = m.strip_prefix("unknown field ") {
        return match rest.split_once(", expected one of ") {
            Some((key, allowed)) => {
                format!("unknown key {key}: the keys allowed here are {allowed}")
            }
            None => match rest.split_once(", expected ") {
                Some((key, allowed)) => {
                    format!("unknown key {key}: the only key allowed here is {allowed}")
                }
                None => format!("unknown key {rest}"),
            },
        };
    }
    if let Some(rest) = m.strip_prefix("unknown variant ") {
        return match rest.split_once(", expected one of ") {
            Some((value, allowed)) => format!("unknown value {value}: use one of {allowed}"),
            None => format!("unknown value {rest}"),
        };
    }
    if let Some(rest) = m.strip_prefix("invalid type: ") {
        if let Some((found, expected)) = rest.split_once(", expected ") {
            return format!("expected {expected}, got {found}");
        }
    }
    m.to_string()
}

/// The first line indented with a tab, as `(line, column)` of the tab: YAML indents with spaces
/// only, and the parser's own message for it ("tabs disallowed within this context") comes after
/// one that blames the line above.
fn tab_indent(text: &str) -> Option<(u64, u64)> {
    text.lines().enumerate().find_map(|(i, line)| {
        let indent = &line[..line.len() - line.trim_start_matches([' ', '\t']).len()];
        let column = indent.find('\t')?;
        is_content(line).then_some((i as u64 + 1, column as u64 + 1))
    })
}

/// Parses a YAML document of type `T`, with `origin` naming it in errors.
pub fn parse<T: serde::de::DeserializeOwned>(text: &str, origin: &str) -> Result<T, FileError> {
    if text
        .lines()
        .all(|l| l.trim().is_empty() || l.trim_start().starts_with('#'))
    {
        // An empty file (e.g. an empty ConfigMap key), or one of comments alone, is an empty
        // configuration.
        return serde_saphyr::from_str("{}").map_err(|e| FileError {
            origin: origin.to_string(),
            location: None,
            message: e.to_string(),
        });
    }
    let options = serde_saphyr::options! { with_snippet: false };
    serde_saphyr::from_str_with_options(text, options).map_err(|e| {
        if let Some(location) = tab_indent(text) {
            return FileError {
                origin: origin.to_string(),
                location: Some(location),
                message: "this line is indented with a tab: YAML indents with spaces only (replace the tab with spaces)".into(),
            };
        }
        let location = e.location().map(|l| (l.line(), l.column()));
        let message = operator_words(&dxdp_core::snapshot::yaml_message(&e), text, location);
        FileError {
            origin: origin.to_string(),
            location,
            message,
        }
    })
}

/// How many errors `dxdp config check` reports of one file at most.
pub const MAX_ERRORS: usize = 20;

/// How many keys [`parse_all`] parses alone at most.
const MAX_PARTS: usize = 200;

/// Parses like [`parse`], but on failure finds every error it can (up to `max`): the first error
/// of each innermost key (a key whose value is a single value, a list or a flow mapping, at any
/// depth), each parsed alone with the keys above it and the other lines blanked (so lines and
/// columns stay right), in file order. A file whose error needs two keys together (a key given
/// twice) or that is indented with a tab reports that one error.
pub fn parse_all<T: serde::de::DeserializeOwned>(
    text: &str,
    origin: &str,
    max: usize,
) -> Result<T, Vec<FileError>> {
    let first = match parse::<T>(text, origin) {
        Ok(v) => return Ok(v),
        Err(e) => e,
    };
    if tab_indent(text).is_some() {
        return Err(vec![first]);
    }
    let lines: Vec<&str> = text.lines().collect();
    let mut parts = Vec::new();
    leaves(&lines, 0, lines.len(), 0, &mut Vec::new(), &mut parts);
    let mut errors = vec![first];
    // Bounded work whatever the file (each part is a parse of the whole, mostly blank, text):
    // the daemon counts a rejected file's errors on every read of it.
    for (above, s, e) in parts.into_iter().take(MAX_PARTS) {
        if errors.len() >= max {
            break;
        }
        let masked: Vec<&str> = lines
            .iter()
            .enumerate()
            .map(|(i, l)| {
                if above.contains(&i) || (s..e).contains(&i) {
                    *l
                } else {
                    ""
                }
            })
            .collect();
        // Only an error in the part's own lines: one elsewhere comes from the keys blanked
        // around it (a rule across two keys, an alias to an anchor in another part).
        let own = |err: &FileError| {
            err.location
                .is_some_and(|(line, _)| (s..e).contains(&(line.saturating_sub(1) as usize)))
        };
        if let Err(err) = parse::<T>(&masked.join("\n"), origin) {
            if own(&err) && !errors.contains(&err) {
                errors.push(err);
            }
        }
    }
    errors.sort_by_key(|e| e.location);
    errors.truncate(max);
    Err(errors)
}

/// The innermost mapping entries in `start..end` at `indent` spaces and below: `(the lines of the
/// keys above it, first line, end)` each.
fn leaves(
    lines: &[&str],
    start: usize,
    end: usize,
    indent: usize,
    above: &mut Vec<usize>,
    out: &mut Vec<(Vec<usize>, usize, usize)>,
) {
    for (s, e) in entries(lines, start, end, indent) {
        let inner = child_indent(lines, s + 1, e);
        let children = if inner > indent {
            entries(lines, s + 1, e, inner)
        } else {
            Vec::new()
        };
        if children.is_empty() {
            out.push((above.clone(), s, e));
        } else {
            above.push(s);
            leaves(lines, s + 1, e, inner, above, out);
            above.pop();
        }
    }
}

/// The indentation of the first content line in `start..end` (0 when there is none).
fn child_indent(lines: &[&str], start: usize, end: usize) -> usize {
    lines[start..end]
        .iter()
        .find(|l| is_content(l))
        .map(|l| l.len() - l.trim_start_matches(' ').len())
        .unwrap_or(0)
}

fn is_content(line: &str) -> bool {
    let t = line.trim_start();
    !t.is_empty() && !t.starts_with('#') && t != "---" && t != "..."
}

/// The mapping entries at exactly `indent` spaces in `start..end`: `(first line, end)` each, its
/// value's lines included. Empty when the lines there are not block-style mapping entries.
fn entries(lines: &[&str], start: usize, end: usize, indent: usize) -> Vec<(usize, usize)> {
    let mut out: Vec<(usize, usize)> = Vec::new();
    if indent == 0 && start > 0 {
        return out;
    }
    for (i, line) in lines.iter().enumerate().take(end).skip(start) {
        if !is_content(line) {
            continue;
        }
        let own = line.len() - line.trim_start_matches(' ').len();
        if own == indent {
            let t = line.trim_start();
            if t.starts_with('-') || !t.contains(':') {
                return Vec::new();
            }
            if let Some(last) = out.last_mut() {
                last.1 = i;
            }
            out.push((i, end));
        } else if own < indent {
            return Vec::new();
        }
    }
    out
}
