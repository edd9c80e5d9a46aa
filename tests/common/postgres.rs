//! A real, throwaway PostgreSQL server for the tests: `initdb` in a temporary
//! folder, listening on 127.0.0.1 and a free port (and a socket in that folder, so
//! nothing under /var/run is needed), with fsync on as in production.
//!
//! The server binaries come from the machine (`/usr/lib/postgresql/<version>/bin`,
//! Debian package `postgresql`; `bash tests/run.sh` installs it when it is missing).
//! Without them a test that needs PostgreSQL fails and names the install command: it
//! never skips. `initdb` refuses to run as root, so as root the server runs as the
//! `postgres` user the package creates.
//!
//! [`Postgres::shared`] is one server per test binary (each test takes its own
//! database from it, [`Postgres::database`]); [`Postgres::start`] is a server of the
//! test's own, for tests that stop and restart it. The server is started from a
//! thread that lives as long as the test process and dies with it
//! (`PR_SET_PDEATHSIG`), so a test binary that ends or is killed leaves no server
//! behind; [`Postgres::start`]'s server is also stopped when dropped.

use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::{mpsc, Mutex, OnceLock};
use std::time::{Duration, Instant};

/// The exact command that installs what these tests need.
pub const INSTALL: &str = "apt-get install -y postgresql";

/// The server binaries of the newest PostgreSQL installed, or a failure naming the
/// install command.
pub fn bin_dir() -> PathBuf {
    let mut found: Vec<(u32, PathBuf)> = std::fs::read_dir("/usr/lib/postgresql")
        .into_iter()
        .flatten()
        .flatten()
        .filter_map(|e| {
            let version = e.file_name().to_str()?.parse::<u32>().ok()?;
            let bin = e.path().join("bin");
            bin.join("initdb").exists().then_some((version, bin))
        })
        .collect();
    found.sort();
    match found.pop() {
        Some((_, bin)) => bin,
        None => panic!(
            "this test needs a PostgreSQL server and none is installed \
             (no /usr/lib/postgresql/*/bin/initdb); install it with: {INSTALL} \
             (or run `bash tests/run.sh`, which installs it when missing)"
        ),
    }
}

/// The user the server runs as: `postgres` when the tests run as root (initdb
/// refuses root), else the current user.
fn server_user() -> Option<(u32, u32)> {
    // SAFETY: getuid has no preconditions.
    if unsafe { libc::getuid() } != 0 {
        return None;
    }
    let out = Command::new("id").arg("-u").arg("postgres").output().ok()?;
    let uid = String::from_utf8_lossy(&out.stdout).trim().parse().ok();
    let out = Command::new("id").arg("-g").arg("postgres").output().ok()?;
    let gid = String::from_utf8_lossy(&out.stdout).trim().parse().ok();
    match (uid, gid) {
        (Some(u), Some(g)) => Some((u, g)),
        _ => panic!(
            "running as root, PostgreSQL needs the `postgres` user, which does not exist; \
             install the server with: {INSTALL}"
        ),
    }
}

/// Removes the data folders of test processes that have ended (a shared server's
/// folder outlives its process: statics are never dropped).
fn remove_stale_servers() {
    let Ok(entries) = std::fs::read_dir(std::env::temp_dir()) else {
        return;
    };
    for e in entries.flatten() {
        let name = e.file_name();
        let Some(pid) = name
            .to_str()
            .and_then(|n| n.strip_prefix("vs-pg-"))
            .and_then(|n| n.split('-').next())
            .and_then(|p| p.parse::<i32>().ok())
        else {
            continue;
        };
        // SAFETY: signal 0 only asks whether the process exists.
        let alive = unsafe { libc::kill(pid, 0) } == 0;
        if !alive {
            let _ = std::fs::remove_dir_all(e.path());
        }
    }
}

fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .map(|a| a.port())
        .expect("a free port")
}

/// A running PostgreSQL server.
pub struct Postgres {
    bin: PathBuf,
    data: PathBuf,
    port: u16,
    user: Option<(u32, u32)>,
    /// The postmaster, started by the keeper thread (see [`keeper`]).
    child: Mutex<Option<Child>>,
    own: bool,
}

impl Postgres {
    /// The server shared by every test of this binary.
    pub fn shared() -> &'static Postgres {
        static SHARED: OnceLock<Postgres> = OnceLock::new();
        SHARED.get_or_init(|| Postgres::boot(false))
    }

    /// A server of this test's own, stopped when dropped.
    pub fn start() -> Postgres {
        Postgres::boot(true)
    }

    fn boot(own: bool) -> Postgres {
        let bin = bin_dir();
        let user = server_user();
        remove_stale_servers();
        static N: AtomicU32 = AtomicU32::new(0);
        let data = std::env::temp_dir().join(format!(
            "vs-pg-{}-{}",
            std::process::id(),
            N.fetch_add(1, Ordering::SeqCst)
        ));
        let _ = std::fs::remove_dir_all(&data);
        std::fs::create_dir_all(&data).expect("create the data folder");
        if let Some((uid, gid)) = user {
            std::os::unix::fs::chown(&data, Some(uid), Some(gid)).expect("chown the data folder");
        }
        let pg = Postgres {
            bin,
            data,
            port: free_port(),
            user,
            child: Mutex::new(None),
            own,
        };
        let out = pg
            .command("initdb")
            .args(["-D"])
            .arg(pg.data.join("db"))
            .args(["-U", "postgres", "--auth=trust", "-E", "UTF8", "--no-sync"])
            .output()
            .expect("run initdb");
        assert!(
            out.status.success(),
            "initdb failed: {}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
        pg.run_server();
        pg
    }

    /// A command of the server's binaries, run as the server's user.
    fn command(&self, name: &str) -> Command {
        let mut c = Command::new(self.bin.join(name));
        c.current_dir(&self.data);
        if let Some((uid, gid)) = self.user {
            c.uid(uid).gid(gid);
        }
        c
    }

    /// Starts the postmaster (from the keeper thread) and waits until it answers.
    fn run_server(&self) {
        let mut cmd = self.command("postgres");
        cmd.arg("-D")
            .arg(self.data.join("db"))
            .args(["-p", &self.port.to_string(), "-k"])
            .arg(&self.data)
            .args(["-c", "listen_addresses=127.0.0.1", "-c", "fsync=on"])
            .args(["-c", "max_connections=200"])
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(
                std::fs::File::create(self.data.join("server.log"))
                    .map(Stdio::from)
                    .unwrap_or_else(|_| Stdio::null()),
            );
        *self.child.lock().expect("child") = Some(keeper().spawn(cmd));
        let t = Instant::now();
        loop {
            let url = self.url("postgres");
            // Off any tokio worker: see `postgres_client`.
            let up = std::thread::scope(|s| s.spawn(|| postgres_client(&url).is_ok()).join());
            if up.unwrap_or(false) {
                return;
            }
            assert!(
                t.elapsed() < Duration::from_secs(30),
                "PostgreSQL did not accept connections within 30 s; its log:\n{}",
                self.log()
            );
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    pub fn port(&self) -> u16 {
        self.port
    }

    /// The connection URL of database `db`.
    pub fn url(&self, db: &str) -> String {
        format!("postgres://postgres@127.0.0.1:{}/{db}", self.port)
    }

    /// A new, empty database for one test; its URL.
    pub fn database(&self) -> String {
        static N: AtomicU32 = AtomicU32::new(0);
        let name = format!(
            "t{}_{}",
            std::process::id(),
            N.fetch_add(1, Ordering::SeqCst)
        );
        let admin = self.url("postgres");
        // On a thread of its own: the synchronous client starts a runtime per call,
        // which tokio refuses on a test's async worker.
        std::thread::scope(|s| {
            s.spawn(|| {
                let mut c = postgres_client(&admin).expect("connect to postgres");
                c.batch_execute(&format!("CREATE DATABASE {name}"))
                    .expect("create database");
            })
            .join()
            .expect("create the database");
        });
        self.url(&name)
    }

    /// Stops the server at once, as a crash would (`pg_ctl -m immediate stop`).
    pub fn stop_immediate(&self) {
        let out = self
            .command("pg_ctl")
            .arg("-D")
            .arg(self.data.join("db"))
            .args(["-m", "immediate", "-w", "stop"])
            .output()
            .expect("run pg_ctl");
        assert!(
            out.status.success(),
            "pg_ctl stop: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        if let Some(mut c) = self.child.lock().expect("child").take() {
            let _ = c.wait();
        }
    }

    /// Starts it again on the same data and port, after [`Postgres::stop_immediate`].
    pub fn restart(&self) {
        self.run_server();
    }

    pub fn log(&self) -> String {
        std::fs::read_to_string(self.data.join("server.log")).unwrap_or_default()
    }
}

impl Drop for Postgres {
    fn drop(&mut self) {
        if !self.own {
            return;
        }
        if let Some(mut c) = self.child.lock().map(|mut c| c.take()).ok().flatten() {
            // SIGQUIT is PostgreSQL's immediate shutdown; its backends follow.
            // SAFETY: kill with a pid this process spawned.
            unsafe { libc::kill(c.id() as i32, libc::SIGQUIT) };
            let _ = c.wait();
        }
        let _ = std::fs::remove_dir_all(&self.data);
    }
}

/// A synchronous client for `url` (for set-up and for reading what the server holds).
/// It starts a runtime per call, so it must not be used on a tokio worker (async
/// tests read through `vectorstep::store::Store` instead).
pub fn postgres_client(url: &str) -> Result<postgres::Client, postgres::Error> {
    postgres::Client::connect(url, postgres::NoTls)
}

/// One thread that lives as long as the test process spawns every server:
/// `PR_SET_PDEATHSIG` fires when the thread that forked the child ends, so a test's
/// own thread (which ends with the test) must not be that parent.
struct Keeper {
    requests: Mutex<mpsc::Sender<(Command, mpsc::Sender<Child>)>>,
}

impl Keeper {
    fn spawn(&self, cmd: Command) -> Child {
        let (tx, rx) = mpsc::channel();
        self.requests
            .lock()
            .expect("keeper")
            .send((cmd, tx))
            .expect("the keeper thread lives");
        rx.recv().expect("the keeper spawned the server")
    }
}

fn keeper() -> &'static Keeper {
    static KEEPER: OnceLock<Keeper> = OnceLock::new();
    KEEPER.get_or_init(|| {
        let (tx, rx) = mpsc::channel::<(Command, mpsc::Sender<Child>)>();
        std::thread::spawn(move || {
            for (mut cmd, reply) in rx {
                // SAFETY: prctl is async-signal-safe; nothing else runs in the child
                // between fork and exec.
                unsafe {
                    cmd.pre_exec(|| {
                        libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGQUIT);
                        Ok(())
                    });
                }
                let child = cmd.spawn().expect("start postgres");
                let _ = reply.send(child);
            }
            // The senders are static: this loop ends only with the process.
        });
        Keeper {
            requests: Mutex::new(tx),
        }
    })
}

/// Whether `path` holds a PostgreSQL data folder (for tests that look at one).
pub fn is_data_dir(path: &Path) -> bool {
    path.join("PG_VERSION").exists()
}
