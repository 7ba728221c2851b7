//! `lab-probe`: the lab's request/response latency probe (see docs/lab.md).
//!
//! `lab-probe server --port P` echoes UDP datagrams and TCP streams on port P (both, IPv4 and
//! IPv6). `lab-probe client --proto udp|tcp --port P [--interval S] [--duration S]
//! [--timeout S] ADDR` sends a 64-byte request every interval for the duration and prints each
//! round trip as `ping -D` prints its replies, so the lab reads both the same way; a request
//! unanswered within the timeout is lost. TCP keeps one connection (TCP_NODELAY) for the whole
//! run: its round trips include what TCP adds under load (retransmits, head-of-line waits),
//! which is what an application's request/response on a busy link sees.
//!
//! ping itself cannot measure this: ICMP may be treated differently from the traffic it is
//! meant to stand for, and the shell tools in the VM (bash's /dev/tcp, busybox nc) measured
//! themselves (5-10 ms per exchange where ping measured 0.4).

mod client;
mod server;
mod wire;

use std::{net::IpAddr, process::ExitCode, time::Duration};

const USAGE: &str = "usage: lab-probe server --port PORT
       lab-probe client --proto udp|tcp --port PORT [--interval SECONDS] [--duration SECONDS]
                        [--timeout SECONDS] ADDRESS";

fn main() -> ExitCode {
    match run(std::env::args().skip(1).collect()) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("lab-probe: {e}");
            ExitCode::FAILURE
        }
    }
}

fn run(args: Vec<String>) -> Result<(), String> {
    let (mode, rest) = args.split_first().ok_or(USAGE)?;
    let mut flags = Flags::parse(rest)?;
    match mode.as_str() {
        "server" => {
            let port = flags.port()?;
            flags.finish(0)?;
            server::run(port).map_err(|e| format!("server on port {port}: {e}"))
        }
        "client" => {
            let proto = match flags.take("--proto").as_deref() {
                Some("udp") => client::Proto::Udp,
                Some("tcp") => client::Proto::Tcp,
                Some(other) => return Err(format!("--proto {other}: use udp or tcp")),
                None => return Err(format!("client needs --proto udp|tcp\n{USAGE}")),
            };
            let port = flags.port()?;
            let interval = flags.seconds("--interval", 0.1)?;
            let duration = flags.seconds("--duration", 10.0)?;
            let timeout = flags.seconds("--timeout", 5.0)?;
            if interval < Duration::from_millis(1) {
                return Err("--interval must be at least 0.001 s".into());
            }
            let addr = flags.finish(1)?.remove(0);
            let addr: IpAddr = addr
                .parse()
                .map_err(|_| format!("{addr:?} is not an IPv4 or IPv6 address"))?;
            client::run(&client::Config {
                proto,
                server: (addr, port).into(),
                interval,
                duration,
                timeout,
            })
            .map(drop)
        }
        "-h" | "--help" | "help" => {
            println!("{USAGE}");
            Ok(())
        }
        other => Err(format!("unknown mode {other:?}\n{USAGE}")),
    }
}

/// `--name value` pairs and positional words, in any order.
struct Flags {
    pairs: Vec<(String, String)>,
    words: Vec<String>,
}

impl Flags {
    fn parse(args: &[String]) -> Result<Self, String> {
        let (mut pairs, mut words) = (Vec::new(), Vec::new());
        let mut it = args.iter();
        while let Some(a) = it.next() {
            if a.starts_with("--") {
                let v = it.next().ok_or_else(|| format!("{a} needs a value"))?;
                pairs.push((a.clone(), v.clone()));
            } else {
                words.push(a.clone());
            }
        }
        Ok(Flags { pairs, words })
    }

    fn take(&mut self, name: &str) -> Option<String> {
        let i = self.pairs.iter().position(|(n, _)| n == name)?;
        Some(self.pairs.remove(i).1)
    }

    fn port(&mut self) -> Result<u16, String> {
        let v = self.take("--port").ok_or("--port is required")?;
        match v.parse::<u16>() {
            Ok(p) if p > 0 => Ok(p),
            _ => Err(format!("--port {v}: a port is 1-65535")),
        }
    }

    fn seconds(&mut self, name: &str, default: f64) -> Result<Duration, String> {
        let Some(v) = self.take(name) else {
            return Ok(Duration::from_secs_f64(default));
        };
        v.parse::<f64>()
            .ok()
            .and_then(|s| Duration::try_from_secs_f64(s).ok())
            .filter(|d| !d.is_zero())
            .ok_or_else(|| format!("{name} {v}: a positive number of seconds (0.01, 20)"))
    }

    /// Errors on flags nobody took and on a count of positional words other than `words`.
    fn finish(self, words: usize) -> Result<Vec<String>, String> {
        if let Some((n, _)) = self.pairs.first() {
            return Err(format!("unknown option {n}\n{USAGE}"));
        }
        if self.words.len() != words {
            return Err(format!("unexpected arguments {:?}\n{USAGE}", self.words));
        }
        Ok(self.words)
    }
}
