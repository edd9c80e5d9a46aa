//! Which process owns a store, and which process owns a run, told by `flock` on
//! sidecar files next to the database.
//!
//! - `<database>.lock` is held by the one `vectorstep serve` of a SQLite store for
//!   its whole life and records its pid, so a second `serve` refuses to start and
//!   names it. SQLite itself is never put in exclusive locking mode: `vectorstep run`
//!   and the read commands keep working beside the server.
//! - `<database>.runs/<owner>.lock` is held by a `vectorstep run` process while it
//!   drives the runs it created (they carry `<owner>` in the store). Liveness is the
//!   lock, not the pid, which the system can hand to another process: a lock that can
//!   be taken belongs to an owner that died.
//!
//! The kernel drops a `flock` when its holder dies, SIGKILL included. A lock file is
//! removed by whoever holds its lock when done; every acquirer checks after locking
//! that the path still names the file it locked, so removing a file never lets two
//! processes believe they hold the same lock.

use std::fs::{File, OpenOptions};
use std::io::{Read, Seek, Write};
use std::os::unix::fs::MetadataExt;
use std::os::unix::io::AsRawFd;
use std::path::{Path, PathBuf};

/// Why a lock could not be taken or read.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("cannot use the lock file {path}: {source}{hint}", hint = disk_full_hint(.source))]
    Io {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error(
        "the store {store} is already used by another `vectorstep serve` ({holder}), \
         which holds the lock file {lock}; stop that process first, or give this one \
         another `database.path`"
    )]
    Held {
        store: PathBuf,
        lock: PathBuf,
        /// `pid N`, or `pid unknown` when the holder had not written it yet.
        holder: String,
    },
}

/// What to do when the lock file cannot be written because the disk is full.
fn disk_full_hint(e: &std::io::Error) -> &'static str {
    if e.raw_os_error() == Some(libc::ENOSPC) {
        "; the disk is full: free some space there and start again"
    } else {
        ""
    }
}

/// The sidecar file `serve` locks: `<database>.lock`.
pub fn serve_lock_path(database: &Path) -> PathBuf {
    with_suffix(database, ".lock")
}

/// The folder of `vectorstep run` owner locks: `<database>.runs`.
pub fn owner_lock_dir(database: &Path) -> PathBuf {
    with_suffix(database, ".runs")
}

/// The lock file of `owner`, if `owner` is a name this module could have made (it
/// is read back from the store, so it is never trusted to be a path).
pub fn owner_lock_path(database: &Path, owner: &str) -> Option<PathBuf> {
    let valid = owner.starts_with(OWNER_PREFIX)
        && owner.len() <= 64
        && owner.chars().all(|c| c.is_ascii_alphanumeric() || c == '-');
    valid.then(|| owner_lock_dir(database).join(format!("{owner}.lock")))
}

const OWNER_PREFIX: &str = "cli-";

/// An exclusive `flock` on a file, held until dropped. Dropping removes the file
/// (while still holding the lock) unless [`FileLock::keep_file`] was called.
#[derive(Debug)]
pub struct FileLock {
    file: File,
    path: PathBuf,
    remove: bool,
}

impl FileLock {
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Releases the lock on drop but leaves the file in place (a probe that only
    /// looked, such as `sweep --dry-run`).
    pub fn keep_file(mut self) {
        self.remove = false;
    }

    /// Replaces the file's content with `pid\n`.
    fn write_pid(&mut self) -> std::io::Result<()> {
        self.file.set_len(0)?;
        self.file.rewind()?;
        writeln!(self.file, "{}", std::process::id())?;
        self.file.flush()
    }
}

impl Drop for FileLock {
    fn drop(&mut self) {
        if self.remove {
            // Removed while locked: an acquirer that opened this file before the
            // removal finds, after locking, that the path no longer names it.
            let _ = std::fs::remove_file(&self.path);
        }
        // Closing the file releases the lock.
    }
}

/// What trying a lock found.
enum Attempt {
    Locked(FileLock),
    /// Another process holds it; its pid if the file records one.
    Held(Option<u32>),
    /// The file does not exist (only when not creating it).
    Missing,
}

/// Tries once (without waiting) to lock `path`, creating it if `create`.
fn try_lock(path: &Path, create: bool) -> Result<Attempt, Error> {
    let io = |source| Error::Io {
        path: path.to_path_buf(),
        source,
    };
    // A file replaced between open and lock is retried; a handful of rounds is
    // plenty, since only a holder that is finishing removes a file.
    for _ in 0..16 {
        let opened = OpenOptions::new()
            .read(true)
            .write(true)
            .create(create)
            .truncate(false)
            .open(path);
        let mut file = match opened {
            Ok(f) => f,
            Err(e) if !create && e.kind() == std::io::ErrorKind::NotFound => {
                return Ok(Attempt::Missing)
            }
            Err(e) => return Err(io(e)),
        };
        if !flock_exclusive(&file).map_err(io)? {
            let mut text = String::new();
            let _ = file.read_to_string(&mut text);
            return Ok(Attempt::Held(text.trim().parse().ok()));
        }
        let ours = file.metadata().map_err(io)?;
        match std::fs::metadata(path) {
            Ok(now) if now.dev() == ours.dev() && now.ino() == ours.ino() => {
                return Ok(Attempt::Locked(FileLock {
                    file,
                    path: path.to_path_buf(),
                    remove: true,
                }));
            }
            // Removed (or replaced) by its previous holder after we opened it.
            Ok(_) => continue,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
                if create {
                    continue;
                }
                return Ok(Attempt::Missing);
            }
            Err(e) => return Err(io(e)),
        }
    }
    Err(io(std::io::Error::other(
        "the lock file kept being replaced while it was being locked",
    )))
}

/// `flock(LOCK_EX | LOCK_NB)`: `Ok(false)` when another open file holds the lock.
fn flock_exclusive(file: &File) -> std::io::Result<bool> {
    loop {
        // SAFETY: `flock` on a descriptor this `File` owns and keeps open.
        let rc = unsafe { libc::flock(file.as_raw_fd(), libc::LOCK_EX | libc::LOCK_NB) };
        if rc == 0 {
            return Ok(true);
        }
        let err = std::io::Error::last_os_error();
        match err.raw_os_error() {
            Some(libc::EINTR) => continue,
            Some(code) if code == libc::EWOULDBLOCK || code == libc::EAGAIN => return Ok(false),
            _ => return Err(err),
        }
    }
}

fn with_suffix(path: &Path, suffix: &str) -> PathBuf {
    let mut s = path.as_os_str().to_os_string();
    s.push(suffix);
    PathBuf::from(s)
}

fn holder(pid: Option<u32>) -> String {
    match pid {
        Some(p) => format!("pid {p}"),
        None => "pid unknown".into(),
    }
}

/// The lock of the one `serve` of a SQLite store.
#[derive(Debug)]
pub struct ServeLock(FileLock);

impl ServeLock {
    /// Takes `<database>.lock` without waiting and records this process's pid in it,
    /// or says which process holds it. Creates the database's folder if needed.
    pub fn acquire(database: &Path) -> Result<ServeLock, Error> {
        let path = serve_lock_path(database);
        create_parent(&path)?;
        match try_lock(&path, true)? {
            Attempt::Locked(mut lock) => {
                lock.write_pid().map_err(|source| Error::Io {
                    path: path.clone(),
                    source,
                })?;
                Ok(ServeLock(lock))
            }
            Attempt::Held(pid) => Err(Error::Held {
                store: database.to_path_buf(),
                lock: path,
                holder: holder(pid),
            }),
            Attempt::Missing => Err(Error::Io {
                path,
                source: std::io::Error::from(std::io::ErrorKind::NotFound),
            }),
        }
    }

    pub fn path(&self) -> &Path {
        self.0.path()
    }
}

/// The lock a `vectorstep run` process holds for the runs it owns.
#[derive(Debug)]
pub struct OwnerLock {
    lock: FileLock,
    owner: String,
}

impl OwnerLock {
    /// Creates and locks a fresh `<database>.runs/cli-<id>.lock` recording this
    /// process's pid. Its name is what the store records as the runs' owner.
    pub fn acquire(database: &Path) -> Result<OwnerLock, Error> {
        let owner = format!("{OWNER_PREFIX}{}", uuid::Uuid::now_v7().simple());
        let Some(path) = owner_lock_path(database, &owner) else {
            return Err(Error::Io {
                path: owner_lock_dir(database),
                source: std::io::Error::other("invalid owner name"),
            });
        };
        create_parent(&path)?;
        match try_lock(&path, true)? {
            Attempt::Locked(mut lock) => {
                lock.write_pid().map_err(|source| Error::Io {
                    path: path.clone(),
                    source,
                })?;
                Ok(OwnerLock { lock, owner })
            }
            // A fresh random name: nobody else can hold it.
            Attempt::Held(pid) => Err(Error::Io {
                path,
                source: std::io::Error::other(format!("unexpectedly held by {}", holder(pid))),
            }),
            Attempt::Missing => Err(Error::Io {
                path,
                source: std::io::Error::from(std::io::ErrorKind::NotFound),
            }),
        }
    }

    /// The owner name recorded on the runs this process creates.
    pub fn owner(&self) -> &str {
        &self.owner
    }

    pub fn path(&self) -> &Path {
        self.lock.path()
    }
}

/// Whether the owner of some runs still lives.
#[derive(Debug)]
pub enum Probe {
    /// Its lock is held: leave its runs alone.
    Alive { pid: Option<u32>, lock: PathBuf },
    /// It died (or finished) without ending its runs. The lock, when the file was
    /// still there, is now held by the caller until it has adopted the runs;
    /// dropping it removes the file.
    Gone(Option<FileLock>),
}

/// Tries the lock of `owner` without waiting.
pub fn probe_owner(database: &Path, owner: &str) -> Result<Probe, Error> {
    let Some(path) = owner_lock_path(database, owner) else {
        // Not a name this build makes, so no live process can hold it.
        return Ok(Probe::Gone(None));
    };
    Ok(match try_lock(&path, false)? {
        Attempt::Locked(lock) => Probe::Gone(Some(lock)),
        Attempt::Missing => Probe::Gone(None),
        Attempt::Held(pid) => Probe::Alive { pid, lock: path },
    })
}

fn create_parent(path: &Path) -> Result<(), Error> {
    if let Some(dir) = path.parent().filter(|d| !d.as_os_str().is_empty()) {
        std::fs::create_dir_all(dir).map_err(|source| Error::Io {
            path: dir.to_path_buf(),
            source,
        })?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_second_serve_lock_names_the_first_holder() {
        let dir = tempfile::tempdir().unwrap();
        let db = dir.path().join("data").join("v.db");
        let first = ServeLock::acquire(&db).unwrap();
        let text = std::fs::read_to_string(serve_lock_path(&db)).unwrap();
        assert_eq!(text.trim(), std::process::id().to_string());
        // flock is per open file, so a second open in this process conflicts too.
        match ServeLock::acquire(&db) {
            Err(Error::Held { holder, lock, .. }) => {
                assert_eq!(holder, format!("pid {}", std::process::id()));
                assert_eq!(lock, serve_lock_path(&db));
            }
            other => panic!("expected Held, got {other:?}"),
        }
        drop(first);
        assert!(!serve_lock_path(&db).exists(), "the lock file is removed");
        ServeLock::acquire(&db).unwrap();
    }

    #[test]
    fn an_owner_is_alive_while_its_lock_is_held() {
        let dir = tempfile::tempdir().unwrap();
        let db = dir.path().join("v.db");
        let lock = OwnerLock::acquire(&db).unwrap();
        let owner = lock.owner().to_string();
        assert!(matches!(
            probe_owner(&db, &owner).unwrap(),
            Probe::Alive { pid: Some(p), .. } if p == std::process::id()
        ));
        drop(lock);
        assert!(matches!(
            probe_owner(&db, &owner).unwrap(),
            Probe::Gone(None)
        ));
    }

    #[test]
    fn owner_names_from_the_store_are_never_paths() {
        let db = Path::new("/tmp/v.db");
        for bad in ["../../etc/passwd", "cli-../x", "other-1", "", "cli-a/b"] {
            assert_eq!(owner_lock_path(db, bad), None, "{bad}");
            assert!(matches!(probe_owner(db, bad).unwrap(), Probe::Gone(None)));
        }
        assert!(owner_lock_path(db, "cli-0190abcd").is_some());
    }
}
