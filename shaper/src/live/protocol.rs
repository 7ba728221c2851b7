//! What `shaper set`, `shaper reload` and a `shaper run --replace` say to a running `shaper
//! run`, and what it answers: one JSON object per line each way, one request per connection,
//! over the interface's control socket (`runtime::control_socket_path`).
//!
//! A request names settings by their command-line and config-file names; the running shaper
//! validates them with the start-up code (`config`), so a value `shaper run` would refuse is
//! refused here, and nothing changes.

use std::{
    io::{BufRead, BufReader, Read, Write},
    os::unix::net::UnixStream,
    path::Path,
    time::Duration,
};

use serde::{Deserialize, Serialize, de::DeserializeOwned};

use crate::config::Options;

/// Longest a request line may be: a few settings, not a file.
pub const MAX_LINE_BYTES: usize = 64 * 1024;

/// How long either side waits for the other's line. Applying a change takes milliseconds
/// (map writes and a few netlink requests); this only bounds a peer that never answers.
pub const TIMEOUT: Duration = Duration::from_secs(10);

/// Settings to change in place, each `None` when unchanged: `shaper set`'s options and the
/// request's fields. Values are text as on the command line (`"40mbit"`, `"30ms"`), validated
/// by the running shaper as `shaper run` validates its own.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize, clap::Args)]
#[serde(deny_unknown_fields, rename_all = "kebab-case")]
pub struct SetOptions {
    /// Wire rate, as for `shaper run`.
    #[arg(long)]
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub rate: Option<String>,
    /// The ingress direction's rate (only while it is shaped: adding or removing it needs a
    /// restart).
    #[arg(long)]
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ingress_rate: Option<String>,
    /// Autorate's range, as for `shaper run` (`off`: a fixed rate again).
    #[arg(long, value_name = "MIN..MAX|off")]
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub autorate: Option<String>,
    #[arg(long, value_name = "MIN..MAX|off")]
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ingress_autorate: Option<String>,
    #[arg(long, value_name = "ADDRS")]
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub autorate_reflectors: Option<String>,
    #[arg(long, value_name = "DURATION")]
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub autorate_threshold: Option<String>,
    #[arg(long)]
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub horizon: Option<String>,
    /// The link's framing in CAKE's keywords, as for `shaper run`.
    #[arg(long)]
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub framing: Option<String>,
    #[arg(long, allow_hyphen_values = true)]
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub overhead: Option<i32>,
    #[arg(long)]
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub mpu: Option<u32>,
    #[arg(long)]
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub isolation: Option<String>,
    #[arg(long)]
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub rtt: Option<String>,
    /// Mark ECN-capable packets instead of dropping them.
    #[arg(long, value_name = "on|off", value_parser = on_off)]
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ecn: Option<bool>,
    #[arg(long)]
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub diffserv: Option<String>,
    /// Clear the DSCP after classifying.
    #[arg(long, value_name = "on|off", value_parser = on_off)]
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub wash: Option<bool>,
    /// Hosts by their addresses before NAT.
    #[arg(long, value_name = "on|off", value_parser = on_off)]
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub nat: Option<bool>,
    #[arg(long)]
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub fwmark: Option<String>,
    #[arg(long)]
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ack_filter: Option<String>,
}

fn on_off(text: &str) -> Result<bool, String> {
    match text {
        "on" | "true" | "yes" => Ok(true),
        "off" | "false" | "no" => Ok(false),
        _ => Err(format!("{text:?}: use on or off")),
    }
}

impl SetOptions {
    /// Nothing asked for.
    pub fn is_empty(&self) -> bool {
        *self == Self::default()
    }

    /// The same settings as a layer of `shaper run`'s options.
    pub fn as_options(&self) -> Options {
        let this = self.clone();
        Options {
            rate: this.rate,
            ingress_rate: this.ingress_rate,
            autorate: this.autorate,
            ingress_autorate: this.ingress_autorate,
            autorate_reflectors: this.autorate_reflectors,
            autorate_threshold: this.autorate_threshold,
            horizon: this.horizon,
            framing: this.framing,
            overhead: this.overhead,
            mpu: this.mpu,
            isolation: this.isolation,
            rtt: this.rtt,
            ecn: this.ecn,
            diffserv: this.diffserv,
            wash: this.wash,
            nat: this.nat,
            fwmark: this.fwmark,
            ack_filter: this.ack_filter,
            ..Options::default()
        }
    }
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "command", rename_all = "kebab-case", deny_unknown_fields)]
pub enum Request {
    /// Change these settings, the others as they are.
    Set { options: Box<SetOptions> },
    /// Read `shaper run --config FILE` again and apply what differs.
    Reload {},
    /// Leave this interface shaped, its state pinned, for the process asking (`shaper run
    /// --replace`), and never shape it again; a process left with no interface ends.
    Leave {},
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "result", rename_all = "kebab-case", deny_unknown_fields)]
pub enum Response {
    /// Applied: each setting that changed, "name: old -> new" (none: nothing differed).
    Changed { changes: Vec<String> },
    /// Refused or failed; `message` says why (and, for a setting that cannot change in place,
    /// to restart).
    Error { message: String },
    /// The interface is left shaped for the asking process, and its lock released.
    Left { pid: u32 },
}

#[derive(Debug, thiserror::Error)]
pub enum ProtocolError {
    #[error("malformed message: {0}")]
    Malformed(serde_json::Error),
    #[error("message longer than {MAX_LINE_BYTES} bytes")]
    TooLong,
    #[error("the connection closed before a whole message")]
    Closed,
    #[error("{0}")]
    Io(#[from] std::io::Error),
}

/// One message as a line: compact JSON (which never holds a raw newline) and `\n`.
pub fn encode<T: Serialize>(message: &T) -> String {
    let mut line = serde_json::to_string(message).expect("protocol messages serialise");
    line.push('\n');
    line
}

/// One message from a line (its `\n` optional).
pub fn decode<T: DeserializeOwned>(line: &str) -> Result<T, ProtocolError> {
    if line.len() > MAX_LINE_BYTES {
        return Err(ProtocolError::TooLong);
    }
    serde_json::from_str(line.trim_end_matches('\n')).map_err(ProtocolError::Malformed)
}

/// Sends `request` to the shaper listening at `path` and waits for its answer.
pub fn ask(path: &Path, request: &Request) -> Result<Response, ProtocolError> {
    let mut stream = UnixStream::connect(path)?;
    stream.set_read_timeout(Some(TIMEOUT))?;
    stream.set_write_timeout(Some(TIMEOUT))?;
    stream.write_all(encode(request).as_bytes())?;
    let mut line = String::new();
    let read = BufReader::new(stream)
        .take(MAX_LINE_BYTES as u64 + 1)
        .read_line(&mut line)?;
    if read == 0 || !line.ends_with('\n') {
        return Err(if line.len() > MAX_LINE_BYTES {
            ProtocolError::TooLong
        } else {
            ProtocolError::Closed
        });
    }
    decode(&line)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_set_request_names_only_what_changes() {
        let request = Request::Set {
            options: Box::new(SetOptions {
                rate: Some("40mbit".into()),
                wash: Some(false),
                ..Default::default()
            }),
        };
        let line = encode(&request);
        assert_eq!(
            line,
            "{\"command\":\"set\",\"options\":{\"rate\":\"40mbit\",\"wash\":false}}\n"
        );
        assert_eq!(decode::<Request>(&line).unwrap(), request);
    }

    #[test]
    fn reload_leave_and_every_answer_round_trip() {
        assert_eq!(encode(&Request::Reload {}), "{\"command\":\"reload\"}\n");
        assert_eq!(encode(&Request::Leave {}), "{\"command\":\"leave\"}\n");
        for response in [
            Response::Changed {
                changes: vec!["rate: 20 Mbit/s -> 40 Mbit/s".into()],
            },
            Response::Changed { changes: vec![] },
            Response::Error {
                message: "a line\nand another".into(),
            },
            Response::Left { pid: 42 },
        ] {
            let line = encode(&response);
            assert_eq!(line.matches('\n').count(), 1, "one line: {line:?}");
            assert_eq!(decode::<Response>(&line).unwrap(), response);
        }
    }

    #[test]
    fn unknown_commands_and_settings_are_refused() {
        for bad in [
            "{\"command\":\"restart\"}",
            "{\"command\":\"set\",\"options\":{\"rat\":\"1gbit\"}}",
            "{\"command\":\"set\",\"options\":{\"overhead\":\"x\"}}",
            "{\"command\":\"reload\",\"file\":\"/etc/passwd\"}",
            "not json",
            "",
        ] {
            assert!(
                matches!(decode::<Request>(bad), Err(ProtocolError::Malformed(_))),
                "{bad:?}"
            );
        }
        let long = format!("{{\"command\":\"reload\"{}}}", " ".repeat(MAX_LINE_BYTES));
        assert!(matches!(
            decode::<Request>(&long),
            Err(ProtocolError::TooLong)
        ));
    }
}
