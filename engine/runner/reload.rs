//! Reloading pipelines and the step library while serving (`POST /-/reload`, SIGHUP).
//!
//! A reload reads the configured pipeline folder again. A folder with any error
//! changes nothing: the old set keeps serving and the caller gets every diagnostic.
//! A clean folder replaces the set at once for new runs, while every definition a
//! non-terminal run started with stays available by its fingerprint
//! ([`Engine::pipeline_for_run`]), so an approval decided after a reload, or a
//! resume after a park, continues on the steps the run began with.
//!
//! `config.yaml` is not reloaded: its changes need a restart. On a shared
//! PostgreSQL store each replica reloads on its own (send each its SIGHUP).

use std::collections::{HashMap, HashSet};
use std::sync::Arc;

use crate::diag::Diagnostic;
use crate::domain::RunStatus;
use crate::pipeline::{Pipeline, PipelineSet};

use super::Engine;

/// Definitions that left the current set and may still be in use, by fingerprint,
/// with the reload generation that retired them.
#[derive(Default)]
pub(super) struct Retained {
    defs: HashMap<String, (Arc<Pipeline>, u64)>,
}

/// What a reload changed, by pipeline name.
#[derive(Debug, Clone, Default, PartialEq, Eq, serde::Serialize)]
pub struct SetChange {
    pub added: Vec<String>,
    pub changed: Vec<String>,
    pub removed: Vec<String>,
}

/// A reload that replaced the set.
#[derive(Debug, Clone, serde::Serialize)]
pub struct Reloaded {
    pub pipelines: usize,
    #[serde(flatten)]
    pub change: SetChange,
    /// Warnings of the new set (they do not stop a reload).
    pub warnings: usize,
}

/// A reload that changed nothing: the folder has errors.
#[derive(Debug, Clone)]
pub struct ReloadRefused {
    pub diagnostics: Vec<Diagnostic>,
}

/// The names added, changed (another fingerprint) and removed from `old` to `new`.
pub fn diff(old: &PipelineSet, new: &PipelineSet) -> SetChange {
    let mut change = SetChange::default();
    for p in &new.pipelines {
        match old.get(&p.name) {
            None => change.added.push(p.name.clone()),
            Some(o) if o.fingerprint != p.fingerprint => change.changed.push(p.name.clone()),
            Some(_) => {}
        }
    }
    for o in &old.pipelines {
        if new.get(&o.name).is_none() {
            change.removed.push(o.name.clone());
        }
    }
    change
}

/// Which retained fingerprints to keep after reload `generation`: those retired
/// by this very reload (a run may have taken its definition an instant before the
/// swap and not be recorded yet), and older ones a running run still uses.
pub fn keep_retained(
    retired_at: &HashMap<String, u64>,
    generation: u64,
    in_use: &HashSet<String>,
) -> HashSet<String> {
    retired_at
        .iter()
        .filter(|(fp, at)| **at == generation || in_use.contains(*fp))
        .map(|(fp, _)| fp.clone())
        .collect()
}

impl Engine {
    /// The definition `run` was started with: the current one when its
    /// fingerprint still matches, else the one a reload retired, else (after a
    /// restart, when only the current folder is known) the current one by name.
    pub fn pipeline_for_run(&self, name: &str, fingerprint: &str) -> Option<Arc<Pipeline>> {
        let current = self.pipeline(name);
        if current
            .as_ref()
            .is_some_and(|p| p.fingerprint == fingerprint)
        {
            return current;
        }
        let retained = match self.retained.lock() {
            Ok(r) => r.defs.get(fingerprint).map(|(p, _)| p.clone()),
            Err(poisoned) => poisoned
                .into_inner()
                .defs
                .get(fingerprint)
                .map(|(p, _)| p.clone()),
        };
        retained.filter(|p| p.name == name).or(current)
    }

    /// Every fingerprint this engine can drive: the current set's and the
    /// retained ones (what a replica publishes in its heartbeat).
    pub fn known_fingerprints(&self) -> Vec<String> {
        let mut all: Vec<String> = self
            .pipelines()
            .pipelines
            .iter()
            .map(|p| p.fingerprint.clone())
            .collect();
        if let Ok(r) = self.retained.lock() {
            all.extend(r.defs.keys().cloned());
        }
        all.sort();
        all.dedup();
        all
    }

    /// A receiver that changes with every reload that replaced the set.
    pub fn reloads(&self) -> tokio::sync::watch::Receiver<u64> {
        self.reload_generation.subscribe()
    }

    /// Replaces the set; the definitions leaving it are retained by fingerprint.
    fn swap_pipelines(&self, new: PipelineSet, in_use: &HashSet<String>) -> u64 {
        let new = Arc::new(new);
        let old = {
            let mut slot = match self.pipelines.write() {
                Ok(s) => s,
                Err(poisoned) => poisoned.into_inner(),
            };
            std::mem::replace(&mut *slot, new.clone())
        };
        let generation = *self.reload_generation.borrow() + 1;
        let mut retained = match self.retained.lock() {
            Ok(r) => r,
            Err(poisoned) => poisoned.into_inner(),
        };
        let current: HashSet<&str> = new
            .pipelines
            .iter()
            .map(|p| p.fingerprint.as_str())
            .collect();
        for p in &old.pipelines {
            if !current.contains(p.fingerprint.as_str()) {
                retained
                    .defs
                    .entry(p.fingerprint.clone())
                    .or_insert_with(|| (p.clone(), generation));
            }
        }
        retained.defs.retain(|fp, _| !current.contains(fp.as_str()));
        let retired_at: HashMap<String, u64> = retained
            .defs
            .iter()
            .map(|(fp, (_, at))| (fp.clone(), *at))
            .collect();
        let keep = keep_retained(&retired_at, generation, in_use);
        retained.defs.retain(|fp, _| keep.contains(fp));
        drop(retained);
        self.reload_generation.send_replace(generation);
        generation
    }
}

/// Reads the pipeline folder and the step library again and, when they load
/// without errors, makes them the set new runs use. One reload at a time.
pub async fn reload(engine: &Arc<Engine>) -> Result<Reloaded, ReloadRefused> {
    let _one = engine.reload_lock.lock().await;
    let config = engine.config.clone();
    let loaded = tokio::task::spawn_blocking(move || {
        let dirs = vec![config.pipeline_config_dir.clone()];
        crate::pipeline::load(&dirs, &config)
    })
    .await;
    let (set, diags) = match loaded {
        Ok(l) => l,
        Err(e) => {
            tracing::error!(error = %e, "Reload failed: the loader did not finish; the loaded pipelines stay.");
            return Err(ReloadRefused {
                diagnostics: Vec::new(),
            });
        }
    };
    for d in diags.iter() {
        match d.severity {
            crate::diag::Severity::Error => {
                tracing::error!(diagnostic = %d, "Reload: pipeline error.")
            }
            crate::diag::Severity::Warning => {
                tracing::warn!(diagnostic = %d, "Reload: pipeline warning.")
            }
        }
    }
    let Some(set) = set.filter(|_| !diags.has_errors()) else {
        tracing::error!(
            errors = diags.error_count(),
            "Reload refused: the pipeline folder has errors; the loaded pipelines stay."
        );
        return Err(ReloadRefused {
            diagnostics: diags.into_vec(),
        });
    };
    let change = diff(&engine.pipelines(), &set);
    let in_use = running_fingerprints(engine).await;
    let count = set.len();
    crate::telemetry::zero_pipeline_counters(set.pipelines.iter().map(|p| p.name.as_str()));
    let generation = engine.swap_pipelines(set, &in_use);
    tracing::info!(
        pipelines = count,
        added = %crate::telemetry::json_text(&change.added),
        changed = %crate::telemetry::json_text(&change.changed),
        removed = %crate::telemetry::json_text(&change.removed),
        generation,
        "Pipelines reloaded."
    );
    Ok(Reloaded {
        pipelines: count,
        warnings: diags.warnings().count(),
        change,
    })
}

/// The fingerprints of the runs still `running` in the store. A store that cannot
/// be read keeps every retained definition (the safe side: memory, not a run).
async fn running_fingerprints(engine: &Arc<Engine>) -> HashSet<String> {
    let store = engine.store.clone();
    let read =
        tokio::task::spawn_blocking(move || store.runs_with_status(RunStatus::Running)).await;
    match read {
        Ok(Ok(runs)) => runs.into_iter().map(|r| r.config_fingerprint).collect(),
        _ => {
            tracing::warn!(
                "Reload: cannot read the running runs; every retired definition is kept."
            );
            let retained = match engine.retained.lock() {
                Ok(r) => r,
                Err(poisoned) => poisoned.into_inner(),
            };
            retained.defs.keys().cloned().collect()
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn set(pipelines: &[(&str, &str)]) -> PipelineSet {
        PipelineSet {
            pipelines: pipelines
                .iter()
                .map(|(name, steps)| {
                    let yaml = format!(
                        "name: {name}\ntrigger: {{match: {{alertname: X}}}}\nsteps:\n{steps}"
                    );
                    crate::run::test_support::pipeline(&yaml)
                })
                .collect(),
        }
    }

    #[test]
    fn diff_names_added_changed_and_removed() {
        let one = "  - {name: a, executor: mock}\n";
        let two = "  - {name: a, executor: mock}\n  - {name: b, executor: mock}\n";
        let check =
            |old: &[(&str, &str)], new: &[(&str, &str)], expected: (&[&str], &[&str], &[&str])| {
                let got = diff(&set(old), &set(new));
                let strings = |v: &[&str]| v.iter().map(|s| s.to_string()).collect::<Vec<_>>();
                assert_eq!(
                    got,
                    SetChange {
                        added: strings(expected.0),
                        changed: strings(expected.1),
                        removed: strings(expected.2),
                    },
                    "{old:?} -> {new:?}"
                );
            };
        check(&[("x", one)], &[("x", one)], (&[], &[], &[]));
        check(&[("x", one)], &[("x", one), ("y", one)], (&["y"], &[], &[]));
        check(&[("x", one)], &[("x", two)], (&[], &["x"], &[]));
        check(
            &[("x", one), ("y", one)],
            &[("y", two)],
            (&[], &["y"], &["x"]),
        );
    }

    /// One row: retired fingerprints with their generation, this reload's
    /// generation, the fingerprints running runs use, and what is kept.
    fn check_kept(
        what: &str,
        retired: &[(&str, u64)],
        generation: u64,
        in_use: &[&str],
        kept: &[&str],
    ) {
        let retired: HashMap<String, u64> =
            retired.iter().map(|(f, g)| (f.to_string(), *g)).collect();
        let set = |v: &[&str]| -> HashSet<String> { v.iter().map(|s| s.to_string()).collect() };
        assert_eq!(
            keep_retained(&retired, generation, &set(in_use)),
            set(kept),
            "{what}"
        );
    }

    #[test]
    fn retained_definitions_stay_while_used_or_just_retired() {
        check_kept(
            "retired by this reload: kept though no run is recorded yet",
            &[("a", 3)],
            3,
            &[],
            &["a"],
        );
        check_kept(
            "retired earlier and unused: dropped",
            &[("a", 2)],
            3,
            &[],
            &[],
        );
        check_kept(
            "retired earlier, a running run uses it: kept",
            &[("a", 1)],
            3,
            &["a"],
            &["a"],
        );
        check_kept(
            "mixed",
            &[("a", 1), ("b", 2), ("c", 3)],
            3,
            &["b"],
            &["b", "c"],
        );
    }
}
