//! The checkout is the same on every OS: `.gitattributes` makes every text file LF in the work
//! tree (GitHub's Windows runners check out with `core.autocrlf=true`, and tests here compare
//! bytes and search for `"\n## …\n"`), and no text file of the source tree has a CR LF where
//! the tests read it. On Windows this second check is the one that fails without the attributes.

use std::path::{Path, PathBuf};

/// Directories the tests and the build read, relative to the repository root.
const TEXT_DIRS: &[&str] = &[
    "src", "crates", "tests", "docs", "deploy", "scripts", "examples", "proto", ".github", ".ci",
];

/// Recorded bytes, kept as they came (see `.gitattributes`).
const RECORDED: &[&str] = &["tests/field-bundle"];

/// File names that are text here (the tree holds no other kind in these directories).
fn is_text(path: &Path) -> bool {
    let ext = path.extension().and_then(|e| e.to_str()).unwrap_or("");
    matches!(
        ext,
        "rs" | "md"
            | "yaml"
            | "yml"
            | "json"
            | "toml"
            | "snap"
            | "proto"
            | "ps1"
            | "py"
            | "sh"
            | "txt"
            | "tpl"
            | "c"
            | "go"
    ) || path
        .file_name()
        .is_some_and(|n| n == "Dockerfile" || n == "run")
}

fn files(root: &Path, dir: &Path, out: &mut Vec<PathBuf>) {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return;
    };
    for entry in entries.filter_map(Result::ok) {
        let path = entry.path();
        let rel = path
            .strip_prefix(root)
            .unwrap()
            .to_string_lossy()
            .replace('\\', "/");
        if RECORDED.iter().any(|r| rel.starts_with(r)) || rel.ends_with("/target") {
            continue;
        }
        if path.is_dir() {
            files(root, &path, out);
        } else if is_text(&path) {
            out.push(path);
        }
    }
}

#[test]
fn gitattributes_makes_every_text_file_lf_and_keeps_bytes_bytes() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let text = std::fs::read_to_string(root.join(".gitattributes"))
        .expect(".gitattributes at the repository root");
    let rules: Vec<&str> = text
        .lines()
        .map(str::trim)
        .filter(|l| !l.is_empty() && !l.starts_with('#'))
        .collect();
    assert_eq!(
        rules,
        [
            "* text=auto eol=lf",
            "fuzz/corpus/** binary",
            "tests/field-bundle/** -text",
        ]
    );
}

#[test]
fn no_text_file_in_the_work_tree_has_crlf() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let mut all = Vec::new();
    for dir in TEXT_DIRS {
        files(root, &root.join(dir), &mut all);
    }
    for name in ["Cargo.toml", "README.md", "CHANGELOG.md", ".gitattributes"] {
        all.push(root.join(name));
    }
    assert!(
        all.len() > 250,
        "only {} files found under {root:?}",
        all.len()
    );
    let crlf: Vec<String> = all
        .iter()
        .filter(|p| std::fs::read(p).is_ok_and(|b| b.windows(2).any(|w| w == b"\r\n")))
        .map(|p| p.strip_prefix(root).unwrap().display().to_string())
        .collect();
    assert!(
        crlf.is_empty(),
        "text files with CR LF in the work tree (is .gitattributes in effect? `git add \
         --renormalize .` then a fresh checkout): {crlf:?}"
    );
}
