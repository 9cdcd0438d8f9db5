//! The shape of the code: no import cycles between files, imports that point down the layers
//! (docs/development.md, "Map of the code"), and one public path per item (no re-export
//! aliases).
//!
//! A file's imports are the `crate::…` and `super::…` paths in its code (comments and its
//! `#[cfg(test)] mod tests` block left out), resolved to the file that defines the module. A
//! module using its own child modules by a relative path (`serve::run` in `plugin/mod.rs`) is
//! the module tree itself, not an import, and is not counted.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

/// The layer of each top-level module of the `dxdp` library: a module may import its own files
/// and modules of lower layers only. The core crate (`dxdp_core`) is below all of them.
const LAYERS: &[(&str, u8)] = &[
    ("util", 0),
    ("logging", 1),
    ("transport", 1),
    ("shutdown", 1),
    ("config", 2),
    ("backend", 2),
    ("kubelet", 2),
    ("observe", 2),
    ("output", 2),
    ("inventory", 3),
    ("supervisor", 3),
    ("cluster", 4),
    ("tools", 4),
    ("render", 4),
    ("context", 5),
    ("plugin", 6),
    ("telemetry", 6),
    ("health", 6),
    ("validation", 6),
    ("daemon", 7),
];

fn rust_files(dir: &Path, out: &mut Vec<PathBuf>) {
    for entry in std::fs::read_dir(dir).unwrap() {
        let path = entry.unwrap().path();
        if path.is_dir() {
            rust_files(&path, out);
        } else if path.extension().is_some_and(|e| e == "rs") {
            out.push(path);
        }
    }
}

/// The module path of a file below `src/` (`plugin/mod.rs` → `["plugin"]`).
fn module_of(rel: &Path) -> Vec<String> {
    let mut parts: Vec<String> = rel
        .with_extension("")
        .components()
        .map(|c| c.as_os_str().to_string_lossy().into_owned())
        .collect();
    if matches!(
        parts.last().map(String::as_str),
        Some("mod" | "lib" | "main")
    ) {
        parts.pop();
    }
    parts
}

/// The code of a file that counts: no comment lines, nothing from its test module on.
fn code(text: &str) -> Vec<&str> {
    let lines: Vec<&str> = text.lines().collect();
    let mut out = Vec::new();
    for (i, line) in lines.iter().enumerate() {
        let t = line.trim_start();
        if t.starts_with("#[cfg(test)]")
            && lines
                .get(i + 1)
                .is_some_and(|n| n.trim_start().starts_with("mod tests"))
        {
            break;
        }
        if t.starts_with("//") {
            continue;
        }
        out.push(*line);
    }
    out
}

/// Every `crate::a::b` / `super::…::a` path in `line`, as module path segments.
fn paths(line: &str) -> Vec<(bool, Vec<String>)> {
    let mut out = Vec::new();
    let bytes = line.as_bytes();
    for start in ["crate::", "super::"] {
        let mut from = 0;
        while let Some(i) = line[from..].find(start).map(|i| i + from) {
            from = i + start.len();
            // Not the tail of a longer identifier (`dxdp_crate::`).
            if i > 0 && (bytes[i - 1].is_ascii_alphanumeric() || bytes[i - 1] == b'_') {
                continue;
            }
            let mut segs = Vec::new();
            for s in line[i..].split("::") {
                let ident: String = s
                    .chars()
                    .take_while(|c| c.is_ascii_alphanumeric() || *c == '_')
                    .collect();
                if ident.is_empty() {
                    break;
                }
                let whole = ident.len() == s.len();
                segs.push(ident);
                if !whole {
                    break;
                }
            }
            out.push((start == "super::", segs));
        }
    }
    out
}

struct Crate {
    /// Files by module path.
    modules: BTreeMap<Vec<String>, PathBuf>,
    /// Each file's imports (files).
    edges: BTreeMap<PathBuf, BTreeSet<PathBuf>>,
}

fn analyse(src: &Path) -> Crate {
    let mut files = Vec::new();
    rust_files(src, &mut files);
    let modules: BTreeMap<Vec<String>, PathBuf> = files
        .iter()
        .filter(|f| !f.ends_with("main.rs"))
        .map(|f| (module_of(f.strip_prefix(src).unwrap()), f.clone()))
        .collect();
    let resolve = |parts: &[String]| -> Option<PathBuf> {
        (1..=parts.len())
            .rev()
            .find_map(|n| modules.get(&parts[..n]).cloned())
    };
    let mut edges: BTreeMap<PathBuf, BTreeSet<PathBuf>> = BTreeMap::new();
    for f in &files {
        let rel = f.strip_prefix(src).unwrap();
        let module = module_of(rel);
        let text = std::fs::read_to_string(f).unwrap();
        for line in code(&text) {
            for (is_super, segs) in paths(line) {
                let mut segs: Vec<String> = segs;
                let mut base: Vec<String> = if is_super {
                    // `super` is the module holding this one.
                    let mut b = module.clone();
                    b.pop();
                    b
                } else {
                    Vec::new()
                };
                segs.remove(0); // `crate` or `super`
                while segs.first().is_some_and(|s| s == "super") {
                    base.pop();
                    segs.remove(0);
                }
                base.extend(segs);
                if let Some(target) = resolve(&base) {
                    if &target != f {
                        edges.entry(f.clone()).or_default().insert(target);
                    }
                }
            }
        }
    }
    Crate { modules, edges }
}

/// The strongly connected components of more than one file (import cycles).
fn cycles(edges: &BTreeMap<PathBuf, BTreeSet<PathBuf>>) -> Vec<Vec<PathBuf>> {
    // Kosaraju: order by finish time, then collect on the reversed graph.
    let nodes: BTreeSet<&PathBuf> = edges
        .keys()
        .chain(edges.values().flat_map(|s| s.iter()))
        .collect();
    let mut seen = BTreeSet::new();
    let mut order = Vec::new();
    for &n in &nodes {
        let mut stack = vec![(n, false)];
        while let Some((v, done)) = stack.pop() {
            if done {
                order.push(v);
                continue;
            }
            if !seen.insert(v) {
                continue;
            }
            stack.push((v, true));
            for w in edges.get(v).into_iter().flatten() {
                if !seen.contains(w) {
                    stack.push((w, false));
                }
            }
        }
    }
    let mut reverse: BTreeMap<&PathBuf, Vec<&PathBuf>> = BTreeMap::new();
    for (a, bs) in edges {
        for b in bs {
            reverse.entry(b).or_default().push(a);
        }
    }
    let mut assigned = BTreeSet::new();
    let mut out = Vec::new();
    for &n in order.iter().rev() {
        if assigned.contains(n) {
            continue;
        }
        let mut component = Vec::new();
        let mut stack = vec![n];
        while let Some(v) = stack.pop() {
            if !assigned.insert(v) {
                continue;
            }
            component.push(v.clone());
            for w in reverse.get(v).into_iter().flatten() {
                stack.push(w);
            }
        }
        if component.len() > 1 {
            component.sort();
            out.push(component);
        }
    }
    out
}

fn root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

#[test]
fn no_import_cycles_between_files() {
    for src in [root().join("src"), root().join("crates/dxdp-core/src")] {
        let c = analyse(&src);
        assert!(c.modules.len() > 10, "{}: files found", src.display());
        let found = cycles(&c.edges);
        assert!(
            found.is_empty(),
            "import cycles in {}: {found:#?}",
            src.display()
        );
    }
}

#[test]
fn imports_point_down_the_layers() {
    let src = root().join("src");
    let c = analyse(&src);
    let layer = |f: &Path| -> Option<(String, u8)> {
        let top = module_of(f.strip_prefix(&src).ok()?).first()?.clone();
        LAYERS
            .iter()
            .find(|(m, _)| *m == top)
            .map(|(m, l)| (m.to_string(), *l))
    };
    let mut wrong = Vec::new();
    for (from, tos) in &c.edges {
        let Some((fm, fl)) = layer(from) else {
            continue;
        };
        for to in tos {
            let Some((tm, tl)) = layer(to) else {
                continue;
            };
            if fm != tm && tl >= fl {
                wrong.push(format!(
                    "{} ({fm}, layer {fl}) imports {} ({tm}, layer {tl})",
                    from.strip_prefix(&src).unwrap().display(),
                    to.strip_prefix(&src).unwrap().display()
                ));
            }
        }
    }
    assert!(
        wrong.is_empty(),
        "imports that do not point down: {wrong:#?}"
    );
    // Every top-level module of the library has a layer.
    let lib = std::fs::read_to_string(src.join("lib.rs")).unwrap();
    for line in lib.lines() {
        if let Some(name) = line
            .strip_prefix("pub mod ")
            .and_then(|l| l.strip_suffix(';'))
        {
            assert!(
                LAYERS.iter().any(|(m, _)| *m == name),
                "module {name} has no layer in tests/cli/structure.rs (and docs/development.md)"
            );
        }
    }
}

#[test]
fn the_checker_finds_a_cycle_and_an_upward_import() {
    let dir = tempfile::tempdir().unwrap();
    let src = dir.path();
    std::fs::create_dir_all(src.join("plugin")).unwrap();
    std::fs::write(src.join("lib.rs"), "pub mod config;\npub mod plugin;\n").unwrap();
    std::fs::write(src.join("config.rs"), "use crate::plugin::tasks::Role;\n").unwrap();
    std::fs::write(
        src.join("plugin/mod.rs"),
        "// use crate::config::Nothing; (a comment)\npub mod tasks;\n",
    )
    .unwrap();
    std::fs::write(
        src.join("plugin/tasks.rs"),
        "use crate::config::Config;\n#[cfg(test)]\nmod tests {\n    use crate::lib::X;\n}\n",
    )
    .unwrap();
    let c = analyse(src);
    assert_eq!(
        cycles(&c.edges),
        vec![vec![src.join("config.rs"), src.join("plugin/tasks.rs")]]
    );
    assert_eq!(
        c.edges[&src.join("config.rs")],
        BTreeSet::from([src.join("plugin/tasks.rs")])
    );
    assert!(!c.edges.contains_key(&src.join("plugin/mod.rs")));
}

/// The loopback transport exists for tests only: nothing the `dxdp` binary runs outside tests
/// may name it (so no flag, environment variable or configuration key can select it), and the
/// daemon's configuration defaults to AF_UNIX.
#[test]
fn only_tests_can_select_the_loopback_transport() {
    let src = root().join("src");
    let mut files = Vec::new();
    rust_files(&src, &mut files);
    let mut named = Vec::new();
    for file in &files {
        let rel = file.strip_prefix(&src).unwrap();
        if rel == Path::new("transport.rs") || rel.ends_with("tests.rs") {
            continue;
        }
        let text = std::fs::read_to_string(file).unwrap();
        // Code before the file's unit tests, comments left out.
        let before_tests = text.split("#[cfg(test)]").next().unwrap_or("");
        if code(before_tests).iter().any(|l| l.contains("Loopback")) {
            named.push(rel.display().to_string());
        }
    }
    assert!(
        named.is_empty(),
        "the loopback transport is named by {named:?}"
    );
    let config = dxdp::plugin::PluginConfig::new(PathBuf::from("k"));
    assert_eq!(config.transport, dxdp::transport::Transport::UnixSocket);
}

/// One public path per item: a `pub use` may lift an item out of a private module (then it is
/// the item's only public path), never out of a public module or another crate, which would
/// give the item a second name.
#[test]
fn no_re_export_gives_an_item_a_second_path() {
    let mut aliases = Vec::new();
    for src in [root().join("src"), root().join("crates/dxdp-core/src")] {
        let mut files = Vec::new();
        rust_files(&src, &mut files);
        for file in &files {
            let text = std::fs::read_to_string(file).unwrap();
            let lines = code(&text);
            let public_mods: BTreeSet<&str> = lines
                .iter()
                .filter_map(|l| l.trim().strip_prefix("pub mod "))
                .map(|m| m.trim_end_matches(';').trim())
                .collect();
            for line in &lines {
                let Some(path) = line.trim().strip_prefix("pub use ") else {
                    continue;
                };
                let path = path.strip_prefix("self::").unwrap_or(path);
                let first = path.split("::").next().unwrap_or("");
                let private_here = !public_mods.contains(first)
                    && lines.iter().any(|l| l.trim() == format!("mod {first};"));
                // `super::x` from a private inner module re-exports a private sibling.
                let private_sibling = first == "super"
                    && path
                        .split("::")
                        .nth(1)
                        .is_some_and(|m| text.contains(&format!("\nmod {m} ")));
                if !(private_here || private_sibling) {
                    aliases.push(format!(
                        "{}: pub use {path}",
                        file.strip_prefix(root()).unwrap().display()
                    ));
                }
            }
        }
    }
    assert!(aliases.is_empty(), "re-export aliases: {aliases:#?}");
}

/// What a block opened on a line is, for [`exported`].
#[derive(Clone, PartialEq)]
enum Block {
    /// An inline `pub mod`: its items are exported under its path.
    Module(String),
    /// An inherent `impl Type`: its `pub` associated items are `Type::item`.
    Impl(String),
    /// A `pub struct Type { … }`: its `pub` fields are `Type.field`.
    Fields(String),
    /// Anything else (function bodies, trait impls, private modules, macros): nothing exported.
    Opaque,
}

/// The name after `keyword ` in `rest` (`fn run(` → `run`).
fn ident(rest: &str) -> String {
    rest.trim_start()
        .trim_start_matches("r#")
        .chars()
        .take_while(|c| c.is_ascii_alphanumeric() || *c == '_')
        .collect()
}

/// The type an inherent impl line is for (`impl<T> Foo<T> {` → `Foo`), `None` for a trait impl.
fn impl_type(line: &str) -> Option<String> {
    let rest = line.strip_prefix("impl")?;
    if line.contains(" for ") || !(rest.starts_with(' ') || rest.starts_with('<')) {
        return None;
    }
    // Skip the impl's own generics.
    let mut depth = 0;
    let mut start = 0;
    for (i, c) in rest.char_indices() {
        match c {
            '<' => depth += 1,
            '>' => depth -= 1,
            ' ' if depth == 0 => {
                start = i;
                break;
            }
            _ => {}
        }
    }
    let name = ident(&rest[start..]);
    (!name.is_empty()).then_some(name)
}

/// The items of one module file (`text`, module path `path`) the crate exports, appended to
/// `out`; `pub mod` children are read from `dir`. With `only`, a private module: just the items
/// its parent re-exports (`pub use child::Item`), under the parent's path.
fn exported_in(
    text: &str,
    dir: &Path,
    path: &str,
    only: Option<&BTreeSet<String>>,
    out: &mut BTreeSet<String>,
) {
    let lines = code(text);
    let mut stack: Vec<(usize, Block)> = Vec::new();
    let mut reexported: BTreeMap<String, BTreeSet<String>> = BTreeMap::new();
    let mut private_mods = BTreeSet::new();
    let mut i = 0;
    while i < lines.len() {
        let line = lines[i];
        i += 1;
        let t = line.trim_start();
        if t.is_empty() || t.starts_with('#') {
            continue;
        }
        let indent = line.len() - t.len();
        while stack.last().is_some_and(|(n, _)| *n >= indent) {
            stack.pop();
        }
        let opens = t.ends_with('{');
        // The module the line is in (`None` inside a function, a trait impl, a private
        // module…), and the type whose member it is, if it is directly in an impl or struct.
        let (outer, last) = match stack.last() {
            Some((_, Block::Impl(ty) | Block::Fields(ty))) => {
                (&stack[..stack.len() - 1], Some(ty.clone()))
            }
            _ => (&stack[..], None),
        };
        let module = outer
            .iter()
            .try_fold(path.to_string(), |p, (_, b)| match b {
                Block::Module(m) => Some(format!("{p}::{m}")),
                _ => None,
            });
        let member_of = last;
        let wanted = |name: &str| only.is_none_or(|o| o.contains(name));
        let mut block = Block::Opaque;
        if let (Some(module), None) = (&module, &member_of) {
            if let Some(rest) = t.strip_prefix("pub use ") {
                // A re-export, as written (joined over lines).
                let mut text = rest.to_string();
                while !text.trim_end().ends_with(';') && i < lines.len() {
                    text.push_str(lines[i].trim());
                    i += 1;
                }
                let text = text.trim_end().trim_end_matches(';').replace(",}", "}");
                if only.is_none() {
                    out.insert(format!("{module}: pub use {text}"));
                    // `pub use child::{A, B}` from a private child: its items are exported here.
                    if let Some((child, names)) = text.split_once("::") {
                        let names = names.trim_matches(|c| c == '{' || c == '}');
                        reexported
                            .entry(child.to_string())
                            .or_default()
                            .extend(names.split(',').map(|n| n.trim().to_string()));
                    }
                }
            } else if let Some(rest) = t.strip_prefix("mod ") {
                private_mods.insert(ident(rest));
            } else if let Some(rest) = t.strip_prefix("pub ") {
                let words: Vec<&str> = rest.split_whitespace().collect();
                // Qualifiers before the keyword (`pub const fn`, `pub async unsafe fn`).
                let mut k = 0;
                while k + 1 < words.len()
                    && (matches!(words[k], "async" | "unsafe" | "extern" | "\"C\"")
                        || (words[k] == "const"
                            && matches!(words[k + 1], "fn" | "unsafe" | "async")))
                {
                    k += 1;
                }
                let kind = words.get(k).copied().unwrap_or("");
                let after = words.get(k + 1..).unwrap_or_default().join(" ");
                let after = after.as_str();
                let name = ident(after);
                if wanted(&name) {
                    out.insert(format!("{module}::{name} ({kind})"));
                }
                match kind {
                    "mod" if opens => block = Block::Module(name),
                    "mod" if only.is_none() => {
                        let file = [
                            dir.join(format!("{name}.rs")),
                            dir.join(&name).join("mod.rs"),
                        ]
                        .into_iter()
                        .find(|f| f.exists())
                        .unwrap_or_else(|| panic!("no file for module {module}::{name}"));
                        let text = std::fs::read_to_string(&file).unwrap();
                        exported_in(
                            &text,
                            &dir.join(&name),
                            &format!("{module}::{name}"),
                            None,
                            out,
                        );
                    }
                    "struct" if opens && wanted(&name) => block = Block::Fields(name),
                    "struct" if wanted(&name) => {
                        // Public tuple fields: `pub struct X(pub T);`.
                        let fields = after.split_once('(').map_or("", |(_, f)| f);
                        for (n, field) in fields.split(',').enumerate() {
                            if field.trim_start().starts_with("pub ") {
                                out.insert(format!("{module}::{name}.{n} (field)"));
                            }
                        }
                    }
                    _ => {}
                }
            } else if let Some(ty) = impl_type(t) {
                if opens && wanted(&ty) {
                    block = Block::Impl(ty);
                }
            }
        } else if let (Some(module), Some(ty)) = (&module, &member_of) {
            let field = matches!(stack.last(), Some((_, Block::Fields(_))));
            if let Some(rest) = t.strip_prefix("pub ") {
                if field {
                    let name = ident(rest);
                    out.insert(format!("{module}::{ty}.{name} (field)"));
                } else {
                    let kind = rest
                        .split_whitespace()
                        .find(|w| matches!(*w, "fn" | "const" | "type"))
                        .unwrap_or("fn");
                    let after = rest.split_once(&format!("{kind} ")).map_or("", |(_, a)| a);
                    out.insert(format!("{module}::{ty}::{} ({kind})", ident(after)));
                }
            }
        }
        if opens {
            stack.push((indent, block));
        }
    }
    for (child, names) in reexported {
        if !private_mods.contains(&child) {
            continue;
        }
        let file = [
            dir.join(format!("{child}.rs")),
            dir.join(&child).join("mod.rs"),
        ]
        .into_iter()
        .find(|f| f.exists());
        if let Some(file) = file {
            let text = std::fs::read_to_string(&file).unwrap();
            exported_in(&text, &dir.join(&child), path, Some(&names), out);
        }
    }
}

/// Every item the `dxdp` library exports, by path: `pub` items of public modules, `pub`
/// associated items of their inherent impls, `pub` fields, `pub use` re-exports (with the items
/// they lift out of private modules). Read from the source, whatever the target (so items under
/// `cfg(windows)` count too); what macros declare is not seen.
fn exported(src: &Path) -> BTreeSet<String> {
    let mut out = BTreeSet::new();
    let text = std::fs::read_to_string(src.join("lib.rs")).unwrap();
    exported_in(&text, src, "dxdp", None, &mut out);
    out
}

/// The library exports only what the `dxdp` binary, the integration tests, the benchmarks and
/// the fuzz crate need; everything else is `pub(crate)` (the compiler then finds dead code).
/// The list is `tests/cli/exported.txt`.
#[test]
fn the_library_exports_only_the_listed_items() {
    let listed_file = root().join("tests/cli/exported.txt");
    let found = exported(&root().join("src"));
    if std::env::var_os("DXDP_UPDATE_EXPORTED").is_some_and(|v| v == "1") {
        let text: String = found.iter().map(|l| format!("{l}\n")).collect();
        std::fs::write(&listed_file, text).unwrap();
        return;
    }
    let listed: BTreeSet<String> = std::fs::read_to_string(&listed_file)
        .unwrap()
        .lines()
        .map(str::to_string)
        .collect();
    let added: Vec<&String> = found.difference(&listed).collect();
    let removed: Vec<&String> = listed.difference(&found).collect();
    assert!(
        added.is_empty() && removed.is_empty(),
        "the library's exported items changed.\n\
         exported now, not listed: {added:#?}\n\
         listed, no longer exported: {removed:#?}\n\
         New items should be pub(crate) unless the binary, a test, a benchmark or the fuzz crate \
         needs them (python3 /work/notes/private.py finds the least). To accept the change, run \
         `DXDP_UPDATE_EXPORTED=1 cargo test --test cli structure::` and review the diff of \
         tests/cli/exported.txt."
    );
}

/// The walk on a small crate: public modules, impls, fields, tuple fields and re-exports out of
/// a private module count; private modules, trait impls, function bodies and `pub(crate)` do not.
#[test]
fn the_export_walk_reads_a_small_crate() {
    let dir = tempfile::tempdir().unwrap();
    let src = dir.path();
    std::fs::create_dir(src.join("a")).unwrap();
    std::fs::write(
        src.join("lib.rs"),
        "pub mod a;\nmod hidden;\npub use hidden::{Lifted, Other};\npub(crate) fn no() {}\n\
         pub fn yes() {\n    pub struct InBody;\n}\n",
    )
    .unwrap();
    std::fs::write(
        src.join("a/mod.rs"),
        "pub struct S {\n    pub x: u32,\n    y: u32,\n}\n\
         impl S {\n    pub fn new() -> Self {\n        todo!()\n    }\n    fn private() {}\n}\n\
         impl Clone for S {\n    fn clone(&self) -> Self {\n        todo!()\n    }\n}\n\
         pub struct T(pub u8, u8);\npub mod inner {\n    pub const C: u8 = 1;\n}\n\
         #[cfg(test)]\nmod tests {\n    pub fn helper() {}\n}\n",
    )
    .unwrap();
    std::fs::write(
        src.join("hidden.rs"),
        "pub struct Lifted;\nimpl Lifted {\n    pub fn go(&self) {}\n}\npub struct NotLifted;\n\
         pub(crate) struct Other;\n",
    )
    .unwrap();
    let found: Vec<String> = exported(src).into_iter().collect();
    assert_eq!(
        found,
        [
            "dxdp: pub use hidden::{Lifted, Other}",
            "dxdp::Lifted (struct)",
            "dxdp::Lifted::go (fn)",
            "dxdp::a (mod)",
            "dxdp::a::S (struct)",
            "dxdp::a::S.x (field)",
            "dxdp::a::S::new (fn)",
            "dxdp::a::T (struct)",
            "dxdp::a::T.0 (field)",
            "dxdp::a::inner (mod)",
            "dxdp::a::inner::C (const)",
            "dxdp::yes (fn)",
        ]
    );
}
