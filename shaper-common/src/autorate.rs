//! Autorate: the shaped rate of a link whose capacity varies (LTE, 5G, satellite, busy cable),
//! chased from the delay it adds. The shaper is only the bottleneck while its rate lies below
//! the link's: when the link slows under it, the queue moves into the modem, and the round trip
//! grows. So each direction's rate is
//!
//! - cut when the delay over the path's own (its baseline) passes a threshold while the
//!   direction is busy: at once to below what it carried when the queue is deep, by a tenth
//!   when a shallow one lasts;
//! - raised, in growing steps, while the direction is loaded and the delay stays low: the link
//!   may have grown;
//! - held otherwise: an idle direction says nothing about the link.
//!
//! A round trip cannot tell which direction queued, so a bloated tick cuts every busy direction;
//! a nearly idle one (the ACKs of the other's transfers) is not cut, as its queue cannot be the
//! one that grew. Busy is not loaded: when the link slows under the shaper, what the direction
//! carries falls to the link's rate, far under the shaper's.
//!
//! Pure decisions, tested on the host; the control plane feeds them delay samples and each
//! direction's carried rate every tick (`shaper::autorate`).

use core::{fmt, str::FromStr};

use crate::rate::{self, DisplayRate, RateError};

/// The `skb->priority` autorate's probes leave with (`SO_PRIORITY`): the data path passes them
/// unshaped, so that their round trip is the link's queue and not shaper's own, which every
/// packet of a bottlenecked host waits in up to the AQM's target. Read as a class id it is
/// 5348:4150, which no qdisc of the interface has (fq has no classes).
pub const PROBE_PRIORITY: u32 = 0x5348_4150;

/// The rates a direction may take (`--autorate MIN..MAX`), bits per second of wire rate.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Range {
    pub min_bps: u64,
    pub max_bps: u64,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum RangeError {
    /// Not two rates joined by `..`.
    Form,
    Rate(RateError),
    /// The minimum lies above the maximum.
    Reversed,
}

impl fmt::Display for RangeError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Form => f.write_str("expected MIN..MAX, two rates (e.g. 10mbit..60mbit)"),
            Self::Rate(e) => write!(f, "{e}"),
            Self::Reversed => f.write_str("the minimum is above the maximum"),
        }
    }
}

impl FromStr for Range {
    type Err = RangeError;

    fn from_str(text: &str) -> Result<Self, Self::Err> {
        let (min, max) = text.split_once("..").ok_or(RangeError::Form)?;
        let parse = |t: &str| rate::parse_rate(t.trim()).map_err(RangeError::Rate);
        let (min_bps, max_bps) = (parse(min)?, parse(max)?);
        if min_bps > max_bps {
            return Err(RangeError::Reversed);
        }
        Ok(Self { min_bps, max_bps })
    }
}

impl fmt::Display for Range {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "{}..{}",
            DisplayRate(self.min_bps),
            DisplayRate(self.max_bps)
        )
    }
}

impl Range {
    pub fn clamp(&self, bps: f64) -> f64 {
        bps.max(self.min_bps as f64).min(self.max_bps as f64)
    }
}

/// Default delay over the baseline that counts as the link queueing: a few full frames at the
/// lowest rates the ranges go to, well under what a user hears or a game feels. A jittery link
/// (LTE, Wi-Fi backhaul) needs it raised over its jitter, or its jitter reads as a queue.
pub const DEFAULT_THRESHOLD_NS: u64 = 5_000_000;

/// A cut takes the rate to this fraction of what the direction carried (or of its rate, when it
/// carried more), or lower for a deeper queue (see [`DRAIN_NS`]): below the link's rate, so
/// that the queue the link built drains.
const DECREASE: f64 = 0.9;

/// A cut leaves the rate low enough that the queue it saw drains within this: a link that fell
/// to less than half leaves a queue of hundreds of ms before the delay shows it, which a cut
/// to 90 % drains at a tenth of the link's rate, in seconds. The queue's delay over this is the
/// fraction the cut takes away, up to [`DEEPEST`]: deeper, the senders' windows, sized for the
/// link's old queue, overflow shaper's own flow limits at the new rate, and the drops that
/// follow stall them for seconds.
const DRAIN_NS: f64 = 1_000_000_000.0;
const DEEPEST: f64 = 0.7;

/// The raises of a run of loaded, calm ticks: the first by [`FIRST_RAISE`], each next one
/// by twice the last, up to [`MOST_RAISE`]; the run starts again where the rate passes what
/// the link carried when it last queued (its ceiling), and the raise that would pass it stops
/// there. So the rate goes back to the link's last known rate quickly, probes past it gently
/// (a link that has not grown queues a few percent over it, not a quarter), and a link that
/// doubled is followed within a second or so: 1, 2, 4, 8, 8, ... % take 11 ticks to double.
const FIRST_RAISE: f64 = 0.01;
const MOST_RAISE: f64 = 0.08;

/// A direction is loaded when it carried at least this fraction of its rate: shaper, not the
/// link, is then the bottleneck, so a low delay says the link carries the rate, and more may
/// be tried. Otherwise the link (or the senders) hold the traffic: a raise would only take the
/// rate over the link's, with nothing to show it until the senders fill the link's queue.
/// (Whether its flows waited on their clocks says less: TCP's bursts wait on them whoever is
/// the bottleneck.)
const LOADED: f64 = 0.9;

/// A direction is busy when it carried at least this fraction of its rate: enough to have
/// queued in a link that fell to a tenth of it.
const BUSY: f64 = 0.1;

/// A queue this many times the threshold is deep: the link fell well under the rate, and
/// what the direction carried is the best measure of it, so the cut is from that, at once. A
/// shallower queue is cut only when the tick before saw one too (for a tick it is as likely
/// jitter on the path, a reflector's or a radio's), and from the rate: the senders may not
/// have filled the link (a slow start overshooting into its buffer), and a cut to what they
/// carried would leave the link idle.
const DEEP: u64 = 3;

/// Ticks after a cut before the next cut: the cut takes a round trip or two to show in the
/// delay, and cutting again meanwhile would cut for the same queue twice.
const CUT_HOLD_TICKS: u32 = 3;

/// Ticks after a cut during which the next cut needs a deeper queue than the cut was for: the
/// queue drains over [`DRAIN_NS`], and one that has not grown is the same queue, draining.
const DRAIN_TICKS: u32 = 10;

/// Ticks after a cut before the rate may rise again: the queue it saw has drained (see
/// [`DRAIN_NS`]).
const RAISE_HOLD_TICKS: u32 = 5;

/// How far the baseline follows a sample above it, per sample: a path that lengthened for good
/// (a new route) is followed within half a minute at 40 samples a second, while a queue that
/// lasts seconds moves it by a few percent only. A sample below it is the new baseline at
/// once: nothing makes a path faster than it is.
const BASELINE_RISE: f64 = 0.001;

/// A reflector's round-trip baseline: the path's delay without the link's queue.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct Baseline {
    ns: Option<f64>,
}

impl Baseline {
    /// Takes a round trip of `rtt_ns`; returns the delay it shows over the baseline.
    pub fn sample(&mut self, rtt_ns: u64) -> u64 {
        let rtt = rtt_ns as f64;
        let base = match self.ns {
            Some(b) if rtt > b => b + (rtt - b) * BASELINE_RISE,
            _ => rtt,
        };
        self.ns = Some(base);
        (rtt - base).max(0.0) as u64
    }

    pub fn ns(&self) -> Option<u64> {
        self.ns.map(|b| b as u64)
    }
}

/// What a tick's delay samples said.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Delay {
    /// No reflector answered during the tick.
    Unknown,
    /// The lower median of the tick's samples' delays over their baselines: half of them saw
    /// at least this much queue, so one late answer (a reflector's own hiccup) is not read as
    /// the link's, nor one early answer as its queue gone (a link's queue under TCP rises and
    /// falls within a tick as its senders lose and recover).
    Over(u64),
}

impl Delay {
    /// The tick's verdict from its samples' delays over their baselines (reordered).
    pub fn of(samples: &mut [u64]) -> Self {
        samples.sort_unstable();
        match samples.len() {
            0 => Self::Unknown,
            n => Self::Over(samples[(n - 1) / 2]),
        }
    }
}

/// What a direction's tick did to its rate.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Step {
    Held,
    Raised,
    Cut,
}

/// One direction's rate and the holds that pace its changes.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Direction {
    pub range: Range,
    rate_bps: f64,
    cut_hold: u32,
    raise_hold: u32,
    /// The next raise's fraction (the run of raises so far doubles it).
    raise: f64,
    /// The last tick saw a queue.
    was_bloated: bool,
    /// What the direction carried when the link last queued (0: never).
    ceiling_bps: f64,
    /// The queue the last cut was for, and ticks since it.
    cut_for_ns: u64,
    since_cut: u32,
}

impl Direction {
    /// A direction starting at `start_bps` (clamped to `range`).
    pub fn new(range: Range, start_bps: u64) -> Self {
        Self {
            range,
            rate_bps: range.clamp(start_bps as f64),
            cut_hold: 0,
            raise_hold: 0,
            raise: FIRST_RAISE,
            was_bloated: false,
            ceiling_bps: 0.0,
            cut_for_ns: 0,
            since_cut: u32::MAX,
        }
    }

    pub fn rate_bps(&self) -> u64 {
        self.rate_bps as u64
    }

    /// A new range (clamping the rate into it) and, when given, a rate to go on from (a
    /// user's `shaper set --rate`).
    pub fn reconfigure(&mut self, range: Range, rate_bps: Option<u64>) {
        self.range = range;
        self.rate_bps = range.clamp(rate_bps.map_or(self.rate_bps, |r| r as f64));
    }

    /// One tick: `carried_bps` is what the direction carried during it (wire rate), `delay`
    /// what the reflectors said.
    pub fn tick(&mut self, carried_bps: f64, delay: Delay, threshold_ns: u64) -> Step {
        self.cut_hold = self.cut_hold.saturating_sub(1);
        self.raise_hold = self.raise_hold.saturating_sub(1);
        self.since_cut = self.since_cut.saturating_add(1);
        let carried = carried_bps;
        let loaded = carried >= self.rate_bps * LOADED;
        let busy = carried >= self.rate_bps * BUSY;
        let queue_ns = match delay {
            Delay::Over(ns) if ns > threshold_ns => Some(ns),
            _ => None,
        };
        let calm = matches!(delay, Delay::Over(ns) if ns <= threshold_ns);
        let was_bloated = core::mem::replace(&mut self.was_bloated, queue_ns.is_some());
        if queue_ns.is_some() || !busy {
            // A run of raises is of a loaded link that kept its delay: the next starts gently.
            self.raise = FIRST_RAISE;
        }
        if let Some(queue_ns) = queue_ns
            && busy
            && self.cut_hold == 0
            && (self.since_cut > DRAIN_TICKS || queue_ns > self.cut_for_ns)
            && (was_bloated || queue_ns >= DEEP * threshold_ns)
        {
            self.cut_for_ns = queue_ns;
            self.since_cut = 0;
            let factor = (1.0 - queue_ns as f64 / DRAIN_NS).clamp(DEEPEST, DECREASE);
            let carried = carried.min(self.rate_bps);
            self.ceiling_bps = carried;
            let from = if queue_ns >= DEEP * threshold_ns {
                carried
            } else {
                self.rate_bps
            };
            let next = self.range.clamp(from * factor);
            self.cut_hold = CUT_HOLD_TICKS;
            self.raise_hold = RAISE_HOLD_TICKS;
            if next < self.rate_bps {
                self.rate_bps = next;
                return Step::Cut;
            }
            return Step::Held;
        }
        if calm && loaded && self.raise_hold == 0 {
            let mut next = self.rate_bps * (1.0 + self.raise);
            self.raise = (self.raise * 2.0).min(MOST_RAISE);
            if self.rate_bps < self.ceiling_bps && next > self.ceiling_bps {
                next = self.ceiling_bps;
                self.raise = FIRST_RAISE;
            }
            let next = self.range.clamp(next);
            if next > self.rate_bps {
                self.rate_bps = next;
                return Step::Raised;
            }
        }
        Step::Held
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const M: f64 = 1e6;

    fn range(min: u64, max: u64) -> Range {
        Range {
            min_bps: min * 1_000_000,
            max_bps: max * 1_000_000,
        }
    }

    #[test]
    fn ranges_read_as_two_rates() {
        assert_eq!("10mbit..60mbit".parse::<Range>(), Ok(range(10, 60)));
        assert_eq!(
            " 500kbit .. 1gbit".parse::<Range>().unwrap().min_bps,
            500_000
        );
        assert_eq!("60mbit..10mbit".parse::<Range>(), Err(RangeError::Reversed));
        assert_eq!("60mbit".parse::<Range>(), Err(RangeError::Form));
        assert!(matches!(
            "x..1mbit".parse::<Range>(),
            Err(RangeError::Rate(_))
        ));
        extern crate std;
        use std::string::ToString;
        assert_eq!(range(10, 60).to_string(), "10Mbit..60Mbit");
    }

    #[test]
    fn the_baseline_is_the_least_round_trip_and_follows_a_longer_path_slowly() {
        let mut b = Baseline::default();
        assert_eq!(b.sample(20_000_000), 0);
        assert_eq!(b.sample(18_000_000), 0);
        // A queue of 30 ms shows whole, and barely moves the baseline.
        let over = b.sample(48_000_000);
        assert!((29_900_000..=30_000_000).contains(&over), "{over}");
        // A path 10 ms longer for good: after 30 s at 40 samples/s the baseline is most of
        // the way there, so that the delay it shows is under the default threshold.
        let mut over = 0;
        for _ in 0..1200 {
            over = b.sample(28_000_000);
        }
        assert!(over < DEFAULT_THRESHOLD_NS, "{over}");
    }

    #[test]
    fn a_tick_is_bloated_when_half_its_samples_saw_the_queue() {
        assert_eq!(Delay::of(&mut []), Delay::Unknown);
        assert_eq!(
            Delay::of(&mut [9_000_000, 1_000_000]),
            Delay::Over(1_000_000)
        );
        assert_eq!(Delay::of(&mut [9, 1, 8, 2]), Delay::Over(2));
        assert_eq!(Delay::of(&mut [9, 1, 8, 7]), Delay::Over(7));
        assert_eq!(Delay::of(&mut [9, 1, 8]), Delay::Over(8));
    }

    #[test]
    fn bloat_while_loaded_cuts_below_what_was_carried_then_waits() {
        let t = DEFAULT_THRESHOLD_NS;
        let mut d = Direction::new(range(10, 60), 50_000_000);
        // The link went down to 20: 50 offered, 21 carried, a queue of 30 ms: 10 % under.
        assert_eq!(d.tick(21.0 * M, Delay::Over(30_000_000), t), Step::Cut);
        assert_eq!(d.rate_bps(), 18_900_000);
        // The queue drains over the next ticks: no second cut for the same queue.
        assert_eq!(d.tick(18.9 * M, Delay::Over(20_000_000), t), Step::Held);
        assert_eq!(d.tick(18.9 * M, Delay::Over(10_000_000), t), Step::Held);
        // Calm again, but the queue may not have drained yet: no raise yet.
        for _ in 0..2 {
            assert_eq!(d.tick(18.9 * M, Delay::Over(1_000_000), t), Step::Held);
        }
        // Then gently: 1 %, 2 %, 4 %.
        for expected in [19_089_000, 19_470_780, 20_249_611] {
            assert_eq!(d.tick(d.rate_bps, Delay::Over(0), t), Step::Raised);
            assert_eq!(d.rate_bps(), expected);
        }
    }

    #[test]
    fn a_shallow_queue_is_cut_only_when_it_lasts_two_ticks() {
        let t = DEFAULT_THRESHOLD_NS;
        let mut d = Direction::new(range(10, 60), 40_000_000);
        let shallow = Delay::Over(2 * t);
        // Jitter for a tick: nothing.
        assert_eq!(d.tick(39.0 * M, shallow, t), Step::Held);
        assert_eq!(d.tick(30.0 * M, Delay::Over(0), t), Step::Held);
        assert_eq!(d.tick(39.0 * M, shallow, t), Step::Held);
        // A queue that stays: cut by a tenth of the rate, not to what was carried (the
        // senders may not have filled the link).
        assert_eq!(d.tick(30.0 * M, shallow, t), Step::Cut);
        assert_eq!(d.rate_bps(), 36_000_000);
        // Deep at once: cut at once.
        let mut d = Direction::new(range(10, 60), 40_000_000);
        assert_eq!(d.tick(30.0 * M, Delay::Over(3 * t), t), Step::Cut);
    }

    #[test]
    fn raises_stop_at_the_links_last_ceiling_then_start_gently_past_it() {
        let t = DEFAULT_THRESHOLD_NS;
        let mut d = Direction::new(range(10, 60), 30_000_000);
        // The link queued while carrying 20: cut to 18, its ceiling 20.
        d.tick(20.0 * M, Delay::Over(50_000_000), t);
        assert_eq!(d.rate_bps(), 18_000_000);
        let mut rates = [0u64; 8];
        for r in &mut rates {
            d.tick(d.rate_bps, Delay::Over(0), t);
            *r = d.rate_bps();
        }
        // Held for the drain, then 1, 2, 4 %, stopped at 20, then 1, 2 % past it.
        assert_eq!(
            rates,
            [
                18_000_000, 18_000_000, 18_000_000, 18_000_000, 18_180_000, 18_543_600, 19_285_344,
                20_000_000
            ]
        );
        d.tick(d.rate_bps, Delay::Over(0), t);
        assert_eq!(d.rate_bps(), 20_200_000);
    }

    #[test]
    fn a_deep_queue_is_cut_to_drain_within_a_second_and_cut_again_only_if_it_grows() {
        let t = DEFAULT_THRESHOLD_NS;
        let mut d = Direction::new(range(10, 60), 50_000_000);
        // 200 ms of queue: 20 % under what was carried.
        assert_eq!(d.tick(30.0 * M, Delay::Over(200_000_000), t), Step::Cut);
        assert_eq!(d.rate_bps(), 24_000_000);
        // Draining: the same queue, or less, is not cut for again.
        for _ in 0..4 {
            d.tick(24.0 * M, Delay::Over(150_000_000), t);
        }
        assert_eq!(d.rate_bps(), 24_000_000);
        // Growing: the link fell further.
        assert_eq!(d.tick(22.0 * M, Delay::Over(250_000_000), t), Step::Cut);
        assert_eq!(d.rate_bps(), 16_500_000);
        // A queue of seconds: 30 % under, no deeper.
        let mut d = Direction::new(range(1, 60), 50_000_000);
        d.tick(30.0 * M, Delay::Over(3_000_000_000), t);
        assert_eq!(d.rate_bps(), 21_000_000);
    }

    #[test]
    fn a_loaded_calm_link_is_probed_upward_to_double_within_two_seconds() {
        let t = DEFAULT_THRESHOLD_NS;
        let mut d = Direction::new(range(10, 60), 20_000_000);
        let mut ticks = 0;
        while d.rate_bps() < 40_000_000 {
            let carried = d.rate_bps * 0.95;
            assert_eq!(d.tick(carried, Delay::Over(0), t), Step::Raised);
            ticks += 1;
        }
        assert!(ticks <= 12, "{ticks} ticks");
        // Up to the maximum, not past it.
        for _ in 0..100 {
            d.tick(d.rate_bps, Delay::Over(0), t);
        }
        assert_eq!(d.rate_bps(), 60_000_000);
    }

    #[test]
    fn an_idle_or_unanswered_direction_holds_its_rate() {
        let t = DEFAULT_THRESHOLD_NS;
        let mut d = Direction::new(range(10, 60), 30_000_000);
        // Bloat the other direction caused: this one carried its ACKs, its queue is not it.
        assert_eq!(d.tick(1.0 * M, Delay::Over(50_000_000), t), Step::Held);
        // Carrying under its rate and calm: nothing says the link could carry more.
        assert_eq!(d.tick(20.0 * M, Delay::Over(0), t), Step::Held);
        assert_eq!(d.tick(30.0 * M, Delay::Unknown, t), Step::Held);
        assert_eq!(d.rate_bps(), 30_000_000);
    }

    #[test]
    fn cuts_stop_at_the_minimum_and_set_rates_are_clamped() {
        let t = DEFAULT_THRESHOLD_NS;
        let mut d = Direction::new(range(10, 60), 11_000_000);
        assert_eq!(d.tick(11.0 * M, Delay::Over(50_000_000), t), Step::Cut);
        assert_eq!(d.rate_bps(), 10_000_000);
        for _ in 0..3 {
            d.tick(10.0 * M, Delay::Over(50_000_000), t);
        }
        assert_eq!(d.tick(10.0 * M, Delay::Over(50_000_000), t), Step::Held);
        assert_eq!(d.rate_bps(), 10_000_000);
        d.reconfigure(range(10, 60), Some(100_000_000));
        assert_eq!(d.rate_bps(), 60_000_000);
        d.reconfigure(range(20, 30), None);
        assert_eq!(d.rate_bps(), 30_000_000);
        assert_eq!(Direction::new(range(10, 60), 1).rate_bps(), 10_000_000);
    }
}
