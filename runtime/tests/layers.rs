//! The runtime's layers stay true: no import loop inside `runtime/src`
//! beyond the two that docs/runtime.md ("Layers: who may import whom")
//! names and justifies. The analysis of `scripts/import-graph --files`, with
//! re-exports followed:
//! an arrow A -> B when A's code (tests and comments left out) names
//! `crate::B` (or an item `B` re-exports from one of its children: the
//! arrow goes to that child); arrows between a module and its own children
//! are the module tree and left out.

use std::collections::{BTreeMap, BTreeSet};
use std::path::Path;

/// The loops docs/runtime.md justifies: a loop may be smaller, never larger.
const ALLOWED: [&[&str]; 2] = [
    // The chare-facing API: one vocabulary whose types name each other.
    &["callback", "chare", "ctx", "proxy"],
    // The node's shared state and what it holds: `node::shared` holds the
    // operation slot and the rescale's records, which PEs reach through it.
    &[
        "checkpoint::service",
        "node::shared",
        "operation",
        "pe",
        "rescale",
    ],
];

fn modules(dir: &Path, prefix: &[String], out: &mut BTreeMap<String, String>) {
    let mut entries: Vec<_> = std::fs::read_dir(dir)
        .expect("runtime/src is readable")
        .map(|e| e.expect("a directory entry").path())
        .collect();
    entries.sort();
    for path in entries {
        let name = path
            .file_stem()
            .and_then(|s| s.to_str())
            .unwrap_or("")
            .to_string();
        if path.is_dir() {
            let mut p = prefix.to_vec();
            p.push(name);
            modules(&path, &p, out);
        } else if path.extension().is_some_and(|e| e == "rs") {
            if name == "tests" {
                continue;
            }
            let mut p = prefix.to_vec();
            if !matches!(name.as_str(), "lib" | "mod" | "main") {
                p.push(name);
            }
            let text = std::fs::read_to_string(&path).expect("a source file is readable");
            out.insert(p.join("::"), strip(&text));
        }
    }
}

/// The file without its unit tests (at the end, behind `#[cfg(test)]`) and comments.
fn strip(text: &str) -> String {
    let mut code = String::new();
    let lines: Vec<&str> = text.lines().collect();
    for (i, line) in lines.iter().enumerate() {
        if line.trim() == "#[cfg(test)]"
            && lines
                .get(i + 1)
                .is_some_and(|l| l.trim_start().starts_with("mod tests"))
        {
            break;
        }
        let line = line.split("//").next().unwrap_or("");
        code.push_str(line);
        code.push('\n');
    }
    code
}

fn ident(s: &str) -> &str {
    let end = s
        .find(|c: char| !(c.is_ascii_alphanumeric() || c == '_'))
        .unwrap_or(s.len());
    &s[..end]
}

/// The paths after each `prefix` (`crate::a::b`, and each item of `crate::{a, b::c}`).
fn paths(code: &str, prefix: &str) -> Vec<Vec<String>> {
    let mut out = Vec::new();
    let mut rest = code;
    while let Some(at) = rest.find(prefix) {
        let before = rest[..at].chars().last();
        rest = &rest[at + prefix.len()..];
        if before.is_some_and(|c| c.is_ascii_alphanumeric() || c == '_') {
            continue;
        }
        if let Some(group) = rest.strip_prefix('{') {
            let end = group.find('}').unwrap_or(group.len());
            for item in group[..end].split(',') {
                let parts: Vec<String> = item
                    .trim()
                    .split("::")
                    .map(|p| ident(p.trim()).to_string())
                    .take_while(|p| !p.is_empty())
                    .collect();
                out.push(parts);
            }
            continue;
        }
        let mut parts = Vec::new();
        let mut s = rest;
        loop {
            let id = ident(s);
            if id.is_empty() {
                break;
            }
            parts.push(id.to_string());
            s = &s[id.len()..];
            match s.strip_prefix("::") {
                Some(next) => s = next,
                None => break,
            }
        }
        out.push(parts);
    }
    out
}

/// `path` (as written in `module`, `crate::`/`super::`/`self::` or relative
/// to `module`) as a path from the crate root.
fn absolute(module: &str, path: &[String]) -> Vec<String> {
    let mut base: Vec<String> = if module.is_empty() {
        Vec::new()
    } else {
        module.split("::").map(String::from).collect()
    };
    let mut rest = path;
    match rest.first().map(String::as_str) {
        Some("crate") => {
            base.clear();
            rest = &rest[1..];
        }
        Some("self") => rest = &rest[1..],
        _ => {}
    }
    while rest.first().is_some_and(|s| s == "super") {
        base.pop();
        rest = &rest[1..];
    }
    base.extend(rest.iter().cloned());
    base
}

/// The longest prefix of `path` that is a module, and the path's length.
fn module_of(mods: &BTreeMap<String, String>, path: &[String]) -> Option<(String, usize)> {
    (1..=path.len())
        .rev()
        .map(|n| (path[..n].join("::"), n))
        .find(|(cand, _)| mods.contains_key(cand))
}

/// The items each module re-exports from another (`pub(crate) use
/// shared::NodeShared;` in `node`): (module, name) -> the module that
/// defines it. An arrow to `node::NodeShared` is an arrow to `node::shared`,
/// so a split module's parts are seen as they are, not hidden behind the
/// parent's re-exports.
fn reexports(mods: &BTreeMap<String, String>) -> BTreeMap<(String, String), String> {
    let mut out = BTreeMap::new();
    for (module, code) in mods {
        for stmt in code.split(';') {
            let Some(tree) = ["pub use ", "pub(crate) use ", "pub(super) use "]
                .iter()
                .find_map(|p| {
                    let at = stmt.find(p)?;
                    let before = stmt[..at].chars().last();
                    before
                        .is_none_or(|c| c.is_whitespace() || c == ']')
                        .then(|| &stmt[at + p.len()..])
                })
            else {
                continue;
            };
            let tree = tree.split_whitespace().collect::<Vec<_>>().join(" ");
            let (prefix, items) = match tree.split_once('{') {
                Some((prefix, items)) => (
                    prefix.trim().trim_end_matches("::").to_string(),
                    items
                        .trim_end_matches('}')
                        .split(',')
                        .map(|i| i.trim().to_string())
                        .collect(),
                ),
                None => (String::new(), vec![tree.clone()]),
            };
            for item in items.iter().filter(|i| !i.is_empty()) {
                let (item, alias) = match item.split_once(" as ") {
                    Some((item, alias)) => (item.trim(), Some(alias.trim())),
                    None => (item.as_str(), None),
                };
                let mut path: Vec<String> = prefix
                    .split("::")
                    .chain(item.split("::"))
                    .filter(|s| !s.is_empty())
                    .map(|s| s.trim().to_string())
                    .collect();
                let Some(last) = path.last().cloned() else {
                    continue;
                };
                if last == "self" {
                    path.pop();
                }
                let name = alias.map_or(last, String::from);
                let full = absolute(module, &path);
                let Some((source, _)) = module_of(mods, &full) else {
                    continue;
                };
                if &source != module {
                    out.insert((module.clone(), name), source);
                }
            }
        }
    }
    out
}

fn arrows(mods: &BTreeMap<String, String>) -> BTreeSet<(String, String)> {
    let reexported = reexports(mods);
    let mut edges = BTreeSet::new();
    for (module, code) in mods {
        if module.is_empty() {
            continue;
        }
        let mut found = paths(code, "crate::");
        for p in paths(code, "super::") {
            let mut rel = vec!["super".to_string()];
            rel.extend(p);
            found.push(absolute(module, &rel));
        }
        for p in found {
            let Some((mut target, n)) = module_of(mods, &p) else {
                continue;
            };
            // An item the target re-exports is an arrow to where it is defined.
            if let Some(name) = p.get(n) {
                if let Some(source) = reexported.get(&(target.clone(), name.clone())) {
                    target = source.clone();
                }
            }
            if &target == module
                || target.starts_with(&format!("{module}::"))
                || module.starts_with(&format!("{target}::"))
            {
                continue;
            }
            edges.insert((module.clone(), target));
        }
    }
    edges
}

/// Strongly connected components of more than one module (Tarjan).
fn loops(nodes: &[String], edges: &BTreeSet<(String, String)>) -> Vec<BTreeSet<String>> {
    struct T<'a> {
        succ: BTreeMap<&'a str, Vec<&'a str>>,
        index: BTreeMap<&'a str, usize>,
        low: BTreeMap<&'a str, usize>,
        stack: Vec<&'a str>,
        on: BTreeSet<&'a str>,
        out: Vec<BTreeSet<String>>,
    }
    fn visit<'a>(t: &mut T<'a>, v: &'a str) {
        let i = t.index.len();
        t.index.insert(v, i);
        t.low.insert(v, i);
        t.stack.push(v);
        t.on.insert(v);
        for w in t.succ.get(v).cloned().unwrap_or_default() {
            if !t.index.contains_key(w) {
                visit(t, w);
                let l = t.low[v].min(t.low[w]);
                t.low.insert(v, l);
            } else if t.on.contains(w) {
                let l = t.low[v].min(t.index[w]);
                t.low.insert(v, l);
            }
        }
        if t.low[v] == t.index[v] {
            let mut comp = BTreeSet::new();
            while let Some(w) = t.stack.pop() {
                t.on.remove(w);
                comp.insert(w.to_string());
                if w == v {
                    break;
                }
            }
            if comp.len() > 1 {
                t.out.push(comp);
            }
        }
    }
    let mut t = T {
        succ: BTreeMap::new(),
        index: BTreeMap::new(),
        low: BTreeMap::new(),
        stack: Vec::new(),
        on: BTreeSet::new(),
        out: Vec::new(),
    };
    for (a, b) in edges {
        t.succ.entry(a.as_str()).or_default().push(b.as_str());
    }
    for v in nodes {
        if !t.index.contains_key(v.as_str()) {
            visit(&mut t, v.as_str());
        }
    }
    t.out
}

#[test]
fn no_import_loop_beyond_the_two_docs_runtime_md_justifies() {
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    let mut mods = BTreeMap::new();
    modules(&src, &[], &mut mods);
    let edges = arrows(&mods);
    let nodes: Vec<String> = mods.keys().cloned().collect();
    let found = loops(&nodes, &edges);
    for comp in &found {
        let allowed = ALLOWED
            .iter()
            .any(|a| comp.iter().all(|m| a.contains(&m.as_str())));
        let inside: Vec<String> = edges
            .iter()
            .filter(|(a, b)| comp.contains(a) && comp.contains(b))
            .map(|(a, b)| format!("{a} -> {b}"))
            .collect();
        assert!(
            allowed,
            "a new import loop in runtime/src (see docs/runtime.md, \"Layers\"): {comp:?}\n{}",
            inside.join("\n")
        );
    }
}

#[test]
fn the_analysis_finds_a_loop_it_is_shown() {
    // A -> B -> A through a `use crate::{..}` group and a plain path.
    let mut mods = BTreeMap::new();
    mods.insert("a".to_string(), "use crate::{b::Thing, c};".to_string());
    mods.insert("b".to_string(), "fn f() { crate::a::g(); }".to_string());
    mods.insert("c".to_string(), String::new());
    // A child naming its parent's items is the module tree, not an arrow.
    mods.insert("c::d".to_string(), "use super::Item;".to_string());
    let edges = arrows(&mods);
    assert!(edges.contains(&("a".into(), "b".into())));
    assert!(edges.contains(&("b".into(), "a".into())));
    assert!(!edges.iter().any(|(from, _)| from == "c::d"));
    // An item a parent re-exports is an arrow to the child that defines it.
    mods.insert("e".to_string(), "pub(crate) use inner::Hub;".to_string());
    mods.insert("e::inner".to_string(), String::new());
    mods.insert("f".to_string(), "use crate::e::Hub;".to_string());
    let edges = arrows(&mods);
    assert!(edges.contains(&("f".into(), "e::inner".into())));
    assert!(!edges.contains(&("f".into(), "e".into())));
    let nodes: Vec<String> = mods.keys().cloned().collect();
    let found = loops(&nodes, &edges);
    assert_eq!(found.len(), 1);
    assert_eq!(
        found[0],
        ["a", "b"]
            .iter()
            .map(|s| s.to_string())
            .collect::<BTreeSet<_>>()
    );
}
