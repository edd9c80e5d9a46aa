//! The deployment snippets in docs/operations.md are checked as the tools that read
//! them would: the systemd unit by `systemd-analyze verify` (Debian package
//! `systemd`; `bash tests/run.sh` installs it), and for what `verify` does not
//! catch, such as an end-of-line comment that systemd would take as part of a value.

use std::process::Command;

/// The unit from docs/operations.md, the block that starts with its path.
fn documented_unit() -> String {
    let doc = include_str!("../docs/operations.md");
    let start = doc
        .find("# /etc/systemd/system/vectorstep.service")
        .expect("docs/operations.md shows the systemd unit");
    let body = &doc[start..];
    let end = body.find("```").expect("the unit's code block ends");
    body[..end].to_string()
}

#[test]
fn the_documented_systemd_unit_has_no_end_of_line_comments() {
    let unit = documented_unit();
    for (i, line) in unit.lines().enumerate() {
        let line = line.trim();
        if line.starts_with('#') || line.starts_with(';') || !line.contains('=') {
            continue;
        }
        assert!(
            !line.contains(" #") && !line.contains("\t#"),
            "unit line {}: systemd has no end-of-line comments, `{line}` would keep the comment in its value",
            i + 1
        );
    }
    for key in [
        "EnvironmentFile=",
        "LimitNOFILE=",
        "Restart=on-failure",
        "NoNewPrivileges=yes",
    ] {
        assert!(unit.contains(key), "the unit sets {key}");
    }
}

#[test]
fn the_documented_systemd_unit_passes_systemd_analyze_verify() {
    let found = Command::new("systemd-analyze").arg("--version").output();
    assert!(
        found.is_ok_and(|o| o.status.success()),
        "systemd-analyze is missing: install it with `apt-get install -y systemd` \
         (or run the suite with `bash tests/run.sh`, which does)"
    );
    // `verify` requires ExecStart's program to exist: point it at the binary under
    // test; every other line is checked as documented.
    let unit = documented_unit().replace(
        "ExecStart=/opt/vectorstep/vectorstep",
        &format!("ExecStart={}", env!("CARGO_BIN_EXE_vectorstep")),
    );
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("vectorstep.service");
    std::fs::write(&path, unit).unwrap();
    let out = Command::new("systemd-analyze")
        .arg("verify")
        .arg(&path)
        .output()
        .expect("systemd-analyze runs");
    let stderr = String::from_utf8_lossy(&out.stderr);
    // Warnings about this machine's own units are not the unit's problem.
    let ours: Vec<&str> = stderr
        .lines()
        .filter(|l| l.starts_with("vectorstep.service") || l.contains(&*path.to_string_lossy()))
        .collect();
    assert!(
        out.status.success() && ours.is_empty(),
        "systemd-analyze verify failed (exit {:?}):\n{stderr}",
        out.status.code()
    );
}
