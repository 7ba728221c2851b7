//! The interfaces present and the devices of the default routes, read from rtnetlink; and the
//! notification groups that say they changed (RTM_NEWLINK/DELLINK, RTM_NEWROUTE/DELROUTE; see
//! `netlink::Subscription`).

use std::collections::BTreeSet;

use crate::{
    interfaces::Link,
    netlink::{
        IFLA_IFNAME, IFLA_INFO_KIND, IFLA_LINKINFO, NetlinkError, RTM_GETLINK, Socket, parse_attrs,
    },
};

const RTM_GETROUTE: u16 = 26;
const RTMGRP_LINK: u32 = 0x1;
const RTMGRP_IPV4_ROUTE: u32 = 0x40;
const RTMGRP_IPV6_ROUTE: u32 = 0x400;
const IFINFOMSG_LEN: usize = 16;
const RTMSG_LEN: usize = 12;
const RTA_OIF: u16 = 4;
const RTA_PRIORITY: u16 = 6;
const RTA_MULTIPATH: u16 = 9;
const RTA_TABLE: u16 = 15;
const RT_TABLE_MAIN: u32 = 254;
const RTN_UNICAST: u8 = 1;

/// Every interface of the namespace.
pub fn links(sock: &mut Socket) -> Result<Vec<Link>, NetlinkError> {
    let body = [0u8; IFINFOMSG_LEN];
    Ok(sock
        .dump(RTM_GETLINK, &body)?
        .iter()
        .filter_map(|m| parse_link(m))
        .collect())
}

/// A link message's interface.
fn parse_link(msg: &[u8]) -> Option<Link> {
    let ifindex = u32::from_ne_bytes(msg.get(4..8)?.try_into().ok()?);
    let mut name = None;
    let mut kind = None;
    for (t, _, value) in parse_attrs(msg.get(IFINFOMSG_LEN..)?) {
        match t {
            IFLA_IFNAME => name = Some(c_string(value)),
            IFLA_LINKINFO => {
                kind = parse_attrs(value)
                    .find(|(t, _, _)| *t == IFLA_INFO_KIND)
                    .map(|(_, _, v)| c_string(v));
            }
            _ => {}
        }
    }
    Some(Link {
        name: name?,
        ifindex,
        kind,
    })
}

fn c_string(value: &[u8]) -> String {
    String::from_utf8_lossy(value)
        .trim_end_matches('\0')
        .to_string()
}

/// A default route of the main table: its metric and its devices.
#[derive(Debug, Clone, PartialEq, Eq)]
struct DefaultRoute {
    family: u8,
    metric: u32,
    ifindexes: Vec<u32>,
}

fn parse_default_route(msg: &[u8]) -> Option<DefaultRoute> {
    let header = msg.get(..RTMSG_LEN)?;
    let (family, dst_len, table, kind) = (header[0], header[1], header[4], header[7]);
    if dst_len != 0 || kind != RTN_UNICAST {
        return None;
    }
    let mut table = u32::from(table);
    let mut metric = 0;
    let mut ifindexes = Vec::new();
    for (t, _, value) in parse_attrs(&msg[RTMSG_LEN..]) {
        let u32_of = |v: &[u8]| {
            v.get(..4)
                .map(|b| u32::from_ne_bytes(b.try_into().unwrap()))
        };
        match t {
            RTA_TABLE => table = u32_of(value)?,
            RTA_PRIORITY => metric = u32_of(value)?,
            RTA_OIF => ifindexes.push(u32_of(value)?),
            RTA_MULTIPATH => {
                // rtnexthop: len u16, flags u8, hops u8, ifindex i32, then its attributes.
                let mut rest = value;
                while rest.len() >= 8 {
                    let len = usize::from(u16::from_ne_bytes([rest[0], rest[1]]));
                    ifindexes.push(u32::from_ne_bytes(rest[4..8].try_into().unwrap()));
                    if len < 8 {
                        break;
                    }
                    rest = &rest[((len + 3) & !3).min(rest.len())..];
                }
            }
            _ => {}
        }
    }
    (table == RT_TABLE_MAIN && !ifindexes.is_empty()).then_some(DefaultRoute {
        family,
        metric,
        ifindexes,
    })
}

/// The devices of the IPv4 and IPv6 default routes (of each family, the route of the lowest
/// metric, all its next hops), by name among `links`.
pub fn default_route_devices(
    sock: &mut Socket,
    links: &[Link],
) -> Result<BTreeSet<String>, NetlinkError> {
    let mut routes = Vec::new();
    for family in [libc::AF_INET as u8, libc::AF_INET6 as u8] {
        let mut body = [0u8; RTMSG_LEN];
        body[0] = family;
        routes.extend(
            sock.dump(RTM_GETROUTE, &body)?
                .iter()
                .filter_map(|m| parse_default_route(m)),
        );
    }
    Ok(devices_of(&routes, links))
}

fn devices_of(routes: &[DefaultRoute], links: &[Link]) -> BTreeSet<String> {
    let mut devices = BTreeSet::new();
    for family in [libc::AF_INET as u8, libc::AF_INET6 as u8] {
        let best = routes
            .iter()
            .filter(|r| r.family == family)
            .min_by_key(|r| r.metric);
        for ifindex in best.iter().flat_map(|r| &r.ifindexes) {
            if let Some(link) = links.iter().find(|l| l.ifindex == *ifindex) {
                devices.insert(link.name.clone());
            }
        }
    }
    devices
}

/// The notification groups that say the links or the default routes changed.
pub const GROUPS: u32 = RTMGRP_LINK | RTMGRP_IPV4_ROUTE | RTMGRP_IPV6_ROUTE;

#[cfg(test)]
mod tests {
    use super::*;
    use crate::netlink::Attrs;

    fn route(family: u8, table: u8, attrs: &Attrs) -> Vec<u8> {
        let mut msg = vec![family, 0, 0, 0, table, 3, 0, RTN_UNICAST, 0, 0, 0, 0];
        msg.extend_from_slice(&attrs.0);
        msg
    }

    fn links() -> Vec<Link> {
        [(2, "eth0"), (3, "wg0"), (4, "eth1")]
            .map(|(i, n)| Link {
                name: n.into(),
                ifindex: i,
                kind: None,
            })
            .to_vec()
    }

    #[test]
    fn a_link_message_names_its_interface_and_kind() {
        let mut msg = vec![0u8; IFINFOMSG_LEN];
        msg[4..8].copy_from_slice(&7u32.to_ne_bytes());
        let mut info = Attrs::default();
        info.put_str(IFLA_INFO_KIND, "veth");
        let mut attrs = Attrs::default();
        attrs
            .put_str(IFLA_IFNAME, "s0")
            .put(IFLA_LINKINFO | 0x8000, &info.0);
        msg.extend_from_slice(&attrs.0);
        assert_eq!(
            parse_link(&msg),
            Some(Link {
                name: "s0".into(),
                ifindex: 7,
                kind: Some("veth".into())
            })
        );
    }

    #[test]
    fn the_default_route_of_the_lowest_metric_per_family() {
        let v4 = libc::AF_INET as u8;
        let v6 = libc::AF_INET6 as u8;
        let mut a = Attrs::default();
        a.put_u32(RTA_OIF, 2).put_u32(RTA_PRIORITY, 100);
        let mut b = Attrs::default();
        b.put_u32(RTA_OIF, 3).put_u32(RTA_PRIORITY, 50);
        let mut c = Attrs::default();
        c.put_u32(RTA_OIF, 4);
        let mut other_table = Attrs::default();
        other_table.put_u32(RTA_OIF, 4).put_u32(RTA_TABLE, 100);
        let routes: Vec<_> = [
            route(v4, 254, &a),
            route(v4, 254, &b),
            route(v6, 254, &c),
            route(v4, 100, &other_table),
        ]
        .iter()
        .filter_map(|m| parse_default_route(m))
        .collect();
        assert_eq!(routes.len(), 3);
        assert_eq!(
            devices_of(&routes, &links()),
            BTreeSet::from(["wg0".to_string(), "eth1".to_string()])
        );
        // Not a default route.
        let mut m = route(v4, 254, &a);
        m[1] = 24;
        assert_eq!(parse_default_route(&m), None);
    }

    #[test]
    fn a_multipath_default_route_names_every_hop() {
        let mut hops = Vec::new();
        for ifindex in [2u32, 4] {
            hops.extend_from_slice(&8u16.to_ne_bytes());
            hops.extend_from_slice(&[0, 0]);
            hops.extend_from_slice(&ifindex.to_ne_bytes());
        }
        let mut a = Attrs::default();
        a.put(RTA_MULTIPATH, &hops);
        let r = parse_default_route(&route(libc::AF_INET as u8, 254, &a)).unwrap();
        assert_eq!(
            devices_of(&[r], &links()),
            BTreeSet::from(["eth0".to_string(), "eth1".to_string()])
        );
    }
}
