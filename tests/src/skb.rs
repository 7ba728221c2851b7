//! The UAPI `struct __sk_buff` as BPF_PROG_TEST_RUN takes it (ctx_in/ctx_out). Only the fields
//! the kernel lets a test set are exposed; the offsets are those of include/uapi/linux/bpf.h.

const SIZE: usize = 192;
const OFF_MARK: usize = 8;
const OFF_PRIORITY: usize = 32;
const OFF_INGRESS_IFINDEX: usize = 36;
const OFF_CB: usize = 48;
const OFF_TSTAMP: usize = 152;
const OFF_WIRE_LEN: usize = 160;
const OFF_GSO_SEGS: usize = 164;
const OFF_GSO_SIZE: usize = 176;
const OFF_HWTSTAMP: usize = 184;
/// Words of the control block (`cb[5]`, qdisc_skb_cb's private area).
pub const CB_WORDS: usize = 5;

#[derive(Clone, Copy, PartialEq, Eq)]
#[repr(C, align(8))]
pub struct SkbContext([u8; SIZE]);

impl Default for SkbContext {
    fn default() -> Self {
        Self([0; SIZE])
    }
}

impl std::fmt::Debug for SkbContext {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SkbContext")
            .field("tstamp", &self.tstamp())
            .field("wire_len", &self.wire_len())
            .field("gso_segs", &self.gso_segs())
            .field("gso_size", &self.gso_size())
            .field("mark", &self.mark())
            .field("priority", &self.priority())
            .field("ingress_ifindex", &self.ingress_ifindex())
            .field("cb", &self.cb())
            .finish()
    }
}

impl SkbContext {
    fn get_u32(&self, off: usize) -> u32 {
        u32::from_ne_bytes(self.0[off..off + 4].try_into().unwrap())
    }
    fn set_u32(&mut self, off: usize, v: u32) {
        self.0[off..off + 4].copy_from_slice(&v.to_ne_bytes());
    }
    fn set_u64(&mut self, off: usize, v: u64) {
        self.0[off..off + 8].copy_from_slice(&v.to_ne_bytes());
    }

    pub fn tstamp(&self) -> u64 {
        u64::from_ne_bytes(self.0[OFF_TSTAMP..OFF_TSTAMP + 8].try_into().unwrap())
    }
    pub fn with_tstamp(mut self, ns: u64) -> Self {
        self.set_u64(OFF_TSTAMP, ns);
        self
    }
    /// `skb->mark` (the fwmark).
    pub fn mark(&self) -> u32 {
        self.get_u32(OFF_MARK)
    }
    pub fn with_mark(mut self, mark: u32) -> Self {
        self.set_u32(OFF_MARK, mark);
        self
    }
    /// `skb->priority` (fq sends `TC_PRIO_CONTROL`, 7, ahead of every flow).
    pub fn priority(&self) -> u32 {
        self.get_u32(OFF_PRIORITY)
    }
    pub fn with_priority(mut self, priority: u32) -> Self {
        self.set_u32(OFF_PRIORITY, priority);
        self
    }
    /// The control block: what the stack (or a test) left there, and the words the data path
    /// uses to hand flags from one of its programs to the next.
    pub fn cb(&self) -> [u32; CB_WORDS] {
        std::array::from_fn(|i| self.get_u32(OFF_CB + 4 * i))
    }
    pub fn with_cb(mut self, words: [u32; CB_WORDS]) -> Self {
        for (i, w) in words.into_iter().enumerate() {
            self.set_u32(OFF_CB + 4 * i, w);
        }
        self
    }
    /// The NIC's receive timestamp (`skb_shinfo(skb)->hwtstamps`); the data path never reads it.
    pub fn with_hwtstamp(mut self, ns: u64) -> Self {
        self.set_u64(OFF_HWTSTAMP, ns);
        self
    }
    /// `skb->skb_iif`: the device the packet came in by (a forwarded packet's), or the IFB
    /// that handed it back.
    pub fn with_ingress_ifindex(mut self, ifindex: u32) -> Self {
        self.set_u32(OFF_INGRESS_IFINDEX, ifindex);
        self
    }
    pub fn ingress_ifindex(&self) -> u32 {
        self.get_u32(OFF_INGRESS_IFINDEX)
    }
    pub fn wire_len(&self) -> u32 {
        self.get_u32(OFF_WIRE_LEN)
    }
    pub fn gso_segs(&self) -> u32 {
        self.get_u32(OFF_GSO_SEGS)
    }
    pub fn gso_size(&self) -> u32 {
        self.get_u32(OFF_GSO_SIZE)
    }
    /// A GSO super-packet: `segs` segments of `size` payload bytes, and the length the qdisc
    /// layer would account (`wire_len`: one copy of the headers per segment).
    pub fn with_gso(mut self, segs: u32, size: u32, wire_len: u32) -> Self {
        self.set_u32(OFF_GSO_SEGS, segs);
        self.set_u32(OFF_GSO_SIZE, size);
        self.set_u32(OFF_WIRE_LEN, wire_len);
        self
    }
    pub fn as_bytes(&self) -> &[u8] {
        &self.0
    }
    pub fn as_bytes_mut(&mut self) -> &mut [u8] {
        &mut self.0
    }
}
