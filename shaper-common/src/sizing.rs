//! What the control plane computes for the data path from the configuration and the levels
//! (calendar bin width, a host's guard slack, a thinned ACK's round), and the tuning constants
//! behind them. The data path only reads the results.

use crate::abi::{HostRate, Levels, ShaperConfig};

/// Bins in the global calendar (a power of two) and how many one packet may span.
pub const CALENDAR_BINS: u32 = 4096;
pub const CALENDAR_MAX_SPAN_BINS: usize = 4;

/// Guards shared by the newcomers towards one destination (a power of two): a destination's
/// slot is a hash of its address and tin (`schedule::destination_slot`). Two destinations that
/// share a slot share their newcomers' guard until the control plane measures them.
pub const DESTINATION_GUARDS: u32 = 1024;

/// The machine's own addresses the data path keeps as one host (`names::map_names::OWN_ADDRS`):
/// beyond these, an address is a host of its own.
pub const OWN_ADDRESSES: u32 = 1024;

/// The longest gap a flow's clock catches up (see `edt::reserve`): a TCP Small Queues
/// completion or a scheduling delay, not an idle period.
pub const FLOW_CREDIT_NS: u64 = 2_000_000;

/// How far ahead of its allocation, in calendar bins, a host may book before its guard clock
/// holds its packets back, at least (see [`host_slack_ns`]).
pub const HOST_SLACK_BINS: u64 = 4;

/// How far ahead of its allocation a host may book before its guard clock holds its packets
/// back: room for its flows' own queues, so that the guard only bites when the flow levels
/// overbook the host (a new flow, a level not yet lowered), and a flow of a host within its
/// allocation never waits behind the host's other flows.
///
/// Those queues are what the AQM lets each flow keep: its standing floor at the host's flow
/// level. A host whose n flows each hold it has booked n of them ahead at a 1/n of its
/// allocation: one floor at the flow level, in the host's time. A fixed slack in bins is less
/// than that at low rates (at 1 Mbit/s eight flows each hold two full frames, 200 ms), and the
/// host's small-packet flows (ACKs, DNS) waited behind the bulk flows' queues for the
/// difference. At least [`HOST_SLACK_BINS`] bins; at most the AQM's interval, the time it lets a
/// standing queue last before it acts (a host of many slow flows would otherwise get seconds).
/// The target stands whole here: with a packet's own frame, a flow keeps that much booked.
/// Computed by the control plane with the host's levels; the data path only reads it.
pub fn host_slack_ns(config: &ShaperConfig, flow_ns_per_byte_fp: u64) -> u64 {
    let floor = crate::aqm::standing_floor_ns(
        &config.aqm,
        config.aqm.mtu_bytes as u64,
        flow_ns_per_byte_fp,
        config.ns_per_byte_fp,
    );
    floor
        .max(config.aqm.base_target_ns)
        .min(config.aqm.interval_ns)
        .max(config.calendar_bin_ns * HOST_SLACK_BINS)
}

/// The calendar's bin width for a rate, a horizon and the largest packet the device sends (wire
/// bytes; its GSO limit): at least 1 ms, wide enough that the largest packet fits in half the
/// bins one packet may book, and so that the ring spans the horizon (every departure the data
/// path admits is booked). The width is also the aggregate's burst: inside its bin a packet
/// leaves when its flow says, so a bin's worth of wire time can leave at once. Sized for 64 KiB
/// whatever the device sends, a bin at 1 Mbit/s was 276 ms: 33 KB released together into the
/// modem behind it, whose queue then held every upload's ping for tens of milliseconds.
pub fn calendar_bin_ns(ns_per_byte_fp: u64, horizon_ns: u64, largest_packet_bytes: u64) -> u64 {
    let largest = crate::edt::tx_time_ns(largest_packet_bytes, ns_per_byte_fp);
    // Half the span: the largest packet still fits when the bins it lands in are half booked.
    let for_gso = largest.div_ceil(CALENDAR_MAX_SPAN_BINS as u64 / 2);
    let for_horizon = horizon_ns.div_ceil(CALENDAR_BINS as u64 - 2);
    let mut bin = 1_000_000;
    if for_gso > bin {
        bin = for_gso;
    }
    if for_horizon > bin {
        bin = for_horizon;
    }
    bin
}

/// A packet the calendar lent a departure counts as on its way to the link for at most this
/// many full frames' wire time at the rate (`ShaperConfig::lent_window_ns`), however far
/// behind the bulk flows' bookings the calendar booked it. CAKE sends a sparse flow's packet
/// after the frame being sent and the sparse packets ahead of it (a frame's time and a little
/// more), and a newer ACK of its flow replaces it only meanwhile. Counted until its booking
/// behind the bins the bulk flows had filled, a lent ACK stood ahead up to 4 ms on a 50 Mbit/s
/// uplink (bins of 1 ms, four to a span), where CAKE's waits 0.25 ms: the filter dropped 43 %
/// of the downloads' ACKs on a symmetric link against CAKE's under 1 %, and the download lost
/// 1.5 %. On 30/1 the senders, hearing fewer and larger ACKs, sent bursts that queued in the
/// modem ahead of the router, where the ping waited: one frame gave the ping 3 ms back and the
/// uploads 8 points of the uplink less, two frames most of the ping and 4 points less.
pub const LENT_WINDOW_FRAMES: u64 = 2;

/// A thinned ACK's share of a round at a level of `ns_per_byte_fp` (see
/// [`HostRate::ack_round_ns`]).
#[inline(always)]
pub fn ack_round_ns(config: &ShaperConfig, ns_per_byte_fp: u64) -> u64 {
    crate::edt::tx_time_ns(config.ack_quantum_bytes as u64, ns_per_byte_fp)
}

impl HostRate {
    /// The levels of a host whose flows run at `flow_ns_per_byte_fp` and whose guard at
    /// `host_ns_per_byte_fp` (0: no guard), with the guard's slack for that flow level.
    pub fn new(
        config: &ShaperConfig,
        flow_ns_per_byte_fp: u64,
        host_ns_per_byte_fp: u64,
        flags: u64,
    ) -> Self {
        Self {
            flow_ns_per_byte_fp,
            host_ns_per_byte_fp,
            flags,
            slack_ns: host_slack_ns(config, flow_ns_per_byte_fp),
            ack_round_ns: ack_round_ns(config, flow_ns_per_byte_fp),
        }
    }

    /// The same, with the rounds of its thinned ACK flows at `level_ns_per_byte_fp` (the level
    /// before the host's boost).
    pub fn with_rounds_at(self, config: &ShaperConfig, level_ns_per_byte_fp: u64) -> Self {
        Self {
            ack_round_ns: ack_round_ns(config, level_ns_per_byte_fp),
            ..self
        }
    }

    /// The factor by which the host's flows run above the level its rounds are charged at
    /// (the control loop's boost, [`HostRate::with_rounds_at`]), recovered from the rates alone:
    /// what a control loop taking over a data path resumes from. 1 where it cannot be told.
    #[cfg(feature = "user")]
    pub fn boost(&self, config: &ShaperConfig) -> f64 {
        if self.flow_ns_per_byte_fp == 0 || self.ack_round_ns == 0 || config.ack_quantum_bytes == 0
        {
            return 1.0;
        }
        // ack_round_ns = quantum x level's ns per byte: the level's pace, over the boosted one.
        let level_ns_per_byte = self.ack_round_ns as f64 / f64::from(config.ack_quantum_bytes);
        let boosted_ns_per_byte =
            self.flow_ns_per_byte_fp as f64 / (1u64 << crate::edt::NS_PER_BYTE_SHIFT) as f64;
        level_ns_per_byte / boosted_ns_per_byte
    }
}

impl Levels {
    /// Sets tin `tin`'s newcomer level (0: none; a new host's flows then run at the rate,
    /// unguarded).
    pub fn set_newcomer(&mut self, config: &ShaperConfig, tin: usize, ns_per_byte_fp: u64) {
        self.new_host_ns_per_byte_fp[tin] = ns_per_byte_fp;
        self.new_host_slack_ns[tin] = host_slack_ns(config, ns_per_byte_fp);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[cfg(feature = "user")]
    #[test]
    fn a_hosts_boost_is_recovered_from_its_rates() {
        use crate::edt::ns_per_byte_fp;
        let config = ShaperConfig {
            ack_quantum_bytes: 3_028,
            ..Default::default()
        };
        for (level_bps, boost) in [(7_500_000.0, 1.0), (7_500_000.0, 1.37), (118_750.0, 1.5)] {
            let rate = HostRate::new(&config, ns_per_byte_fp((level_bps * boost) as u64), 0, 0)
                .with_rounds_at(&config, ns_per_byte_fp(level_bps as u64));
            let recovered = rate.boost(&config);
            assert!((recovered - boost).abs() < 1e-3, "{boost}: {recovered}");
        }
        assert_eq!(HostRate::default().boost(&config), 1.0);
    }

    #[test]
    fn calendar_bins_fit_the_largest_packet_and_no_more() {
        use crate::edt::ns_per_byte_fp;
        const S: u64 = 1_000_000_000;
        // 1 ms at the rates where the largest packet takes less than 2 ms.
        assert_eq!(
            calendar_bin_ns(ns_per_byte_fp(100_000_000), 2 * S, 3_028),
            1_000_000
        );
        // Two frames at 950 kbit/s take 25.5 ms: bins of half that, not the 276 ms a 64 KiB
        // packet would need.
        let slow = calendar_bin_ns(ns_per_byte_fp(950_000), 2 * S, 3_028);
        assert!((12_700_000..12_800_000).contains(&slow), "{slow}");
        let gso = calendar_bin_ns(ns_per_byte_fp(950_000), 2 * S, 65_536);
        assert!((275_000_000..277_000_000).contains(&gso), "{gso}");
        // The ring always spans the horizon.
        let far = calendar_bin_ns(ns_per_byte_fp(1_000_000_000), 100 * S, 1_514);
        assert!(far * (CALENDAR_BINS as u64 - 2) >= 100 * S);
    }

    #[test]
    fn host_slack_holds_its_flows_standing_queues_up_to_an_interval() {
        use crate::{aqm::AqmParams, edt::ns_per_byte_fp};
        const MS: u64 = 1_000_000;
        let config = |rate: u64, largest: u64| {
            let fp = ns_per_byte_fp(rate);
            ShaperConfig {
                ns_per_byte_fp: fp,
                calendar_bin_ns: calendar_bin_ns(fp, 2_000 * MS, largest),
                aqm: AqmParams::for_rate(crate::aqm::DEFAULT_RTT_NS, fp, 1514, 2_000 * MS),
                ..Default::default()
            }
        };
        // 100 Mbit/s, 64 KiB packets: a host of 10 flows at 10 Mbit/s holds 2.4 ms of its
        // flows' floors; the four bins (10.5 ms) are more.
        let fast = config(100_000_000, 65_536);
        assert_eq!(
            host_slack_ns(&fast, ns_per_byte_fp(10_000_000)),
            4 * fast.calendar_bin_ns
        );
        // 950 kbit/s, eight flows at a level of 118.75 kbit/s: two full frames at that level
        // are 204 ms, more than the interval (113.9 ms): the interval.
        let slow = config(950_000, 3_028);
        let interval = slow.aqm.interval_ns;
        assert!((113 * MS..115 * MS).contains(&interval), "{interval}");
        assert_eq!(host_slack_ns(&slow, ns_per_byte_fp(118_750)), interval);
        // Two flows at 475 kbit/s: their floors (51 ms) and the four bins (51 ms) agree.
        let two = host_slack_ns(&slow, ns_per_byte_fp(475_000));
        assert!((50 * MS..52 * MS).contains(&two), "{two}");
    }
}
