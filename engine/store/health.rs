//! Whether the store can write right now, and whether its path still names the file
//! the process opened.
//!
//! The writer thread records every group that failed for a transient reason (busy,
//! full disk, I/O) and clears the mark on the next commit that succeeds; while the
//! mark is set it probes the file with a tiny write every second, so the mark clears
//! on its own once the condition does even when nobody else writes. The file check
//! compares the device and inode of the path with those recorded at open: a database
//! deleted or replaced under a running process would otherwise go on taking writes
//! into a file nobody will read again.

use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
use std::sync::Mutex;

use tracing::{error, info};

/// The identity of a file: device and inode.
type Identity = (u64, u64);

pub(super) struct Health {
    path: PathBuf,
    opened: Option<Identity>,
    /// Why the last group could not be committed, until one is.
    write_problem: Mutex<Option<String>>,
    /// Why the path no longer names the open file, while it does not.
    file_problem: Mutex<Option<String>>,
}

impl Health {
    /// Records the identity of `path`, just opened.
    pub(super) fn new(path: &Path) -> Health {
        Health {
            path: path.to_path_buf(),
            opened: identity(path).ok(),
            write_problem: Mutex::new(None),
            file_problem: Mutex::new(None),
        }
    }

    /// For a database that is not a local file (PostgreSQL, named by its URL
    /// without the password): only the write path is watched.
    pub(super) fn remote(name: &str) -> Health {
        Health {
            path: PathBuf::from(name),
            opened: None,
            write_problem: Mutex::new(None),
            file_problem: Mutex::new(None),
        }
    }

    /// Why the store cannot take writes now, if it cannot. Checks the file afresh.
    pub(super) fn problem(&self) -> Option<String> {
        if let Some(p) = self.check_file() {
            return Some(p);
        }
        lock(&self.write_problem).clone()
    }

    /// Whether a group failed for a transient reason and none has committed since.
    pub(super) fn write_failing(&self) -> bool {
        lock(&self.write_problem).is_some()
    }

    pub(super) fn write_failed(&self, why: &str) {
        let mut slot = lock(&self.write_problem);
        if slot.is_none() {
            error!(path = %self.path.display(), error = why, "The store cannot write; runs wait and intake answers 503 until it can.");
        }
        *slot = Some(format!("the store cannot write: {why}"));
    }

    pub(super) fn write_succeeded(&self) {
        let mut slot = lock(&self.write_problem);
        if slot.take().is_some() {
            info!(path = %self.path.display(), "The store accepts writes again.");
        }
    }

    /// `Some(detail)` when the path no longer names the file opened (logged once per
    /// change, and cleared if the file comes back).
    pub(super) fn check_file(&self) -> Option<String> {
        let opened = self.opened?;
        let now = match identity(&self.path) {
            Ok(id) if id == opened => None,
            Ok(_) => Some("the path now names a different file".to_string()),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
                Some("the file was deleted".to_string())
            }
            Err(e) => Some(format!("the path cannot be checked: {e}")),
        };
        let mut slot = lock(&self.file_problem);
        match (&*slot, &now) {
            (None, Some(detail)) => {
                error!(path = %self.path.display(), detail = %detail, "The database file is no longer the file this process opened; nothing more is written to it and intake answers 503. Restore the file or restart vectorstep.");
            }
            (Some(_), None) => {
                info!(path = %self.path.display(), "The database file is back; writes resume.");
            }
            _ => {}
        }
        slot.clone_from(&now);
        now
    }

    pub(super) fn path(&self) -> &Path {
        &self.path
    }
}

fn identity(path: &Path) -> std::io::Result<Identity> {
    let m = std::fs::metadata(path)?;
    Ok((m.dev(), m.ino()))
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    // A poisoned lock only means a thread panicked while holding it; the value is a
    // plain Option and still meaningful.
    m.lock().unwrap_or_else(|p| p.into_inner())
}
