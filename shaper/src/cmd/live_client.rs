//! The client side of `shaper set` and `shaper reload`: one request to the interface's running
//! shaper, its answer printed.

use std::io::ErrorKind;

use crate::{
    link::Interface,
    live::protocol::{self, ProtocolError, Request, Response},
    probe,
    runtime::{self, RuntimeError},
};

/// Sends `request` to the shaper on `iface`; prints what changed, or fails with its error.
pub fn ask(iface: &str, request: &Request) -> anyhow::Result<()> {
    probe::require_privileges()?;
    let interface = Interface::lookup(iface)?;
    let path = runtime::control_socket_path(&interface);
    let response = match protocol::ask(&path, request) {
        Ok(response) => response,
        // No socket, or one a killed shaper left.
        Err(ProtocolError::Io(e))
            if matches!(e.kind(), ErrorKind::NotFound | ErrorKind::ConnectionRefused) =>
        {
            return Err(RuntimeError::NotRunning(iface.to_string()).into());
        }
        Err(e) => anyhow::bail!("asking the shaper on {iface} ({}): {e}", path.display()),
    };
    match response {
        Response::Changed { changes } if changes.is_empty() => {
            println!("{iface}: nothing changed (the settings asked for are the running ones)");
        }
        Response::Changed { changes } => {
            for change in changes {
                println!("{iface}: {change}");
            }
        }
        Response::Error { message } => anyhow::bail!("{iface}: {message}"),
    }
    Ok(())
}
