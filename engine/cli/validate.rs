//! `vectorstep validate` and `vectorstep fingerprint`.

use std::path::{Path, PathBuf};

use super::{load_config, Cli};
use vectorstep::config::Config;
use vectorstep::pipeline::{self, PipelineSet};

/// Loads pipelines from `paths` (or the configured folder), printing diagnostics.
pub fn load_pipelines(config: &Config, paths: &[PathBuf]) -> anyhow::Result<PipelineSet> {
    load_counting(config, paths).map(|(set, _)| set)
}

/// [`load_pipelines`], with the number of warnings printed.
fn load_counting(config: &Config, paths: &[PathBuf]) -> anyhow::Result<(PipelineSet, usize)> {
    let paths = if paths.is_empty() {
        vec![config.pipeline_config_dir.clone()]
    } else {
        paths.to_vec()
    };
    let (set, diags) = pipeline::load(&paths, config);
    for d in diags.iter() {
        super::logging::diagnostic(d);
    }
    match set {
        Some(s) => Ok((s, diags.warnings().count())),
        None => anyhow::bail!("{} error(s); nothing was loaded", diags.error_count()),
    }
}

/// `validate [PATH...] [--strict]`: exit 0 with `N pipelines OK`, 1 on any
/// error, and with `--strict` on any warning too (config.yaml's included).
pub fn validate(cli: &Cli, paths: &[PathBuf], strict: bool) -> anyhow::Result<i32> {
    let (config, config_warnings) = super::load_config_counting(&cli.config)?;
    let scripts = check_scripts(&config);
    let (set, warnings) = load_counting(&config, paths)?;
    if scripts > 0 {
        anyhow::bail!("{scripts} scripted provider script(s) cannot be used");
    }
    let warnings = warnings + config_warnings;
    if strict && warnings > 0 {
        anyhow::bail!("{warnings} warning(s), and --strict makes warnings fail");
    }
    println!("{} pipelines OK", set.len());
    Ok(0)
}

/// Finds a pipeline by name in the configured folder, or by file path. A file is
/// loaded on its own (not its folder's other files), with the sub-pipelines it calls
/// taken from the configured pipeline folder.
pub fn find_pipeline(config: &Config, name_or_file: &str) -> anyhow::Result<(PipelineSet, String)> {
    let as_path = Path::new(name_or_file);
    if as_path.is_file() {
        let (set, diags) = pipeline::load_file(as_path, &config.pipeline_config_dir, config);
        for d in diags.iter() {
            super::logging::diagnostic(d);
        }
        let Some(set) = set else {
            anyhow::bail!("{} error(s); nothing was loaded", diags.error_count());
        };
        let name = set
            .pipelines
            .first()
            .map(|p| p.name.clone())
            .ok_or_else(|| anyhow::anyhow!("{name_or_file} holds no valid pipeline"))?;
        return Ok((set, name));
    }
    let set = load_pipelines(config, &[])?;
    if set.get(name_or_file).is_none() {
        let names: Vec<&str> = set.pipelines.iter().map(|p| p.name.as_str()).collect();
        anyhow::bail!(
            "no pipeline named `{name_or_file}` in {} (known: {})",
            config.pipeline_config_dir.display(),
            names.join(", ")
        );
    }
    Ok((set, name_or_file.to_string()))
}

pub fn fingerprint(cli: &Cli, name_or_file: &str) -> anyhow::Result<i32> {
    let config = load_config(&cli.config)?;
    let (set, name) = find_pipeline(&config, name_or_file)?;
    let p = set
        .get(&name)
        .ok_or_else(|| anyhow::anyhow!("pipeline `{name}` vanished"))?;
    println!("{}", p.fingerprint);
    Ok(0)
}

/// Loads the script of every `scripted` provider, printing what is wrong with it
/// (at its file and line); the number of scripts that failed.
fn check_scripts(config: &Config) -> usize {
    let mut failed = 0;
    for (name, p) in &config.providers {
        if let vectorstep::config::ProviderKind::Scripted { script } = &p.kind {
            if let Err(e) = vectorstep::agent::scripted::Script::load(script) {
                eprintln!("provider `{name}`: {e}");
                failed += 1;
            }
        }
    }
    failed
}
