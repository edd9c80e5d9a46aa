//! The files of `engine/pipeline/` form layers: no file reaches itself through the
//! modules it names. The check reads the source, not the compiler: every
//! `super::...` and `crate::pipeline::...` path (in `use` lines and inline) becomes an
//! arrow from its file to the file of the module it names, and a loop of arrows fails
//! the test with the files on it.
//!
//! Two rules follow Rust's module tree. A `mod.rs` declares and re-exports its own
//! children, so its arrows to them are not counted (the children may build on what
//! the folder's `mod.rs` defines). A name a `mod.rs` re-exports with
//! `pub use child::{Name}` is an arrow to `child`, where it is defined.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

/// A module path below `pipeline`: `[]` is `pipeline/mod.rs`, `["loader"]` is
/// `pipeline/loader.rs`, `["executor_config", "fields"]` its folder's `fields.rs`.
type ModPath = Vec<String>;

struct Source {
    file: String,
    module: ModPath,
    is_mod_rs: bool,
    /// The code above the file's `#[cfg(test)]`, without `//` comments.
    code: String,
}

fn sources(root: &Path) -> Vec<Source> {
    let mut out = Vec::new();
    let mut stack = vec![root.to_path_buf()];
    while let Some(dir) = stack.pop() {
        let Ok(entries) = std::fs::read_dir(&dir) else {
            panic!("cannot read {}", dir.display());
        };
        let mut paths: Vec<PathBuf> = entries.filter_map(|e| e.ok().map(|e| e.path())).collect();
        paths.sort();
        for p in paths {
            if p.is_dir() {
                stack.push(p);
            } else if p.extension().is_some_and(|e| e == "rs") {
                let Ok(text) = std::fs::read_to_string(&p) else {
                    panic!("cannot read {}", p.display());
                };
                let rel = p.strip_prefix(root).unwrap_or(&p);
                let file = format!("engine/pipeline/{}", rel.display());
                out.push(source(&file, &text));
            }
        }
    }
    out
}

/// `file` is the path from the repository root (`engine/pipeline/...`).
fn source(file: &str, text: &str) -> Source {
    let rel = file
        .trim_start_matches("engine/pipeline/")
        .trim_end_matches(".rs");
    let mut module: ModPath = rel.split('/').map(str::to_string).collect();
    let is_mod_rs = module.last().is_some_and(|m| m == "mod");
    if is_mod_rs {
        module.pop();
    }
    let above_tests = text.split("#[cfg(test)]").next().unwrap_or("");
    let code = above_tests
        .lines()
        .map(|l| match l.find("//") {
            Some(i) => &l[..i],
            None => l,
        })
        .collect::<Vec<_>>()
        .join("\n");
    Source {
        file: file.to_string(),
        module,
        is_mod_rs,
        code,
    }
}

fn ident(s: &str) -> (&str, &str) {
    let end = s
        .find(|c: char| !(c.is_alphanumeric() || c == '_'))
        .unwrap_or(s.len());
    (&s[..end], &s[end..])
}

/// The paths that follow `prefix` at `rest`: `a::b::C` gives one, `{a::X, b}` one per
/// item of the group (nested groups are cut at their first segment's module).
fn paths_after(rest: &str) -> Vec<Vec<String>> {
    let rest = rest.trim_start();
    if let Some(group) = rest.strip_prefix('{') {
        let mut depth = 0;
        let mut items = Vec::new();
        let mut current = String::new();
        for c in group.chars() {
            match c {
                '{' => depth += 1,
                '}' if depth == 0 => break,
                '}' => depth -= 1,
                ',' if depth == 0 => {
                    items.push(std::mem::take(&mut current));
                    continue;
                }
                _ => {}
            }
            current.push(c);
        }
        items.push(current);
        return items
            .iter()
            .flat_map(|item| paths_after(item))
            .filter(|p| !p.is_empty())
            .collect();
    }
    let mut segs = Vec::new();
    let mut s = rest;
    loop {
        let (id, tail) = ident(s);
        if id.is_empty() {
            break;
        }
        segs.push(id.to_string());
        match tail.strip_prefix("::") {
            Some(t) if !t.starts_with('{') => s = t,
            _ => break,
        }
    }
    vec![segs]
}

/// The arrows `file -> file` of the tree, with the name that makes each.
fn arrows(srcs: &[Source]) -> BTreeMap<String, BTreeMap<String, String>> {
    let by_module: BTreeMap<&ModPath, &Source> = srcs.iter().map(|s| (&s.module, s)).collect();
    // `pub use child::{A, B}` of each `mod.rs`: name -> child module.
    let mut reexports: BTreeMap<(ModPath, String), ModPath> = BTreeMap::new();
    for s in srcs.iter().filter(|s| s.is_mod_rs) {
        for line in s.code.lines() {
            let Some(rest) = line.trim().strip_prefix("pub use ") else {
                continue;
            };
            let (child, tail) = ident(rest);
            let mut module = s.module.clone();
            module.push(child.to_string());
            if !by_module.contains_key(&module) {
                continue;
            }
            for p in paths_after(tail.trim_start_matches("::")) {
                if let Some(name) = p.first() {
                    reexports.insert((s.module.clone(), name.clone()), module.clone());
                }
            }
        }
    }
    let mut out: BTreeMap<String, BTreeMap<String, String>> = BTreeMap::new();
    for s in srcs {
        let parent: ModPath = s.module[..s.module.len().saturating_sub(1)].to_vec();
        let mut found = Vec::new();
        for (prefix, base) in [
            ("super::", parent.clone()),
            ("crate::pipeline::", Vec::new()),
        ] {
            let mut at = 0;
            while let Some(i) = s.code[at..].find(prefix) {
                let start = at + i;
                at = start + prefix.len();
                // `crate::pipeline::` inside a longer path is not this crate's.
                let before = s.code[..start].chars().next_back();
                if before.is_some_and(|c| c.is_alphanumeric() || c == '_' || c == ':') {
                    continue;
                }
                let mut base = base.clone();
                let mut rest = &s.code[at..];
                while let Some(r) = rest.strip_prefix("super::") {
                    base.pop();
                    rest = r;
                }
                for p in paths_after(rest) {
                    found.push((base.clone(), p));
                }
            }
        }
        for (base, path) in found {
            let mut target = base;
            let mut rest = path.iter();
            let mut name = String::new();
            for seg in rest.by_ref() {
                let mut next = target.clone();
                next.push(seg.clone());
                if by_module.contains_key(&next) {
                    target = next;
                } else {
                    name = seg.clone();
                    break;
                }
            }
            if let Some(child) = reexports.get(&(target.clone(), name.clone())) {
                target = child.clone();
            }
            let own_child = s.is_mod_rs && target.starts_with(&s.module);
            if target == s.module || own_child {
                continue;
            }
            let Some(to) = by_module.get(&target) else {
                continue;
            };
            let label = if name.is_empty() {
                path.join("::")
            } else {
                name
            };
            out.entry(s.file.clone())
                .or_default()
                .entry(to.file.clone())
                .or_insert(label);
        }
    }
    out
}

/// The first loop of arrows found, as `a -> b (Name) -> ... -> a`.
fn find_cycle(arrows: &BTreeMap<String, BTreeMap<String, String>>) -> Option<String> {
    fn visit(
        file: &str,
        arrows: &BTreeMap<String, BTreeMap<String, String>>,
        path: &mut Vec<String>,
        done: &mut BTreeSet<String>,
    ) -> Option<String> {
        if let Some(i) = path.iter().position(|f| f == file) {
            let mut cycle: Vec<String> = path[i..].to_vec();
            cycle.push(file.to_string());
            let steps: Vec<String> = cycle
                .windows(2)
                .map(|w| format!("{} -> {} ({})", w[0], w[1], arrows[&w[0]][&w[1]]))
                .collect();
            return Some(steps.join("\n  "));
        }
        if done.contains(file) {
            return None;
        }
        path.push(file.to_string());
        for to in arrows.get(file).into_iter().flat_map(|m| m.keys()) {
            if let Some(c) = visit(to, arrows, path, done) {
                return Some(c);
            }
        }
        path.pop();
        done.insert(file.to_string());
        None
    }
    let mut done = BTreeSet::new();
    for file in arrows.keys() {
        if let Some(c) = visit(file, arrows, &mut Vec::new(), &mut done) {
            return Some(c);
        }
    }
    None
}

#[test]
fn pipeline_files_form_layers_without_a_cycle() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("engine/pipeline");
    let srcs = sources(&root);
    assert!(
        srcs.len() > 5,
        "found only {} files under {}",
        srcs.len(),
        root.display()
    );
    let arrows = arrows(&srcs);
    if let Some(cycle) = find_cycle(&arrows) {
        panic!(
            "engine/pipeline/ has a cycle of imports:\n  {cycle}\n\
             move what both ends need into a lower file (the files must form layers)"
        );
    }
}

#[test]
fn the_check_sees_a_cycle_through_use_groups_inline_paths_and_reexports() {
    let srcs = [
        source("engine/pipeline/mod.rs", "mod a;\nmod b;\nmod sub;\n"),
        source("engine/pipeline/a.rs", "use super::{model::X, b::{self, Y}};\n"),
        source("engine/pipeline/b.rs", "fn f() { super::sub::Z::new(); }\n"),
        source(
            "engine/pipeline/sub/mod.rs",
            "mod inner;\npub use inner::Z;\npub struct Helper;\nuse crate::pipeline::a::W;\n",
        ),
        source(
            "engine/pipeline/sub/inner.rs",
            "use super::Helper;\n// use super::super::b;\n#[cfg(test)]\nmod tests { use super::super::super::b; }\n",
        ),
    ];
    let arrows = arrows(&srcs);
    let expected = "engine/pipeline/a.rs -> engine/pipeline/b.rs (b)\n  \
         engine/pipeline/b.rs -> engine/pipeline/sub/inner.rs (Z)\n  \
         engine/pipeline/sub/inner.rs -> engine/pipeline/sub/mod.rs (Helper)\n  \
         engine/pipeline/sub/mod.rs -> engine/pipeline/a.rs (W)";
    assert_eq!(find_cycle(&arrows).as_deref(), Some(expected));
}

#[test]
fn super_super_climbs_two_modules() {
    let srcs = [
        source("engine/pipeline/mod.rs", "mod a;\nmod sub;\n"),
        source("engine/pipeline/a.rs", "use super::sub::inner;\n"),
        source("engine/pipeline/sub/mod.rs", "mod inner;\n"),
        source("engine/pipeline/sub/inner.rs", "use super::super::a::X;\n"),
    ];
    let arrows = arrows(&srcs);
    assert!(
        find_cycle(&arrows).is_some_and(|c| c.contains("sub/inner.rs -> engine/pipeline/a.rs (X)"))
    );
}

/// The database drivers stay behind the store: no file outside `engine/store/`
/// names rusqlite or postgres in code (comments aside), so the engine runs on
/// either backend unchanged.
#[test]
fn only_the_store_names_a_database_driver() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("engine");
    let mut stack = vec![root.clone()];
    let mut offenders = Vec::new();
    while let Some(dir) = stack.pop() {
        for e in std::fs::read_dir(&dir).expect("read engine/").flatten() {
            let path = e.path();
            if path.is_dir() {
                if path != root.join("store") {
                    stack.push(path);
                }
                continue;
            }
            if path.extension().is_none_or(|x| x != "rs") {
                continue;
            }
            let text = std::fs::read_to_string(&path).expect("read");
            for (n, line) in text.lines().enumerate() {
                let code = line.split("//").next().unwrap_or("");
                let names_driver = ["rusqlite", "postgres::", "tokio_postgres"]
                    .iter()
                    .any(|d| code.contains(d) && !code.contains(&format!("\"{d}")));
                if names_driver {
                    offenders.push(format!("{}:{}: {line}", path.display(), n + 1));
                }
            }
        }
    }
    assert!(offenders.is_empty(), "{}", offenders.join("\n"));
}
