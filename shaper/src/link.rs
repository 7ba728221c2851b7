//! The network interface being shaped: name, index, TX queues, GSO and GRO limits, offloads;
//! and the IFB devices that ingress shaping creates.

use std::{
    ffi::CString,
    os::{
        fd::{AsRawFd, FromRawFd, OwnedFd},
        unix::fs::MetadataExt,
    },
};

use serde::{Deserialize, Serialize};
use tracing::{info, warn};

use crate::{
    filter::{Filter, Hook},
    netlink::{
        Attrs, IFLA_GRO_IPV4_MAX_SIZE, IFLA_GRO_MAX_SIZE, IFLA_GSO_MAX_SEGS, IFLA_GSO_MAX_SIZE,
        IFLA_IFNAME, IFLA_INFO_KIND, IFLA_LINKINFO, IFLA_MTU, IFLA_NUM_RX_QUEUES,
        IFLA_NUM_TX_QUEUES, IFLA_TXQLEN, NLM_F_CREATE, NLM_F_EXCL, NetlinkError, RTM_DELLINK,
        RTM_GETLINK, RTM_NEWLINK, Socket, parse_attrs,
    },
};

#[derive(Debug, thiserror::Error)]
pub enum LinkError {
    #[error("no interface named {0:?} in this network namespace (see `ip link`)")]
    Unknown(String),
    #[error("reading link {iface}: {source}")]
    Netlink { iface: String, source: NetlinkError },
    #[error(
        "{iface} is a link of type {arphrd} (ARPHRD_*, include/uapi/linux/if_arp.h): shaper shapes Ethernet devices and devices that carry IP alone (PPP, WireGuard, IP tunnels, tun)"
    )]
    LinkType { iface: String, arphrd: u16 },
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
        let [queues] = self.link_u32s(sock, [IFLA_NUM_TX_QUEUES])?;
        Ok(queues.unwrap_or(1))
    }

    pub fn mtu(&self, sock: &mut Socket) -> Result<u32, LinkError> {
        let [mtu] = self.link_u32s(sock, [IFLA_MTU])?;
        Ok(mtu.unwrap_or(1_500))
    }

    /// The link-layer header in front of the network header of what the device sends
    /// ([`link_header_bytes`] of its type).
    pub fn link_header_bytes(&self, sock: &mut Socket) -> Result<u32, LinkError> {
        let replies = self.getlink(sock)?;
        // struct ifinfomsg: family, pad, then the ARPHRD_* type.
        let arphrd = replies
            .iter()
            .find(|r| r.len() >= 16)
            .map_or(ARPHRD_ETHER, |r| u16::from_ne_bytes([r[2], r[3]]));
        link_header_bytes(arphrd).ok_or_else(|| LinkError::LinkType {
            iface: self.name.clone(),
            arphrd,
        })
    }

    /// The device's current GSO limits.
    pub fn gso_limits(&self, sock: &mut Socket) -> Result<GsoLimits, LinkError> {
        let [size, segs] = self.link_u32s(sock, [IFLA_GSO_MAX_SIZE, IFLA_GSO_MAX_SEGS])?;
        Ok(GsoLimits {
            max_size: size.unwrap_or(GsoLimits::UNKNOWN.max_size),
            max_segs: segs.unwrap_or(GsoLimits::UNKNOWN.max_segs),
        })
    }

    /// Sets the device's GSO limits (no link down/up; sockets pick them up as they connect).
    pub fn set_gso_limits(&self, sock: &mut Socket, limits: GsoLimits) -> Result<(), LinkError> {
        let mut body = self.ifinfo();
        let mut attrs = Attrs::default();
        attrs
            .put_u32(IFLA_GSO_MAX_SIZE, limits.max_size)
            .put_u32(IFLA_GSO_MAX_SEGS, limits.max_segs);
        body.extend_from_slice(&attrs.0);
        sock.request(RTM_NEWLINK, 0, &body)
            .map(|_| ())
            .map_err(|source| self.netlink_error(source))
    }

    /// The device's GRO limits; `None` on kernels without them (< 5.19).
    pub fn gro_limits(&self, sock: &mut Socket) -> Result<Option<GroLimits>, LinkError> {
        let [size, ipv4] = self.link_u32s(sock, [IFLA_GRO_MAX_SIZE, IFLA_GRO_IPV4_MAX_SIZE])?;
        Ok(size.map(|max_size| GroLimits {
            max_size,
            ipv4_max_size: ipv4,
        }))
    }

    /// Sets the device's GRO limits; packets being merged now finish at the old ones.
    pub fn set_gro_limits(&self, sock: &mut Socket, limits: GroLimits) -> Result<(), LinkError> {
        let mut body = self.ifinfo();
        let mut attrs = Attrs::default();
        // The kernel applies the IPv4 limit after the general one, which (at 64 KB or less)
        // sets both: restoring a BIG TCP IPv4 limit needs it last.
        attrs.put_u32(IFLA_GRO_MAX_SIZE, limits.max_size);
        if let Some(v4) = limits.ipv4_max_size {
            attrs.put_u32(IFLA_GRO_IPV4_MAX_SIZE, v4);
        }
        body.extend_from_slice(&attrs.0);
        sock.request(RTM_NEWLINK, 0, &body)
            .map(|_| ())
            .map_err(|source| self.netlink_error(source))
    }

    /// The device's kind (`ifb`, `veth`...; empty for physical devices).
    pub fn kind(&self, sock: &mut Socket) -> Result<String, LinkError> {
        let replies = self.getlink(sock)?;
        let kind = link_attrs(&replies)
            .filter(|(kind, _, _)| *kind == IFLA_LINKINFO)
            .flat_map(|(_, _, info)| parse_attrs(info))
            .find(|(kind, _, _)| *kind == IFLA_INFO_KIND)
            .map(|(_, _, v)| {
                String::from_utf8_lossy(v)
                    .trim_end_matches('\0')
                    .to_string()
            });
        Ok(kind.unwrap_or_default())
    }

    /// Creates an IFB device with `queues` TX and RX queues, this MTU and transmit queue length
    /// (`None`: the IFB's default), and brings it up.
    pub fn create_ifb(
        sock: &mut Socket,
        name: &str,
        mtu: u32,
        queues: u32,
        txqlen: Option<u32>,
    ) -> Result<Self, LinkError> {
        let netlink = |source| LinkError::Netlink {
            iface: name.to_string(),
            source,
        };
        let mut info = Attrs::default();
        info.put_str(IFLA_INFO_KIND, "ifb");
        let mut attrs = Attrs::default();
        attrs
            .put_str(IFLA_IFNAME, name)
            .put_u32(IFLA_MTU, mtu)
            .put_u32(IFLA_NUM_TX_QUEUES, queues)
            .put_u32(IFLA_NUM_RX_QUEUES, queues)
            .put(IFLA_LINKINFO, &info.0);
        if let Some(len) = txqlen {
            attrs.put_u32(IFLA_TXQLEN, len);
        }
        let mut body = vec![0u8; 16];
        body[0] = libc::AF_UNSPEC as u8;
        body.extend_from_slice(&attrs.0);
        sock.request(RTM_NEWLINK, NLM_F_CREATE | NLM_F_EXCL, &body)
            .map_err(netlink)?;
        let ifb = Self::lookup(name)?;
        let mut up = ifb.ifinfo();
        up[8..12].copy_from_slice(&(libc::IFF_UP as u32).to_ne_bytes());
        up[12..16].copy_from_slice(&(libc::IFF_UP as u32).to_ne_bytes());
        if let Err(source) = sock.request(RTM_NEWLINK, 0, &up) {
            let _ = ifb.delete(sock);
            return Err(netlink(source));
        }
        Ok(ifb)
    }

    /// Deletes the device (with its qdiscs and programs).
    pub fn delete(&self, sock: &mut Socket) -> Result<(), LinkError> {
        sock.request(RTM_DELLINK, 0, &self.ifinfo())
            .map(drop)
            .map_err(|source| self.netlink_error(source))
    }

    /// The u32 link attributes `attrs`, from one RTM_GETLINK.
    fn link_u32s<const N: usize>(
        &self,
        sock: &mut Socket,
        attrs: [u16; N],
    ) -> Result<[Option<u32>; N], LinkError> {
        let replies = self.getlink(sock)?;
        let mut values = [None; N];
        for (kind, _, v) in link_attrs(&replies) {
            if let (Some(i), Ok(bytes)) = (attrs.iter().position(|a| *a == kind), v.try_into()) {
                values[i] = Some(u32::from_ne_bytes(bytes));
            }
        }
        Ok(values)
    }

    /// The kernel's RTM_GETLINK reply for the device.
    fn getlink(&self, sock: &mut Socket) -> Result<Vec<Vec<u8>>, LinkError> {
        sock.request(RTM_GETLINK, 0, &self.ifinfo())
            .map_err(|source| self.netlink_error(source))
    }

    /// A `struct ifinfomsg` addressing this interface.
    fn ifinfo(&self) -> Vec<u8> {
        let mut body = vec![0u8; 16];
        body[0] = libc::AF_UNSPEC as u8;
        body[4..8].copy_from_slice(&(self.ifindex as i32).to_ne_bytes());
        body
    }

    fn netlink_error(&self, source: NetlinkError) -> LinkError {
        LinkError::Netlink {
            iface: self.name.clone(),
            source,
        }
    }
}

/// A device offload, by its ethtool get command (the legacy ones, which the kernel answers
/// from the device's feature flags for every driver).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Offload {
    Tso = 0x1e,
    Gso = 0x23,
    Gro = 0x2b,
}

impl Interface {
    /// Whether `offload` is on; `None` when the device does not say.
    pub fn offload(&self, offload: Offload) -> Option<bool> {
        /// struct ethtool_value.
        #[repr(C)]
        struct EthtoolValue {
            cmd: u32,
            data: u32,
        }
        /// struct ifreq with its union as ifr_data (40 bytes).
        #[repr(C)]
        struct IfReq {
            name: [u8; libc::IFNAMSIZ],
            data: *mut EthtoolValue,
            rest: [u8; 16],
        }
        const _: () = assert!(std::mem::size_of::<IfReq>() == 40);
        const SIOCETHTOOL: libc::Ioctl = 0x8946;
        let mut value = EthtoolValue {
            cmd: offload as u32,
            data: 0,
        };
        let mut req = IfReq {
            name: [0; libc::IFNAMSIZ],
            data: &mut value,
            rest: [0; 16],
        };
        // Interface names are at most 15 bytes; the 16th stays the terminating NUL.
        let name = &self.name.as_bytes()[..self.name.len().min(libc::IFNAMSIZ - 1)];
        req.name[..name.len()].copy_from_slice(name);
        // SAFETY: plain socket(2) call; the result is checked before being wrapped.
        let raw = unsafe { libc::socket(libc::AF_INET, libc::SOCK_DGRAM | libc::SOCK_CLOEXEC, 0) };
        if raw < 0 {
            return None;
        }
        // SAFETY: `raw` is a fresh descriptor we own.
        let sock = unsafe { OwnedFd::from_raw_fd(raw) };
        // SAFETY: SIOCETHTOOL reads the ifreq and writes `value`, both alive across the call.
        let rc = unsafe { libc::ioctl(sock.as_raw_fd(), SIOCETHTOOL, &mut req) };
        (rc == 0).then_some(value.data != 0)
    }
}

/// The link attributes of RTM_GETLINK replies (after their `struct ifinfomsg`).
fn link_attrs(replies: &[Vec<u8>]) -> impl Iterator<Item = (u16, u16, &[u8])> {
    replies
        .iter()
        .filter(|r| r.len() >= 16)
        .flat_map(|r| parse_attrs(&r[16..]))
}

/// Enough IFB queues that a direction through an IFB is not one qdisc lock for every CPU.
const MAX_IFB_QUEUES: u32 = 16;

/// An IFB device shaper creates for an interface, and the filter of the interface's clsact
/// that sends packets to it: the one place that knows the IFBs' names and roles, for the parts
/// that create them and for `shaper reset`, which removes them without a record.
#[derive(Debug, Clone, Copy)]
pub struct IfbRole {
    prefix: &'static str,
    /// The interface's hook whose last filter redirects to the IFB.
    pub hook: Hook,
    /// That filter's kind.
    pub kind: &'static str,
}

/// Ingress shaping's IFB (`ingress`), which a `matchall` redirect at the interface's ingress
/// feeds.
pub const INGRESS_IFB: IfbRole = IfbRole {
    prefix: "ifb4",
    hook: Hook::Ingress,
    kind: "matchall",
};

/// The segmenter's IFB (`segmenter`), which a classifier program at the interface's egress
/// feeds.
pub const SEGMENTER_IFB: IfbRole = IfbRole {
    prefix: "seg4",
    hook: Hook::Egress,
    kind: "bpf",
};

/// Every IFB shaper creates.
pub const IFB_ROLES: [IfbRole; 2] = [INGRESS_IFB, SEGMENTER_IFB];

impl IfbRole {
    /// The IFB's name for `iface`: `<prefix><iface>` where it fits in 15 bytes (as
    /// sqm-scripts' `ifb4<iface>`), else `<prefix>i<ifindex>`.
    pub fn name(&self, iface: &Interface) -> String {
        let name = format!("{}{}", self.prefix, iface.name);
        if name.len() <= 15 {
            name
        } else {
            format!("{}i{}", self.prefix, iface.ifindex)
        }
    }

    /// The filter that redirects `iface`'s packets to the IFB: the last of its hook.
    pub fn redirect(&self, iface: &Interface) -> Filter {
        Filter {
            ifindex: iface.ifindex,
            hook: self.hook,
            kind: self.kind,
        }
    }
}

/// How many queues shaper gives an IFB device: one per CPU, up to [`MAX_IFB_QUEUES`].
pub fn ifb_queues() -> u32 {
    std::thread::available_parallelism()
        .map_or(1, |n| n.get() as u32)
        .min(MAX_IFB_QUEUES)
}

/// Largest GSO packet the kernel builds by default (without BIG TCP).
const GSO_MAX_BYTES: u32 = 65_536;

/// The link-layer header in front of an Ethernet device's network header.
pub const ETH_HEADER_BYTES: u32 = 14;

const ARPHRD_ETHER: u16 = 1;
const ARPHRD_PPP: u16 = 512;
const ARPHRD_RAWIP: u16 = 519;
const ARPHRD_TUNNEL: u16 = 768;
const ARPHRD_TUNNEL6: u16 = 769;
const ARPHRD_LOOPBACK: u16 = 772;
const ARPHRD_SIT: u16 = 776;
const ARPHRD_IPGRE: u16 = 778;
const ARPHRD_IP6GRE: u16 = 823;
const ARPHRD_NONE: u16 = 0xfffe;

/// The link-layer header a device of type `arphrd` puts in front of the network header of
/// what it sends: Ethernet's (VLAN devices and bridges are Ethernet; the loopback device uses
/// its header too), none on the devices that carry IP alone (PPP, WireGuard and tun are
/// `ARPHRD_NONE`, the IP-in-IP and GRE tunnels their own types). `None` for any other kind of
/// link, which the parser cannot read.
pub fn link_header_bytes(arphrd: u16) -> Option<u32> {
    match arphrd {
        ARPHRD_ETHER | ARPHRD_LOOPBACK => Some(ETH_HEADER_BYTES),
        ARPHRD_NONE | ARPHRD_PPP | ARPHRD_RAWIP | ARPHRD_TUNNEL | ARPHRD_TUNNEL6 | ARPHRD_SIT
        | ARPHRD_IPGRE | ARPHRD_IP6GRE => Some(0),
        _ => None,
    }
}

/// A full Ethernet frame: the unit of the GSO budget.
const FRAME_BYTES: u32 = 1_500 + ETH_HEADER_BYTES;

/// Longest a packet GRO builds on the shaped device's receive path may occupy the wire at the
/// ingress rate. One timestamp covers the whole packet, and what leaves the IFB together reaches
/// the receiver together: its ACKs come back in a clump and the remote sender, clocked by them,
/// bursts into the bottleneck upstream. CAKE splits GSO below 1 Gbit/s for the same reason; GRO
/// is held to this before it builds: about ten frames at 1 Gbit/s, no merging at 100 Mbit/s.
pub const GRO_BUDGET_NS: u64 = 125_000;

/// The longest burst a packet may make stamped whole, whoever built it: local TCP (its GSO
/// limits are lowered to it) or another host (a forwarded TSO or GRO packet longer than it is
/// split into frames by the segmenter, see `segmenter`). A burst only delays what follows it into
/// the next bottleneck, by at most this. Splitting costs a software segmentation and a pass
/// through an IFB per frame, CPU better spent elsewhere at high rates: 1 ms splits every
/// super-packet at 10 Mbit/s, those over 4 frames at 50 Mbit/s, over 23 at 280 Mbit/s, none from
/// 524 Mbit/s (CAKE: all of them below 1 Gbit/s, where 64 KB is 0.5 ms).
///
/// Local TCP is never held below [`TCP_MIN_SEGS`] per packet: TCP Small Queues lets a socket
/// keep about two of its own packets below it (or a millisecond at its pacing rate), so the
/// packets' size is how long the link stays busy when the socket is next served late
/// (docs/notebook/busy-host.md). Where a packet of [`TCP_MIN_SEGS`] is longer than the burst,
/// the segmenter gives its frames their own departures, as CAKE's split-gso does.
pub const SEGMENT_BURST_NS: u64 = 1_000_000;

/// The fewest segments TCP puts in a packet it builds (the kernel's `tcp_min_tso_segs`
/// default): the GSO limits shaper sets never go below it.
pub const TCP_MIN_SEGS: u32 = 2;

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct GsoLimits {
    pub max_size: u32,
    pub max_segs: u32,
}

impl GsoLimits {
    /// What the kernel allows by default (without BIG TCP): assumed for a limit the device does
    /// not report, or when its limits cannot be read.
    pub const UNKNOWN: GsoLimits = GsoLimits {
        max_size: GSO_MAX_BYTES,
        max_segs: u16::MAX as u32,
    };

    /// The limits for shaping at `rate_bps`: a super-packet of at most [`SEGMENT_BURST_NS`] of
    /// wire time, never less than [`TCP_MIN_SEGS`] frames, never more than the device allows
    /// now. `None` when the current limits are already within the budget (nothing to change).
    pub fn for_rate(rate_bps: u64, current: GsoLimits) -> Option<GsoLimits> {
        let budget = bytes_in(rate_bps, SEGMENT_BURST_NS);
        if budget >= GSO_MAX_BYTES as u64 {
            return None;
        }
        let segs = (budget / FRAME_BYTES as u64).clamp(TCP_MIN_SEGS as u64, u16::MAX as u64) as u32;
        // TCP keeps room for its headers below the size limit.
        let size = budget.clamp(
            TCP_MIN_SEGS as u64 * FRAME_BYTES as u64,
            GSO_MAX_BYTES as u64,
        ) as u32;
        let wanted = GsoLimits {
            max_size: size.min(current.max_size),
            max_segs: segs.min(current.max_segs),
        };
        (wanted != current).then_some(wanted)
    }

    /// The most segments a packet built elsewhere (forwarded TSO, GRO) may have to be stamped
    /// whole at `rate_bps`: [`SEGMENT_BURST_NS`] of wire time in frames, at least one; larger
    /// ones go through the segmenter. `None` where that holds the largest GSO packet.
    pub fn split_segs(rate_bps: u64) -> Option<u32> {
        let burst = bytes_in(rate_bps, SEGMENT_BURST_NS);
        (burst < GSO_MAX_BYTES as u64)
            .then(|| (burst / FRAME_BYTES as u64).clamp(1, u16::MAX as u64) as u32)
    }

    /// Wire bytes of the largest packet a device with these limits sends, for frames of
    /// `frame_bytes`: what the calendar's bins must hold. Never under two frames: a host's TCP
    /// builds packets of at least two segments (`tcp_min_tso_segs`) and a router forwards them
    /// whole, whatever its own device's limits.
    pub fn largest_packet_bytes(&self, frame_bytes: u32) -> u64 {
        let frame = frame_bytes as u64;
        let by_segs = self.max_segs as u64 * frame;
        let by_size = self.max_size as u64 + frame;
        by_segs.min(by_size).max(2 * frame)
    }
}

fn bytes_in(rate_bps: u64, ns: u64) -> u64 {
    (rate_bps as u128 * ns as u128 / 8_000_000_000) as u64
}

/// How large a packet the device's receive path (GRO) may build from one flow's segments.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct GroLimits {
    pub max_size: u32,
    /// The separate IPv4 limit of kernels 6.3+ (BIG TCP); `None` before.
    pub ipv4_max_size: Option<u32>,
}

impl GroLimits {
    /// The limits for shaping the device's incoming traffic at `rate_bps`. A packet GRO builds
    /// gets one departure time, like a GSO packet, so it is held to a wire-time budget
    /// ([`GRO_BUDGET_NS`]); a budget under one frame means GRO merges nothing (the kernel
    /// stops merging once the packet would reach the limit). This is what CAKE's split-gso
    /// does to forwarded super-packets, done before they are built. `None`: nothing to change.
    pub fn for_rate(rate_bps: u64, current: GroLimits) -> Option<GroLimits> {
        let budget = bytes_in(rate_bps, GRO_BUDGET_NS);
        if budget >= GSO_MAX_BYTES as u64 {
            return None;
        }
        let size = (budget.max(FRAME_BYTES as u64) as u32).min(current.max_size);
        let wanted = GroLimits {
            max_size: size,
            ipv4_max_size: current.ipv4_max_size.map(|v| v.min(size)),
        };
        (wanted != current).then_some(wanted)
    }
}

/// Limits of a device that shaper lowers at low rates and puts back on exit: GSO (what local
/// TCP builds for the device) and GRO (what the device's receive path builds).
pub trait DeviceLimits: Copy + PartialEq + std::fmt::Debug {
    const WHAT: &'static str;
    fn read(iface: &Interface, sock: &mut Socket) -> Result<Option<Self>, LinkError>;
    fn write(self, iface: &Interface, sock: &mut Socket) -> Result<(), LinkError>;
    /// The limits for `rate_bps`, from the device's own; `None`: keep them.
    fn for_rate(rate_bps: u64, baseline: Self) -> Option<Self>;
}

impl DeviceLimits for GsoLimits {
    const WHAT: &'static str = "GSO";
    fn read(iface: &Interface, sock: &mut Socket) -> Result<Option<Self>, LinkError> {
        iface.gso_limits(sock).map(Some)
    }
    fn write(self, iface: &Interface, sock: &mut Socket) -> Result<(), LinkError> {
        iface.set_gso_limits(sock, self)
    }
    fn for_rate(rate_bps: u64, baseline: Self) -> Option<Self> {
        GsoLimits::for_rate(rate_bps, baseline)
    }
}

impl DeviceLimits for GroLimits {
    const WHAT: &'static str = "GRO";
    fn read(iface: &Interface, sock: &mut Socket) -> Result<Option<Self>, LinkError> {
        iface.gro_limits(sock)
    }
    fn write(self, iface: &Interface, sock: &mut Socket) -> Result<(), LinkError> {
        iface.set_gro_limits(sock, self)
    }
    fn for_rate(rate_bps: u64, baseline: Self) -> Option<Self> {
        GroLimits::for_rate(rate_bps, baseline)
    }
}

/// A device's limits now, before any shaper (`baseline`), and for the rate (the device's own
/// when not splitting).
pub struct LimitsPlan<L> {
    current: L,
    baseline: L,
    pub wanted: L,
}

impl<L: DeviceLimits> LimitsPlan<L> {
    /// What to restore on exit once the plan may have been applied: recorded before it is, so
    /// that a crash while applying it still leaves the device's own limits on record.
    pub fn to_restore(&self) -> Option<L> {
        (self.wanted != self.baseline || self.current != self.baseline).then_some(self.baseline)
    }
}

/// The baseline is what the device had before any shaper: the limits found now, or those a
/// previous unclean run recorded, so a restart at another rate starts from the device's own
/// limits, not from the previous run's. `None` when the device's limits cannot be read.
pub fn plan_limits<L: DeviceLimits>(
    sock: &mut Socket,
    iface: &Interface,
    rate_bps: u64,
    split: bool,
    recorded: Option<L>,
) -> Option<LimitsPlan<L>> {
    let current = match L::read(iface, sock) {
        Ok(Some(c)) => c,
        Ok(None) => return None,
        Err(e) => {
            warn!("reading the {} limits of {}: {e}", L::WHAT, iface.name);
            return None;
        }
    };
    let baseline = recorded.unwrap_or(current);
    let wanted = if split {
        L::for_rate(rate_bps, baseline).unwrap_or(baseline)
    } else {
        baseline
    };
    Some(LimitsPlan {
        current,
        baseline,
        wanted,
    })
}

/// Sets the planned limits (what to restore on exit is recorded before, from
/// [`LimitsPlan::to_restore`]). A device that refuses is shaped anyway, with coarser packets
/// (warned).
pub fn apply_limits<L: DeviceLimits>(sock: &mut Socket, iface: &Interface, plan: LimitsPlan<L>) {
    let LimitsPlan {
        current,
        baseline,
        wanted,
    } = plan;
    if wanted == current {
        return;
    }
    match wanted.write(iface, sock) {
        Ok(()) => info!(
            "{} limits of {} set to {wanted:?} (device's own: {baseline:?})",
            L::WHAT,
            iface.name
        ),
        Err(e) => warn!("setting the {} limits of {}: {e}", L::WHAT, iface.name),
    }
}

/// Puts back limits `apply_limits` changed (`None`: nothing was changed); a failure is warned,
/// the rest of the exit goes on.
pub fn restore_limits<L: DeviceLimits>(sock: &mut Socket, iface: &Interface, original: Option<L>) {
    if let Some(limits) = original
        && let Err(e) = limits.write(iface, sock)
    {
        warn!("restoring the {} limits of {}: {e}", L::WHAT, iface.name);
    }
}

/// The inode of this process's network namespace.
pub fn current_netns_id() -> u64 {
    std::fs::metadata("/proc/self/ns/net")
        .map(|m| m.ino())
        .unwrap_or(0)
}

#[cfg(test)]
mod tests {

    #[test]
    fn devices_that_carry_ip_alone_have_no_link_header() {
        assert_eq!(link_header_bytes(ARPHRD_ETHER), Some(14));
        // WireGuard and tun, PPP, ipip, gre.
        for arphrd in [ARPHRD_NONE, ARPHRD_PPP, ARPHRD_TUNNEL, ARPHRD_IPGRE] {
            assert_eq!(link_header_bytes(arphrd), Some(0), "{arphrd}");
        }
        // InfiniBand, CAN: refused, never parsed as something else.
        assert_eq!(link_header_bytes(32), None);
        assert_eq!(link_header_bytes(280), None);
    }

    use super::*;

    const DEFAULT: GsoLimits = GsoLimits::UNKNOWN;

    #[test]
    fn forwarded_packets_are_split_over_a_millisecond_of_wire_time() {
        assert_eq!(GsoLimits::split_segs(10_000_000), Some(1));
        assert_eq!(GsoLimits::split_segs(50_000_000), Some(4));
        assert_eq!(GsoLimits::split_segs(280_000_000), Some(23));
        assert_eq!(GsoLimits::split_segs(500_000_000), Some(41));
        assert_eq!(GsoLimits::split_segs(525_000_000), None);
        assert_eq!(GsoLimits::split_segs(10_000_000_000), None);
    }

    #[test]
    fn gso_is_limited_to_the_burst_at_the_rate_and_never_below_tcps_two_segments() {
        // From 524 Mbit/s 64 KB is under a millisecond: left alone.
        assert_eq!(GsoLimits::for_rate(1_000_000_000, DEFAULT), None);
        // 280 Mbit/s: 35 KB, 23 frames, as the segmenter's threshold (nothing local is split).
        assert_eq!(
            GsoLimits::for_rate(280_000_000, DEFAULT),
            Some(GsoLimits {
                max_size: 35_000,
                max_segs: 23
            })
        );
        assert_eq!(
            GsoLimits::for_rate(73_000_000, DEFAULT),
            Some(GsoLimits {
                max_size: 9_125,
                max_segs: 6
            })
        );
        // 30 Mbit/s: two frames' time; below, TCP's own minimum of two segments (split by the
        // segmenter, as that is over the burst).
        assert_eq!(
            GsoLimits::for_rate(30_000_000, DEFAULT),
            Some(GsoLimits {
                max_size: 3_750,
                max_segs: 2
            })
        );
        for rate in [10_000_000, 1_000_000] {
            assert_eq!(
                GsoLimits::for_rate(rate, DEFAULT),
                Some(GsoLimits {
                    max_size: 3_028,
                    max_segs: 2
                })
            );
        }
    }

    #[test]
    fn largest_packet_is_the_limits_in_frames_and_at_least_two() {
        assert_eq!(DEFAULT.largest_packet_bytes(1_514), 65_536 + 1_514);
        let fast = GsoLimits::for_rate(280_000_000, DEFAULT).unwrap();
        assert_eq!(fast.largest_packet_bytes(1_514), 23 * 1_514);
        let slow = GsoLimits::for_rate(1_000_000, DEFAULT).unwrap();
        assert_eq!(slow.largest_packet_bytes(1_514), 2 * 1_514);
        let few = GsoLimits {
            max_size: 65_536,
            max_segs: 4,
        };
        assert_eq!(few.largest_packet_bytes(9_014), 4 * 9_014);
    }

    #[test]
    fn gro_is_held_to_its_budget() {
        let default = GroLimits {
            max_size: 65_536,
            ipv4_max_size: Some(65_536),
        };
        // 1 Gbit/s: about ten frames; 100 Mbit/s and below: no merging.
        assert_eq!(
            GroLimits::for_rate(1_000_000_000, default),
            Some(GroLimits {
                max_size: 15_625,
                ipv4_max_size: Some(15_625)
            })
        );
        // (Two 1448-byte segments with their headers make 2,948 bytes: below that, no merge.)
        for (rate, size) in [(100_000_000, 1_562), (1_000_000, FRAME_BYTES)] {
            assert_eq!(
                GroLimits::for_rate(rate, default).map(|g| g.max_size),
                Some(size)
            );
        }
        // Fast rates and devices already tighter are left alone; 6.1 has no IPv4 limit.
        assert_eq!(GroLimits::for_rate(5_000_000_000, default), None);
        let tight = GroLimits {
            max_size: 1_000,
            ipv4_max_size: None,
        };
        assert_eq!(GroLimits::for_rate(10_000_000, tight), None);
    }

    #[test]
    fn fast_rates_and_tighter_devices_are_left_alone() {
        assert_eq!(GsoLimits::for_rate(5_000_000_000, DEFAULT), None);
        let tight = GsoLimits {
            max_size: 8_000,
            max_segs: 4,
        };
        assert_eq!(GsoLimits::for_rate(600_000_000, tight), None);
        // Only ever lowered: a device limit below the budget is kept.
        assert_eq!(
            GsoLimits::for_rate(
                100_000_000,
                GsoLimits {
                    max_size: 65_536,
                    max_segs: 4
                }
            ),
            Some(GsoLimits {
                max_size: 12_500,
                max_segs: 4
            })
        );
    }
}
