//! Pipeline loading speed: 1,000 pipeline files in one folder, loaded and validated
//! the way `vectorstep validate` and a service start do it.
//!
//! Run: `cargo bench --bench load`. Target: well under a second for 1,000 files
//! on a 2-core machine. Numbers and how to read them: docs/performance.md.
//!
//! The files are copies of `samples/pipelines/` (plain steps, parallel groups,
//! fan-outs, loops, `use:` steps, budgets, schedules, sub-pipelines), each copy
//! renamed so the names stay unique and sub-pipeline references stay resolvable.

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use vectorstep::config::Config;
use vectorstep::pipeline;

const FILES: usize = 1000;
const RUNS: usize = 7;

fn repo() -> &'static Path {
    Path::new(env!("CARGO_MANIFEST_DIR"))
}

/// The top-level `name:` of a sample pipeline.
fn pipeline_name(text: &str) -> String {
    text.lines()
        .find_map(|l| l.strip_prefix("name: "))
        .expect("a top-level `name:` line")
        .trim()
        .to_string()
}

/// Writes `FILES` pipelines into `dir`: copy `k` of every sample gets the suffix
/// `-k` on its name and on every sub-pipeline it calls.
fn write_corpus(dir: &Path) -> usize {
    let samples: Vec<(String, String)> =
        pipeline::loader::yaml_files(&repo().join("samples/pipelines"))
            .expect("samples/pipelines")
            .into_iter()
            .map(|p| {
                let text = std::fs::read_to_string(&p).unwrap();
                (pipeline_name(&text), text)
            })
            .collect();
    let names: Vec<&str> = samples.iter().map(|(n, _)| n.as_str()).collect();
    let mut bytes = 0;
    for i in 0..FILES {
        let (name, text) = &samples[i % samples.len()];
        let copy = i / samples.len();
        let mut out = text.replacen(
            &format!("\nname: {name}\n"),
            &format!("\nname: {name}-{copy}\n"),
            1,
        );
        for callee in &names {
            out = out.replace(
                &format!("pipeline: {callee}\n"),
                &format!("pipeline: {callee}-{copy}\n"),
            );
        }
        bytes += out.len();
        std::fs::write(dir.join(format!("{i:04}-{name}.yaml")), out).unwrap();
    }
    bytes
}

fn load(dir: &Path, config: &Config) -> Duration {
    let start = Instant::now();
    let (set, d) = pipeline::load(&[PathBuf::from(dir)], config);
    let took = start.elapsed();
    let set = set.unwrap_or_else(|| panic!("the corpus does not load:\n{d}"));
    assert_eq!(set.len(), FILES);
    took
}

fn ms(d: Duration) -> f64 {
    d.as_secs_f64() * 1000.0
}

fn main() {
    let (config, _) = Config::load(&repo().join("config.yaml"), true).expect("config.yaml");
    let dir = tempfile::tempdir().expect("a temp dir");
    let bytes = write_corpus(dir.path());
    println!(
        "load: {FILES} pipeline files, {:.1} MiB, in {}",
        bytes as f64 / (1024.0 * 1024.0),
        dir.path().display()
    );
    // One untimed run warms the page cache and the allocator.
    load(dir.path(), &config);
    let mut times = Vec::with_capacity(RUNS);
    for run in 1..=RUNS {
        let t = load(dir.path(), &config);
        println!(
            "load: run {run}/{RUNS}: {:.1} ms ({:.0} files/s)",
            ms(t),
            FILES as f64 / t.as_secs_f64()
        );
        times.push(t);
    }
    times.sort();
    let (min, median) = (times[0], times[RUNS / 2]);
    println!("load: min {:.1} ms", ms(min));
    println!(
        "load: median {:.1} ms ({:.0} files/s, {:.3} ms per file)",
        ms(median),
        FILES as f64 / median.as_secs_f64(),
        ms(median) / FILES as f64
    );
}
