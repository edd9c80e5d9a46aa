//! Reads pipeline files and the step library from disk and validates them as a set.
//! The only part of `pipeline/` that touches the file system.

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use super::context::{Ctx, SubpipelineRef};
use super::library::Library;
use super::model::{Entry, Pipeline};
use super::steps::{LIBRARY_EXTRA_KEYS, STEP_KEYS};
use super::validate;
use crate::config::Config;
use crate::diag::{Diagnostics, Span};
use crate::yaml;

/// Every loaded pipeline, in file order (the resolver's priority order).
#[derive(Debug, Default, Clone)]
pub struct PipelineSet {
    pub pipelines: Vec<Arc<Pipeline>>,
}

impl PipelineSet {
    pub fn get(&self, name: &str) -> Option<&Arc<Pipeline>> {
        self.pipelines.iter().find(|p| p.name == name)
    }

    pub fn len(&self) -> usize {
        self.pipelines.len()
    }

    pub fn is_empty(&self) -> bool {
        self.pipelines.is_empty()
    }
}

/// `*.yaml` and `*.yml` files of a folder, sorted by name.
pub fn yaml_files(dir: &Path) -> std::io::Result<Vec<PathBuf>> {
    let mut files: Vec<PathBuf> = std::fs::read_dir(dir)?
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| {
            p.is_file() && matches!(p.extension().and_then(|e| e.to_str()), Some("yaml" | "yml"))
        })
        .collect();
    files.sort();
    Ok(files)
}

/// Reads every `*.yaml`/`*.yml` file of `dir` in file-name order into a [`Library`].
/// A missing folder is an empty library. Files are only parsed here; they are
/// validated as steps by [`load_library`].
fn read_library(dir: &Path, d: &mut Diagnostics) -> Library {
    let mut lib = Library::default();
    let Ok(files) = yaml_files(dir) else {
        return lib;
    };
    for path in files {
        let file: Arc<str> = Arc::from(path.display().to_string());
        let text = match std::fs::read_to_string(&path) {
            Ok(t) => t,
            Err(e) => {
                d.error(&Span::new(file, 1, 1), "", format!("cannot read file: {e}"));
                continue;
            }
        };
        match yaml::parse(&file, &text) {
            Ok(node) => lib.add(node, d),
            Err(e) => {
                d.error(&e.span, "", e.message);
            }
        }
    }
    lib
}

/// Loads and validates the step library of `config`.
pub fn load_library(config: &Config, d: &mut Diagnostics) -> Library {
    let library = read_library(&config.step_library_dir, d);
    // Each library step must be a valid step on its own (without `when`).
    let mut keys: Vec<&str> = STEP_KEYS.iter().copied().filter(|k| *k != "when").collect();
    keys.extend_from_slice(LIBRARY_EXTRA_KEYS);
    let empty = Library::default();
    for node in library.steps.values() {
        let mut cx = Ctx::new(config, &empty);
        super::steps::step(node, "", &keys, &mut cx, d);
    }
    library
}

/// Loads every pipeline under `paths` (files or folders). Returns the set when no
/// errors were found; diagnostics (warnings included) either way.
pub fn load(paths: &[PathBuf], config: &Config) -> (Option<PipelineSet>, Diagnostics) {
    let mut d = Diagnostics::new();
    let library = load_library(config, &mut d);
    let mut files = Vec::new();
    for p in paths {
        if p.is_dir() {
            match yaml_files(p) {
                Ok(f) => files.extend(f),
                Err(e) => {
                    d.error(
                        &Span::new(Arc::from(p.display().to_string()), 1, 1),
                        "",
                        format!("cannot read folder: {e}"),
                    );
                }
            }
        } else if p.is_file() {
            files.push(p.clone());
        } else {
            d.error_hint(
                &Span::new(Arc::from(p.display().to_string()), 1, 1),
                "",
                "no such file or folder",
                "pass pipeline files or folders, or set `pipeline_config_dir` in config.yaml",
            );
        }
    }
    let mut set = PipelineSet::default();
    let mut refs = Vec::new();
    let mut first_seen: HashMap<String, PathBuf> = HashMap::new();
    for file in files {
        let name: Arc<str> = Arc::from(file.display().to_string());
        let text = match std::fs::read_to_string(&file) {
            Ok(t) => t,
            Err(e) => {
                d.error(&Span::new(name, 1, 1), "", format!("cannot read file: {e}"));
                continue;
            }
        };
        let root = match yaml::parse(&name, &text) {
            Ok(n) => n,
            Err(e) => {
                d.error_hint(
                    &e.span,
                    "",
                    e.message,
                    "check indentation and quoting around this position",
                );
                continue;
            }
        };
        let Some((pipeline, sub_refs)) = validate::pipeline(&root, &file, config, &library, &mut d)
        else {
            continue;
        };
        if let Some(first) = first_seen.get(&pipeline.name) {
            let span = root
                .get("name")
                .map(|n| n.span.clone())
                .unwrap_or(root.span.clone());
            d.error_hint(
                &span,
                "name",
                format!("duplicate pipeline name `{}`", pipeline.name),
                format!(
                    "already defined in {}; pipeline names must be unique",
                    first.display()
                ),
            );
            continue;
        }
        first_seen.insert(pipeline.name.clone(), file.clone());
        refs.push((pipeline.name.clone(), sub_refs));
        set.pipelines.push(Arc::new(pipeline));
    }
    finish(set, &refs, d)
}

/// Loads the one pipeline in `file`, plus the pipelines of `folder` it calls as
/// sub-pipelines (directly or through others). Other files of `folder` are not
/// loaded: a draft beside `file` that reuses its name, or does not validate, is no
/// concern of this file's. `file` may itself lie in `folder`; its own name wins over
/// any other file's there. Returns the set (`file`'s pipeline first) when no errors
/// were found in `file` or in the files it needs; diagnostics either way.
pub fn load_file(
    file: &Path,
    folder: &Path,
    config: &Config,
) -> (Option<PipelineSet>, Diagnostics) {
    let mut d = Diagnostics::new();
    let library = load_library(config, &mut d);
    let Some((main, main_refs)) = read_one(file, config, &library, &mut d) else {
        d.sort();
        return (None, d);
    };
    // Every other file of the folder, by the name it declares, first file first;
    // each keeps its own diagnostics until it turns out to be needed.
    let own = file.canonicalize().ok();
    let mut candidates: HashMap<String, PathBuf> = HashMap::new();
    if !main_refs.is_empty() {
        match yaml_files(folder) {
            Ok(files) => {
                for f in files {
                    if f.canonicalize().ok() == own {
                        continue;
                    }
                    if let Some(name) = declared_name(&f) {
                        candidates.entry(name).or_insert(f);
                    }
                }
            }
            Err(e) => {
                d.error(
                    &Span::new(Arc::from(folder.display().to_string()), 1, 1),
                    "",
                    format!("cannot read the pipeline folder for sub-pipelines: {e}"),
                );
            }
        }
    }
    let mut set = PipelineSet::default();
    let mut refs = vec![(main.name.clone(), main_refs.clone())];
    let mut wanted: Vec<String> = main_refs.iter().map(|r| r.0.clone()).collect();
    let mut loaded = std::collections::HashSet::from([main.name.clone()]);
    set.pipelines.push(Arc::new(main));
    while let Some(name) = wanted.pop() {
        if !loaded.insert(name.clone()) {
            continue;
        }
        // An unknown name is reported by `check_subpipelines` below.
        let Some(f) = candidates.get(&name) else {
            continue;
        };
        if let Some((p, sub_refs)) = read_one(f, config, &library, &mut d) {
            wanted.extend(sub_refs.iter().map(|r| r.0.clone()));
            refs.push((p.name.clone(), sub_refs));
            set.pipelines.push(Arc::new(p));
        }
    }
    finish(set, &refs, d)
}

/// Reads, parses and validates one pipeline file, reporting problems into `d`.
fn read_one(
    file: &Path,
    config: &Config,
    library: &Library,
    d: &mut Diagnostics,
) -> Option<(Pipeline, Vec<SubpipelineRef>)> {
    let name: Arc<str> = Arc::from(file.display().to_string());
    let text = match std::fs::read_to_string(file) {
        Ok(t) => t,
        Err(e) => {
            d.error(&Span::new(name, 1, 1), "", format!("cannot read file: {e}"));
            return None;
        }
    };
    let root = match yaml::parse(&name, &text) {
        Ok(n) => n,
        Err(e) => {
            d.error_hint(
                &e.span,
                "",
                e.message,
                "check indentation and quoting around this position",
            );
            return None;
        }
    };
    validate::pipeline(&root, file, config, library, d)
}

/// The `name:` a pipeline file declares, if it parses far enough to say.
fn declared_name(file: &Path) -> Option<String> {
    let text = std::fs::read_to_string(file).ok()?;
    let root = yaml::parse(&Arc::from(file.display().to_string()), &text).ok()?;
    root.get("name")?.as_str().map(str::to_string)
}

type Refs = Vec<(String, Vec<SubpipelineRef>)>;

/// Every `executor: pipeline` names a loaded pipeline, and no pipeline reaches itself.
/// The end of every load: sub-pipeline references checked, diagnostics sorted,
/// and the set only when nothing is an error.
fn finish(set: PipelineSet, refs: &Refs, mut d: Diagnostics) -> (Option<PipelineSet>, Diagnostics) {
    check_subpipelines(&set, refs, &mut d);
    d.sort();
    if d.has_errors() {
        (None, d)
    } else {
        (Some(set), d)
    }
}

fn check_subpipelines(set: &PipelineSet, refs: &Refs, d: &mut Diagnostics) {
    let names: Vec<&str> = set.pipelines.iter().map(|p| p.name.as_str()).collect();
    let mut graph: HashMap<&str, Vec<&str>> = HashMap::new();
    for (from, list) in refs {
        for (to, span, path) in list {
            if !names.contains(&to.as_str()) {
                let mut hint = String::new();
                if let Some(s) = crate::diag::did_you_mean(to, names.iter().copied()) {
                    hint.push_str(&format!("did you mean `{s}`? "));
                }
                hint.push_str("the sub-pipeline must be loaded from the same pipeline folder");
                d.error_hint(span, path, format!("unknown pipeline `{to}`"), hint);
            } else {
                graph.entry(from.as_str()).or_default().push(to.as_str());
            }
        }
    }
    for (from, list) in refs {
        for (to, span, path) in list {
            if let Some(cycle) = find_cycle(&graph, to, from) {
                d.error_hint(
                    span,
                    path,
                    format!("sub-pipeline cycle: {from} -> {}", cycle.join(" -> ")),
                    "a pipeline cannot call itself, directly or through others",
                );
            }
        }
    }
}

/// A path from `start` back to `target`, if there is one.
fn find_cycle<'a>(
    graph: &HashMap<&'a str, Vec<&'a str>>,
    start: &'a str,
    target: &str,
) -> Option<Vec<&'a str>> {
    let mut stack = vec![(start, vec![start])];
    let mut seen = std::collections::HashSet::new();
    while let Some((node, path)) = stack.pop() {
        if node == target {
            return Some(path);
        }
        if !seen.insert(node) {
            continue;
        }
        for next in graph.get(node).into_iter().flatten() {
            let mut p = path.clone();
            p.push(next);
            stack.push((next, p));
        }
    }
    None
}

/// The names of steps, branches and fan-outs a pipeline has, for tools and tests.
pub fn step_paths(p: &Pipeline) -> Vec<String> {
    let mut out = Vec::new();
    for e in &p.steps {
        match e {
            Entry::Step(s) => out.push(s.name.clone()),
            Entry::Parallel(g) => {
                out.extend(g.branches.iter().map(|b| format!("{}/{}", g.name, b.name)));
            }
            Entry::FanOut(f) => out.push(f.name.clone()),
        }
    }
    out
}
