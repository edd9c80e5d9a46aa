//! `vectorstep store copy --from URL --to URL`: every run, step, event, approval,
//! notification and journal row of one store copied into another, empty one
//! (`store::copy_all`), e.g. a single node's SQLite file into the PostgreSQL
//! database its replicas will share. Exit 0 when copied, 64 for a store that is not
//! `sqlite:PATH`/`postgres://...`, 1 when the copy is refused or fails. URLs are
//! shown without their password, errors included.

use vectorstep::store::{copy_all, redact_url, CopyError, StoreLocation};

use super::USAGE;

pub fn copy(from: &str, to: &str) -> i32 {
    let (source, target) = match (StoreLocation::parse(from), StoreLocation::parse(to)) {
        (Ok(s), Ok(t)) => (s, t),
        (Err(e), _) => return usage("--from", &e),
        (_, Err(e)) => return usage("--to", &e),
    };
    match run(&source, &target) {
        Ok(()) => 0,
        Err(e) => {
            eprintln!("error: {}", scrub(&e.to_string(), &[from, to]));
            1
        }
    }
}

fn usage(flag: &str, e: &CopyError) -> i32 {
    eprintln!("error: {flag}: {e}");
    eprintln!("usage: vectorstep store copy --from sqlite:PATH --to postgres://USER@HOST/DATABASE");
    USAGE
}

fn run(source: &StoreLocation, target: &StoreLocation) -> Result<(), CopyError> {
    println!("Copying {} to {}", source.display(), target.display());
    let from = source.open_source()?;
    let to = target.open_target()?;
    let report = copy_all(&from, &to)?;
    let width = report
        .tables
        .iter()
        .map(|t| t.table.len())
        .max()
        .unwrap_or(0);
    for t in &report.tables {
        println!("  {:<width$}  {:>9}", t.table, t.rows);
    }
    println!(
        "Copied {} rows in {} tables to {}.",
        report.total(),
        report.tables.len(),
        target.display()
    );
    Ok(())
}

/// Whatever the error says, the URLs as given (with their passwords) are replaced
/// by their redacted form.
fn scrub(text: &str, urls: &[&str]) -> String {
    urls.iter()
        .filter(|u| !u.is_empty())
        .fold(text.to_string(), |t, u| t.replace(u, &redact_url(u)))
}

#[cfg(test)]
mod tests {
    use super::scrub;

    #[test]
    fn a_url_in_an_error_loses_its_password() {
        let url = "postgres://vs:hunter2@db/vs";
        let got = scrub(&format!("cannot reach {url}: refused"), &[url, ""]);
        assert_eq!(got, "cannot reach postgres://vs:***@db/vs: refused");
    }
}
