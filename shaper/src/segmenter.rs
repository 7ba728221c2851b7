//! The segmenter: CAKE's split-gso for GSO packets shaper's device did not build.
//!
//! shaper lowers its device's GSO limits at low rates so that local TCP builds packets of at
//! most the budget's wire time (`link::GsoLimits`). Packets built elsewhere arrive whole: a
//! neighbour's TSO through a veth or a bridge, GRO on the router's receiving NIC. One 64 KB
//! super-packet gets one departure time and fq releases it at once, 17 ms of wire time at
//! 30 Mbit/s that the next bottleneck (a modem) queues in front of everything else. The
//! kernel would segment it anyway, but only when the device transmits it, after fq.
//!
//! BPF cannot segment. So the data path leaves such a packet (one longer than
//! `link::SEGMENT_BURST_NS` on the wire) unstamped, and a filter after it
//! (`shaper_segment` + `mirred`) sends it to an IFB whose GSO limit is one segment: the IFB's
//! transmit path segments it, and the IFB hands each frame back to this device's transmit
//! path, where the data path stamps it like any other. The frames of one super-packet leave
//! paced, interleaved with other flows, as CAKE's split-gso makes them.
//!
//! Not on an IFB itself (the ingress direction): a packet the segmenter hands back is no
//! longer marked as redirected, and an IFB drops what was not redirected to it.

use tracing::{info, warn};

use crate::{
    config::Settings,
    deploy::{Context, Part, repaired},
    filter::{Filter, Matcher},
    health::{self, Fault},
    link::{self, GsoLimits, Interface, LinkError, SEGMENTER_IFB},
    netlink::{NetlinkError, Socket},
    record::{SegmenterState, State},
    runtime,
};
use shaper_common::names::program_names;

#[derive(Debug, thiserror::Error)]
pub enum SegmenterError {
    #[error("{ifb} already exists and is not a leftover of shaper on {iface}")]
    IfbExists { ifb: String, iface: String },
    #[error("creating the IFB device {ifb}: {source} (needs CONFIG_IFB)")]
    Ifb { ifb: String, source: LinkError },
    #[error(
        "adding the segmenter's filter to {iface}: {source} (needs the bpf classifier and the mirred action: CONFIG_NET_CLS_BPF, CONFIG_NET_ACT_MIRRED)"
    )]
    Filter { iface: String, source: NetlinkError },
}

/// Room in each IFB queue for the frames of many super-packets (a 64 KB one is 44): the IFB
/// stops its queue at this length, and packets then wait in its qdisc.
const IFB_TXQLEN: u32 = 1000;

/// Long enough for the IFB's queues to hand back what they hold (they run in softirq, within
/// microseconds) before it is deleted.
const DRAIN: std::time::Duration = std::time::Duration::from_millis(20);

/// The segmenter, a part of its interface's deployment (after the programs, whose data path
/// sends it packets).
pub struct Segmenter {
    state: SegmenterState,
    /// Packets of more segments than this are split (`None`: none, at a rate that needs no
    /// splitting since a live change; the IFB stays until exit).
    split_segs: Option<u32>,
    /// The IFB, once created (what restore removes).
    ifb: Option<Interface>,
    /// Given up after it could not be started again: no longer recorded or kept.
    given_up: bool,
    /// A predecessor's segmenter, for `apply` to take up (or remove).
    prior: Option<SegmenterState>,
}

impl Segmenter {
    /// Splits `iface`'s GSO packets of more than `split_segs` segments before its data path
    /// stamps them, taking up `prior`'s IFB and filter (a predecessor's) where they are still
    /// there.
    pub fn new(iface: &Interface, split_segs: u32, prior: Option<SegmenterState>) -> Self {
        Self {
            state: SegmenterState::planned(iface),
            split_segs: Some(split_segs),
            ifb: None,
            given_up: false,
            prior,
        }
    }

    /// Adds the filter that sends the data path's verdicts to the IFB (and clsact for it when
    /// the interface has none, recorded first).
    fn add_filter(&mut self, cx: &mut Context, ifb: &Interface) -> anyhow::Result<()> {
        self.put_filter(cx, ifb, false)
    }

    /// [`Segmenter::add_filter`]; with `replace`, in place of the one there (a predecessor's),
    /// so that no packet goes unsplit between the two.
    fn put_filter(
        &mut self,
        cx: &mut Context,
        ifb: &Interface,
        replace: bool,
    ) -> anyhow::Result<()> {
        cx.ensure_clsact(self, |s| &mut s.state.clsact_added)?;
        let program = Matcher::Program {
            fd: cx.datapath.segment_program()?,
            name: program_names::SEGMENT,
        };
        let filter = filter(cx.iface);
        let put = if replace {
            filter.replace_redirect(cx.sock, program, ifb.ifindex)
        } else {
            filter.add_redirect(cx.sock, program, ifb.ifindex)
        };
        put.map_err(|source| SegmenterError::Filter {
            iface: cx.iface.name.clone(),
            source,
        })?;
        Ok(())
    }

    /// Takes up `prior`'s IFB if it is still shaper's: its filter runs this process's program
    /// from here on. `None` when there is nothing to take up (what is left of it is removed).
    fn take_up(
        &mut self,
        cx: &mut Context,
        prior: SegmenterState,
    ) -> anyhow::Result<Option<Interface>> {
        let ifb = Interface::lookup(&prior.ifb).ok().filter(|ifb| {
            prior.ifb == self.state.ifb && ifb.kind(cx.sock).is_ok_and(|k| k == "ifb")
        });
        let Some(ifb) = ifb else {
            clean_stale(cx.iface, &prior)?;
            return Ok(None);
        };
        self.state = prior;
        cx.record(self)?;
        self.ifb = Some(ifb.clone());
        self.put_filter(cx, &ifb, true)?;
        Ok(Some(ifb))
    }

    /// What is no longer in place: the IFB (gone or replaced) or the filter.
    fn fault(&self, cx: &mut Context, ifb: &Interface) -> anyhow::Result<Option<Fault>> {
        if let Some(fault) = health::link_fault(ifb) {
            return Ok(Some(fault));
        }
        let program_id = cx.datapath.program(program_names::SEGMENT)?.info()?.id();
        if filter(cx.iface).is_present(cx.sock, Some(program_id))? {
            return Ok(None);
        }
        Ok(Some(Fault::Filter {
            what: "the segmenter's",
        }))
    }

    /// Starts the segmenter anew (its IFB went away), recorded as planned first; one that
    /// cannot be had is given up, with a warning, as at start.
    fn restart(&mut self, cx: &mut Context, fault: &Fault) -> anyhow::Result<()> {
        self.restore(cx)?;
        self.state = SegmenterState::planned(cx.iface);
        cx.record(self)?;
        match self.apply(cx) {
            Ok(()) => repaired(cx.iface, fault, "segmenter started again"),
            Err(e) => {
                self.restore(cx)?;
                self.given_up = true;
                cx.record(self)?;
                warn!(
                    "{}: {fault}; GSO packets built elsewhere (forwarded, GRO) will leave as whole bursts: {e:#}",
                    cx.iface.name
                );
            }
        }
        Ok(())
    }
}

impl Segmenter {
    /// Points the data path at the IFB for packets of more than `split_segs` segments.
    fn turn_on(&mut self, cx: &mut Context, ifb: &Interface) -> anyhow::Result<()> {
        cx.datapath
            .set_segmenter(self.split_segs.map(|segs| (segs, ifb.ifindex)))?;
        match self.split_segs {
            Some(segs) => info!(
                "{}: GSO packets of more than {segs} segments are split on {} before shaping",
                cx.iface.name, ifb.name
            ),
            None => info!(
                "{}: no GSO packet needs splitting at this rate",
                cx.iface.name
            ),
        }
        Ok(())
    }
}

impl Part for Segmenter {
    fn record(&self, state: &mut State) {
        state.segmenter = (!self.given_up).then(|| self.state.clone());
    }

    fn apply(&mut self, cx: &mut Context) -> anyhow::Result<()> {
        if let Some(prior) = self.prior.take()
            && let Some(ifb) = self.take_up(cx, prior)?
        {
            return self.turn_on(cx, &ifb);
        }
        if Interface::lookup(&self.state.ifb).is_ok() {
            return Err(SegmenterError::IfbExists {
                ifb: self.state.ifb.clone(),
                iface: cx.iface.name.clone(),
            }
            .into());
        }
        let mtu = cx.iface.mtu(cx.sock)?;
        let ifb = Interface::create_ifb(
            cx.sock,
            &self.state.ifb,
            mtu,
            link::ifb_queues(),
            Some(IFB_TXQLEN),
        )
        .map_err(|source| SegmenterError::Ifb {
            ifb: self.state.ifb.clone(),
            source,
        })?;
        self.ifb = Some(ifb.clone());
        ifb.set_gso_limits(
            cx.sock,
            GsoLimits {
                max_size: GsoLimits::UNKNOWN.max_size,
                max_segs: 1,
            },
        )?;
        self.add_filter(cx, &ifb)?;
        self.turn_on(cx, &ifb)
    }

    /// Applies a new rate's split (`link::GsoLimits::split_segs`) to the data path.
    fn change(&mut self, cx: &mut Context, settings: &Settings) -> anyhow::Result<()> {
        let split_segs = GsoLimits::split_segs(settings.sizing_rate_bps());
        if split_segs == self.split_segs {
            return Ok(());
        }
        self.split_segs = split_segs;
        match self.ifb.clone() {
            Some(ifb) => self.turn_on(cx, &ifb),
            None => Ok(()),
        }
    }

    /// Sends no more packets to the segmenter, lets it hand back what it holds, removes it.
    fn restore(&mut self, cx: &mut Context) -> anyhow::Result<()> {
        let Some(ifb) = self.ifb.take() else {
            return Ok(());
        };
        if let Err(e) = cx.datapath.set_segmenter(None) {
            warn!("turning the segmenter of {} off: {e}", cx.iface.name);
        }
        if !cx.gone {
            remove(cx.sock, cx.iface, &self.state);
        }
        std::thread::sleep(DRAIN);
        if let Err(e) = ifb.delete(cx.sock) {
            warn!("deleting {}: {e}", ifb.name);
        }
        Ok(())
    }

    /// The filter is put back; a segmenter whose IFB is gone is started anew.
    fn keep(&mut self, cx: &mut Context) -> anyhow::Result<()> {
        let Some(ifb) = self.ifb.clone() else {
            return Ok(());
        };
        match self.fault(cx, &ifb)? {
            None => Ok(()),
            Some(fault @ Fault::Filter { .. }) => {
                self.add_filter(cx, &ifb)?;
                repaired(cx.iface, &fault, "filter added again");
                Ok(())
            }
            Some(fault) => self.restart(cx, &fault),
        }
    }
}

/// Undoes a predecessor's segmenter: its filter, its IFB.
pub fn clean_stale(iface: &Interface, stale: &SegmenterState) -> anyhow::Result<()> {
    let sock = &mut Socket::open()?;
    remove(sock, iface, stale);
    runtime::delete_leftover_ifb(sock, &stale.ifb);
    Ok(())
}

/// Removes the filter (or the clsact shaper added for it).
fn remove(sock: &mut Socket, iface: &Interface, state: &SegmenterState) {
    if let Err(e) = filter(iface).remove(sock, state.clsact_added) {
        warn!("removing the segmenter's filter from {}: {e}", iface.name);
    }
}

/// The segmenter's filter: the last of the interface's egress.
fn filter(iface: &Interface) -> Filter {
    SEGMENTER_IFB.redirect(iface)
}
