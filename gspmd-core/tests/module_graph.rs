//! ARCHITECTURE.md's module graph is the code's: every top-level module of gspmd-core
//! uses exactly the modules the graph lists for it, whether by a `use` line, a full
//! path (`crate::analysis::...` in an expression) or a re-export of the crate root
//! (`crate::compile` is `executable`'s), and the graph has no cycle.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

type Graph = BTreeMap<String, BTreeSet<String>>;

/// The source with comments and string literals blanked, so that paths in doc links or
/// messages do not count.
fn code_of(source: &str) -> String {
    let mut out = String::with_capacity(source.len());
    let mut chars = source.chars().peekable();
    while let Some(c) = chars.next() {
        match (c, chars.peek()) {
            ('/', Some('/')) => {
                for c in chars.by_ref() {
                    if c == '\n' {
                        out.push('\n');
                        break;
                    }
                }
            }
            ('/', Some('*')) => {
                let mut last = ' ';
                for c in chars.by_ref() {
                    if last == '*' && c == '/' {
                        break;
                    }
                    last = c;
                }
            }
            ('"', _) => {
                let mut escaped = false;
                for c in chars.by_ref() {
                    if !escaped && c == '"' {
                        break;
                    }
                    escaped = !escaped && c == '\\';
                }
                out.push_str("\"\"");
            }
            // A char literal such as '"' would open a string above.
            ('\'', Some('"')) => {
                chars.next();
                out.push_str("' '");
            }
            _ => out.push(c),
        }
    }
    out
}

/// The identifiers following `prefix` in `code` (`crate::` gives `analysis` for
/// `crate::analysis::...`), and each name of a `prefix{a, b::c}` group.
fn names_after(code: &str, prefix: &str) -> Vec<String> {
    let ident = |s: &str| -> String {
        s.chars()
            .take_while(|c| c.is_alphanumeric() || *c == '_')
            .collect()
    };
    let mut names = Vec::new();
    for (at, _) in code.match_indices(prefix) {
        let before = code[..at].chars().next_back();
        if before.is_some_and(|c| c.is_alphanumeric() || c == '_') {
            continue;
        }
        let rest = &code[at + prefix.len()..];
        if let Some(group) = rest.strip_prefix('{') {
            let group = &group[..group.find('}').unwrap_or(group.len())];
            names.extend(group.split(',').map(|item| ident(item.trim())));
        } else {
            names.push(ident(rest));
        }
    }
    names.retain(|n| !n.is_empty() && n != "self");
    names
}

fn rust_files(dir: &Path, out: &mut Vec<PathBuf>) {
    for entry in std::fs::read_dir(dir).expect("readable source dir") {
        let path = entry.expect("a dir entry").path();
        if path.is_dir() {
            rust_files(&path, out);
        } else if path.extension().is_some_and(|e| e == "rs") {
            out.push(path);
        }
    }
}

/// The root's re-exports: name -> the module it comes from (`pub use executable::{compile, ..}`).
fn root_exports(lib: &str) -> BTreeMap<String, String> {
    let code = code_of(lib);
    let mut exports = BTreeMap::new();
    for item in code.split(';') {
        let Some(path) = item.trim().strip_prefix("pub use ") else {
            continue;
        };
        let Some((module, names)) = path.split_once("::") else {
            continue;
        };
        let names = names.trim_start_matches('{').trim_end_matches('}');
        for name in names.split(',') {
            let name = name.trim().rsplit(' ').next().unwrap_or_default();
            if !name.is_empty() {
                exports.insert(name.to_string(), module.trim().to_string());
            }
        }
    }
    exports
}

/// The graph of gspmd-core's top-level modules, from their sources.
fn code_graph(src: &Path) -> Graph {
    let lib = std::fs::read_to_string(src.join("lib.rs")).expect("lib.rs");
    let exports = root_exports(&lib);
    let mut files = Vec::new();
    rust_files(src, &mut files);
    let mut graph = Graph::new();
    for file in files {
        let relative = file.strip_prefix(src).expect("under src");
        let parts: Vec<&str> = relative.iter().filter_map(|p| p.to_str()).collect();
        let at_top = parts.len() == 1;
        let module = parts[0].trim_end_matches(".rs").to_string();
        if module == "lib" {
            continue;
        }
        let code = code_of(&std::fs::read_to_string(&file).expect("readable"));
        let mut used = names_after(&code, "crate::");
        // In a top-level file, `super::` is the crate root.
        if at_top {
            used.extend(names_after(&code, "super::"));
        }
        let deps = graph.entry(module.clone()).or_default();
        for name in used {
            let target = exports.get(&name).cloned().unwrap_or(name);
            if target != module {
                deps.insert(target);
            }
        }
    }
    let modules: BTreeSet<String> = graph.keys().cloned().collect();
    for deps in graph.values_mut() {
        deps.retain(|d| modules.contains(d));
    }
    graph
}

/// The graph ARCHITECTURE.md states: the lines `module -> a, b, c` of the block after
/// its `<!-- module graph -->` marker.
fn stated_graph(architecture: &str) -> Graph {
    let block = architecture
        .split("<!-- module graph -->")
        .nth(1)
        .expect("ARCHITECTURE.md has a `<!-- module graph -->` block");
    let block = block
        .split("```")
        .nth(1)
        .expect("a fenced block after the marker");
    let mut graph = Graph::new();
    for line in block.lines().filter(|l| l.contains("->")) {
        let (module, deps) = line.split_once("->").expect("checked");
        let deps = deps
            .split(',')
            .map(|d| d.trim().to_string())
            .filter(|d| !d.is_empty() && d != "(nothing)")
            .collect();
        graph.insert(module.trim().to_string(), deps);
    }
    graph
}

/// A cycle of `graph`, if it has one.
fn cycle(graph: &Graph) -> Option<Vec<String>> {
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
        for dep in graph.get(node).into_iter().flatten() {
            if let Some(cycle) = visit(graph, dep, path, done) {
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
fn the_module_graph_is_the_one_architecture_md_states_and_has_no_cycle() {
    let core = Path::new(env!("CARGO_MANIFEST_DIR"));
    let architecture =
        std::fs::read_to_string(core.join("../ARCHITECTURE.md")).expect("ARCHITECTURE.md");
    let (code, stated) = (code_graph(&core.join("src")), stated_graph(&architecture));
    let lines = |g: &Graph| -> String {
        g.iter()
            .map(|(m, deps)| {
                let deps: Vec<&str> = deps.iter().map(String::as_str).collect();
                format!("{m} -> {}\n", deps.join(", "))
            })
            .collect()
    };
    assert_eq!(
        lines(&code),
        lines(&stated),
        "the code's module graph (left) differs from ARCHITECTURE.md's (right)"
    );
    assert_eq!(cycle(&code), None, "the module graph has a cycle");
}

#[test]
fn full_paths_and_groups_count_as_uses() {
    let code = code_of(
        "use crate::{ir::Op, runtime};\n// crate::train in a comment\nlet x = crate::analysis::f(\"crate::error\");",
    );
    assert_eq!(names_after(&code, "crate::"), ["ir", "runtime", "analysis"]);
    let graph: Graph = [("a", vec!["b"]), ("b", vec!["a"])]
        .into_iter()
        .map(|(m, d)| (m.to_string(), d.into_iter().map(String::from).collect()))
        .collect();
    assert!(cycle(&graph).is_some());
}
