//! Active queue management on the scheduled delay: COBALT (CoDel's control law plus BLUE), as
//! CAKE runs it, applied when a packet is stamped instead of when it is dequeued.
//!
//! A flow's queue is its departure clock minus now: how long its next packet will wait. That is
//! known exactly when the packet is stamped, so the signal is taken then (one sojourn early,
//! which only makes it sooner). The packet the law picks is ECN-marked if it can be, else
//! dropped; a dropped packet books no wire time, so it costs the flow nothing but the signal.
//!
//! - **CoDel**: once the queue has stayed above `target` for an `interval`, signal, and keep
//!   signalling at intervals shrinking as `interval / sqrt(count)` while it stays above; when it
//!   falls below, stop, and let `count` decay by one per (shrinking) interval instead of
//!   resetting it, so a flow that comes back soon is signalled at the rate that worked.
//! - **The packet in hand**: CoDel at a queue's head drops the oldest packet, with the flow's
//!   later ones behind it to show the sender the loss. Here the packet is the newest: a drop that
//!   falls on a segment that may end its sender's write (TCP PSH or FIN) can leave nothing
//!   behind it, and the sender then learns of the loss from a timer (a tail loss probe or a
//!   retransmission timeout, hundreds of ms for the last segment of a short transfer). Such a
//!   drop moves to the flow's next packet, once: a flow that pushes every segment is dropped on
//!   the next. Nor does a drop fall on a retransmission: the sender sent it because it heard
//!   the last signal, and a lost retransmission is found only by a timeout (in a short
//!   transfer's slow start, the queue still stands above target when the fast retransmission
//!   comes, and dropping it cost one of them in seven a 200-400 ms timeout).
//! - **BLUE**: a flow whose queue keeps overflowing its hard limit is not responding to CoDel
//!   (a UDP flood). Each overflow raises a drop probability, each time its queue is found empty
//!   lowers it, both at most once per `target`; packets are dropped at that probability whatever
//!   their ECN marking (a flow that ignores drops ignores marks too). Only overflows that go on
//!   for a hard limit's time count: the first overflow's drop is the sender's signal, and a
//!   responsive sender has answered it by then. A queue overflows at once, and then falls
//!   back, when its flow's pace falls under it (a rate cut, a host joining) or the flow bursts;
//!   BLUE, which falls slowly, would hold such a flow in timeouts for seconds.
//! - **Retransmissions** pass the hard limit and BLUE, as they pass CoDel: see
//!   [`AqmState::on_packet`].
//!
//! Everything is integer arithmetic that runs in BPF as it runs in the host's unit tests.

use crate::branchless;

/// Q32 fixed point: `u32::MAX` stands for 1.0.
const ONE_Q32: u64 = 1 << 32;

/// What BLUE adds on each overflow and takes away on each empty queue (Q32 probabilities):
/// 1/256 up, 1/4096 down, so it rises fast under a flood and decays slowly after it.
pub const BLUE_INCREMENT: u32 = 1 << 24;
pub const BLUE_DECREMENT: u32 = 1 << 20;

/// Parameters of the law, shared by all flows of an interface (written by the control plane).
#[repr(C)]
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct AqmParams {
    /// Acceptable standing queue (ns); zero disables the AQM.
    pub target_ns: u64,
    /// How long the queue may stay above target before the first signal, and the scale of the
    /// signal spacing (ns): the RTT the flows are expected to have.
    pub interval_ns: u64,
    /// A flow's hard limit (ns of queue): beyond it packets are dropped and BLUE is told. Also
    /// how far ahead of its allocation a host may have booked before its sparse packets are
    /// dropped (the host guard), so it is set even where the target turns the AQM off.
    pub limit_ns: u64,
    /// Wire bytes of one full-sized frame: a queue of two of them at the flow's pace is not a
    /// standing queue, whatever the target says.
    pub mtu_bytes: u32,
    /// `flags::*`.
    pub flags: u32,
    /// 5 % of the RTT: the target before it is raised for full frames at low rates. A flow of
    /// smaller frames (pure ACKs, VoIP) is held to it and to its own frames' times
    /// ([`standing_floor_ns`]), not to a full frame's that it never sends.
    pub base_target_ns: u64,
}

pub mod flags {
    /// Mark ECN-capable packets instead of dropping them.
    pub const ECN: u32 = 1 << 0;
}

/// What the law needs to know of the packet in hand (bits for [`AqmState::on_packet`]).
pub mod packet {
    /// It can carry a CE mark.
    pub const ECT: u32 = 1 << 0;
    /// It may be the last its sender has to send for now: a TCP segment with PSH or FIN.
    pub const ENDS_WRITE: u32 = 1 << 1;
    /// A TCP segment with no data beyond what its flow sent before ([`DataReach`]).
    pub const RETRANSMIT: u32 = 1 << 2;
    /// A TCP segment with FIN: the end of its sender's stream. Nothing follows it to bring a
    /// duplicate ACK, so its loss costs the sender a probe and often a timeout; and a sender
    /// sends one per connection, so always sparing it lets no flow escape the law.
    pub const ENDS_STREAM: u32 = 1 << 3;
}

/// How far a TCP connection's data reaches (part of its flow's state; zero: none seen), to tell
/// its retransmissions. Where the isolation mode makes one flow of several connections (a host,
/// or everything), it follows the connection of the flow's latest data segment: a segment of
/// another one starts it again, as new.
#[repr(C)]
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct DataReach {
    /// One past the highest sequence number sent.
    pub end: u32,
    /// The connection's ports (source in the high half, [`DataReach::ports`]); zero before
    /// any segment with data (no TCP connection has both ports zero).
    pub ports: u32,
}

impl DataReach {
    /// The connection identity [`DataReach::check`] and [`DataReach::record`] take.
    pub const fn ports(src_port: u16, dst_port: u16) -> u32 {
        (src_port as u32) << 16 | dst_port as u32
    }

    /// [`DataReach::check`], then [`DataReach::record`]: what the unit tests step through.
    #[cfg(test)]
    fn on_segment(&mut self, data: bool, ports: u32, seq: u32, payload: u32) -> u32 {
        let retransmit = self.check(data, ports, seq, payload);
        self.record(data, ports, seq, payload);
        retransmit
    }

    /// 1 when a segment of the connection `ports` ending at `end` is news to this reach:
    /// another connection's, or reaching beyond what this one sent.
    #[inline(always)]
    fn news(&self, ports: u32, end: u32) -> u32 {
        (self.ports != ports) as u32 | crate::ackfilter::after(end, self.end) as u32
    }

    /// [`packet::RETRANSMIT`] if the segment (`data`: a TCP segment with data; anything else is
    /// not one) is of the connection last recorded and none of it reaches beyond what that
    /// connection sent, else 0. Branch-free: the data path calls it on every packet, TCP or not.
    #[inline(always)]
    pub fn check(&self, data: bool, ports: u32, seq: u32, payload: u32) -> u32 {
        let news = self.news(ports, seq.wrapping_add(payload));
        (data as u32 & (news ^ 1)) * packet::RETRANSMIT
    }

    /// Records the segment as sent (anything but data leaves the state alone): the data path
    /// records only what goes on, so that a dropped segment a local sender sends again at once
    /// is new data, not a retransmission (which passes the hard limit). Branch-free.
    #[inline(always)]
    pub fn record(&mut self, data: bool, ports: u32, seq: u32, payload: u32) {
        let data = data as u32;
        let end = seq.wrapping_add(payload);
        let reach = data & self.news(ports, end);
        self.end = branchless::select(reach as u64, end as u64, self.end as u64) as u32;
        self.ports = branchless::select(data as u64, ports as u64, self.ports as u64) as u32;
    }
}

/// `AqmState::signalling` (zero: the queue is not above target): it stands above target.
const SIGNAL_ABOVE: u32 = 1;
/// It stands above target, and a drop due on a packet that may end a write was moved to the
/// flow's next packet.
const SIGNAL_DEFERRED: u32 = 2;

/// CAKE's RTT presets (the interval; the target is 5% of it).
pub const RTT_PRESETS: [(&str, u64); 8] = [
    ("datacentre", 100_000),
    ("lan", 1_000_000),
    ("metro", 10_000_000),
    ("regional", 30_000_000),
    ("internet", 100_000_000),
    ("oceanic", 300_000_000),
    ("satellite", 1_000_000_000),
    ("interplanetary", 3_600_000_000_000),
];

/// The default preset (`internet`).
pub const DEFAULT_RTT_NS: u64 = 100_000_000;

impl AqmParams {
    /// Target and interval for an expected RTT at a rate: the target is 5% of the RTT, raised so
    /// that one and a half full frames at the rate fit in it (at low rates one frame takes longer
    /// than 5% of the RTT, and a target below it would signal a queue that is only one packet);
    /// the interval grows by what the target grew, and stays at least twice the target.
    /// `limit_ns` is four intervals: summed over the flows at their fair shares that is CAKE's
    /// default buffer (four intervals at the rate), capped by the horizon.
    pub fn for_rate(rtt_ns: u64, ns_per_byte_fp: u64, mtu_bytes: u32, horizon_ns: u64) -> Self {
        let base_target = (rtt_ns / 20).max(1);
        let frame = crate::edt::tx_time_ns(mtu_bytes as u64, ns_per_byte_fp);
        let target = base_target.max(frame * 3 / 2);
        let interval = (rtt_ns + target - base_target).max(target * 2);
        Self {
            target_ns: target,
            interval_ns: interval,
            limit_ns: interval.saturating_mul(4).min(horizon_ns),
            mtu_bytes,
            flags: flags::ECN,
            base_target_ns: base_target,
        }
    }

    pub const fn enabled(&self) -> bool {
        self.target_ns != 0
    }
}

/// A flow's COBALT state (part of its map entry; zero is a quiet flow).
#[repr(C)]
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct AqmState {
    /// While signalling: when the next signal is due. While not, with `count > 0`: when
    /// `count` decays next; with `count == 0`: unused.
    pub next_ns: u64,
    /// When BLUE last moved its probability (it moves at most once per target). While the
    /// probability is zero: when the flow's queue first overflowed since it last stood at or
    /// below its floor (zero: not since).
    pub blue_ns: u64,
    /// Signals in the current episode (decays, does not reset).
    pub count: u32,
    /// `1/sqrt(count)` in Q32.
    pub inv_sqrt: u32,
    /// BLUE's drop probability in Q32.
    pub p_drop: u32,
    /// Zero, [`SIGNAL_ABOVE`] or [`SIGNAL_DEFERRED`]: non-zero while the queue stands above
    /// target.
    pub signalling: u32,
}

/// What to do with the packet at hand.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Verdict {
    Pass,
    /// Set CE (the packet is ECN-capable and ECN is on).
    Mark,
    /// CoDel's signal on a packet that cannot carry a mark.
    DropCodel,
    /// BLUE's probabilistic drop.
    DropBlue,
    /// Beyond the flow's hard limit.
    DropOverlimit,
}

impl Verdict {
    /// Whether the packet goes on (passed or marked): the variants that go on come first.
    /// Branch-free.
    #[inline(always)]
    pub const fn goes_on(self) -> bool {
        (self as u32) < Verdict::DropCodel as u32
    }
}

/// Newton steps per change of `count`: from 1.0 at count 1, five reach 1/sqrt(2) within 1e-5;
/// after that count moves by one and two would do, but a fixed number keeps it branch-free.
const NEWTON_STEPS: usize = 5;

/// `1/sqrt(count)` in Q32, refined from the previous value by Newton's method.
///
/// No lookup table and no branches in the steps: the BPF verifier tracks a value used as an
/// index precisely, and would then keep every path through the control law apart instead of
/// merging them. The steps are safe without checks because `count` only moves by one from a
/// value at or below the exact root (Newton's iteration for 1/sqrt approaches it from below),
/// so `count × previous²` stays below 2.
#[inline(always)]
pub fn inv_sqrt(count: u32, previous: u32) -> u32 {
    if count < 2 {
        return u32::MAX;
    }
    let mut y = previous as u64;
    for _ in 0..NEWTON_STEPS {
        // y' = y (3 - n y²) / 2, in Q32 without 128-bit products.
        let y2 = (y * y) >> 32;
        let factor = (3 * ONE_Q32).wrapping_sub(count as u64 * y2) >> 2; // (3 - n y²) / 4
        y = (y * factor) >> 31;
    }
    y as u32
}

/// `t + interval / sqrt(count)`, from the cached inverse square root: the spacing of signals
/// shrinks as the square root of how many were needed, CoDel's control law. (Not
/// `sqrt(interval / count)`, nor `interval / count`: those make the spacing collapse far too
/// fast.)
#[inline(always)]
pub fn control_law(t_ns: u64, interval_ns: u64, inv_sqrt: u32) -> u64 {
    // interval × inv_sqrt / 2^32 in two 16-bit halves: exact to 1 ns for intervals up to
    // 2^48 ns (78 hours) with no 128-bit multiply (BPF has none).
    let hi = (inv_sqrt >> 16) as u64;
    let lo = (inv_sqrt & 0xffff) as u64;
    t_ns + ((interval_ns * hi) >> 16) + ((interval_ns * lo) >> 32)
}

impl AqmState {
    /// The flow's queue would overflow its hard limit: BLUE tightens once the overflow has
    /// gone on for the limit's time (at once if BLUE is already dropping), and CoDel is put on
    /// alert so that its next due signal is not an interval away.
    #[inline(always)]
    pub fn queue_full(&mut self, p: &AqmParams, now_ns: u64) {
        // Without branches (they multiply the verifier's paths through the rest of the
        // scheduler). `start`: the first overflow since the queue stood at its floor, which
        // starts the wait; its time is stored odd, as zero means "not overflowing".
        let quiet = branchless::below(self.p_drop as u64, 1);
        let start = quiet & branchless::below(self.blue_ns, 1);
        let wait = branchless::select(quiet, p.limit_ns, p.target_ns);
        let raise = (start ^ 1) & branchless::below(self.blue_ns + wait, now_ns);
        self.p_drop = branchless::min(
            self.p_drop as u64 + raise * BLUE_INCREMENT as u64,
            u32::MAX as u64,
        ) as u32;
        self.blue_ns = branchless::select(start | raise, now_ns | 1, self.blue_ns);
        if self.signalling == 0 {
            self.signalling = SIGNAL_ABOVE;
            self.next_ns = now_ns;
        }
        if self.count == 0 {
            self.count = 1;
            self.inv_sqrt = u32::MAX;
        }
    }

    /// Decides for a packet that will wait `queue_ns` behind its flow's earlier packets;
    /// `empty` says the flow's queue had drained when it came (its clock had passed), which
    /// relaxes BLUE. `floor_ns` is the smallest queue that counts as standing for this flow
    /// (the target, raised for flows whose own pace makes two frames take longer); `packet`
    /// holds [`packet`] bits; `random` is a uniform u32 for BLUE.
    ///
    /// `count` changes in one place, so the data path carries one copy of the square root.
    #[inline(always)]
    #[allow(clippy::too_many_arguments)]
    pub fn on_packet(
        &mut self,
        p: &AqmParams,
        now_ns: u64,
        queue_ns: u64,
        empty: bool,
        floor_ns: u64,
        packet: u32,
        random: u32,
    ) -> Verdict {
        // A retransmission passes the hard limit and BLUE (it books its time as any packet):
        // lost, it is found only by a timeout, and a flow whose pace fell under its window
        // (a rate cut) overflows for several of its round trips while it comes down; each
        // lost retransmission there doubled the timeout into seconds of silence. A flow sends
        // one per loss, so sparing them lets no flood past.
        let retransmit = ((packet >> packet::RETRANSMIT.trailing_zeros()) & 1) as u64;
        let limit = p.limit_ns | (retransmit << 62);
        if queue_ns > limit {
            self.queue_full(p, now_ns);
            return Verdict::DropOverlimit;
        }
        if empty && self.p_drop != 0 && now_ns.saturating_sub(self.blue_ns) > p.target_ns {
            self.p_drop = self.p_drop.saturating_sub(BLUE_DECREMENT);
            self.blue_ns = now_ns;
        }
        let due = self.count != 0 && now_ns >= self.next_ns;
        if queue_ns > floor_ns {
            if self.signalling == 0 {
                // First time above: the first signal comes one (scaled) interval from now,
                // unless the queue falls below in the meantime. A flow still decaying from a
                // recent episode resumes at the spacing that worked then.
                self.signalling = SIGNAL_ABOVE;
                let spacing = if self.count < 2 {
                    u32::MAX
                } else {
                    self.inv_sqrt
                };
                self.next_ns = control_law(now_ns, p.interval_ns, spacing);
            }
            if self.count == 0 {
                self.count = 1;
                self.inv_sqrt = u32::MAX;
            }
        } else {
            self.signalling = 0;
            self.blue_ns =
                branchless::select(branchless::below(self.p_drop as u64, 1), 0, self.blue_ns);
        }

        let mut verdict = Verdict::Pass;
        let mark = packet & packet::ECT != 0 && p.flags & flags::ECN != 0;
        // A drop on a retransmission or a stream's end, or on a segment that may end its write,
        // moves to the flow's next packet, still due then (the module's doc says why); for the
        // last once, so that pushing every segment does not escape the law.
        let spare = packet & (packet::RETRANSMIT | packet::ENDS_STREAM) != 0
            || (packet & packet::ENDS_WRITE != 0 && self.signalling == SIGNAL_ABOVE);
        let defer = due && !mark && self.signalling != 0 && spare;
        if defer {
            self.signalling = SIGNAL_DEFERRED;
        } else if due {
            // Above target: signal, and the next comes sooner. Below: the count decays by one
            // per (shrinking) interval instead of resetting, so a flow that comes back soon is
            // signalled at the rate that worked.
            let signal = self.signalling != 0;
            if signal {
                verdict = if mark {
                    Verdict::Mark
                } else {
                    Verdict::DropCodel
                };
                self.count = self.count.saturating_add(1);
                self.signalling = SIGNAL_ABOVE;
            } else {
                self.count -= 1;
            }
            self.inv_sqrt = inv_sqrt(self.count, self.inv_sqrt);
            self.next_ns = control_law(self.next_ns, p.interval_ns, self.inv_sqrt);
            if verdict == Verdict::Mark && self.next_ns < now_ns {
                // A mark does not shorten the queue now: do not let a backlog of due marks
                // fire on consecutive packets (a drop does, and may).
                self.next_ns = now_ns;
            }
        }

        let p_drop = self.p_drop as u64 * (retransmit ^ 1);
        if verdict == Verdict::Pass && p_drop != 0 && (random as u64) < p_drop {
            verdict = Verdict::DropBlue;
        }
        if self.count == 0 {
            // Quiet: nothing pending; keep the decay clock from pointing into the past.
            self.next_ns = now_ns + p.interval_ns;
        }
        verdict
    }
}

/// The smallest queue ahead of a packet that counts as standing for a flow paced at
/// `flow_ns_per_byte_fp` on a link at `rate_ns_per_byte_fp`, for a packet of `frame_bytes` on
/// the wire: the RTT's target less the packet's own frame at the flow's pace, or two of the
/// flow's frames at its own pace, or four at the link's, whichever is longest (CAKE's rule, with
/// the flow's pace in place of the rate divided by the bulk flows).
///
/// The target is CoDel's bound on the sojourn, the time to the packet's dequeue. The queue ahead
/// (its flow's clock less now) is when the packet starts to leave: with n bulk flows CAKE
/// dequeues it somewhere within its flow's turn of the round, up to one frame at the flow's pace
/// later, and measures the sojourn there. Judged on the queue ahead against the whole target,
/// TCP flows held by TCP Small Queues (two to four frames ahead when each new packet comes)
/// dipped under it within every interval, were never signalled, and kept their frames 5-8 ms in
/// the queue. Two frames ahead still never count: a flow whose own frames are long (a slow
/// flow) is not signalled for the one it is sending and the one behind it.
///
/// A frame is the packet's size, at most a full frame (a GSO packet is full frames). CAKE counts
/// full frames whatever the flow sends; at 1 Mbit/s that lets a flow of 66-byte ACKs queue
/// 50 ms (four full frames) that are 45 of its ACKs, and the sender hears them that late. Held to
/// its own frames, a flow of small packets keeps a queue of a few of them. A flow that mixes
/// sizes is only signalled while the queue stands above the floor of each packet it sends, so
/// its full frames keep theirs.
#[inline(always)]
pub fn standing_floor_ns(
    p: &AqmParams,
    frame_bytes: u64,
    flow_ns_per_byte_fp: u64,
    rate_ns_per_byte_fp: u64,
) -> u64 {
    let frame = branchless::min(frame_bytes, p.mtu_bytes as u64);
    let own = crate::edt::tx_time_ns(frame, flow_ns_per_byte_fp);
    let at_rate = 4 * crate::edt::tx_time_ns(frame, rate_ns_per_byte_fp);
    let target = p.base_target_ns - branchless::min(own, p.base_target_ns);
    branchless::max(target, branchless::max(2 * own, at_rate))
}

/// Parses an RTT as CAKE does: a preset name or a duration.
pub fn parse_rtt_ns(text: &str) -> Result<u64, crate::time::DurationError> {
    for (name, ns) in RTT_PRESETS {
        if text == name {
            return Ok(ns);
        }
    }
    crate::time::parse_duration_ns(text)
}

#[cfg(test)]
mod tests {
    extern crate std;
    use std::vec::Vec;

    use super::*;
    use crate::edt::ns_per_byte_fp;

    const MS: u64 = 1_000_000;

    fn params() -> AqmParams {
        AqmParams {
            target_ns: 5 * MS,
            interval_ns: 100 * MS,
            limit_ns: 400 * MS,
            mtu_bytes: 1514,
            flags: flags::ECN,
            base_target_ns: 5 * MS,
        }
    }

    fn q32(x: f64) -> f64 {
        x * ONE_Q32 as f64
    }

    #[test]
    fn inverse_square_root_is_accurate_as_count_climbs_and_falls() {
        let mut y = u32::MAX;
        for n in 0..100_000u32 {
            y = inv_sqrt(n, y);
            let exact = if n < 2 { 1.0 } else { 1.0 / (n as f64).sqrt() };
            let err = (y as f64 - q32(exact)).abs() / q32(exact);
            assert!(err < 1e-4, "n={n}: {y} vs {}", q32(exact));
        }
        for n in (2..100_000u32).rev() {
            y = inv_sqrt(n, y);
            let err =
                (y as f64 - q32(1.0 / (n as f64).sqrt())).abs() / q32(1.0 / (n as f64).sqrt());
            assert!(err < 1e-4, "n={n} falling");
        }
        // Down to 1 and up again, as after a long quiet spell.
        assert_eq!(inv_sqrt(1, y), u32::MAX);
        let y2 = inv_sqrt(2, u32::MAX);
        assert!((y2 as f64 - q32(0.5f64.sqrt())).abs() < q32(1e-5));
    }

    #[test]
    fn control_law_spacing_is_interval_over_sqrt_count() {
        // The precedence that matters: interval / sqrt(count), not sqrt(interval / count) and
        // not interval / count.
        let interval = 100 * MS;
        for (count, spacing) in [
            (1u32, 100 * MS),
            (4, 50 * MS),
            (16, 25 * MS),
            (100, 10 * MS),
        ] {
            let mut y = u32::MAX;
            for n in 0..=count {
                y = inv_sqrt(n, y);
            }
            let got = control_law(1_000, interval, y) - 1_000;
            let err = got.abs_diff(spacing);
            assert!(
                err <= spacing / 10_000 + 1,
                "count {count}: {got} vs {spacing}"
            );
        }
        // Very long intervals do not overflow (interplanetary: an hour).
        let hour = 3_600_000_000_000u64;
        assert!(control_law(0, hour, u32::MAX).abs_diff(hour) < 1_000);
    }

    /// Feeds a flow whose queue stays at `queue` for `duration`, one packet every `gap`;
    /// returns the times of the signals.
    fn run(
        s: &mut AqmState,
        p: &AqmParams,
        start: u64,
        duration: u64,
        gap: u64,
        queue: u64,
        packet: u32,
    ) -> Vec<(u64, Verdict)> {
        let mut out = Vec::new();
        let mut t = start;
        while t < start + duration {
            let v = s.on_packet(p, t, queue, false, p.target_ns, packet, u32::MAX);
            if v != Verdict::Pass {
                out.push((t, v));
            }
            t += gap;
        }
        out
    }

    #[test]
    fn no_signal_below_target_or_within_the_first_interval() {
        let p = params();
        let mut s = AqmState::default();
        assert!(run(&mut s, &p, 0, 2_000 * MS, MS / 10, 4 * MS, 0).is_empty());
        let mut s = AqmState::default();
        let signals = run(&mut s, &p, 0, 99 * MS, MS / 10, 20 * MS, 0);
        assert!(signals.is_empty(), "{signals:?}");
    }

    #[test]
    fn signals_follow_codel_spacing_while_above_target() {
        let p = params();
        let mut s = AqmState::default();
        let signals = run(&mut s, &p, 0, 1_000 * MS, MS / 100, 20 * MS, 0);
        assert!(signals.iter().all(|(_, v)| *v == Verdict::DropCodel));
        let times: Vec<u64> = signals.iter().map(|(t, _)| *t).collect();
        // First one interval after the queue first stood above target.
        assert!(times[0].abs_diff(100 * MS) <= MS / 100, "{times:?}");
        // Then at interval/sqrt(count) after each, count being 2 after the first signal (the
        // episode started at 1 when the queue first stood above target), 3 after the second...
        for (i, w) in times.windows(2).enumerate() {
            let count = (i + 2) as f64;
            let want = 100.0 * MS as f64 / count.sqrt();
            let got = (w[1] - w[0]) as f64;
            assert!(
                (got - want).abs() <= MS as f64 / 100.0 + 1.0,
                "signal {i}: {got} vs {want}"
            );
        }
        // In one second: the first at 100 ms, then spacings 100/sqrt(k) ms for k = 2, 3, ...,
        // whose sum reaches 900 ms at k = 33.
        assert_eq!(times.len(), 32);
    }

    #[test]
    fn ecn_capable_packets_are_marked_not_dropped() {
        let p = params();
        let mut s = AqmState::default();
        let signals = run(&mut s, &p, 0, 500 * MS, MS / 100, 20 * MS, packet::ECT);
        assert!(!signals.is_empty());
        assert!(signals.iter().all(|(_, v)| *v == Verdict::Mark));
        // Without ECN enabled they are dropped.
        let p = AqmParams {
            flags: 0,
            ..params()
        };
        let mut s = AqmState::default();
        let signals = run(&mut s, &p, 0, 500 * MS, MS / 100, 20 * MS, packet::ECT);
        assert!(signals.iter().all(|(_, v)| *v == Verdict::DropCodel));
    }

    /// Feeds a flow whose queue stands at 20 ms, one packet every 10 µs, the `i`th with
    /// `packet(i)`'s bits, for `duration`; returns the signalled packets' indices and verdicts.
    fn signalled(duration: u64, packet: impl Fn(u64) -> u32) -> Vec<(u64, Verdict)> {
        let p = params();
        let mut s = AqmState::default();
        let mut out = Vec::new();
        for i in 0..duration / (MS / 100) {
            let v = s.on_packet(
                &p,
                i * (MS / 100),
                20 * MS,
                false,
                p.target_ns,
                packet(i),
                u32::MAX,
            );
            if v != Verdict::Pass {
                out.push((i, v));
            }
        }
        out
    }

    #[test]
    fn a_drop_due_on_a_segment_that_may_end_its_write_falls_on_the_next_packet() {
        let plain = signalled(1_000 * MS, |_| 0);
        // Every tenth segment pushed, the one a drop first falls due on among them.
        let first = plain[0].0;
        let pushed = move |i: u64| {
            if i % 10 == first % 10 {
                packet::ENDS_WRITE
            } else {
                0
            }
        };
        let moved = signalled(1_000 * MS, pushed);
        assert_eq!(moved.len(), plain.len(), "as many signals: {moved:?}");
        for ((i, v), (j, w)) in plain.iter().zip(&moved) {
            assert_eq!((*v, *w), (Verdict::DropCodel, Verdict::DropCodel));
            if i % 10 == first % 10 {
                assert_eq!(
                    *j,
                    i + 1,
                    "a drop due on a pushed segment falls on the next one"
                );
            } else {
                assert_eq!(j, i, "others where they fell due");
            }
        }
        // A flow that pushes every segment is dropped one packet later, as often.
        let all = signalled(1_000 * MS, |_| packet::ENDS_WRITE);
        let shifted: Vec<(u64, Verdict)> = plain.iter().map(|(i, v)| (i + 1, *v)).collect();
        assert_eq!(all, shifted);
        // A mark does not lose the packet: it stays where it falls due.
        let marked = signalled(1_000 * MS, |_| packet::ECT | packet::ENDS_WRITE);
        let plain_marked = signalled(1_000 * MS, |_| packet::ECT);
        assert_eq!(marked, plain_marked);
        assert!(marked.iter().all(|(_, v)| *v == Verdict::Mark));
    }

    #[test]
    fn a_drop_never_falls_on_a_retransmission() {
        let plain = signalled(1_000 * MS, |_| 0);
        // Every packet from the first drop due on for five is a retransmission (a sender in
        // recovery): the drop falls on the first new segment after them, as due as it was.
        let first = plain[0].0;
        let retransmits = move |i: u64| {
            if (first..first + 5).contains(&i) {
                packet::RETRANSMIT | packet::ENDS_WRITE
            } else {
                0
            }
        };
        let moved = signalled(1_000 * MS, retransmits);
        assert_eq!(moved[0], (first + 5, Verdict::DropCodel));
        assert_eq!(moved.len(), plain.len());
        // A mark loses nothing: a retransmission that can carry one is marked.
        let marked = signalled(1_000 * MS, |_| packet::ECT | packet::RETRANSMIT);
        assert_eq!(marked, signalled(1_000 * MS, |_| packet::ECT));
    }

    #[test]
    fn a_drop_never_falls_on_a_streams_end() {
        let plain = signalled(1_000 * MS, |_| 0);
        // A sender that pushes every segment spends the one deferral on the first due packet;
        // the next ends its stream (a short transfer's last packet, its FIN): dropped, nothing
        // would follow to bring a duplicate ACK. The drop falls on the packet after it.
        let first = plain[0].0;
        let fin_second = move |i: u64| match i.wrapping_sub(first) {
            0 => packet::ENDS_WRITE,
            1 => packet::ENDS_WRITE | packet::ENDS_STREAM,
            _ => 0,
        };
        assert_eq!(
            signalled(1_000 * MS, fin_second)[0],
            (first + 2, Verdict::DropCodel)
        );
        let pushed_second = move |i: u64| {
            if i.wrapping_sub(first) < 2 {
                packet::ENDS_WRITE
            } else {
                0
            }
        };
        assert_eq!(
            signalled(1_000 * MS, pushed_second)[0],
            (first + 1, Verdict::DropCodel),
            "a push alone is spared once"
        );
    }

    #[test]
    fn data_reach_tells_retransmissions_across_the_wrap() {
        let a = DataReach::ports(40_000, 443);
        let mut r = DataReach::default();
        assert_eq!(
            r.on_segment(true, a, u32::MAX - 999, 1000),
            0,
            "the first is new"
        );
        assert_eq!(r.on_segment(true, a, 0, 1000), 0, "beyond, across the wrap");
        assert_eq!(r.end, 1000);
        assert_eq!(
            r.on_segment(true, a, u32::MAX - 999, 1000),
            packet::RETRANSMIT
        );
        assert_eq!(
            r.on_segment(true, a, 500, 500),
            packet::RETRANSMIT,
            "ends where it is"
        );
        assert_eq!(
            r.on_segment(true, a, 500, 1000),
            0,
            "partly new: carries news"
        );
        assert_eq!(r.end, 1500);
        // Not TCP data (a pure ACK, another protocol): neither counted nor recorded.
        assert_eq!(r.on_segment(false, a, 0, 0), 0);
        assert_eq!(r.on_segment(false, 7, 9_999, 1000), 0);
        assert_eq!((r.end, r.ports), (1500, a));
        let mut fresh = DataReach::default();
        assert_eq!(fresh.on_segment(false, a, 0, 1000), 0);
        assert_eq!(fresh, DataReach::default());
        // A flow of several connections (a host's): another connection's segment starts it
        // again, as new; its own retransmissions are told until the next switch.
        let b = DataReach::ports(40_001, 443);
        assert_eq!(
            r.on_segment(true, b, 100, 1000),
            0,
            "below a's reach, but b's"
        );
        assert_eq!(r.on_segment(true, b, 100, 1000), packet::RETRANSMIT);
        assert_eq!(
            r.on_segment(true, a, 0, 1000),
            0,
            "a again: new to the flow"
        );
        // Checked but not recorded (dropped), a segment is new when sent again.
        let mut r = DataReach::default();
        let c = DataReach::ports(1, 2);
        r.on_segment(true, c, 0, 1000);
        for seq in [1000, 2000] {
            assert_eq!(r.check(true, c, seq, 1000), 0);
        }
        assert_eq!(r.on_segment(true, c, 1000, 1000), 0, "sent again: new");
        assert_eq!(r.check(true, c, 0, 1000), packet::RETRANSMIT);
    }

    #[test]
    fn a_deferred_drop_is_forgotten_when_the_queue_falls_below_target() {
        let p = params();
        let mut s = AqmState::default();
        run(&mut s, &p, 0, 300 * MS, MS / 100, 20 * MS, 0);
        let count = s.count;
        // Due on a pushed segment: moved; then the queue has drained.
        let t = s.next_ns;
        let v = s.on_packet(
            &p,
            t,
            20 * MS,
            false,
            p.target_ns,
            packet::ENDS_WRITE,
            u32::MAX,
        );
        assert_eq!((v, s.signalling), (Verdict::Pass, SIGNAL_DEFERRED));
        let v = s.on_packet(&p, t + MS / 100, MS, false, p.target_ns, 0, u32::MAX);
        assert_eq!(v, Verdict::Pass, "below target: no drop");
        assert_eq!(s.signalling, 0);
        assert!(s.count < count, "the count decays as after any episode");
    }

    #[test]
    fn count_decays_instead_of_resetting_and_a_quick_return_resumes_fast() {
        let p = params();
        let mut s = AqmState::default();
        run(&mut s, &p, 0, 1_000 * MS, MS / 100, 20 * MS, 0);
        let peak = s.count;
        assert!(peak > 10);
        // Below target for a short while: the count decays a little, not to zero.
        run(&mut s, &p, 1_000 * MS, 50 * MS, MS / 100, MS, 0);
        assert!(s.count > 0 && s.count < peak, "{} of {peak}", s.count);
        assert_eq!(s.signalling, 0);
        // Back above: the first signal comes well within an interval.
        let signals = run(&mut s, &p, 1_050 * MS, 100 * MS, MS / 100, 20 * MS, 0);
        assert!(signals[0].0 < 1_050 * MS + 60 * MS, "{signals:?}");
        // A long quiet spell (empty queues) decays it fully.
        let mut t = 1_200 * MS;
        for _ in 0..10_000 {
            s.on_packet(&p, t, 0, true, p.target_ns, 0, u32::MAX);
            t += 10 * MS;
        }
        assert_eq!(s.count, 0);
    }

    #[test]
    fn blue_rises_on_overflow_and_drops_regardless_of_ecn() {
        let p = params();
        let mut s = AqmState::default();
        // Overflow every millisecond for a second: at most once per target counts.
        for i in 0..1_000 {
            assert_eq!(
                s.on_packet(
                    &p,
                    i * MS,
                    500 * MS,
                    false,
                    p.target_ns,
                    packet::ECT,
                    u32::MAX
                ),
                Verdict::DropOverlimit
            );
        }
        // The first 400 ms (the limit) are the sender's time to answer; then once per target
        // (6 ms at 1 ms steps).
        let steps = (s.p_drop / BLUE_INCREMENT) as u64;
        assert!((95..=105).contains(&steps), "{steps}");
        // Below the limit, an ECN-capable packet drawn under p_drop is still dropped.
        let t = 1_000 * MS;
        assert_eq!(
            s.on_packet(&p, t, MS, false, p.target_ns, packet::ECT, 0),
            Verdict::DropBlue
        );
        assert_ne!(
            s.on_packet(&p, t, MS, false, p.target_ns, packet::ECT, u32::MAX),
            Verdict::DropBlue
        );
        // A retransmission passes BLUE, and the hard limit.
        assert_ne!(
            s.on_packet(&p, t, MS, false, p.target_ns, packet::RETRANSMIT, 0),
            Verdict::DropBlue
        );
        let before = s;
        let passed = s.on_packet(&p, t, 500 * MS, false, p.target_ns, packet::RETRANSMIT, 0);
        assert!(
            matches!(passed, Verdict::Pass | Verdict::Mark),
            "{passed:?}"
        );
        assert_eq!(s.p_drop, before.p_drop, "and tells BLUE nothing");
        // Empty queues bring it back down, slowly.
        let before = s.p_drop;
        let mut t = 2_000 * MS;
        for _ in 0..10 {
            s.on_packet(&p, t, 0, true, p.target_ns, 0, u32::MAX);
            t += 10 * MS;
        }
        assert_eq!(before - s.p_drop, 10 * BLUE_DECREMENT);
    }

    #[test]
    fn pass_and_mark_go_on_the_drops_do_not() {
        use Verdict::*;
        for (v, on) in [
            (Pass, true),
            (Mark, true),
            (DropCodel, false),
            (DropBlue, false),
            (DropOverlimit, false),
        ] {
            assert_eq!(v.goes_on(), on, "{v:?}");
        }
    }

    #[test]
    fn overflows_that_end_within_the_limit_leave_blue_alone() {
        // A flow whose pace fell under its window: it overflows for most of the limit's time,
        // falls back below its floor as its sender answers, and does it again later.
        let p = params();
        let mut s = AqmState::default();
        let mut t = 0;
        for _ in 0..3 {
            for _ in 0..390 {
                s.on_packet(&p, t, 500 * MS, false, p.target_ns, 0, u32::MAX);
                t += MS;
            }
            s.on_packet(&p, t, 0, false, p.target_ns, 0, u32::MAX);
            t += 2_000 * MS;
        }
        assert_eq!(s.p_drop, 0);
        // Overflowing on past the limit's time is not answering.
        for _ in 0..405 {
            s.on_packet(&p, t, 500 * MS, false, p.target_ns, 0, u32::MAX);
            t += MS;
        }
        assert_eq!(s.p_drop, BLUE_INCREMENT);
    }

    #[test]
    fn target_is_raised_at_low_rates_so_a_frame_fits() {
        // 100 Mbit/s, internet: 5 ms / 100 ms, limit 400 ms.
        let p = AqmParams::for_rate(
            DEFAULT_RTT_NS,
            ns_per_byte_fp(100_000_000),
            1514,
            2_000 * MS,
        );
        assert_eq!(
            (p.target_ns, p.interval_ns, p.limit_ns),
            (5 * MS, 100 * MS, 400 * MS)
        );
        // 1 Mbit/s: one frame is 12.1 ms; target 18.2 ms, interval grows by the same.
        let p = AqmParams::for_rate(DEFAULT_RTT_NS, ns_per_byte_fp(1_000_000), 1514, 2_000 * MS);
        assert_eq!(p.target_ns, 18_168_000);
        assert_eq!(p.interval_ns, 100 * MS + 18_168_000 - 5 * MS);
        // datacentre at 10 Gbit/s: 5 us / 100 us; the interval stays at least twice the target.
        let p = AqmParams::for_rate(100_000, ns_per_byte_fp(10_000_000_000), 1514, 2_000 * MS);
        assert_eq!((p.target_ns, p.interval_ns), (5_000, 100_000));
        // The horizon caps the hard limit.
        let p = AqmParams::for_rate(1_000 * MS, ns_per_byte_fp(100_000_000), 1514, 2_000 * MS);
        assert_eq!(p.limit_ns, 2_000 * MS);
    }

    #[test]
    fn floor_is_two_frames_at_the_flows_pace() {
        let p = params();
        let rate = ns_per_byte_fp(100_000_000);
        // A flow at 50 Mbit/s: two frames take 0.48 ms, the target wins, less the packet's
        // own frame (0.24 ms).
        assert_eq!(
            standing_floor_ns(&p, 1514, ns_per_byte_fp(50_000_000), rate),
            5 * MS - 242_240
        );
        // One of 16 flows at 100 Mbit/s: its own frame takes 1.94 ms, so the target leaves
        // 3.06 ms ahead of it, and two frames (3.88 ms) are still no standing queue.
        assert_eq!(
            standing_floor_ns(&p, 1514, ns_per_byte_fp(6_250_000), rate),
            3_875_840
        );
        // A flow at 1 Mbit/s: two frames take 24.2 ms.
        assert_eq!(
            standing_floor_ns(&p, 1514, ns_per_byte_fp(1_000_000), rate),
            24_224_000
        );
        // A GSO packet counts as full frames.
        assert_eq!(
            standing_floor_ns(&p, 64 * 1514, ns_per_byte_fp(1_000_000), rate),
            24_224_000
        );
    }

    #[test]
    fn floor_counts_a_small_packets_own_frames_not_full_ones() {
        // 1 Mbit/s, internet: the target is raised to 18.2 ms for full frames.
        let rate = ns_per_byte_fp(1_000_000);
        let p = AqmParams::for_rate(DEFAULT_RTT_NS, rate, 1514, 2_000 * MS);
        // Full frames: four at the link, 48.4 ms (CAKE's floor).
        assert_eq!(standing_floor_ns(&p, 1514, rate, rate), 48_448_000);
        // 66-byte ACKs of a flow at an eighth of the link: two of them at its pace, 8.4 ms.
        assert_eq!(
            standing_floor_ns(&p, 66, ns_per_byte_fp(125_000), rate),
            8_448_000
        );
        // The same ACKs at the whole link: the RTT's 5 ms target (not the raised one) less the
        // ACK's own 0.53 ms.
        assert_eq!(standing_floor_ns(&p, 66, rate, rate), 5 * MS - 528_000);
    }

    #[test]
    fn rtt_presets_and_durations() {
        assert_eq!(parse_rtt_ns("internet"), Ok(100 * MS));
        assert_eq!(parse_rtt_ns("datacentre"), Ok(100_000));
        assert_eq!(parse_rtt_ns("interplanetary"), Ok(3_600_000 * MS));
        assert_eq!(parse_rtt_ns("30ms"), Ok(30 * MS));
        assert!(parse_rtt_ns("intranet").is_err());
    }
}
