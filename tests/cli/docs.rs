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

/// README.md and every docs/*.md, relative to the repository.
fn pages() -> Vec<String> {
    let mut pages = vec!["README.md".to_string()];
    let docs = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("docs");
    for entry in std::fs::read_dir(&docs).into_iter().flatten().flatten() {
        let name = entry.file_name().to_string_lossy().into_owned();
        if name.ends_with(".md") {
            pages.push(format!("docs/{name}"));
        }
    }
    pages.sort();
    assert!(pages.len() > 5, "docs/ not found: {pages:?}");
    pages
}

/// `dxdp <path…> --help`, split into its subcommands and its flags.
fn help(path: &[&str]) -> (BTreeSet<String>, BTreeSet<String>) {
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_dxdp"))
        .args(path)
        .arg("--help")
        .env_clear()
        .output()
        .unwrap_or_else(|e| panic!("dxdp {path:?} --help: {e}"));
    assert!(out.status.success(), "dxdp {path:?} --help failed");
    let text = String::from_utf8_lossy(&out.stdout).into_owned();
    let (mut commands, mut flags) = (BTreeSet::new(), BTreeSet::new());
    let mut section = "";
    for line in text.lines() {
        if line.is_empty() {
            continue;
        }
        if !line.starts_with(' ') {
            section = line;
            continue;
        }
        let trimmed = line.trim_start();
        match section {
            // A subcommand line is indented by two; deeper lines continue a description.
            "Commands:" if line.starts_with("  ") && !line.starts_with("   ") => {
                if let Some(name) = trimmed.split_whitespace().next() {
                    commands.insert(name.to_string());
                }
            }
            // Flags under a heading of their own (`top`'s and `audit`'s "Secured endpoint:").
            s if s.starts_with("Options:")
                || s.starts_with("Arguments:")
                || s == "Secured endpoint:" =>
            {
                let spec = trimmed.split("  ").next().unwrap_or_default();
                for word in spec.split([' ', ',']) {
                    if let Some(flag) = word.strip_prefix("--") {
                        let flag = flag.split(['=', '<', '[']).next().unwrap_or_default();
                        flags.insert(flag.to_string());
                    } else if word.len() == 2 && word.starts_with('-') {
                        // A short flag, kept with its dash: `-o`.
                        flags.insert(word.to_string());
                    }
                }
            }
            _ => {}
        }
    }
    (commands, flags)
}

/// Each `dxdp …` command line in the Markdown: from `dxdp` to the end of its code span or line.
fn documented_command_lines(text: &str) -> Vec<String> {
    let mut found = Vec::new();
    let mut in_fence = false;
    for line in text.lines() {
        if line.trim_start().starts_with("```") {
            in_fence = !in_fence;
            continue;
        }
        // Code spans outside fences; whole lines inside them.
        let pieces: Vec<&str> = if in_fence {
            vec![line]
        } else {
            line.split('`').skip(1).step_by(2).collect()
        };
        for piece in pieces {
            let mut rest = piece;
            while let Some(i) = rest.find("dxdp") {
                let before_ok = rest[..i]
                    .chars()
                    .last()
                    .is_none_or(|c| c.is_whitespace() || c == '\\' || c == '/' || c == '(');
                let after = &rest[i + 4..];
                let after = after.strip_prefix(".exe").unwrap_or(after);
                if before_ok && after.starts_with(' ') {
                    let end = after.find(['|', ';', ')', '>']).unwrap_or(after.len());
                    found.push(after[..end].trim().to_string());
                }
                rest = &rest[i + 4..];
            }
        }
    }
    found
}

#[test]
fn every_documented_flag_exists_on_its_subcommand() {
    let (top_commands, top_flags) = help(&[]);
    let mut cache: std::collections::HashMap<Vec<String>, (BTreeSet<String>, BTreeSet<String>)> =
        Default::default();
    let pages = pages();
    let mut problems = Vec::new();
    let mut checked = 0;
    for page in &pages {
        for line in documented_command_lines(&doc(page)) {
            let words: Vec<&str> = line.split_whitespace().collect();
            // The subcommand path: words naming subcommands, after any global flags.
            let mut path: Vec<String> = Vec::new();
            let mut commands = top_commands.clone();
            for w in &words {
                if w.starts_with('-') {
                    continue;
                }
                if commands.contains(*w) {
                    path.push(w.to_string());
                    let p: Vec<&str> = path.iter().map(String::as_str).collect();
                    let entry = cache.entry(path.clone()).or_insert_with(|| help(&p));
                    commands = entry.0.clone();
                } else {
                    break;
                }
            }
            if path.is_empty() || path[0] == "help" {
                continue;
            }
            let flags = cache.get(&path).map(|e| e.1.clone()).unwrap_or_default();
            let mut skip_next = false;
            for w in &words[..] {
                if skip_next {
                    skip_next = false;
                    continue;
                }
                // A short flag (`-o`) is checked with its dash.
                let short = w.len() == 2
                    && w.starts_with('-')
                    && w[1..].chars().all(|c| c.is_ascii_alphabetic());
                if short {
                    checked += 1;
                    if !flags.contains(*w) && !top_flags.contains(*w) {
                        problems.push(format!(
                            "{page}: `dxdp {line}`: dxdp {} has no {w}",
                            path.join(" ")
                        ));
                    }
                    continue;
                }
                let Some(flag) = w.strip_prefix("--") else {
                    continue;
                };
                let flag = flag
                    .split(['=', '[', '<', '`', ',', '.', ':', '\\'])
                    .next()
                    .unwrap_or_default();
                if flag.is_empty() || flag.contains(['…', '*']) {
                    continue;
                }
                checked += 1;
                if !flags.contains(flag) && !top_flags.contains(flag) {
                    problems.push(format!(
                        "{page}: `dxdp {line}`: dxdp {} has no --{flag}",
                        path.join(" ")
                    ));
                }
                // What follows `--run` belongs to ctr and the container; a `--ctr-arg` value too.
                if flag == "run" {
                    break;
                }
                skip_next = flag == "ctr-arg";
            }
        }
    }
    assert!(
        checked > 10,
        "only {checked} documented flags found: is the scan broken?"
    );
    assert!(problems.is_empty(), "{}", problems.join("\n"));
}

/// Flags of other programs that the docs show (kubectl, helm, ctr, nerdctl, docker, the kubelet,
/// cargo), and prose placeholders.
const FOREIGN_FLAGS: &[&str] = &[
    // ctr, nerdctl and docker flags that `dxdp mounts` prints.
    "device",
    "mount",
    "isolation",
    "namespace",
    // helm's `--set key=value` in prose.
    "set",
    // The kubelet's flags for its state directory and its container runtime's CRI endpoint.
    "root-dir",
    "container-runtime-endpoint",
    // eksctl / AKS node-pool options in docs/install.md.
    "gpu-driver",
    "skip-gpu-driver-install",
    "driver-type",
    "node-vm-size",
    // helm uninstall's flag in docs/install.md and the chart README.
    "no-hooks",
    // `flag --x` in docs/configuration.md: the shape of a flag origin.
    "x",
    // The kubelet's flag registering a node with taints (the startup taint, docs/install.md).
    "register-with-taints",
];

/// Command lines of other programs, by how they start: their flags are not dxdp's.
const FOREIGN_COMMANDS: &[&str] = &[
    "cargo ",
    "az ",
    // docs/install.md: an EKS managed node group with the startup taint.
    "aws ",
    "helm ",
    "docker ",
    "ctr ",
    "nerdctl ",
    "kubectl ",
    "python3 ",
    // docs/release.md: verifying a release.
    "cosign ",
    "gh ",
    "sha256sum ",
    "HELM=",
    "RUSTDOCFLAGS=",
    "DXDP_SOAK_SECS=",
    "DXDP_UPDATE_SCHEMAS=",
    "DXDP_UPDATE_EXPORTED=",
    ".ci/",
    "deploy/check.py",
];

fn is_foreign(command: &str) -> bool {
    let c = command.trim_start().trim_start_matches(['$', '>', ' ']);
    FOREIGN_COMMANDS.iter().any(|f| c.starts_with(f))
}

/// Every `--flag` in a code span or code block of the docs, outside command lines of other
/// programs, is a flag of some dxdp command.
#[test]
fn every_documented_flag_belongs_to_dxdp() {
    // Every flag of every command, walking the tree.
    let mut all_flags = BTreeSet::new();
    let mut queue: Vec<Vec<String>> = vec![Vec::new()];
    while let Some(path) = queue.pop() {
        let p: Vec<&str> = path.iter().map(String::as_str).collect();
        let (commands, flags) = help(&p);
        all_flags.extend(flags);
        for c in commands.into_iter().filter(|c| c != "help") {
            let mut next = path.clone();
            next.push(c);
            queue.push(next);
        }
    }
    let pages = pages();
    let mut unknown = BTreeSet::new();
    for page in &pages {
        let mut in_fence = false;
        // Inside a fence: whether the current (possibly continued) command is another program's.
        let (mut continued, mut foreign) = (false, false);
        for line in doc(page).lines() {
            if line.trim_start().starts_with("```") {
                in_fence = !in_fence;
                continue;
            }
            let pieces: Vec<&str> = if in_fence {
                if !continued {
                    foreign = is_foreign(line);
                }
                continued = line.trim_end().ends_with('\\');
                if foreign {
                    continue;
                }
                vec![line.split(" #").next().unwrap_or_default()]
            } else {
                line.split('`')
                    .skip(1)
                    .step_by(2)
                    .filter(|p| !is_foreign(p))
                    .collect()
            };
            for piece in pieces {
                for word in piece.split([' ', '[', '(', '|', '"']) {
                    let Some(flag) = word.strip_prefix("--") else {
                        continue;
                    };
                    let flag = flag
                        .split(['=', ']', ')', ',', '.', ':', '<', '\\'])
                        .next()
                        .unwrap_or_default();
                    if flag.is_empty() || !flag.chars().all(|c| c.is_ascii_lowercase() || c == '-')
                    {
                        continue;
                    }
                    if !all_flags.contains(flag) && !FOREIGN_FLAGS.contains(&flag) {
                        unknown.insert(format!("{page}: --{flag} in `{}`", piece.trim()));
                    }
                }
            }
        }
    }
    assert!(
        unknown.is_empty(),
        "flags in the docs that no dxdp command has (fix the doc, or list another program's flag in FOREIGN_FLAGS):\n{}",
        unknown.into_iter().collect::<Vec<_>>().join("\n")
    );
}

/// Table keys of docs/configuration.md that are not [`Key`]s, and why.
const DOCUMENTED_NOT_KEYS: [&str; 4] = [
    // Node-wide defaults of the per-resource include switches.
    "devices.includeIntegrated",
    "devices.includeDetachable",
    // The compute resource's keys, documented once as "as above".
    "resources.compute.*",
    // The map of named configurations (its selection is the `configuration` key).
    "configurations",
];

#[test]
fn every_configuration_key_is_in_the_docs_key_table_and_the_table_names_only_keys() {
    use dxdp::config::keys::Key;
    use dxdp_core::devices::Resource;
    let table = first_column_codes(section(&doc("docs/configuration.md"), "Keys"));
    for key in Key::all() {
        let documented = match key {
            Key::Resource(Resource::Compute, _) => table.contains("resources.compute.*"),
            // Not a key of the file: the named configuration applied, shown by `config show`.
            Key::Configuration => doc("docs/configuration.md").contains("`configuration:"),
            k => table.contains(&k.to_string()),
        };
        assert!(documented, "{key} is not in docs/configuration.md#keys");
    }
    for name in &table {
        assert!(
            Key::parse(name).is_some() || DOCUMENTED_NOT_KEYS.contains(&name.as_str()),
            "docs/configuration.md#keys lists {name}, which is no configuration key"
        );
    }
}
