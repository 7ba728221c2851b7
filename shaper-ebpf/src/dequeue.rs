//! The dequeue observer: meters what the shaped device sends against the rate and charges the
//! calendar for what left ahead of it (see `shaper_common::overrun`). It reads the kernel's structures at offsets the loader found in
//! the running kernel's BTF, and only ever reads them.

use core::intrinsics::{AtomicOrdering::Relaxed, atomic_xadd};

use aya_ebpf::{
    helpers::bpf_ktime_get_ns,
    macros::{map, raw_tracepoint},
    maps::Array,
    programs::RawTracePointContext,
};
use shaper_common::{edt, overrun};

use crate::{CONFIG, STATS, calendar, clock, kmem::read};

#[map(name = "SHAPER_DEQUEUE_WATCH")]
static WATCH: Array<overrun::DequeueWatch> = Array::with_max_entries(1, 0);

/// `qdisc_dequeue(struct Qdisc *, const struct netdev_queue *, int packets, struct sk_buff *)`:
/// the packet is the fourth argument (null when the qdisc had none to give).
const SKB_ARG: usize = 3;

#[raw_tracepoint(tracepoint = "qdisc_dequeue")]
pub fn shaper_dequeue(ctx: RawTracePointContext) -> i32 {
    observe(&ctx);
    0
}

#[inline(always)]
fn observe(ctx: &RawTracePointContext) -> Option<()> {
    // Most calls are a qdisc found empty.
    let skb: *const u8 = ctx.arg(SKB_ARG);
    if skb.is_null() {
        return None;
    }
    let watch = WATCH.get(0)?;
    if watch.ifindex == 0 {
        return None;
    }
    // Every qdisc on the machine passes here: the device first, the rest only for ours.
    let dev: *const u8 = read(skb, watch.skb_dev)?;
    if dev.is_null() || read::<u32>(dev, watch.dev_ifindex)? != watch.ifindex {
        return None;
    }
    let net: *const u8 = read(dev, watch.dev_net)?;
    if net.is_null() || read::<u32>(net, watch.net_inum)? != watch.netns_inum {
        return None;
    }
    let len: u32 = read(skb, watch.skb_len)?;
    // In front of the bottleneck, a stall's clump fills its queue whenever the packets were
    // due: no departure time to go by.
    let due = if watch.behind_bottleneck != 0 {
        overrun::Due::Behind(read(skb, watch.skb_tstamp)?)
    } else {
        overrun::Due::InFront
    };
    let config = CONFIG.get(0)?;
    // One frame: the bypass's packets are counted as the device sends them.
    let wire = config.framing.frame_bytes(len, config.link_header_bytes);
    let tx = edt::tx_time_ns(wire, config.ns_per_byte_fp);
    // SAFETY: no preconditions.
    let now = unsafe { bpf_ktime_get_ns() };
    earn_slack(now, tx, config.calendar_bin_ns);
    let meter = calendar::DEPARTURES.get_ptr_mut(overrun::departures::METER)?;
    let burst = overrun::burst_ns(config.calendar_bin_ns);
    let floor = overrun::credit_floor(now, burst, due, config.horizon_ns);
    // SAFETY: a map value, valid for the program's run.
    let owed = unsafe { clock::meter(meter, now, tx, floor) };
    if owed == 0 {
        return None;
    }
    calendar::owe_overrun(owed);
    let stats = STATS.get_ptr_mut(0)?;
    // SAFETY: per-CPU map value; the dequeue runs with bottom halves off, like the classifiers.
    let stats = unsafe { &mut *stats };
    stats.overrun_packets += 1;
    stats.overrun_ns += owed;
    Some(())
}

/// The departure through the link at the rate; the time the link sat idle before it goes to
/// the slack's credit, up to its cap (`overrun::link_idle`, `earned`). A credit the loader left
/// unbounded (behind the bottleneck, `Datapath::watch_dequeue`) earns nothing.
#[inline(always)]
fn earn_slack(now: u64, tx: u64, bin_ns: u64) -> Option<()> {
    let link = calendar::DEPARTURES.get_ptr_mut(overrun::departures::LINK)?;
    // SAFETY: a map value, valid for the program's run.
    let idle = unsafe { clock::link(link, now, tx) };
    if idle == 0 {
        return None;
    }
    let credit = calendar::DEPARTURES.get_ptr_mut(overrun::departures::SLACK_CREDIT)?;
    // SAFETY: as above; a racing update earns a little more or less, within one packet's idle.
    let current = unsafe { core::ptr::read_volatile(credit) };
    let add = overrun::earned(current, idle, overrun::slack_credit_cap(bin_ns));
    if add != 0 {
        unsafe { atomic_xadd::<u64, u64, { Relaxed }>(credit, add) };
    }
    Some(())
}
