//! The network interface being shaped: name, index, TX queues.

use std::{ffi::CString, os::unix::fs::MetadataExt};

use crate::netlink::{IFLA_NUM_TX_QUEUES, NetlinkError, RTM_GETLINK, Socket, parse_attrs};

#[derive(Debug, thiserror::Error)]
pub enum LinkError {
    #[error("no interface named {0:?} in this network namespace (see `ip link`)")]
    Unknown(String),
    #[error("reading link {iface}: {source}")]
    Netlink { iface: String, source: NetlinkError },
}

#[derive(Debug, Clone)]
pub struct Interface {
    pub name: String,
    pub ifindex: u32,
    /// Identifies the network namespace, so that two namespaces' `eth0` are told apart.
    pub netns_id: u64,
}

impl Interface {
    pub fn lookup(name: &str) -> Result<Self, LinkError> {
        let unknown = || LinkError::Unknown(name.to_string());
        let c_name = CString::new(name).map_err(|_| unknown())?;
        // SAFETY: NUL-terminated string; returns 0 when there is no such interface.
        let ifindex = unsafe { libc::if_nametoindex(c_name.as_ptr()) };
        if ifindex == 0 {
            return Err(unknown());
        }
        Ok(Self {
            name: name.to_string(),
            ifindex,
            netns_id: current_netns_id(),
        })
    }

    /// TX queues of the device (`mq` needs more than one).
    pub fn num_tx_queues(&self, sock: &mut Socket) -> Result<u32, LinkError> {
        let mut body = vec![0u8; 16];
        body[0] = libc::AF_UNSPEC as u8;
        body[4..8].copy_from_slice(&(self.ifindex as i32).to_ne_bytes());
        let replies = sock
            .request(RTM_GETLINK, 0, &body)
            .map_err(|source| LinkError::Netlink {
                iface: self.name.clone(),
                source,
            })?;
        let queues = replies
            .iter()
            .filter(|r| r.len() >= 16)
            .flat_map(|r| parse_attrs(&r[16..]))
            .find(|(kind, _, v)| *kind == IFLA_NUM_TX_QUEUES && v.len() == 4)
            .map(|(_, _, v)| u32::from_ne_bytes(v.try_into().unwrap()))
            .unwrap_or(1);
        Ok(queues)
    }
}

/// The inode of this process's network namespace.
pub fn current_netns_id() -> u64 {
    std::fs::metadata("/proc/self/ns/net")
        .map(|m| m.ino())
        .unwrap_or(0)
}
