//! The control socket of a running shaper: a Unix socket next to its state file, root's alone
//! (0600 in the 0700 run directory), one request and one answer per connection.
//!
//! Connections are read on tasks of their own, each bounded by `protocol::TIMEOUT`; a whole
//! request is handed to the run loop ([`ControlSocket::next`]), which applies it between two
//! ticks and answers. So a client that connects and sends nothing, or never reads its answer,
//! holds only its own task, never a tick.

use std::{
    os::unix::fs::PermissionsExt,
    path::{Path, PathBuf},
};

use tokio::{
    io::{AsyncBufReadExt, AsyncReadExt, AsyncWriteExt, BufReader},
    net::{UnixListener, UnixStream},
    sync::{mpsc, oneshot},
    task::JoinHandle,
    time::timeout,
};
use tracing::warn;

use crate::live::protocol::{self, MAX_LINE_BYTES, Request, Response, TIMEOUT};

/// Requests waiting for the run loop; more wait on their connections.
const QUEUE: usize = 4;

/// A request read whole, and where its answer goes.
pub struct Pending {
    pub request: Request,
    reply: oneshot::Sender<Response>,
    /// Told once the answer is written (or could not be).
    written: oneshot::Receiver<()>,
}

impl Pending {
    /// Sends the answer (a client that went away meanwhile does not get it).
    pub fn answer(self, response: Response) {
        let _ = self.reply.send(response);
    }

    /// Sends the answer and waits until its connection has written it (at most
    /// `protocol::TIMEOUT`): for a last answer, before the process ends and its tasks with it.
    pub async fn answer_written(self, response: Response) {
        let _ = self.reply.send(response);
        let _ = timeout(TIMEOUT, self.written).await;
    }
}

/// The listening socket; removed when dropped.
pub struct ControlSocket {
    path: PathBuf,
    requests: mpsc::Receiver<Pending>,
    accept: JoinHandle<()>,
}

impl ControlSocket {
    /// Listens at `path` (within a tokio runtime). A file already there is a crashed
    /// predecessor's: the caller holds the interface's lock.
    pub fn bind(path: &Path) -> std::io::Result<Self> {
        match std::fs::remove_file(path) {
            Err(e) if e.kind() != std::io::ErrorKind::NotFound => return Err(e),
            _ => {}
        }
        let listener = UnixListener::bind(path)?;
        std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o600))?;
        let (tx, requests) = mpsc::channel(QUEUE);
        let accept = tokio::spawn(accept(listener, tx));
        Ok(Self {
            path: path.to_path_buf(),
            requests,
            accept,
        })
    }

    /// The next whole request. Cancel-safe: a request is never lost to a `select!` branch that
    /// lost the race.
    pub async fn next(&mut self) -> Option<Pending> {
        self.requests.recv().await
    }

    /// [`ControlSocket::next`] as a poll, to wait on several sockets at once.
    pub fn poll_next(
        &mut self,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<Option<Pending>> {
        self.requests.poll_recv(cx)
    }
}

impl Drop for ControlSocket {
    fn drop(&mut self) {
        self.accept.abort();
        let _ = std::fs::remove_file(&self.path);
    }
}

async fn accept(listener: UnixListener, requests: mpsc::Sender<Pending>) {
    loop {
        match listener.accept().await {
            Ok((stream, _)) => {
                tokio::spawn(converse(stream, requests.clone()));
            }
            Err(e) => {
                warn!("control socket: {e}");
                tokio::time::sleep(std::time::Duration::from_millis(100)).await;
            }
        }
    }
}

/// Reads one request, waits for the run loop's answer, writes it.
async fn converse(stream: UnixStream, requests: mpsc::Sender<Pending>) {
    let (read, mut write) = stream.into_split();
    let mut line = String::new();
    let mut reader = BufReader::new(read).take(MAX_LINE_BYTES as u64 + 1);
    // The answer, and who waits for it to be written (the run loop's, not a refusal's).
    let (response, done) = match timeout(TIMEOUT, reader.read_line(&mut line)).await {
        Ok(Ok(_)) if line.ends_with('\n') => match protocol::decode(&line) {
            Ok(request) => {
                let (reply, answer) = oneshot::channel();
                let (done, written) = oneshot::channel();
                let pending = Pending {
                    request,
                    reply,
                    written,
                };
                if requests.send(pending).await.is_err() {
                    return;
                }
                match answer.await {
                    Ok(response) => (response, Some(done)),
                    Err(_) => return,
                }
            }
            Err(e) => {
                let message = e.to_string();
                (Response::Error { message }, None)
            }
        },
        Ok(Ok(_)) if line.len() > MAX_LINE_BYTES => {
            let message = protocol::ProtocolError::TooLong.to_string();
            (Response::Error { message }, None)
        }
        _ => return,
    };
    let _ = timeout(
        TIMEOUT,
        write.write_all(protocol::encode(&response).as_bytes()),
    )
    .await;
    if let Some(done) = done {
        let _ = done.send(());
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::live::protocol::SetOptions;

    fn runtime() -> tokio::runtime::Runtime {
        tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap()
    }

    #[test]
    fn a_request_reaches_the_loop_and_its_answer_the_client_while_a_silent_client_waits() {
        let dir = std::env::temp_dir().join(format!("shaper-control-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("test.sock");
        // A file left where the socket goes is replaced.
        std::fs::write(&path, "stale").unwrap();
        let rt = runtime();
        let mut control = {
            let _rt = rt.enter();
            ControlSocket::bind(&path).unwrap()
        };
        let mode = std::fs::metadata(&path).unwrap().permissions().mode() & 0o777;
        assert_eq!(mode, 0o600);
        // Connected, says nothing: holds only its own task.
        let _silent = std::os::unix::net::UnixStream::connect(&path).unwrap();
        let client_path = path.clone();
        let client = std::thread::spawn(move || {
            let request = Request::Set {
                options: Box::new(SetOptions {
                    rate: Some("40mbit".into()),
                    ..Default::default()
                }),
            };
            protocol::ask(&client_path, &request).unwrap()
        });
        rt.block_on(async {
            let pending = timeout(TIMEOUT, control.next()).await.unwrap().unwrap();
            assert!(matches!(&pending.request, Request::Set { options } if options.rate.as_deref() == Some("40mbit")));
            pending.answer(Response::Changed {
                changes: vec!["rate: 20Mbit -> 40Mbit".into()],
            });
            // Lets the connection's task write the answer.
            tokio::time::sleep(std::time::Duration::from_millis(50)).await;
        });
        assert_eq!(
            client.join().unwrap(),
            Response::Changed {
                changes: vec!["rate: 20Mbit -> 40Mbit".into()]
            }
        );
        drop(control);
        assert!(!path.exists(), "the socket is removed with the server");
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn a_last_answer_is_written_before_the_runtime_ends() {
        let dir = std::env::temp_dir().join(format!("shaper-leave-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("test.sock");
        let rt = runtime();
        let mut control = {
            let _rt = rt.enter();
            ControlSocket::bind(&path).unwrap()
        };
        let client_path = path.clone();
        let client = std::thread::spawn(move || protocol::ask(&client_path, &Request::Leave {}));
        rt.block_on(async {
            let pending = timeout(TIMEOUT, control.next()).await.unwrap().unwrap();
            assert_eq!(pending.request, Request::Leave {});
            drop(control);
            pending.answer_written(Response::Left { pid: 7 }).await;
        });
        // The process ends here: its runtime, and every task still on it, with it.
        drop(rt);
        assert_eq!(client.join().unwrap().unwrap(), Response::Left { pid: 7 });
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
