//! The HTTP server's limits against slow and idle clients, on the real binary:
//! 1,100 connections that send one header byte every 5 s to a server whose
//! open-files limit is 1024 (soft and hard) do not keep `/healthz` from answering,
//! and the server closes them by its header timeout; a body that never arrives
//! whole is cut off by the body timeout; an idle keep-alive connection is closed.

use std::io::{BufRead, BufReader};
use std::os::unix::process::CommandExt;
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

struct Server {
    child: Child,
    port: u16,
    _dir: tempfile::TempDir,
}

impl Drop for Server {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// `vectorstep serve` with `server_extra` config and, when given, this open-files
/// limit (soft and hard) applied to the child before it starts.
fn start(server_extra: &str, open_files: Option<u64>) -> Server {
    let dir = tempfile::tempdir().unwrap();
    std::fs::create_dir_all(dir.path().join("pipelines")).unwrap();
    std::fs::write(
        dir.path().join("config.yaml"),
        format!(
            "server: {{host: 127.0.0.1, port: 0{server_extra}}}\ndatabase: {{path: ./data/v.db}}\n\
             logging: {{level: warn}}\n"
        ),
    )
    .unwrap();
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_vectorstep"));
    cmd.current_dir(dir.path())
        .arg("serve")
        .env_remove("VECTORSTEP_CONFIG")
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::null());
    if let Some(n) = open_files {
        // SAFETY: only setrlimit runs between fork and exec.
        unsafe {
            cmd.pre_exec(move || {
                let lim = libc::rlimit {
                    rlim_cur: n,
                    rlim_max: n,
                };
                if libc::setrlimit(libc::RLIMIT_NOFILE, &lim) != 0 {
                    return Err(std::io::Error::last_os_error());
                }
                Ok(())
            });
        }
    }
    let mut child = cmd.spawn().expect("vectorstep starts");
    let stdout = child.stdout.take().unwrap();
    let mut port = None;
    for line in BufReader::new(stdout).lines().map_while(Result::ok) {
        if let Some(addr) = line.strip_prefix("vectorstep listening on http://") {
            port = addr.rsplit(':').next().and_then(|p| p.parse().ok());
            break;
        }
    }
    let port = port.expect("the server printed its address");
    Server {
        child,
        port,
        _dir: dir,
    }
}

/// Lets this test process hold more than 1,100 sockets (root may raise the hard limit).
fn allow_many_files(n: u64) {
    unsafe {
        let mut lim = libc::rlimit {
            rlim_cur: 0,
            rlim_max: 0,
        };
        assert_eq!(libc::getrlimit(libc::RLIMIT_NOFILE, &mut lim), 0);
        let want = libc::rlimit {
            rlim_cur: n.max(lim.rlim_cur),
            rlim_max: n.max(lim.rlim_max),
        };
        assert_eq!(
            libc::setrlimit(libc::RLIMIT_NOFILE, &want),
            0,
            "this test needs {n} open files (run as root, or raise `ulimit -Hn`)"
        );
    }
}

async fn healthz(port: u16) -> Result<u16, String> {
    let client = reqwest::Client::builder()
        .timeout(Duration::from_secs(5))
        .pool_max_idle_per_host(0)
        .build()
        .unwrap();
    client
        .get(format!("http://127.0.0.1:{port}/healthz"))
        .send()
        .await
        .map(|r| r.status().as_u16())
        .map_err(|e| e.to_string())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn slow_clients_at_the_open_files_limit_do_not_lock_out_health_checks() {
    allow_many_files(4096);
    let server = start(", header_read_timeout_seconds: 3", Some(1024));
    let port = server.port;
    assert_eq!(healthz(port).await, Ok(200));

    const SLOW: usize = 1_100;
    let opened = Arc::new(AtomicUsize::new(0));
    let closed = Arc::new(AtomicUsize::new(0));
    let started = Instant::now();
    let mut slow = Vec::new();
    for _ in 0..SLOW {
        let (opened, closed) = (opened.clone(), closed.clone());
        slow.push(tokio::spawn(async move {
            let Ok(Ok(mut s)) = tokio::time::timeout(
                Duration::from_secs(3),
                TcpStream::connect(("127.0.0.1", port)),
            )
            .await
            else {
                return;
            };
            opened.fetch_add(1, Ordering::SeqCst);
            let header = b"GET /healthz HTTP/1.1\r\nHost: x\r\n";
            let mut buf = [0u8; 64];
            for byte in header.iter().cycle() {
                if s.write_all(&[*byte]).await.is_err() {
                    break;
                }
                // One byte every 5 s, watching for the server closing the connection.
                match tokio::time::timeout(Duration::from_secs(5), s.read(&mut buf)).await {
                    Ok(Ok(0)) | Ok(Err(_)) => break,
                    Ok(Ok(_)) => break, // an answer (e.g. 408) also ends it
                    Err(_) => {}
                }
                if started.elapsed() > Duration::from_secs(60) {
                    return; // never closed: counted as open below
                }
            }
            closed.fetch_add(1, Ordering::SeqCst);
        }));
    }

    // Health checks keep answering, each within 5 s, while the slow clients hold on.
    let mut checks = 0;
    while started.elapsed() < Duration::from_secs(12) {
        let t = Instant::now();
        let answer = healthz(port).await;
        assert_eq!(
            answer,
            Ok(200),
            "/healthz after {:?} with {} slow connections open (took {:?})",
            started.elapsed(),
            opened.load(Ordering::SeqCst) - closed.load(Ordering::SeqCst),
            t.elapsed()
        );
        checks += 1;
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
    assert!(checks >= 10, "{checks} health checks");
    for t in slow {
        let _ = t.await;
    }
    let (opened, closed) = (opened.load(Ordering::SeqCst), closed.load(Ordering::SeqCst));
    assert!(
        opened >= 1_000,
        "only {opened} of {SLOW} slow connections were opened"
    );
    assert_eq!(closed, opened, "the server closed every slow connection");
}

#[tokio::test]
async fn a_body_that_never_arrives_whole_is_cut_off() {
    let server = start(", body_read_timeout_seconds: 1", None);
    let mut s = TcpStream::connect(("127.0.0.1", server.port))
        .await
        .unwrap();
    s.write_all(
        b"POST /webhook?source=generic HTTP/1.1\r\nHost: x\r\ncontent-type: application/json\r\ncontent-length: 100\r\n\r\n{\"pipe",
    )
    .await
    .unwrap();
    let mut answer = Vec::new();
    let read = tokio::time::timeout(Duration::from_secs(10), s.read_to_end(&mut answer)).await;
    assert!(
        read.is_ok(),
        "the server neither answered nor closed within 10 s"
    );
    let text = String::from_utf8_lossy(&answer);
    assert!(
        text.is_empty() || text.starts_with("HTTP/1.1 4"),
        "a 4xx or a closed connection, got: {text}"
    );
}

#[tokio::test]
async fn an_idle_keep_alive_connection_is_closed() {
    let server = start(", idle_timeout_seconds: 1", None);
    let mut s = TcpStream::connect(("127.0.0.1", server.port))
        .await
        .unwrap();
    s.write_all(b"GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n")
        .await
        .unwrap();
    let mut buf = vec![0u8; 4096];
    let n = s.read(&mut buf).await.unwrap();
    assert!(String::from_utf8_lossy(&buf[..n]).starts_with("HTTP/1.1 200"));
    let t = Instant::now();
    let end = tokio::time::timeout(Duration::from_secs(10), s.read(&mut buf)).await;
    assert!(
        matches!(end, Ok(Ok(0)) | Ok(Err(_))),
        "the idle connection was closed: {end:?} after {:?}",
        t.elapsed()
    );
}
