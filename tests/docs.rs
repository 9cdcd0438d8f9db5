//! The docs match the code: warning codes, runtime-file origins, and the flags of every
//! documented `dxdp` command line.

use std::collections::BTreeSet;
use std::path::PathBuf;

use dxdp_core::devices::{Origin, WarningCode};

fn doc(name: &str) -> String {
    let path = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join(name);
    std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()))
}

/// The text of the `## title` section of a Markdown page.
fn section<'a>(page: &'a str, title: &str) -> &'a str {
    let start = page
        .find(&format!("\n## {title}\n"))
        .unwrap_or_else(|| panic!("no section ## {title}"));
    let rest = &page[start + 1..];
    let end = rest[3..].find("\n## ").map_or(rest.len(), |i| i + 3);
    &rest[..end]
}

/// The first cell of each table row whose first cell is one code span: `` | `x` | ``.
fn first_column_codes(text: &str) -> BTreeSet<String> {
    text.lines()
        .filter_map(|l| l.strip_prefix("| `"))
        .filter_map(|l| l.split_once("` |"))
        .map(|(code, _)| code.to_string())
        .collect()
}

#[test]
fn every_warning_code_is_documented_and_every_documented_code_exists() {
    let page = doc("docs/troubleshooting.md");
    let documented = first_column_codes(section(&page, "Warning codes"));
    let emitted: BTreeSet<String> = WarningCode::ALL
        .iter()
        .map(|c| c.as_str().to_string())
        .collect();
    let undocumented: Vec<_> = emitted.difference(&documented).collect();
    let unknown: Vec<_> = documented.difference(&emitted).collect();
    assert!(
        undocumented.is_empty(),
        "add these warning codes to the table in docs/troubleshooting.md#warning-codes: {undocumented:?}"
    );
    assert!(
        unknown.is_empty(),
        "docs/troubleshooting.md lists warning codes dxdp does not have: {unknown:?}"
    );
}

#[test]
fn every_runtime_file_origin_is_documented() {
    let page = doc("docs/discovery.md");
    let line = page
        .split("\n\n")
        .find(|p| p.starts_with("Each runtime file:"))
        .unwrap_or_default();
    let documented: BTreeSet<&str> = line
        .split('`')
        .skip(1)
        .step_by(2)
        .filter(|s| {
            !s.chars()
                .any(|c| c.is_ascii_uppercase() || c == '\\' || c == '.')
        })
        .collect();
    // Every variant: the match is exhaustive, so a new variant fails to compile here until it is
    // added to `all`.
    let all = [Origin::Registry, Origin::VendorDefault, Origin::Config];
    let position = |o: Origin| match o {
        Origin::Registry => 0,
        Origin::VendorDefault => 1,
        Origin::Config => 2,
    };
    for origin in all {
        assert_eq!(all[position(origin)], origin);
        assert!(
            documented.contains(origin.as_str()),
            "docs/discovery.md does not list origin {} in \"Each runtime file\": {documented:?}",
            origin.as_str()
        );
    }
}
