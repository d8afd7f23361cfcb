//! The metrics server out of descriptors: a real `EMFILE` at accept, in a child process
//! of this test binary whose descriptor limit is lowered (`ulimit -n`, through `sh`) and
//! whose descriptor table is then filled. A client's connection waits in the backlog,
//! unanswered; the server neither spins a core on it (the accept error backs off) nor
//! dies, and once descriptors are free again it answers that very connection and the
//! next ones.
//!
//! Spinning is judged by the child's own threads' scheduler account
//! (`/proc/<pid>/task/*/schedstat`: time running plus time waiting to run), not by CPU
//! time: a spinning thread is runnable all the time however busy the machine is, and a
//! backing-off one almost never.

use std::io::{BufRead, BufReader, Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::process::{Command, Stdio};
use std::sync::Arc;
use std::time::{Duration, Instant};

use hyper::{Method, Response};
use tokio::sync::watch;
use vgpu_node_agent::http::{self, Handler};

/// Set in the child's environment: it runs the server instead of the test.
const CHILD: &str = "VGPU_ACCEPT_BACKOFF_CHILD";
/// This test's name, for the child's `--exact`.
const TEST: &str = "an_accept_error_backs_off_and_serving_resumes_when_descriptors_are_free";
/// The child's descriptor limit.
const DESCRIPTORS: u32 = 64;
/// How long the child's threads are watched while the connection waits.
const WINDOW: Duration = Duration::from_millis(1500);

/// The child: serves `/healthz` with everything but its descriptors, then fills its
/// descriptor table until `EMFILE`, says so on stdout (`FULL <address> <held>`), and
/// gives the descriptors back when stdin says `free`. Exits when stdin closes.
fn child() -> ! {
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("runtime");
    // Stdin is read on a thread started before the table is full.
    let (said, mut told) = tokio::sync::mpsc::unbounded_channel::<String>();
    std::thread::spawn(move || {
        for line in std::io::stdin().lock().lines() {
            let Ok(line) = line else { break };
            if said.send(line).is_err() {
                break;
            }
        }
    });
    runtime.block_on(async move {
        let handler: Handler =
            Arc::new(|_: Method, _: String| Box::pin(async { Response::new("ok\n".to_string()) }));
        let (_stop, stop) = watch::channel(false);
        let (address, _server) =
            http::bind_and_serve(SocketAddr::from(([127, 0, 0, 1], 0)), handler, stop)
                .await
                .expect("bind");
        let mut held = Vec::new();
        let error = loop {
            match std::fs::File::open("/dev/null") {
                Ok(file) => held.push(file),
                Err(err) => break err,
            }
        };
        assert_eq!(error.raw_os_error(), Some(libc::EMFILE), "{error}");
        println!("FULL {address} {}", held.len());
        while let Some(line) = told.recv().await {
            if line == "free" {
                held.clear();
                println!("FREED");
            }
        }
    });
    std::process::exit(0)
}

/// Nanoseconds the threads of `pid` have been running or waiting to run.
fn runnable_ns(pid: u32) -> u64 {
    let tasks = std::fs::read_dir(format!("/proc/{pid}/task")).expect("tasks");
    let accounts: Vec<u64> = tasks
        .filter_map(|task| std::fs::read_to_string(task.ok()?.path().join("schedstat")).ok())
        .map(|line| {
            line.split_whitespace()
                .take(2)
                .filter_map(|field| field.parse::<u64>().ok())
                .sum::<u64>()
        })
        .collect();
    // A kernel without the account would pass a spinning server: not judged blind.
    assert!(!accounts.is_empty(), "no /proc/{pid}/task/*/schedstat");
    accounts.iter().sum()
}

fn request(stream: &mut TcpStream) {
    stream
        .write_all(b"GET /healthz HTTP/1.1\r\nHost: node\r\nConnection: close\r\n\r\n")
        .expect("request");
}

fn answer(stream: &mut TcpStream, within: Duration) -> std::io::Result<String> {
    stream.set_read_timeout(Some(within))?;
    let mut text = String::new();
    stream.read_to_string(&mut text)?;
    Ok(text)
}

#[test]
fn an_accept_error_backs_off_and_serving_resumes_when_descriptors_are_free() {
    if std::env::var_os(CHILD).is_some() {
        child();
    }
    let exe = std::env::current_exe().expect("this test binary");
    let mut server = Command::new("sh")
        .arg("-c")
        .arg(format!("ulimit -n {DESCRIPTORS} && exec \"$0\" \"$@\""))
        .arg(&exe)
        .args(["--exact", TEST, "--nocapture", "--test-threads", "1"])
        .env(CHILD, "1")
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit())
        .spawn()
        .expect("child");
    let pid = server.id();
    let mut out = BufReader::new(server.stdout.take().expect("stdout"));
    let mut line = String::new();
    let (address, held) = loop {
        line.clear();
        if out.read_line(&mut line).expect("child's stdout") == 0 {
            panic!("the child ended before its descriptor table was full");
        }
        // The harness's `test NAME ... ` opens the line the child's first print ends.
        if let Some((_, rest)) = line.trim().split_once("FULL ") {
            let (address, held) = rest.split_once(' ').expect("FULL address held");
            break (
                address.parse::<SocketAddr>().expect("address"),
                held.parse::<usize>().expect("held"),
            );
        }
    };
    assert!(held > 0, "the child filled its table");

    // The handshake completes in the kernel's backlog; accept(2) fails with EMFILE.
    let mut waiting = TcpStream::connect(address).expect("connect");
    request(&mut waiting);
    std::thread::sleep(Duration::from_millis(200));
    let before = runnable_ns(pid);
    let started = Instant::now();
    std::thread::sleep(WINDOW);
    let runnable = runnable_ns(pid) - before;
    let watched = started.elapsed();
    assert!(
        server.try_wait().expect("child").is_none(),
        "the server died out of descriptors"
    );
    assert!(
        runnable < watched.as_nanos() as u64 * 3 / 10,
        "the server's threads were runnable {:.0} ms of {:.0} ms: it spins on the accept error",
        runnable as f64 / 1e6,
        watched.as_secs_f64() * 1e3
    );
    let early = answer(&mut waiting, Duration::from_millis(100));
    assert!(
        early.is_err(),
        "answered while out of descriptors (no EMFILE reached): {early:?}"
    );

    // Descriptors free again: that connection is served, and the next ones.
    let mut stdin = server.stdin.take().expect("stdin");
    writeln!(stdin, "free").expect("tell the child");
    let freed = Instant::now();
    let text = answer(&mut waiting, Duration::from_secs(10)).expect("the waiting connection");
    assert!(text.starts_with("HTTP/1.1 200"), "{text}");
    assert!(text.ends_with("ok\n"), "{text}");
    eprintln!(
        "out of descriptors: threads runnable {:.1} ms of {:.0} ms; served {:.0} ms after they were freed",
        runnable as f64 / 1e6,
        watched.as_secs_f64() * 1e3,
        freed.elapsed().as_secs_f64() * 1e3
    );
    let mut next = TcpStream::connect(address).expect("connect");
    request(&mut next);
    let text = answer(&mut next, Duration::from_secs(10)).expect("the next connection");
    assert!(text.starts_with("HTTP/1.1 200"), "{text}");

    drop(stdin);
    let status = server.wait().expect("child");
    assert!(status.success(), "{status}");
}
