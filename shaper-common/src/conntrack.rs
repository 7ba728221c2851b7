//! A packet's addresses before NAT (CAKE's `nat`): where the kernel keeps the connection a
//! packet belongs to, and which of its two tuples is the packet as it entered the machine.
//!
//! On a router that masquerades, the egress packet carries the router's address; the host behind
//! it is in the packet's conntrack entry, which the kernel attaches to the socket buffer
//! (`skb->_nfct`: the entry's address, its low three bits the packet's `ip_conntrack_info`).
//! The entry holds two tuples, one per direction, each as the packets of that direction arrived,
//! before any translation: the packet's own direction's tuple has the addresses and ports to
//! classify by. The data path reads them at the offsets the control plane found in the kernel's
//! BTF (this layout), through the kernel-memory read helper, which fails cleanly.

/// Where the data path reads a packet's conntrack entry, from the running kernel's BTF. All zero:
/// off (no `--nat`, or no conntrack in the kernel).
#[repr(C)]
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct ConntrackLayout {
    /// `struct sk_buff`'s `_nfct` (an `unsigned long`); 0 for off.
    pub skb_nfct: u32,
    /// `struct nf_conn`: where `tuplehash[IP_CT_DIR_ORIGINAL].tuple` lies, and how far on the
    /// reply direction's (the size of a `struct nf_conntrack_tuple_hash`).
    pub ct_tuple: u32,
    pub tuple_stride: u32,
    /// `struct nf_conntrack_tuple`: the source's and the destination's address (each a 16-byte
    /// `union nf_inet_addr`).
    pub src_addr: u32,
    pub dst_addr: u32,
    /// Not zero: the packets are the replies of connections whose addresses before NAT another
    /// data path of this process records (`NAT_FLOWS`, shared): the ingress direction's IFB
    /// gets them before conntrack sees them, and finds each by its 5-tuple reversed.
    pub replies: u32,
}

const _: () = assert!(core::mem::size_of::<ConntrackLayout>() == 24);

// SAFETY: plain `#[repr(C)]` integers with no padding (asserted above).
#[cfg(feature = "user")]
unsafe impl aya::Pod for ConntrackLayout {}

/// A flow's host addresses before NAT (`PacketInfo::host_src`/`host_dst` in the data path).
#[repr(C)]
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct BeforeNat {
    pub src: [u32; 4],
    pub dst: [u32; 4],
}

const _: () = assert!(core::mem::size_of::<BeforeNat>() == 32);

// SAFETY: plain `#[repr(C)]` integers with no implicit padding (asserted above).
#[cfg(feature = "user")]
unsafe impl aya::Pod for BeforeNat {}

/// The flows whose addresses before NAT the data path keeps, by their 5-tuple as they leave
/// (after NAT; `abi::FlowKey` as the ACK filter keys flows): one per connection through the
/// router that is sending.
pub const NAT_FLOWS: u32 = 16_384;

/// The low bits of `skb->_nfct` that hold the packet's `ip_conntrack_info` (`NFCT_INFOMASK`).
pub const INFO_MASK: u64 = 7;
/// `IP_CT_IS_REPLY`: an `ip_conntrack_info` at or above it is a packet of the reply direction.
pub const IS_REPLY: u64 = 3;
/// `struct sk_buff`'s members are within its first 4 KiB: what an offset read from a map is
/// bounded to before it is added to the packet's address.
pub const SKB_OFFSET_MASK: u32 = 0xfff;

/// The packet's entry and the offset in it of the tuple of the packet's own direction, from
/// `skb->_nfct`: none for a packet conntrack did not see (or chose not to track).
#[inline(always)]
pub const fn own_tuple(nfct: u64, layout: &ConntrackLayout) -> Option<(u64, u64)> {
    let entry = nfct & !INFO_MASK;
    if entry == 0 {
        return None;
    }
    let reply = (nfct & INFO_MASK >= IS_REPLY) as u64;
    Some((
        entry,
        layout.ct_tuple as u64 + reply * layout.tuple_stride as u64,
    ))
}

/// An address as the packet parser keeps it, from a tuple's `union nf_inet_addr`: an IPv4
/// address is its first word, the rest zero.
#[inline(always)]
pub const fn address(raw: [u32; 4], v6: bool) -> [u32; 4] {
    if v6 { raw } else { [raw[0], 0, 0, 0] }
}

#[cfg(test)]
mod tests {
    use super::*;

    const LAYOUT: ConntrackLayout = ConntrackLayout {
        skb_nfct: 104,
        ct_tuple: 16,
        tuple_stride: 56,
        src_addr: 0,
        dst_addr: 20,
        replies: 0,
    };

    #[test]
    fn a_packet_is_classified_by_its_own_directions_tuple() {
        let entry = 0xffff_8880_1234_5600;
        // IP_CT_ESTABLISHED (0), IP_CT_NEW (2): the original direction's tuple.
        assert_eq!(own_tuple(entry, &LAYOUT), Some((entry, 16)));
        assert_eq!(own_tuple(entry | 2, &LAYOUT), Some((entry, 16)));
        // IP_CT_ESTABLISHED_REPLY (3), IP_CT_RELATED_REPLY (4): the reply direction's.
        assert_eq!(own_tuple(entry | 3, &LAYOUT), Some((entry, 16 + 56)));
        assert_eq!(own_tuple(entry | 4, &LAYOUT), Some((entry, 16 + 56)));
    }

    #[test]
    fn a_packet_conntrack_did_not_see_keeps_its_addresses() {
        assert_eq!(own_tuple(0, &LAYOUT), None);
        // IP_CT_UNTRACKED (7) with no entry.
        assert_eq!(own_tuple(7, &LAYOUT), None);
    }

    #[test]
    fn an_ipv4_address_is_its_first_word() {
        assert_eq!(address([1, 2, 3, 4], false), [1, 0, 0, 0]);
        assert_eq!(address([1, 2, 3, 4], true), [1, 2, 3, 4]);
    }
}
