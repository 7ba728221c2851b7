//! The machine's own addresses, IPv4 and IPv6, on every interface, read from rtnetlink
//! (RTM_GETADDR): in a host key each of them is the machine (`isolation::SELF_HOST`), one host
//! whatever the family or the address it sends from, so that a dual-stack server is fair
//! between its clients of either family (docs/design.md, "How a host is identified"). The set
//! is read again whole whenever the address notifications ([`GROUPS`]) say it changed.

use std::{
    collections::BTreeSet,
    net::{IpAddr, Ipv4Addr, Ipv6Addr},
};

use shaper_common::isolation::own_lookup_key;
use tracing::warn;

use crate::{
    bpf::{BpfError, Datapath},
    netlink::{NetlinkError, Socket, parse_attrs},
};

const RTM_GETADDR: u16 = 22;
const RTMGRP_IPV4_IFADDR: u32 = 0x10;
const RTMGRP_IPV6_IFADDR: u32 = 0x100;
const IFADDRMSG_LEN: usize = 8;
const IFA_ADDRESS: u16 = 1;
const IFA_LOCAL: u16 = 2;

/// The notification groups that say an address was added or removed.
pub const GROUPS: u32 = RTMGRP_IPV4_IFADDR | RTMGRP_IPV6_IFADDR;

/// The machine's own addresses, as the data path looks them up (`isolation::own_lookup_key`).
pub type Own = BTreeSet<[u32; 4]>;

/// Every address of every interface of the namespace, both families.
pub fn addresses(sock: &mut Socket) -> Result<Own, NetlinkError> {
    // An ifaddrmsg of family AF_UNSPEC: every family.
    let body = [0u8; IFADDRMSG_LEN];
    Ok(sock
        .dump(RTM_GETADDR, &body)?
        .iter()
        .filter_map(|m| parse_address(m))
        .map(lookup_key)
        .collect())
}

/// An address message's own address. IFA_LOCAL is the address itself where the kernel gives
/// one; on a point-to-point link (PPP, a tunnel with a peer) IFA_ADDRESS is the peer's.
fn parse_address(msg: &[u8]) -> Option<IpAddr> {
    let family = i32::from(*msg.first()?);
    let (mut local, mut address) = (None, None);
    for (t, _, value) in parse_attrs(msg.get(IFADDRMSG_LEN..)?) {
        match t {
            IFA_LOCAL => local = Some(value),
            IFA_ADDRESS => address = Some(value),
            _ => {}
        }
    }
    let value = local.or(address)?;
    match family {
        libc::AF_INET => Some(Ipv4Addr::from(<[u8; 4]>::try_from(value.get(..4)?).ok()?).into()),
        libc::AF_INET6 => Some(Ipv6Addr::from(<[u8; 16]>::try_from(value.get(..16)?).ok()?).into()),
        _ => None,
    }
}

/// `addr` as the data path looks it up (`isolation::own_lookup_key`), from its words as a
/// packet carries them.
pub fn lookup_key(addr: IpAddr) -> [u32; 4] {
    let word = |b: &[u8]| u32::from_ne_bytes(b.try_into().unwrap());
    match addr {
        IpAddr::V4(a) => own_lookup_key(&[word(&a.octets()), 0, 0, 0], false),
        IpAddr::V6(a) => {
            let o = a.octets();
            own_lookup_key(&std::array::from_fn(|i| word(&o[4 * i..4 * i + 4])), true)
        }
    }
}

/// Writes `own` to `datapath` (`iface`'s, for the log). Addresses beyond the map's room are
/// hosts of their own, and said so.
pub fn apply(datapath: &mut Datapath, own: &Own, iface: &str) -> Result<(), BpfError> {
    let left_out = datapath.set_own_addresses(own)?;
    if left_out > 0 {
        warn!(
            "{iface}: {left_out} of the machine's {} addresses are each a host of their own (room for {})",
            own.len(),
            shaper_common::sizing::OWN_ADDRESSES
        );
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::netlink::Attrs;

    fn message(family: i32, attrs: &Attrs) -> Vec<u8> {
        let mut msg = vec![0u8; IFADDRMSG_LEN];
        msg[0] = family as u8;
        msg.extend_from_slice(&attrs.0);
        msg
    }

    #[test]
    fn an_address_is_the_local_one_not_a_point_to_point_peer() {
        let mut ppp = Attrs::default();
        ppp.put(IFA_ADDRESS, &[192, 0, 2, 1])
            .put(IFA_LOCAL, &[198, 51, 100, 7]);
        assert_eq!(
            parse_address(&message(libc::AF_INET, &ppp)),
            Some(Ipv4Addr::new(198, 51, 100, 7).into())
        );
        let v6: Ipv6Addr = "fd09::1".parse().unwrap();
        let mut lan = Attrs::default();
        lan.put(IFA_ADDRESS, &v6.octets());
        assert_eq!(
            parse_address(&message(libc::AF_INET6, &lan)),
            Some(v6.into())
        );
        assert_eq!(parse_address(&message(libc::AF_PACKET, &lan)), None);
        let mut short = Attrs::default();
        short.put(IFA_ADDRESS, &[10, 0]);
        assert_eq!(parse_address(&message(libc::AF_INET, &short)), None);
    }

    #[test]
    fn the_loader_keys_addresses_as_the_data_path_looks_them_up() {
        let bytes = |k: [u32; 4]| -> Vec<u8> { k.iter().flat_map(|w| w.to_ne_bytes()).collect() };
        let v4 = Ipv4Addr::new(10, 9, 0, 1);
        assert_eq!(
            bytes(lookup_key(v4.into())),
            v4.to_ipv6_mapped().octets().to_vec()
        );
        let v6: Ipv6Addr = "fd09::1".parse().unwrap();
        assert_eq!(bytes(lookup_key(v6.into())), v6.octets().to_vec());
    }
}
