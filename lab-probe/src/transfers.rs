//! The transfers client: short TCP transfers back to back, each on a new connection, as a
//! browser's or an API client's fetches are, and how long each took to complete:
//!
//! ```text
//! LAB-PROBE transfers 10.1.1.2 port 5199: 1000 downloads of 10240-102400 bytes, 1 at a time, for at most 60 s
//! [1795394521.508878] transfer 0: 54321 bytes in 123.456 ms
//! [1795394521.900112] transfer 1: 20480 bytes failed after 30000.000 ms: timed out
//! [1795394522.000001] transfer 2: 77777 bytes unfinished after 99.517 ms
//! ...
//! --- 10.1.1.2 transfers statistics ---
//! 1000 transfers started, 998 completed, 1 failed, 1 unfinished
//! ```
//!
//! A transfer's time runs from the start of connect() (the handshake is part of what a short
//! transfer costs) to its last byte: read by the client for a download, confirmed by the server
//! for an upload. The time in brackets is the wall clock when it ended. One that errs or
//! outlasts its timeout has failed; one still running when the duration ends is unfinished
//! (cut off, neither a success nor a failure). Workers take transfer numbers from one counter,
//! and a transfer's size depends on its number only (see `sizes`).

use std::{
    io::{self, Read, Write},
    net::{SocketAddr, TcpStream},
    sync::atomic::{AtomicU64, Ordering},
    thread,
    time::{Duration, Instant, SystemTime},
};

use crate::{
    sizes::Sizes,
    tcpinfo::report_rtos,
    wire::{DONE, Transfer},
};

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Direction {
    /// The server sends.
    Download,
    /// The client sends.
    Upload,
}

impl Direction {
    fn transfer(self, bytes: u64) -> Transfer {
        match self {
            Direction::Download => Transfer::Download(bytes),
            Direction::Upload => Transfer::Upload(bytes),
        }
    }

    fn plural(self) -> &'static str {
        match self {
            Direction::Download => "downloads",
            Direction::Upload => "uploads",
        }
    }
}

#[derive(Debug)]
pub struct Config {
    pub server: SocketAddr,
    pub direction: Direction,
    pub count: u64,
    pub sizes: Sizes,
    /// Transfers at once.
    pub concurrency: u32,
    /// No transfer starts after this, and those still running then are cut off.
    pub duration: Duration,
    /// A transfer taking longer has failed.
    pub timeout: Duration,
}

/// What a run did, as its closing line says.
#[derive(Debug, Default, PartialEq, Eq)]
pub struct Summary {
    pub started: u64,
    pub completed: u64,
    pub failed: u64,
    pub unfinished: u64,
}

enum Outcome {
    Completed,
    Failed(io::Error),
    Unfinished,
}

pub fn run(c: &Config) -> Summary {
    println!(
        "LAB-PROBE transfers {} port {}: {} {} of {}-{} bytes, {} at a time, for at most {} s",
        c.server.ip(),
        c.server.port(),
        c.count,
        c.direction.plural(),
        c.sizes.min,
        c.sizes.max,
        c.concurrency,
        c.duration.as_secs_f64()
    );
    let end = Instant::now() + c.duration;
    let next = AtomicU64::new(0);
    let tallies: Vec<Summary> = thread::scope(|scope| {
        let workers: Vec<_> = (0..c.concurrency)
            .map(|_| scope.spawn(|| worker(c, &next, end)))
            .collect();
        // A worker cannot panic short of a bug; its tally is then lost, not the others'.
        workers.into_iter().filter_map(|w| w.join().ok()).collect()
    });
    let mut total = Summary::default();
    for t in tallies {
        total.started += t.started;
        total.completed += t.completed;
        total.failed += t.failed;
        total.unfinished += t.unfinished;
    }
    println!(
        "\n--- {} transfers statistics ---\n{} transfers started, {} completed, {} failed, {} unfinished",
        c.server.ip(),
        total.started,
        total.completed,
        total.failed,
        total.unfinished
    );
    total
}

/// Transfers one after the other until the count is reached or the duration is over.
fn worker(c: &Config, next: &AtomicU64, end: Instant) -> Summary {
    let mut tally = Summary::default();
    let mut buf = vec![0u8; 64 * 1024];
    while Instant::now() < end {
        let i = next.fetch_add(1, Ordering::Relaxed);
        if i >= c.count {
            break;
        }
        let bytes = c.sizes.nth(i);
        let start = Instant::now();
        let deadline = (start + c.timeout).min(end);
        let outcome = match transfer(c.server, c.direction.transfer(bytes), deadline, &mut buf) {
            Ok(()) => Outcome::Completed,
            // Cut off by the end of the run rather than by its own timeout.
            Err(_) if Instant::now() >= end && start + c.timeout > end => Outcome::Unfinished,
            Err(e) => Outcome::Failed(e),
        };
        let ms = start.elapsed().as_secs_f64() * 1e3;
        tally.started += 1;
        let what = match outcome {
            Outcome::Completed => {
                tally.completed += 1;
                format!("in {ms:.3} ms")
            }
            Outcome::Failed(e) => {
                tally.failed += 1;
                let e = if is_timeout(&e) {
                    "timed out".to_string()
                } else {
                    e.to_string()
                };
                format!("failed after {ms:.3} ms: {e}")
            }
            Outcome::Unfinished => {
                tally.unfinished += 1;
                format!("unfinished after {ms:.3} ms")
            }
        };
        let wall = SystemTime::now()
            .duration_since(SystemTime::UNIX_EPOCH)
            .unwrap_or_default();
        // println! holds stdout's lock for the line, so workers' lines do not interleave.
        println!(
            "[{}.{:06}] transfer {i}: {bytes} bytes {what}",
            wall.as_secs(),
            wall.subsec_micros()
        );
    }
    tally
}

fn is_timeout(e: &io::Error) -> bool {
    matches!(
        e.kind(),
        io::ErrorKind::TimedOut | io::ErrorKind::WouldBlock
    )
}

/// The time left before `deadline`, or a timeout error once it has passed (a zero socket
/// timeout would mean none at all).
fn left(deadline: Instant) -> io::Result<Duration> {
    let d = deadline.saturating_duration_since(Instant::now());
    if d.is_zero() {
        Err(io::ErrorKind::TimedOut.into())
    } else {
        Ok(d)
    }
}

/// One transfer on a new connection, done by `deadline`.
fn transfer(server: SocketAddr, t: Transfer, deadline: Instant, buf: &mut [u8]) -> io::Result<()> {
    let mut s = TcpStream::connect_timeout(&server, left(deadline)?)?;
    s.set_nodelay(true)?;
    s.set_write_timeout(Some(left(deadline)?))?;
    s.write_all(t.line().as_bytes())?;
    let n = t.bytes();
    match t {
        Transfer::Download(_) => {
            let mut got = 0u64;
            while got < n {
                s.set_read_timeout(Some(left(deadline)?))?;
                let want = (n - got).min(buf.len() as u64) as usize;
                match s.read(&mut buf[..want]) {
                    Ok(0) => {
                        return Err(io::Error::new(
                            io::ErrorKind::UnexpectedEof,
                            format!("the server closed after {got} of {n} bytes"),
                        ));
                    }
                    Ok(k) => got += k as u64,
                    Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                    Err(e) => return Err(e),
                }
            }
        }
        Transfer::Upload(_) => {
            buf.fill(0);
            let mut sent = 0u64;
            while sent < n {
                s.set_write_timeout(Some(left(deadline)?))?;
                let k = (n - sent).min(buf.len() as u64) as usize;
                s.write_all(&buf[..k])?;
                sent += k as u64;
            }
            s.set_read_timeout(Some(left(deadline)?))?;
            let mut done = [0u8; 1];
            s.read_exact(&mut done).map_err(|e| {
                if e.kind() == io::ErrorKind::UnexpectedEof {
                    io::Error::new(e.kind(), "the server closed without confirming the upload")
                } else {
                    e
                }
            })?;
            if done[0] != DONE {
                return Err(io::Error::new(
                    io::ErrorKind::InvalidData,
                    "the server's confirmation was not the expected byte",
                ));
            }
            // This side sent the data: its timeouts are the transfer's (the server reports a
            // download's the same way).
            report_rtos(&s, server.ip())?;
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use std::net::Ipv4Addr;

    use super::*;

    /// Downloads and uploads against the server on loopback: every transfer completes, and a
    /// count larger than the duration allows stops at the duration.
    #[test]
    fn transfers_over_loopback() {
        let (echo, port) = (crate::server::free_port(), crate::server::free_port());
        thread::spawn(move || crate::server::run(echo, Some(port)));
        let server: SocketAddr = (Ipv4Addr::LOCALHOST, port).into();
        for _ in 0..100 {
            if TcpStream::connect(server).is_ok() {
                break;
            }
            thread::sleep(Duration::from_millis(10));
        }
        for direction in [Direction::Download, Direction::Upload] {
            let s = run(&Config {
                server,
                direction,
                count: 20,
                sizes: Sizes {
                    min: 1,
                    max: 200_000,
                    seed: 1,
                },
                concurrency: 3,
                duration: Duration::from_secs(20),
                timeout: Duration::from_secs(10),
            });
            assert_eq!(
                s,
                Summary {
                    started: 20,
                    completed: 20,
                    failed: 0,
                    unfinished: 0
                },
                "{direction:?}"
            );
        }
        let s = run(&Config {
            server,
            direction: Direction::Download,
            count: u64::MAX,
            sizes: Sizes {
                min: 1000,
                max: 1000,
                seed: 1,
            },
            concurrency: 1,
            duration: Duration::from_millis(200),
            timeout: Duration::from_secs(10),
        });
        assert!(s.completed > 0 && s.failed == 0, "{s:?}");
        // Nobody answers on port 1: a failure, reported, not a stop.
        let s = run(&Config {
            server: (Ipv4Addr::LOCALHOST, 1).into(),
            direction: Direction::Download,
            count: 2,
            sizes: Sizes {
                min: 10,
                max: 10,
                seed: 1,
            },
            concurrency: 1,
            duration: Duration::from_secs(5),
            timeout: Duration::from_secs(1),
        });
        assert_eq!((s.started, s.failed), (2, 2));
        // A server that accepts (the kernel does, from the backlog) but never answers: cut off
        // by the end of the run, or failed by the transfer's own timeout, whichever comes first.
        let mute = std::net::TcpListener::bind((Ipv4Addr::LOCALHOST, 0)).unwrap();
        let silent = |duration: u64, timeout: u64| {
            run(&Config {
                server: mute.local_addr().unwrap(),
                direction: Direction::Download,
                count: 1,
                sizes: Sizes {
                    min: 10,
                    max: 10,
                    seed: 1,
                },
                concurrency: 1,
                duration: Duration::from_millis(duration),
                timeout: Duration::from_millis(timeout),
            })
        };
        let s = silent(200, 10_000);
        assert_eq!((s.started, s.unfinished), (1, 1));
        let s = silent(10_000, 200);
        assert_eq!((s.started, s.failed), (1, 1));
    }
}
