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
                // A shaper of several interfaces names the one each change is on.
                if names_an_interface(&change) {
                    println!("{change}");
                } else {
                    println!("{iface}: {change}");
                }
            }
        }
        Response::Error { message } => anyhow::bail!("{iface}: {message}"),
        Response::Left { .. } => anyhow::bail!("{iface}: the running shaper left instead"),
    }
    Ok(())
}

/// Whether `change` starts with the name of an interface (`eth1: rate: ...`), as the changes of
/// a reload of several interfaces do, rather than with a setting's (`rate: ...`).
fn names_an_interface(change: &str) -> bool {
    change
        .split_once(": ")
        .is_some_and(|(first, _)| Interface::lookup(first).is_ok())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_change_on_a_named_interface_is_printed_as_it_is() {
        assert!(names_an_interface("lo: rate: 16Mbit -> 18Mbit"));
        assert!(!names_an_interface("rate: 16Mbit -> 18Mbit"));
        assert!(!names_an_interface("nothing"));
    }
}
