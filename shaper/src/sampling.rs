//! What each host did lately, measured over enough of its packets to mean something.
//!
//! A host sending 9000-byte frames at 400 kbit/s sends one every 180 ms: over one 100 ms control
//! interval it sent either nothing or twice its rate. Measured tick by tick, such hosts drop in
//! and out of the plan, and the level swings with how many of them happened to send (with 1,000
//! of them, a third were missing from each tick and the others' level was half as high again as
//! their share). So a host's sample covers the most recent ticks that together hold
//! [`MIN_PACKETS`] of its packets, up to [`WINDOW_TICKS`]: one tick for any host sending more than
//! 80 packets a second, so bulk hosts are measured as fast as before. And a host that fell silent
//! stays in the plan for twice its mean gap between packets: one tick of silence ends a bulk host,
//! a few end a host that sends a packet every other tick.

use shaper_common::abi::HostState;

/// Packets a sample should hold: with fewer, one packet more or less moves the rate measured by
/// more than an eighth.
pub const MIN_PACKETS: f32 = 8.0;

/// Bytes the rate a host's boost reads should hold (see [`HostWindow::carried_rate_bps`]): 64
/// full-size frames. At 950 kbit/s a tick holds about ten; 50 Mbit/s fills it in one tick.
pub const CARRIED_BYTES: f32 = 64.0 * 1514.0;

/// The longest window, in control ticks: the slowest a host's rate is followed.
pub const WINDOW_TICKS: usize = 10;

/// What one host did over its window.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct HostSample {
    pub rate_bps: f64,
    /// Rate of the packets that did not wait on their own flow clock.
    pub unbacklogged_bps: f64,
    /// Flows kept busy on average (flow-time over the window; a flow using half its level counts
    /// one half).
    pub active_flows: f64,
    /// The same for flows that were backlogged (waited on their own clock).
    pub backlogged_flows: f64,
    /// Relative weight (triple-isolate), 1 otherwise.
    pub weight: f64,
}

/// Below this many backlogged flows (flow-time over the window) a host is limited elsewhere: a
/// flow that waited on its clock for a tenth of the time is a burst, not a bottleneck.
const BACKLOGGED_MIN: f64 = 0.1;

impl HostSample {
    /// Whether the host would have sent more: its flows waited here.
    pub fn bottlenecked(&self) -> bool {
        self.backlogged_flows >= BACKLOGGED_MIN
    }
}

/// One tick of a host's counters (differences; `f32` keeps 64k hosts' windows small).
#[derive(Debug, Clone, Copy, Default)]
struct Tick {
    seconds: f32,
    bytes: f32,
    packets: f32,
    waited_bytes: f32,
    busy_s: f32,
    backlogged_busy_s: f32,
    flows_seen: f32,
}

/// A host's recent ticks: the last [`WINDOW_TICKS`] at most, oldest first, in a ring held inline
/// (a window costs no allocation of its own: a flood brings hundreds of new hosts a tick).
#[derive(Debug, Clone)]
pub struct HostWindow {
    last: HostState,
    ring: [Tick; WINDOW_TICKS],
    /// Where the oldest tick is in `ring`, and how many ticks it holds.
    start: u8,
    len: u8,
}

impl Default for HostWindow {
    fn default() -> Self {
        Self::since(HostState::default())
    }
}

impl HostWindow {
    /// A window that starts from the counters at `state` (a host known before).
    pub fn since(state: HostState) -> Self {
        Self {
            last: state,
            ring: [Tick::default(); WINDOW_TICKS],
            start: 0,
            len: 0,
        }
    }

    fn len(&self) -> usize {
        usize::from(self.len)
    }

    /// The `i`-th tick of the window, oldest first (`i < len`).
    fn tick(&self, i: usize) -> &Tick {
        &self.ring[(usize::from(self.start) + i) % WINDOW_TICKS]
    }

    /// The ticks from the `first`-th on, oldest first.
    fn ticks_from(&self, first: usize) -> impl Iterator<Item = &Tick> {
        (first..self.len()).map(|i| self.tick(i))
    }

    /// Records the tick that ended with the host's counters at `state`, `seconds` after the
    /// previous one. A window starts from zero counters: the data path created the entry
    /// during the tick it is first seen in.
    pub fn record(&mut self, state: HostState, seconds: f64) {
        // An entry evicted and created again starts its counters from zero.
        let prev = if state.bytes >= self.last.bytes {
            self.last
        } else {
            HostState::default()
        };
        let diff = |now: u64, before: u64| now.saturating_sub(before) as f32;
        let tick = Tick {
            seconds: seconds as f32,
            bytes: diff(state.bytes, prev.bytes),
            packets: diff(state.packets, prev.packets),
            waited_bytes: diff(state.waited_bytes, prev.waited_bytes),
            busy_s: diff(state.busy_ns, prev.busy_ns) / 1e9,
            backlogged_busy_s: diff(state.backlogged_busy_ns, prev.backlogged_busy_ns) / 1e9,
            flows_seen: diff(state.flows_seen, prev.flows_seen),
        };
        if self.len() == WINDOW_TICKS {
            // The oldest tick gives way.
            self.ring[usize::from(self.start)] = tick;
            self.start = ((usize::from(self.start) + 1) % WINDOW_TICKS) as u8;
        } else {
            self.ring[(usize::from(self.start) + self.len()) % WINDOW_TICKS] = tick;
            self.len += 1;
        }
        self.last = state;
    }

    /// Ticks since the host's last packet.
    pub fn idle_ticks(&self) -> usize {
        (0..self.len())
            .rev()
            .take_while(|&i| self.tick(i).packets == 0.0)
            .count()
    }

    /// The host's rate over its most recent ticks that together hold [`CARRIED_BYTES`] (or the
    /// whole window): what the boost compares with the host's allocation. Its bytes are a
    /// few full-size frames a tick at a low rate, stamped in bursts as the senders' ACKs
    /// return, while the packet count [`Self::sample`] goes by is made up by small ones (a
    /// download's ACKs): at 950 kbit/s one host's ticks read 0.4 to 1.6 times its allocation
    /// while it carried 0.97 of it.
    pub fn carried_rate_bps(&self) -> f64 {
        let (first, bytes) = self.latest_holding(CARRIED_BYTES, |t| t.bytes);
        let seconds: f32 = self.ticks_from(first).map(|t| t.seconds).sum();
        f64::from(bytes) * 8.0 / f64::from(seconds).max(1e-3)
    }

    /// The first of the most recent ticks that together hold `min` of what `count` counts (the
    /// oldest tick when the whole window holds less), and how much they hold.
    fn latest_holding(&self, min: f32, count: impl Fn(&Tick) -> f32) -> (usize, f32) {
        let mut held = 0.0;
        let mut first = self.len();
        while first > 0 && held < min {
            first -= 1;
            held += count(self.tick(first));
        }
        (first, held)
    }

    /// The host's sample, or `None` when it has left: no packet in the window, or silent for
    /// more than twice its mean gap between packets.
    pub fn sample(&self) -> Option<HostSample> {
        let idle = self.idle_ticks();
        if idle == self.len() {
            return None;
        }
        let (first, packets) = self.latest_holding(MIN_PACKETS, |t| t.packets);
        let window = self.ticks_from(first);
        let sending_ticks = (self.len() - idle - first) as f32;
        let allowed_idle = (2.0 * sending_ticks / packets).floor() as usize;
        if idle > allowed_idle {
            return None;
        }
        let sum = window.fold(Tick::default(), |a, t| Tick {
            seconds: a.seconds + t.seconds,
            bytes: a.bytes + t.bytes,
            packets: a.packets + t.packets,
            waited_bytes: a.waited_bytes + t.waited_bytes,
            busy_s: a.busy_s + t.busy_s,
            backlogged_busy_s: a.backlogged_busy_s + t.backlogged_busy_s,
            flows_seen: a.flows_seen.max(t.flows_seen),
        });
        let seconds = f64::from(sum.seconds).max(1e-3);
        // Flow-time counts at most the flows that sent in a tick: a clock pushed far ahead
        // counts its whole push in the tick it happens.
        let flows = |busy_s: f32| (f64::from(busy_s) / seconds).min(f64::from(sum.flows_seen));
        Some(HostSample {
            rate_bps: f64::from(sum.bytes) * 8.0 / seconds,
            unbacklogged_bps: f64::from((sum.bytes - sum.waited_bytes).max(0.0)) * 8.0 / seconds,
            active_flows: flows(sum.busy_s),
            backlogged_flows: flows(sum.backlogged_busy_s),
            weight: 1.0,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A window fed `per_tick` (bytes, packets, waited bytes) over 100 ms ticks, each packet's
    /// flow-time 1 ms, one flow.
    fn fed(per_tick: &[(u64, u64, u64)]) -> HostWindow {
        let mut w = HostWindow::default();
        let mut s = HostState::default();
        for &(bytes, packets, waited) in per_tick {
            s.bytes += bytes;
            s.packets += packets;
            s.waited_bytes += waited;
            s.busy_ns += packets * 1_000_000;
            s.backlogged_busy_ns += if packets > 0 {
                waited * packets * 1_000_000 / bytes
            } else {
                0
            };
            s.flows_seen += u64::from(packets > 0);
            w.record(s, 0.1);
        }
        w
    }

    fn close(a: f64, b: f64) -> bool {
        (a - b).abs() <= 1e-3 * b.abs().max(1.0)
    }

    #[test]
    fn a_bulk_host_is_measured_over_its_last_tick_and_leaves_after_one_silent_one() {
        let w = fed(&[(1_000_000, 700, 0), (500_000, 350, 500_000)]);
        let s = w.sample().unwrap();
        assert!(close(s.rate_bps, 40e6), "{s:?}");
        assert!(close(s.unbacklogged_bps, 0.0), "{s:?}");
        assert!(close(s.backlogged_flows, 1.0), "{s:?}");
        let w = fed(&[(1_000_000, 700, 0), (500_000, 350, 0), (0, 0, 0)]);
        assert_eq!(w.sample(), None);
    }

    #[test]
    fn a_host_sending_a_packet_every_other_tick_is_measured_at_its_mean_rate() {
        // One 9000-byte frame every 200 ms: 360 kbit/s, though each tick says 0 or 720k.
        let mut ticks = Vec::new();
        for i in 0..12 {
            ticks.push(if i % 2 == 0 {
                (9000, 1, 9000)
            } else {
                (0, 0, 0)
            });
        }
        let w = fed(&ticks);
        let s = w
            .sample()
            .expect("a silent tick between packets does not end it");
        assert!(close(s.rate_bps, 360e3), "{s:?}");
        assert!(s.backlogged_flows > 0.0, "{s:?}");
        // Silent for twice its gap and more: gone.
        ticks.extend([(0, 0, 0); 4]);
        assert_eq!(fed(&ticks).sample(), None);
    }

    #[test]
    fn the_rate_the_boost_reads_holds_enough_full_size_frames() {
        // About ten frames a tick, stamped in bursts: ticks of 5, 15, 13 and 5 frames, each
        // tick's count also holding 60 small packets (a download's ACKs).
        let pattern = [5u64, 15, 13, 5];
        let ticks: Vec<_> = (0..12)
            .map(|i| {
                let frames = pattern[i % 4];
                (frames * 1514 + 60 * 66, frames + 60, frames * 1514)
            })
            .collect();
        let w = fed(&ticks);
        let per_tick = |frames: u64| (frames * 1514 + 60 * 66) as f64 * 8.0 / 0.1;
        // The sample goes by packets: the last tick alone.
        assert!(close(w.sample().unwrap().rate_bps, per_tick(5)));
        // The boost's rate covers 64 frames or more (six ticks here): within 2 % of the mean
        // over whole cycles, where the last tick alone is a third under it.
        let mean = (38 * 1514 + 4 * 60 * 66) as f64 * 8.0 / 0.4;
        let carried = w.carried_rate_bps();
        assert!(
            (carried / mean - 1.0).abs() < 0.02,
            "{carried} against {mean}"
        );
        assert!(per_tick(5) < 0.65 * mean);
        // A bulk host fills it in its last tick.
        let w = fed(&[(1_000_000, 700, 0), (500_000, 350, 500_000)]);
        assert!(close(w.carried_rate_bps(), 40e6));
    }

    #[test]
    fn the_window_is_bounded_and_counters_that_restart_start_over() {
        let mut w = fed(&[(9000, 1, 0); 30]);
        assert_eq!(w.len(), WINDOW_TICKS);
        assert!(close(w.sample().unwrap().rate_bps, 720e3));
        // The entry was evicted and created again: its counters restart below the last ones.
        w.record(
            HostState {
                bytes: 1500,
                packets: 1,
                ..Default::default()
            },
            0.1,
        );
        assert_eq!(w.tick(w.len() - 1).bytes, 1500.0);
    }

    #[test]
    fn a_host_followed_again_is_measured_from_then_on() {
        // A forgotten host's entry keeps its counters; when it sends again only the new bytes
        // count (read from zero, its whole history would look like one tick's burst).
        let state = HostState {
            bytes: 50_000_000,
            packets: 40_000,
            ..Default::default()
        };
        let mut w = HostWindow::since(state);
        assert_eq!(w.sample(), None);
        w.record(
            HostState {
                bytes: state.bytes + 12_500,
                packets: state.packets + 10,
                ..state
            },
            0.1,
        );
        assert!(close(w.sample().unwrap().rate_bps, 1e6));
    }

    #[test]
    fn a_window_with_no_packet_is_no_host() {
        let w = fed(&[(0, 0, 0); 3]);
        assert_eq!(w.sample(), None);
        assert_eq!(HostWindow::default().sample(), None);
    }
}
