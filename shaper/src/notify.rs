//! systemd's service notification protocol (`sd_notify(3)`): one datagram of `KEY=VALUE`
//! lines to the Unix socket named by `$NOTIFY_SOCKET` (a path, or with a leading `@` an
//! abstract name). Without the variable (not started by systemd with `Type=notify`) nothing is
//! sent. A notification that cannot be sent is logged, never fatal: systemd then times the
//! service out, which says more than a failed start would.

use std::{
    io,
    os::{
        linux::net::SocketAddrExt,
        unix::net::{SocketAddr, UnixDatagram},
    },
};

use tracing::warn;

const VARIABLE: &str = "NOTIFY_SOCKET";

/// Every interface is shaped: the start is complete. `status` is shown by `systemctl status`.
pub fn ready(status: &str) {
    send(&format!("READY=1\nSTATUS={status}"));
}

/// A reload (SIGHUP, `shaper reload`) is being applied; [`ready`] follows when it is done.
pub fn reloading() {
    send("RELOADING=1");
}

/// Every interface was left to the next shaper; the process waits to be stopped.
pub fn replaced() {
    send("STATUS=every interface was left to the next shaper; waiting to be stopped");
}

/// The interfaces are being restored before exit.
pub fn stopping() {
    send("STOPPING=1\nSTATUS=restoring the interfaces");
}

fn send(message: &str) {
    let Some(target) = std::env::var_os(VARIABLE) else {
        return;
    };
    let target = target.to_string_lossy().into_owned();
    if let Err(e) = send_to(&target, message) {
        warn!("telling systemd {message:?} through {target}: {e}");
    }
}

/// Sends `message` to the notification socket `target`.
pub fn send_to(target: &str, message: &str) -> io::Result<()> {
    let address = match target.strip_prefix('@') {
        Some(name) => SocketAddr::from_abstract_name(name.as_bytes())?,
        None if target.starts_with('/') => SocketAddr::from_pathname(target)?,
        None => {
            return Err(io::Error::new(
                io::ErrorKind::InvalidInput,
                "neither a path nor an abstract name (@...)",
            ));
        }
    };
    let socket = UnixDatagram::unbound()?;
    socket.send_to_addr(message.as_bytes(), &address)?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_path_socket_receives_the_message() {
        let path = std::env::temp_dir().join(format!("shaper-notify-{}", std::process::id()));
        let _ = std::fs::remove_file(&path);
        let listener = UnixDatagram::bind(&path).unwrap();
        send_to(path.to_str().unwrap(), "READY=1\nSTATUS=shaping eth0").unwrap();
        let mut buf = [0; 128];
        let n = listener.recv(&mut buf).unwrap();
        assert_eq!(&buf[..n], b"READY=1\nSTATUS=shaping eth0");
        std::fs::remove_file(&path).unwrap();
    }

    #[test]
    fn an_abstract_socket_receives_the_message() {
        let name = format!("shaper-notify-test-{}", std::process::id());
        let listener =
            UnixDatagram::bind_addr(&SocketAddr::from_abstract_name(name.as_bytes()).unwrap())
                .unwrap();
        send_to(&format!("@{name}"), "RELOADING=1").unwrap();
        let mut buf = [0; 64];
        let n = listener.recv(&mut buf).unwrap();
        assert_eq!(&buf[..n], b"RELOADING=1");
    }

    #[test]
    fn a_relative_name_is_refused() {
        assert!(send_to("notify.sock", "READY=1").is_err());
    }
}
