//! The metrics endpoint's HTTP/1.1 server: `GET /metrics`, `/healthz`, `/readyz`, one request
//! per connection (`Connection: close`), nothing else.
//!
//! It runs on a thread of its own with its own runtime, so that neither a scrape (which reads
//! the maps) nor a client that sends its request slowly, or never, can delay the control loop:
//! the run loop only ever touches the [`Monitor`]'s lock. Each connection has a deadline and
//! at most [`MAX_CONNECTIONS`] are served at once; more wait in the listen backlog.

use std::{net::TcpListener, sync::Arc, time::Duration};

use tokio::{
    io::{AsyncReadExt, AsyncWriteExt},
    net::TcpStream,
    sync::Semaphore,
};
use tracing::{debug, warn};

use super::{status::Monitor, text};

/// Connections served at once: a scraper and a probe or two, with room to spare.
const MAX_CONNECTIONS: usize = 8;

/// A connection's whole life: reading the request, answering it.
const CONNECTION_DEADLINE: Duration = Duration::from_secs(10);

/// The largest request head read; a scrape's is a few hundred bytes.
const MAX_REQUEST_BYTES: usize = 8 * 1024;

/// Listens at `addr`, sharing the port with other shaper processes (SO_REUSEPORT, same user
/// only): during a takeover by `--replace`, as in a rolling update that starts the new pod
/// first, old and new serve side by side. A port held by anything else still fails.
pub fn listen(addr: std::net::SocketAddr) -> std::io::Result<TcpListener> {
    let socket = socket2::Socket::new(
        socket2::Domain::for_address(addr),
        socket2::Type::STREAM,
        Some(socket2::Protocol::TCP),
    )?;
    socket.set_reuse_address(true)?;
    socket.set_reuse_port(true)?;
    socket.bind(&addr.into())?;
    socket.listen(128)?;
    Ok(socket.into())
}

/// Serves `listener` (bound by the caller, so that a bad address fails the start) on a new
/// thread until the process exits.
pub fn spawn(listener: TcpListener, monitor: Monitor, top_hosts: usize) -> std::io::Result<()> {
    listener.set_nonblocking(true)?;
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_io()
        .enable_time()
        .build()?;
    std::thread::Builder::new()
        .name("metrics".into())
        .spawn(move || runtime.block_on(accept(listener, monitor, top_hosts)))?;
    Ok(())
}

async fn accept(listener: TcpListener, monitor: Monitor, top_hosts: usize) {
    let listener = match tokio::net::TcpListener::from_std(listener) {
        Ok(l) => l,
        Err(e) => {
            warn!("metrics endpoint: {e}");
            return;
        }
    };
    let slots = Arc::new(Semaphore::new(MAX_CONNECTIONS));
    loop {
        let Ok(slot) = slots.clone().acquire_owned().await else {
            return;
        };
        let (stream, peer) = match listener.accept().await {
            Ok(c) => c,
            Err(e) => {
                // Out of descriptors, say: the next accept may succeed.
                debug!("metrics endpoint: accept: {e}");
                tokio::time::sleep(Duration::from_millis(100)).await;
                continue;
            }
        };
        let monitor = monitor.clone();
        tokio::spawn(async move {
            let _slot = slot;
            match tokio::time::timeout(CONNECTION_DEADLINE, serve(stream, &monitor, top_hosts))
                .await
            {
                Ok(Err(e)) => debug!(%peer, "metrics endpoint: {e}"),
                Err(_) => debug!(%peer, "metrics endpoint: connection timed out"),
                Ok(Ok(())) => {}
            }
        });
    }
}

async fn serve(mut stream: TcpStream, monitor: &Monitor, top_hosts: usize) -> std::io::Result<()> {
    let mut head = Vec::with_capacity(512);
    let mut buf = [0u8; 1024];
    while !head.windows(4).any(|w| w == b"\r\n\r\n") && head.len() < MAX_REQUEST_BYTES {
        let n = stream.read(&mut buf).await?;
        if n == 0 {
            break;
        }
        head.extend_from_slice(&buf[..n]);
    }
    let bytes = match parse_request_line(&head) {
        Some((method, path)) => {
            answer(method, path, monitor, top_hosts).bytes(method == Method::Head)
        }
        None => Response::text(400, "bad request\n").bytes(false),
    };
    stream.write_all(&bytes).await?;
    stream.shutdown().await
}

/// The method and path (without its query) of a request's first line.
fn parse_request_line(head: &[u8]) -> Option<(Method, &str)> {
    let line = head.split(|&b| b == b'\n').next()?;
    let line = std::str::from_utf8(line).ok()?.trim_end_matches('\r');
    let mut words = line.split(' ');
    let (method, target, version) = (words.next()?, words.next()?, words.next()?);
    if words.next().is_some() || !version.starts_with("HTTP/1.") {
        return None;
    }
    let method = match method {
        "GET" => Method::Get,
        "HEAD" => Method::Head,
        _ => Method::Other,
    };
    Some((method, target.split('?').next().unwrap_or(target)))
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Method {
    Get,
    Head,
    Other,
}

/// What to answer `method path`, reading the monitor (and the maps) as the path asks.
fn answer(method: Method, path: &str, monitor: &Monitor, top_hosts: usize) -> Response {
    match path {
        "/metrics" | "/healthz" | "/readyz" if method == Method::Other => {
            Response::text(405, "only GET and HEAD\n")
        }
        "/metrics" => match monitor.scrape(top_hosts) {
            Ok(scrape) => Response {
                status: 200,
                content_type: text::CONTENT_TYPE,
                body: text::render(&scrape),
            },
            Err(e) => Response::text(503, &format!("{e}\n")),
        },
        "/healthz" => match monitor.health() {
            Ok(()) => Response::text(200, "ok\n"),
            Err(e) => Response::text(503, &format!("{e}\n")),
        },
        "/readyz" => match monitor.ready() {
            Ok(()) => Response::text(200, "ready\n"),
            Err(why) => Response::text(503, &format!("{why}\n")),
        },
        _ => Response::text(404, "not found: try /metrics, /healthz or /readyz\n"),
    }
}

#[derive(Debug)]
struct Response {
    status: u16,
    content_type: &'static str,
    body: String,
}

impl Response {
    fn text(status: u16, body: &str) -> Self {
        Self {
            status,
            content_type: "text/plain; charset=utf-8",
            body: body.to_string(),
        }
    }

    /// The response on the wire; a HEAD answer's headers are the GET answer's, without body.
    fn bytes(&self, head_only: bool) -> Vec<u8> {
        let reason = match self.status {
            200 => "OK",
            400 => "Bad Request",
            404 => "Not Found",
            405 => "Method Not Allowed",
            _ => "Service Unavailable",
        };
        let mut out = format!(
            "HTTP/1.1 {} {reason}\r\nContent-Type: {}\r\nContent-Length: {}\r\nConnection: close\r\n\r\n",
            self.status,
            self.content_type,
            self.body.len()
        )
        .into_bytes();
        if !head_only {
            out.extend_from_slice(self.body.as_bytes());
        }
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn two_shapers_share_the_port_and_anything_else_is_refused() {
        let first = listen("127.0.0.1:0".parse().unwrap()).unwrap();
        let addr = first.local_addr().unwrap();
        // The next process of a takeover binds beside the first.
        let second = listen(addr).unwrap();
        assert_eq!(second.local_addr().unwrap(), addr);
        // A listener without SO_REUSEPORT holds its port against shaper.
        let other = TcpListener::bind("127.0.0.1:0").unwrap();
        let err = listen(other.local_addr().unwrap()).unwrap_err();
        assert_eq!(err.kind(), std::io::ErrorKind::AddrInUse);
    }

    #[test]
    fn request_lines_give_method_and_path() {
        let get = b"GET /metrics?x=1 HTTP/1.1\r\nHost: a\r\n\r\n";
        assert_eq!(parse_request_line(get), Some((Method::Get, "/metrics")));
        assert_eq!(
            parse_request_line(b"HEAD /readyz HTTP/1.0\r\n\r\n"),
            Some((Method::Head, "/readyz"))
        );
        assert_eq!(
            parse_request_line(b"POST /healthz HTTP/1.1\r\n\r\n"),
            Some((Method::Other, "/healthz"))
        );
        for bad in [
            &b""[..],
            b"GET /metrics\r\n",
            b"GET  /metrics HTTP/1.1\r\n",
            b"\xff\r\n",
        ] {
            assert_eq!(parse_request_line(bad), None, "{bad:?}");
        }
    }

    #[test]
    fn answers_route_by_path_and_method() {
        // Nothing shaped yet: alive, not ready, an empty scrape.
        let monitor = Monitor::default();
        let status = |m, p| answer(m, p, &monitor, 0).status;
        assert_eq!(status(Method::Get, "/healthz"), 200);
        assert_eq!(status(Method::Get, "/readyz"), 503);
        assert_eq!(status(Method::Get, "/metrics"), 200);
        assert_eq!(status(Method::Get, "/"), 404);
        assert_eq!(status(Method::Other, "/metrics"), 405);
        let metrics = answer(Method::Get, "/metrics", &monitor, 0);
        assert_eq!(metrics.content_type, text::CONTENT_TYPE);
        assert!(
            metrics.body.contains("shaper_ready 0\n"),
            "{}",
            metrics.body
        );
    }

    #[test]
    fn a_head_answer_announces_the_body_it_leaves_out() {
        let r = Response::text(200, "ok\n");
        let head = String::from_utf8(r.bytes(true)).unwrap();
        let get = String::from_utf8(r.bytes(false)).unwrap();
        assert!(head.starts_with("HTTP/1.1 200 OK\r\n"), "{head}");
        assert!(head.contains("Content-Length: 3\r\n"), "{head}");
        assert!(head.ends_with("\r\n\r\n"));
        assert_eq!(get, format!("{head}ok\n"));
    }
}

#[cfg(test)]
mod served {
    use std::{
        io::{Read, Write},
        net::TcpStream,
    };

    use super::*;

    fn get(addr: std::net::SocketAddr, request: &str) -> String {
        let mut s = TcpStream::connect(addr).unwrap();
        s.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
        s.write_all(request.as_bytes()).unwrap();
        let mut out = String::new();
        s.read_to_string(&mut out).unwrap();
        out
    }

    #[test]
    fn clients_that_send_nothing_hold_no_one_else_back() {
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = listener.local_addr().unwrap();
        spawn(listener, Monitor::default(), 0).unwrap();
        // Each silent client holds a slot until its deadline; with one slot left, requests
        // sent whole are still answered at once, one after the other.
        let idle: Vec<TcpStream> = (0..MAX_CONNECTIONS - 1)
            .map(|_| TcpStream::connect(addr).unwrap())
            .collect();
        let started = std::time::Instant::now();
        let ready = get(addr, "GET /readyz HTTP/1.1\r\nHost: x\r\n\r\n");
        assert!(ready.starts_with("HTTP/1.1 503 "), "{ready}");
        let health = get(addr, "GET /healthz HTTP/1.0\r\n\r\n");
        assert!(health.starts_with("HTTP/1.1 200 OK\r\n"), "{health}");
        assert!(health.ends_with("\r\n\r\nok\n"), "{health}");
        let metrics = get(addr, "GET /metrics HTTP/1.1\r\n\r\n");
        assert!(
            metrics.contains("Content-Type: text/plain; version=0.0.4"),
            "{metrics}"
        );
        assert!(metrics.contains("\r\n\r\n# HELP shaper_info "), "{metrics}");
        assert!(get(addr, "GET /x HTTP/1.1\r\n\r\n").starts_with("HTTP/1.1 404 "));
        assert!(get(addr, "nonsense\r\n\r\n").starts_with("HTTP/1.1 400 "));
        assert!(
            started.elapsed() < Duration::from_secs(2),
            "{:?}",
            started.elapsed()
        );
        drop(idle);
    }
}
