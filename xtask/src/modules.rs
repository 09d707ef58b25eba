//! `cargo xtask modules`: the module graph of each crate (and the Python binding), checked for
//! cycles: our layering rule is that imports point down, so two modules that import each
//! other (directly or around a loop) are a defect. `cargo test -p xtask` runs the check over
//! the repository, so CI keeps the rule.
//!
//! The graph is read from the source text, not compiled: a module is a file (`lib.rs`,
//! `main.rs` and `mod.rs` stand for their folder), an edge is a `crate::`, `super::` or
//! `self::` path in code (comments and the trailing `#[cfg(test)]` module are left out; brace
//! groups of a `use` are expanded), resolved to the deepest module it names. A module's
//! paths to its own ancestors are not edges (a child reads its parent's items; the parent
//! declares the child), nor are paths to itself.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

use anyhow::{Context, Result};

/// A module, as the path of names from the crate root (empty: the root).
type Module = Vec<String>;

/// The modules of one crate and which others each one's code names.
#[derive(Debug, Default)]
pub struct Graph {
    /// Each module's edges, with a file that makes each.
    edges: BTreeMap<Module, BTreeMap<Module, PathBuf>>,
}

/// A cycle: its modules, and each edge inside it with the file that makes it.
#[derive(Debug)]
pub struct Cycle {
    pub modules: Vec<String>,
    pub edges: Vec<(String, String, PathBuf)>,
}

fn name(m: &Module) -> String {
    if m.is_empty() {
        "crate".into()
    } else {
        m.join("::")
    }
}

/// The module a source file under `src` is.
fn module_of(src: &Path, file: &Path) -> Module {
    let rel = file.strip_prefix(src).unwrap_or(file).with_extension("");
    let mut parts: Module = rel
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

/// The code of a file: comments and the trailing test module left out.
fn code(text: &str) -> String {
    let lines: Vec<&str> = text.lines().collect();
    let mut out = String::new();
    for (i, line) in lines.iter().enumerate() {
        let t = line.trim();
        if t == "#[cfg(test)]"
            && lines
                .get(i + 1)
                .is_some_and(|n| n.trim_start().starts_with("mod ") && n.trim_end().ends_with('{'))
        {
            break;
        }
        let code = match line.find("//") {
            Some(at) => &line[..at],
            None => line,
        };
        out.push_str(code);
        out.push('\n');
    }
    out
}

fn is_ident(c: char) -> bool {
    c.is_alphanumeric() || c == '_'
}

/// `a::b::c` at the start of `s` (after spaces), as names, and the text after it.
fn path_at(s: &str) -> (Vec<String>, &str) {
    let mut names = Vec::new();
    let mut rest = s.trim_start();
    loop {
        let end = rest.find(|c: char| !is_ident(c)).unwrap_or(rest.len());
        if end == 0 {
            break;
        }
        names.push(rest[..end].to_string());
        rest = &rest[end..];
        match rest.strip_prefix("::") {
            Some(r) if r.starts_with(is_ident) => rest = r,
            _ => break,
        }
    }
    (names, rest)
}

/// The top-level items of a brace group starting right after its `{` in `s`.
fn group_items(s: &str) -> Vec<String> {
    let (mut depth, mut item, mut items) = (1usize, String::new(), Vec::new());
    for c in s.chars() {
        match c {
            '{' => {
                depth += 1;
                item.push(c);
            }
            '}' => {
                depth -= 1;
                if depth == 0 {
                    break;
                }
                item.push(c);
            }
            ',' if depth == 1 => items.push(std::mem::take(&mut item)),
            _ => item.push(c),
        }
    }
    items.push(item);
    items
}

/// Every `crate::`/`super::`/`self::` path in `code`, brace groups expanded one level.
fn paths(code: &str) -> Vec<Vec<String>> {
    let mut out = Vec::new();
    for kw in ["crate", "super", "self"] {
        let pat = format!("{kw}::");
        let mut from = 0;
        while let Some(at) = code[from..].find(&pat) {
            let start = from + at;
            from = start + pat.len();
            if code[..start].ends_with(is_ident) || code[..start].ends_with("::") {
                // Part of another name, `a::self::`, or the rest of a `super::super::` chain
                // (taken whole below).
                continue;
            }
            // `super::super::x`: the whole chain.
            let mut head = vec![kw.to_string()];
            let mut rest = &code[from..];
            while kw == "super" && rest.starts_with("super::") {
                head.push("super".into());
                rest = &rest["super::".len()..];
            }
            let (tail, after) = path_at(rest);
            let bare = tail.is_empty();
            let mut base = head;
            base.extend(tail);
            // `crate::a::{b, c}` (a group after the path) or `crate::{a, b}` (right after it).
            let group = after
                .strip_prefix("::{")
                .or_else(|| if bare { after.strip_prefix('{') } else { None });
            match group {
                Some(group) => {
                    for item in group_items(group) {
                        let mut p = base.clone();
                        p.extend(path_at(&item).0);
                        out.push(p);
                    }
                }
                None => out.push(base),
            }
        }
    }
    out
}

fn rust_files(dir: &Path, out: &mut Vec<PathBuf>) -> Result<()> {
    for entry in std::fs::read_dir(dir).with_context(|| format!("reading {}", dir.display()))? {
        let path = entry?.path();
        if path.is_dir() {
            rust_files(&path, out)?;
        } else if path.extension().is_some_and(|e| e == "rs") {
            out.push(path);
        }
    }
    Ok(())
}

impl Graph {
    /// The graph of the crate whose sources are under `src`.
    pub fn read(src: &Path) -> Result<Graph> {
        let mut files = Vec::new();
        rust_files(src, &mut files)?;
        files.sort();
        let modules: BTreeSet<Module> = files.iter().map(|f| module_of(src, f)).collect();
        let mut graph = Graph::default();
        for file in &files {
            let me = module_of(src, file);
            let text = std::fs::read_to_string(file)
                .with_context(|| format!("reading {}", file.display()))?;
            let edges = graph.edges.entry(me.clone()).or_default();
            for path in paths(&code(&text)) {
                let target: Module = match path[0].as_str() {
                    "crate" => path[1..].to_vec(),
                    "super" => {
                        let ups = path.iter().take_while(|p| *p == "super").count();
                        let Some(keep) = me.len().checked_sub(ups) else {
                            continue;
                        };
                        me[..keep].iter().chain(&path[ups..]).cloned().collect()
                    }
                    _ => me.iter().chain(&path[1..]).cloned().collect(),
                };
                // The deepest module the path names.
                let Some(to) = (0..=target.len())
                    .rev()
                    .map(|n| target[..n].to_vec())
                    .find(|m| modules.contains(m))
                else {
                    continue;
                };
                if to == me || me.starts_with(&to) {
                    continue;
                }
                edges.entry(to).or_insert_with(|| file.clone());
            }
        }
        Ok(graph)
    }

    /// The cycles (strongly connected components of more than one module), by Tarjan's
    /// algorithm.
    pub fn cycles(&self) -> Vec<Cycle> {
        struct Walk<'a> {
            g: &'a Graph,
            index: BTreeMap<&'a Module, usize>,
            low: BTreeMap<&'a Module, usize>,
            stack: Vec<&'a Module>,
            on: BTreeSet<&'a Module>,
            out: Vec<Vec<&'a Module>>,
        }
        impl<'a> Walk<'a> {
            fn visit(&mut self, v: &'a Module) {
                let i = self.index.len();
                self.index.insert(v, i);
                self.low.insert(v, i);
                self.stack.push(v);
                self.on.insert(v);
                for w in self.g.edges.get(v).into_iter().flat_map(|e| e.keys()) {
                    if !self.index.contains_key(w) {
                        self.visit(w);
                        let lw = self.low[w];
                        let lv = self.low.get_mut(v).expect("visited");
                        *lv = (*lv).min(lw);
                    } else if self.on.contains(w) {
                        let iw = self.index[w];
                        let lv = self.low.get_mut(v).expect("visited");
                        *lv = (*lv).min(iw);
                    }
                }
                if self.low[v] == self.index[v] {
                    let mut comp = Vec::new();
                    while let Some(w) = self.stack.pop() {
                        self.on.remove(w);
                        comp.push(w);
                        if w == v {
                            break;
                        }
                    }
                    if comp.len() > 1 {
                        self.out.push(comp);
                    }
                }
            }
        }
        let mut walk = Walk {
            g: self,
            index: BTreeMap::new(),
            low: BTreeMap::new(),
            stack: Vec::new(),
            on: BTreeSet::new(),
            out: Vec::new(),
        };
        for v in self.edges.keys() {
            if !walk.index.contains_key(v) {
                walk.visit(v);
            }
        }
        walk.out
            .into_iter()
            .map(|comp| {
                let set: BTreeSet<&Module> = comp.iter().copied().collect();
                let mut edges = Vec::new();
                for a in &comp {
                    for (b, file) in &self.edges[*a] {
                        if set.contains(b) {
                            edges.push((name(a), name(b), file.clone()));
                        }
                    }
                }
                edges.sort();
                let mut modules: Vec<String> = comp.iter().map(|m| name(m)).collect();
                modules.sort();
                Cycle { modules, edges }
            })
            .collect()
    }
}

/// The source folders checked: every crate's `src` and the Python binding's.
pub fn source_dirs(root: &Path) -> Result<Vec<PathBuf>> {
    let mut dirs: Vec<PathBuf> = std::fs::read_dir(root.join("crates"))
        .context("reading crates/")?
        .filter_map(|e| e.ok().map(|e| e.path().join("src")))
        .filter(|p| p.is_dir())
        .collect();
    dirs.push(root.join("python/src"));
    dirs.sort();
    Ok(dirs)
}

/// Checks `dirs` (default: [`source_dirs`]), prints every cycle, fails if there is one.
pub fn run(root: &Path, dirs: &[PathBuf]) -> Result<()> {
    let dirs = if dirs.is_empty() {
        source_dirs(root)?
    } else {
        dirs.to_vec()
    };
    let mut found = 0;
    for dir in &dirs {
        for cycle in Graph::read(dir)?.cycles() {
            found += 1;
            println!("{}: cycle {}", dir.display(), cycle.modules.join(", "));
            for (a, b, file) in &cycle.edges {
                println!("  {a} -> {b}  ({})", file.display());
            }
        }
    }
    anyhow::ensure!(found == 0, "{found} module cycle(s)");
    println!("no module cycle in {} source folders", dirs.len());
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn tree(files: &[(&str, &str)]) -> tempfile::TempDir {
        let dir = tempfile::tempdir().unwrap();
        for (path, text) in files {
            let p = dir.path().join(path);
            std::fs::create_dir_all(p.parent().unwrap()).unwrap();
            std::fs::write(p, text).unwrap();
        }
        dir
    }

    #[test]
    fn the_repository_has_no_module_cycle() {
        let root = Path::new(env!("CARGO_MANIFEST_DIR")).parent().unwrap();
        let dirs = source_dirs(root).unwrap();
        assert!(dirs.len() > 10, "{dirs:?}");
        for dir in dirs {
            let cycles = Graph::read(&dir).unwrap().cycles();
            assert!(cycles.is_empty(), "{}: {cycles:#?}", dir.display());
        }
    }

    #[test]
    fn a_cycle_through_a_group_and_super_is_found() {
        let t = tree(&[
            ("lib.rs", "mod a;\nmod b;\nmod c;\n"),
            ("a.rs", "use crate::{b::Thing, c};\n"),
            ("b/mod.rs", "mod inner;\n"),
            ("b/inner.rs", "use super::super::c::f;\n"),
            (
                "c.rs",
                "// use crate::b; (a comment)\npub fn f() { crate::a::g() }\n",
            ),
        ]);
        let cycles = Graph::read(t.path()).unwrap().cycles();
        assert_eq!(cycles.len(), 1, "{cycles:#?}");
        assert_eq!(cycles[0].modules, ["a", "c"]);
        let t = tree(&[
            ("lib.rs", "mod a;\nmod b;\n"),
            ("a.rs", "use crate::b::X;\n"),
            (
                "b.rs",
                "pub struct X;\n#[cfg(test)]\nmod tests {\n    use crate::a;\n}\n",
            ),
        ]);
        assert!(Graph::read(t.path()).unwrap().cycles().is_empty());
        let t = tree(&[
            ("lib.rs", "mod a;\nmod b;\n"),
            ("a.rs", "use crate::b::X;\n"),
            ("b.rs", "pub struct X;\nfn f() { super::a::y(); }\n"),
        ]);
        let cycles = Graph::read(t.path()).unwrap().cycles();
        assert_eq!(cycles[0].edges.len(), 2, "{cycles:#?}");
    }

    #[test]
    fn paths_expand_groups_and_skip_other_names() {
        assert_eq!(
            paths("use crate::a::{b::C, d, e::{F, G}};\nlet x = my_crate::z;"),
            vec![
                vec!["crate", "a", "b", "C"],
                vec!["crate", "a", "d"],
                vec!["crate", "a", "e"],
            ]
        );
        assert_eq!(
            paths("use super::super::x::Y;"),
            vec![vec!["super", "super", "x", "Y"]]
        );
    }
}
