//! The control plane's modules import each other in layers, never in a circle: each one can be
//! read, tested and changed knowing only those below it. A module's imports are what its source
//! (outside its `#[cfg(test)]` tests) names as `crate::MODULE`, in paths or in `use crate::{..}`.

use std::{
    collections::{BTreeMap, BTreeSet},
    fs,
    path::Path,
};

type Graph = BTreeMap<String, BTreeSet<String>>;

/// The top-level module a source file belongs to (`cmd/run.rs` is `cmd`).
fn module_of(src: &Path, file: &Path) -> String {
    let rel = file.strip_prefix(src).unwrap();
    let first = rel
        .components()
        .next()
        .unwrap()
        .as_os_str()
        .to_string_lossy();
    first.trim_end_matches(".rs").to_string()
}

fn sources(dir: &Path, out: &mut Vec<std::path::PathBuf>) {
    for entry in fs::read_dir(dir).unwrap() {
        let path = entry.unwrap().path();
        if path.is_dir() {
            sources(&path, out);
        } else if path.extension().is_some_and(|e| e == "rs") {
            out.push(path);
        }
    }
}

/// The names a `use crate::{...}` group or a `crate::` path starts with.
fn crate_references(text: &str) -> BTreeSet<String> {
    let mut names = BTreeSet::new();
    let ident = |s: &str| {
        s.chars()
            .take_while(|c| c.is_alphanumeric() || *c == '_')
            .collect::<String>()
    };
    for (at, _) in text.match_indices("crate::") {
        let rest = &text[at + "crate::".len()..];
        if let Some(group) = rest.strip_prefix('{') {
            // Top-level items of the group: split on commas outside nested braces.
            let mut depth = 0;
            let mut item = String::new();
            for c in group.chars() {
                match c {
                    '{' => depth += 1,
                    '}' if depth == 0 => break,
                    '}' => depth -= 1,
                    ',' if depth == 0 => {
                        names.insert(ident(item.trim()));
                        item.clear();
                        continue;
                    }
                    _ => {}
                }
                item.push(c);
            }
            names.insert(ident(item.trim()));
        } else {
            names.insert(ident(rest));
        }
    }
    names.remove("");
    names
}

fn graph() -> Graph {
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    let mut files = Vec::new();
    sources(&src, &mut files);
    let mut graph = Graph::new();
    for file in &files {
        let module = module_of(&src, file);
        let text = fs::read_to_string(file).unwrap();
        let text = text.split("#[cfg(test)]").next().unwrap_or_default();
        graph
            .entry(module)
            .or_default()
            .extend(crate_references(text));
    }
    let modules: BTreeSet<String> = graph.keys().cloned().collect();
    for (module, imports) in graph.iter_mut() {
        imports.retain(|m| m != module && modules.contains(m));
    }
    graph
}

/// A circle of imports, if there is one (depth-first search for a back edge).
fn find_cycle(graph: &Graph) -> Option<Vec<String>> {
    fn visit(
        graph: &Graph,
        node: &str,
        path: &mut Vec<String>,
        done: &mut BTreeSet<String>,
    ) -> Option<Vec<String>> {
        if let Some(at) = path.iter().position(|n| n == node) {
            let mut cycle = path[at..].to_vec();
            cycle.push(node.to_string());
            return Some(cycle);
        }
        if done.contains(node) {
            return None;
        }
        path.push(node.to_string());
        for next in &graph[node] {
            if let Some(cycle) = visit(graph, next, path, done) {
                return Some(cycle);
            }
        }
        path.pop();
        done.insert(node.to_string());
        None
    }
    let mut done = BTreeSet::new();
    graph
        .keys()
        .find_map(|node| visit(graph, node, &mut Vec::new(), &mut done))
}

#[test]
fn no_module_imports_one_that_imports_it_back() {
    let graph = graph();
    assert!(graph.len() > 10, "the sources were not found: {graph:?}");
    if let Some(cycle) = find_cycle(&graph) {
        panic!(
            "modules import each other in a circle: {}",
            cycle.join(" -> ")
        );
    }
}

#[test]
fn the_check_finds_a_circle() {
    let mut graph = Graph::new();
    for (m, imports) in [
        ("a", vec!["b"]),
        ("b", vec!["c"]),
        ("c", vec!["a"]),
        ("d", vec![]),
    ] {
        graph.insert(m.into(), imports.into_iter().map(String::from).collect());
    }
    assert_eq!(
        find_cycle(&graph),
        Some(vec!["a".into(), "b".into(), "c".into(), "a".into()])
    );
    graph.get_mut("c").unwrap().clear();
    assert_eq!(find_cycle(&graph), None);
    let refs = crate_references(
        "use crate::{\n    bpf::{self, X},\n    link,\n};\nlet x = crate::qdisc::f();",
    );
    assert_eq!(
        refs,
        ["bpf", "link", "qdisc"]
            .map(String::from)
            .into_iter()
            .collect()
    );
}
