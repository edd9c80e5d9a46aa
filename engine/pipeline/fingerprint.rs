//! The config fingerprint (SPEC 6.7): blake3 over the ordered list of
//! (step path, executor, agent) for every plain step, every parallel branch
//! (`group/branch`) and every fan-out. Nothing else feeds it, so prompt, threshold,
//! `when`, retry and budget edits do not block a resume, while any change to what
//! runs, in which order, on which agent, does.

use super::model::{Action, Entry};

/// The (path, executor, agent) triples in run order.
pub fn triples(entries: &[Entry]) -> Vec<(String, String, String)> {
    let t = |path: String, a: &Action| {
        (
            path,
            a.executor_name.clone(),
            a.agent.clone().unwrap_or_default(),
        )
    };
    let mut out = Vec::new();
    for e in entries {
        match e {
            Entry::Step(s) => out.push(t(s.name.clone(), &s.action)),
            Entry::Parallel(p) => {
                for b in &p.branches {
                    out.push(t(format!("{}/{}", p.name, b.name), &b.action));
                }
            }
            Entry::FanOut(f) => out.push(t(f.name.clone(), &f.action)),
        }
    }
    out
}

/// Lowercase hex blake3 of the triples, length-prefixed so no two lists collide.
pub fn of_entries(entries: &[Entry]) -> String {
    let mut h = blake3::Hasher::new();
    for (path, executor, agent) in triples(entries) {
        for part in [path, executor, agent] {
            h.update(&(part.len() as u64).to_le_bytes());
            h.update(part.as_bytes());
        }
    }
    h.finalize().to_hex().to_string()
}
