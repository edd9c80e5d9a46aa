//! `vectorstep schema [pipeline|config]`: the JSON Schema of pipeline files or of
//! config.yaml, for editors and CI. Reads no config and connects to nothing.

use vectorstep::schema::{schema, Which};

/// Which schema to print.
#[derive(clap::ValueEnum, Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum SchemaKind {
    /// Pipeline YAML files (the pipeline folder, `validate` arguments).
    #[default]
    Pipeline,
    /// config.yaml.
    Config,
}

/// Prints the schema as pretty JSON on standard output.
pub fn print(which: SchemaKind) -> anyhow::Result<i32> {
    let which = match which {
        SchemaKind::Pipeline => Which::Pipeline,
        SchemaKind::Config => Which::Config,
    };
    println!("{}", serde_json::to_string_pretty(&schema(which))?);
    Ok(0)
}
