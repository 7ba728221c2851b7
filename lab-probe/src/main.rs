//! `lab-probe`: the lab's request/response latency probe and short-transfers client (see
//! docs/lab.md).
//!
//! `lab-probe server --port P [--transfers-port Q]` echoes UDP datagrams and TCP streams on
//! port P (both, IPv4 and IPv6), and serves transfers on TCP port Q.
//!
//! `lab-probe client --proto udp|tcp --port P [--interval S] [--duration S] [--timeout S] ADDR`
//! sends a 64-byte request every interval for the duration and prints each round trip as
//! `ping -D` prints its replies, so the lab reads both the same way; a request unanswered within
//! the timeout is lost. TCP keeps one connection (TCP_NODELAY) for the whole run: its round
//! trips include what TCP adds under load (retransmits, head-of-line waits), which is what an
//! application's request/response on a busy link sees. ping itself cannot measure this: ICMP
//! may be treated differently from the traffic it is meant to stand for, and the shell tools in
//! the VM (bash's /dev/tcp, busybox nc) measured themselves (5-10 ms per exchange where ping
//! measured 0.4).
//!
//! `lab-probe transfers --port Q --count N --size MIN-MAX [--direction download|upload]
//! [--concurrency C] [--duration S] [--timeout S] [--seed N] ADDR` runs N short TCP transfers,
//! each on a new connection, against a server's transfers port, and prints each one's
//! completion time (see `transfers`): how short flows fare next to bulk ones.
//!
//! `lab-probe blast --from ADDR --hosts N [--sockets K] --port P [--ports M] --rate BITS
//! [--size BYTES] [--duration S] [--weights W,W,...] ADDR` sends UDP from N local addresses
//! over K x M flows each, and `lab-probe sink --port P [--ports M] [--warmup S] [--duration S]`
//! counts what arrives per source (see `blast` and `sink`): the scale benchmark's load.
//!
//! `lab-probe flood --kind syn|udp --port P [--from ADDR] [--sources S] [--tuples T]
//! [--size BYTES] [--pps N] [--duration S] [--seed N] ADDR` sends packets with spoofed source
//! addresses through a raw socket (see `flood`).

mod blast;
mod client;
mod flood;
mod server;
mod sink;
mod sizes;
mod tcpinfo;
mod transfers;
mod wire;

use std::{
    net::{IpAddr, Ipv4Addr},
    process::ExitCode,
    time::Duration,
};

const USAGE: &str = "usage: lab-probe server --port PORT [--transfers-port PORT]
       lab-probe client --proto udp|tcp --port PORT [--interval SECONDS] [--duration SECONDS]
                        [--timeout SECONDS] ADDRESS
       lab-probe transfers --port PORT --count N --size BYTES[-BYTES]
                           [--direction download|upload] [--concurrency N]
                           [--duration SECONDS] [--timeout SECONDS] [--seed N] ADDRESS
       lab-probe blast --from ADDRESS --hosts N [--sockets N] --port PORT [--ports N]
                       --rate BITS_PER_SECOND [--size BYTES] [--duration SECONDS]
                       [--weights W,W,...] [--window SECONDS] ADDRESS
       lab-probe sink --port PORT [--ports N] [--warmup SECONDS] [--duration SECONDS]
       lab-probe flood --kind syn|udp --port PORT [--from ADDRESS] [--sources N] [--tuples N]
                       [--size BYTES] [--pps N] [--duration SECONDS] [--seed N] ADDRESS";

fn main() -> ExitCode {
    match parse(std::env::args().skip(1).collect()).and_then(execute) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("lab-probe: {e}");
            ExitCode::FAILURE
        }
    }
}

/// What the command line asks for, checked before anything runs.
#[derive(Debug)]
enum Command {
    Server {
        port: u16,
        transfers_port: Option<u16>,
    },
    Client(client::Config),
    Transfers(transfers::Config),
    Blast(blast::Config),
    Sink(sink::Config),
    Flood(flood::Config),
    Help,
}

fn execute(c: Command) -> Result<(), String> {
    match c {
        Command::Server {
            port,
            transfers_port,
        } => server::run(port, transfers_port).map_err(|e| format!("server on port {port}: {e}")),
        Command::Client(c) => client::run(&c).map(drop),
        Command::Transfers(c) => {
            // Failed transfers are results, reported line by line, not an error of the probe.
            transfers::run(&c);
            Ok(())
        }
        Command::Blast(c) => blast::run(&c),
        Command::Sink(c) => sink::run(&c),
        Command::Flood(c) => flood::run(&c),
        Command::Help => {
            println!("{USAGE}");
            Ok(())
        }
    }
}

fn parse(args: Vec<String>) -> Result<Command, String> {
    let (mode, rest) = args.split_first().ok_or(USAGE)?;
    let mut flags = Flags::parse(rest)?;
    match mode.as_str() {
        "server" => {
            let port = flags.port()?;
            let transfers_port = flags
                .take("--transfers-port")
                .map(|v| parse_port("--transfers-port", &v))
                .transpose()?;
            flags.finish(0)?;
            Ok(Command::Server {
                port,
                transfers_port,
            })
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
            let addr = flags.address()?;
            Ok(Command::Client(client::Config {
                proto,
                server: (addr, port).into(),
                interval,
                duration,
                timeout,
            }))
        }
        "transfers" => {
            let port = flags.port()?;
            let count = flags.number("--count")?.ok_or("--count is required")?;
            if count == 0 {
                return Err("--count 0: at least one transfer".into());
            }
            let seed = flags.number("--seed")?.unwrap_or(1);
            let size = flags.take("--size").ok_or("--size is required")?;
            let sizes = sizes::Sizes::parse_range(&size, seed)?;
            let direction = match flags.take("--direction").as_deref() {
                None | Some("download") => transfers::Direction::Download,
                Some("upload") => transfers::Direction::Upload,
                Some(other) => return Err(format!("--direction {other}: download or upload")),
            };
            let concurrency = match flags.number("--concurrency")?.unwrap_or(1) {
                n @ 1..=MAX_CONCURRENCY => n as u32,
                n => return Err(format!("--concurrency {n}: 1-{MAX_CONCURRENCY}")),
            };
            let duration = flags.seconds("--duration", 60.0)?;
            let timeout = flags.seconds("--timeout", 30.0)?;
            let addr = flags.address()?;
            Ok(Command::Transfers(transfers::Config {
                server: (addr, port).into(),
                direction,
                count,
                sizes,
                concurrency,
                duration,
                timeout,
            }))
        }
        "blast" => {
            let first = flags.take("--from").ok_or("--from is required")?;
            let first: Ipv4Addr = first
                .parse()
                .map_err(|_| format!("--from {first}: an IPv4 address"))?;
            let hosts = flags.count("--hosts", None, 1 << 16)?;
            let sockets = flags.count("--sockets", Some(1), 1024)?;
            let (port, ports) = flags.port_range(65535)?;
            let rate = flags.take("--rate").ok_or("--rate is required")?;
            let rate_bps = rate
                .parse::<f64>()
                .ok()
                .filter(|r| *r >= 1.0 && r.is_finite())
                .ok_or_else(|| format!("--rate {rate}: bits per second (1000000)"))?;
            let size = flags.count("--size", Some(1400), 65000)? as usize;
            let duration = flags.seconds("--duration", 10.0)?;
            let window = flags.seconds_from_zero("--window")?;
            if window >= duration {
                return Err("--window must be shorter than --duration".into());
            }
            let weights = match flags.take("--weights") {
                None => vec![1.0],
                Some(w) => w
                    .split(',')
                    .map(|x| x.parse::<f64>().ok().filter(|v| *v > 0.0 && v.is_finite()))
                    .collect::<Option<Vec<f64>>>()
                    .ok_or_else(|| format!("--weights {w}: positive numbers, comma-separated"))?,
            };
            let target = match flags.address()? {
                IpAddr::V4(a) => a,
                IpAddr::V6(a) => return Err(format!("{a}: blast sends IPv4 only")),
            };
            Ok(Command::Blast(blast::Config {
                first,
                hosts,
                sockets,
                port,
                ports,
                rate_bps,
                size,
                duration,
                window,
                weights,
                target,
            }))
        }
        "sink" => {
            let (port, ports) = flags.port_range(1024)?;
            let warmup = flags.seconds_from_zero("--warmup")?;
            let duration = flags.seconds("--duration", 10.0)?;
            if warmup >= duration {
                return Err("--warmup must be shorter than --duration".into());
            }
            flags.finish(0)?;
            Ok(Command::Sink(sink::Config {
                port,
                ports,
                warmup,
                duration,
            }))
        }
        "flood" => {
            let kind = match flags.take("--kind").as_deref() {
                Some("syn") => flood::Kind::Syn,
                Some("udp") => flood::Kind::Udp,
                _ => return Err(format!("flood needs --kind syn|udp\n{USAGE}")),
            };
            let port = flags.port()?;
            let from = flags.take("--from").unwrap_or_else(|| "10.128.0.0".into());
            let from: Ipv4Addr = from
                .parse()
                .map_err(|_| format!("--from {from}: an IPv4 address"))?;
            let sources = flags.count("--sources", Some(1 << 23), 1 << 24)?;
            let tuples = flags.number("--tuples")?.unwrap_or(0);
            let size = flags.number("--size")?.unwrap_or(1) as usize;
            if size > 1400 {
                return Err(format!("--size {size}: at most 1400"));
            }
            let pps = flags.number("--pps")?.unwrap_or(0);
            let duration = flags.seconds("--duration", 10.0)?;
            let seed = flags.number("--seed")?.unwrap_or(1);
            let target = match flags.address()? {
                IpAddr::V4(a) => a,
                IpAddr::V6(a) => return Err(format!("{a}: flood sends IPv4 only")),
            };
            Ok(Command::Flood(flood::Config {
                kind,
                from,
                sources,
                tuples,
                port,
                size,
                pps,
                duration,
                seed,
                target,
            }))
        }
        "-h" | "--help" | "help" => Ok(Command::Help),
        other => Err(format!("unknown mode {other:?}\n{USAGE}")),
    }
}

/// Transfers at once: a thread each.
const MAX_CONCURRENCY: u64 = 256;

fn parse_port(name: &str, v: &str) -> Result<u16, String> {
    match v.parse::<u16>() {
        Ok(p) if p > 0 => Ok(p),
        _ => Err(format!("{name} {v}: a port is 1-65535")),
    }
}

fn parse_seconds(v: &str) -> Option<Duration> {
    v.parse::<f64>()
        .ok()
        .and_then(|s| Duration::try_from_secs_f64(s).ok())
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
        parse_port("--port", &v)
    }

    /// A whole number, if the flag is given.
    fn number(&mut self, name: &str) -> Result<Option<u64>, String> {
        self.take(name)
            .map(|v| {
                v.parse()
                    .map_err(|_| format!("{name} {v}: a whole number (0, 1000)"))
            })
            .transpose()
    }

    /// A count from 1 to `max`; `default` when the flag is absent, required if None.
    fn count(&mut self, name: &str, default: Option<u32>, max: u32) -> Result<u32, String> {
        match (self.number(name)?, default) {
            (Some(n @ 1..), _) if n <= u64::from(max) => Ok(n as u32),
            (Some(n), _) => Err(format!("{name} {n}: 1-{max}")),
            (None, Some(d)) => Ok(d),
            (None, None) => Err(format!("{name} is required")),
        }
    }

    /// The one positional word, the server's address; errors on anything left over.
    fn address(self) -> Result<IpAddr, String> {
        let addr = self.finish(1)?.remove(0);
        addr.parse()
            .map_err(|_| format!("{addr:?} is not an IPv4 or IPv6 address"))
    }

    fn seconds(&mut self, name: &str, default: f64) -> Result<Duration, String> {
        let Some(v) = self.take(name) else {
            return Ok(Duration::from_secs_f64(default));
        };
        parse_seconds(&v)
            .filter(|d| !d.is_zero())
            .ok_or_else(|| format!("{name} {v}: a positive number of seconds (0.01, 20)"))
    }

    /// Seconds that may be zero, the default.
    fn seconds_from_zero(&mut self, name: &str) -> Result<Duration, String> {
        let Some(v) = self.take(name) else {
            return Ok(Duration::ZERO);
        };
        parse_seconds(&v).ok_or_else(|| format!("{name} {v}: seconds (0, 5)"))
    }

    /// `--port` and `--ports` (1 to `max`, default 1): a range of ports that ends by 65535.
    fn port_range(&mut self, max: u32) -> Result<(u16, u16), String> {
        let port = self.port()?;
        let ports = self.count("--ports", Some(1), max)? as u16;
        if u32::from(port) + u32::from(ports) > 65536 {
            return Err(format!("--port {port} --ports {ports}: past port 65535"));
        }
        Ok((port, ports))
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

#[cfg(test)]
mod tests {
    use super::*;

    fn parse_str(s: &str) -> Result<Command, String> {
        parse(s.split_whitespace().map(String::from).collect())
    }

    #[test]
    fn transfers_command_line() {
        let Ok(Command::Transfers(c)) = parse_str(
            "transfers --port 5199 --count 1000 --size 10240-102400 --direction upload \
             --concurrency 4 --duration 90 --seed 7 fd01:1::2",
        ) else {
            panic!("not a transfers command");
        };
        assert_eq!(c.server, "[fd01:1::2]:5199".parse().unwrap());
        assert_eq!((c.count, c.concurrency), (1000, 4));
        assert_eq!(c.direction, transfers::Direction::Upload);
        assert_eq!(
            (c.sizes.min, c.sizes.max, c.sizes.seed),
            (10_240, 102_400, 7)
        );
        assert_eq!(c.duration, Duration::from_secs(90));
        assert_eq!(c.timeout, Duration::from_secs(30));
        // Defaults: downloads, one at a time, seed 1.
        let Ok(Command::Transfers(c)) =
            parse_str("transfers --port 1 --count 1 --size 100 10.1.1.2")
        else {
            panic!("not a transfers command");
        };
        assert_eq!(c.direction, transfers::Direction::Download);
        assert_eq!((c.concurrency, c.sizes.seed), (1, 1));
        for (bad, why) in [
            (
                "transfers --port 1 --size 100 10.1.1.2",
                "--count is required",
            ),
            (
                "transfers --port 1 --count 0 --size 100 10.1.1.2",
                "--count 0",
            ),
            (
                "transfers --port 1 --count 1 10.1.1.2",
                "--size is required",
            ),
            (
                "transfers --port 1 --count 1 --size 9-2 10.1.1.2",
                "above the maximum",
            ),
            (
                "transfers --port 1 --count x --size 9 10.1.1.2",
                "whole number",
            ),
            (
                "transfers --port 1 --count 1 --size 9 --direction up 10.1.1.2",
                "download or upload",
            ),
            (
                "transfers --port 1 --count 1 --size 9 --concurrency 0 10.1.1.2",
                "1-256",
            ),
            (
                "transfers --port 1 --count 1 --size 9 --bogus 1 10.1.1.2",
                "unknown option --bogus",
            ),
            (
                "transfers --port 1 --count 1 --size 9 server",
                "not an IPv4 or IPv6",
            ),
            (
                "transfers --port 1 --count 1 --size 9",
                "unexpected arguments",
            ),
        ] {
            let e = parse_str(bad).expect_err(bad);
            assert!(e.contains(why), "{bad}: {e}");
        }
    }

    #[test]
    fn blast_and_sink_command_lines() {
        let Ok(Command::Blast(c)) = parse_str(
            "blast --from 10.20.0.1 --hosts 1000 --port 6000 --ports 100 --rate 1.5e9 \
             --size 8900 --duration 20 --weights 1.1,2 --window 5.5 10.9.0.2",
        ) else {
            panic!("not a blast command");
        };
        assert_eq!((c.hosts, c.sockets, c.port, c.ports), (1000, 1, 6000, 100));
        assert_eq!((c.rate_bps, c.size), (1.5e9, 8900));
        assert_eq!(c.weights, vec![1.1, 2.0]);
        assert_eq!(c.window, Duration::from_millis(5500));
        assert_eq!(c.target, Ipv4Addr::new(10, 9, 0, 2));
        let Ok(Command::Sink(c)) =
            parse_str("sink --port 6000 --ports 100 --warmup 5 --duration 20")
        else {
            panic!("not a sink command");
        };
        assert_eq!((c.port, c.ports), (6000, 100));
        assert_eq!(c.warmup, Duration::from_secs(5));
        for (bad, why) in [
            (
                "blast --hosts 1 --port 1 --rate 1 10.0.0.1",
                "--from is required",
            ),
            (
                "blast --from 10.0.0.1 --port 1 --rate 1 10.0.0.1",
                "--hosts is required",
            ),
            (
                "blast --from 10.0.0.1 --hosts 0 --port 1 --rate 1 10.0.0.1",
                "--hosts 0",
            ),
            (
                "blast --from 10.0.0.1 --hosts 1 --port 65000 --ports 1000 --rate 1 10.0.0.1",
                "past port",
            ),
            (
                "blast --from 10.0.0.1 --hosts 1 --port 1 --rate fast 10.0.0.1",
                "--rate fast",
            ),
            (
                "blast --from 10.0.0.1 --hosts 1 --port 1 --rate 1 --weights 1,-1 10.0.0.1",
                "--weights",
            ),
            (
                "blast --from 10.0.0.1 --hosts 1 --port 1 --rate 1 fd00::1",
                "IPv4 only",
            ),
            ("sink --port 1 --warmup 10 --duration 5", "shorter than"),
        ] {
            let e = parse_str(bad).expect_err(bad);
            assert!(e.contains(why), "{bad}: {e}");
        }
    }

    #[test]
    fn server_command_line() {
        assert!(matches!(
            parse_str("server --port 5200 --transfers-port 5199"),
            Ok(Command::Server {
                port: 5200,
                transfers_port: Some(5199)
            })
        ));
        assert!(matches!(
            parse_str("server --port 5200"),
            Ok(Command::Server {
                transfers_port: None,
                ..
            })
        ));
        assert!(parse_str("server --port 5200 --transfers-port 0").is_err());
    }
}
