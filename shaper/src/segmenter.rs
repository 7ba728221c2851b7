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
    bpf::Datapath,
    clsact,
    filter::{Filter, Hook, Matcher},
    health::{self, Fault},
    link::{self, GsoLimits, Interface, LinkError},
    netlink::{NetlinkError, Socket},
    qdisc,
    record::SegmenterState,
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

pub struct Segmenter {
    iface: Interface,
    ifb: Interface,
    state: SegmenterState,
    /// Removed (by `stop`, or by `Drop` after a failed start or a panic).
    removed: bool,
}

impl Segmenter {
    /// Splits `iface`'s GSO packets of more than `split_segs` segments before `datapath`
    /// stamps them. What it changes on `iface` is passed to `record` before it is changed, so
    /// that a crash at any point leaves a record a successor can undo. Either completes or
    /// undoes its own steps.
    pub fn start(
        iface: &Interface,
        datapath: &mut Datapath,
        split_segs: u32,
        record: &mut dyn FnMut(&SegmenterState) -> anyhow::Result<()>,
    ) -> anyhow::Result<Self> {
        let mut sock = Socket::open()?;
        let state = SegmenterState::planned(iface);
        if Interface::lookup(&state.ifb).is_ok() {
            return Err(SegmenterError::IfbExists {
                ifb: state.ifb,
                iface: iface.name.clone(),
            }
            .into());
        }
        let mtu = iface.mtu(&mut sock)?;
        let ifb = Interface::create_ifb(
            &mut sock,
            &state.ifb,
            mtu,
            link::ifb_queues(),
            Some(IFB_TXQLEN),
        )
        .map_err(|source| SegmenterError::Ifb {
            ifb: state.ifb.clone(),
            source,
        })?;
        let mut segmenter = Self {
            iface: iface.clone(),
            ifb,
            state,
            removed: false,
        };
        // From here on, Drop undoes what is recorded in `state`.
        segmenter.ifb.set_gso_limits(
            &mut sock,
            GsoLimits {
                max_size: GsoLimits::UNKNOWN.max_size,
                max_segs: 1,
            },
        )?;
        segmenter.restore_filter(&mut sock, datapath, record)?;
        datapath.set_segmenter(Some((split_segs, segmenter.ifb.ifindex)))?;
        info!(
            "{}: GSO packets of more than {split_segs} segments are split on {} before shaping",
            iface.name, segmenter.ifb.name
        );
        Ok(segmenter)
    }

    /// Adds the filter that sends the data path's verdicts to the IFB (and clsact for it when
    /// the interface has none, recorded first).
    pub fn restore_filter(
        &mut self,
        sock: &mut Socket,
        datapath: &Datapath,
        record: &mut dyn FnMut(&SegmenterState) -> anyhow::Result<()>,
    ) -> anyhow::Result<()> {
        let iface = &self.iface;
        if qdisc::ingress_slot(sock, iface.ifindex)?.as_deref() != Some("clsact") {
            self.state.clsact_added = true;
            record(&self.state)?;
            clsact::add_recorded(sock, iface, &mut self.state.clsact_added)?;
        }
        let program = Matcher::Program {
            fd: datapath.segment_program()?,
            name: program_names::SEGMENT,
        };
        filter(iface)
            .add_redirect(sock, program, self.ifb.ifindex)
            .map_err(|source| SegmenterError::Filter {
                iface: iface.name.clone(),
                source,
            })?;
        Ok(())
    }

    /// What is no longer in place: the IFB (gone or replaced) or the filter.
    pub fn fault(&self, sock: &mut Socket, datapath: &Datapath) -> anyhow::Result<Option<Fault>> {
        if let Some(fault) = health::link_fault(&self.ifb) {
            return Ok(Some(fault));
        }
        let program_id = datapath.program(program_names::SEGMENT)?.info()?.id();
        if filter(&self.iface).is_present(sock, Some(program_id))? {
            return Ok(None);
        }
        Ok(Some(Fault::Filter {
            what: "the segmenter's",
        }))
    }

    pub fn state(&self) -> &SegmenterState {
        &self.state
    }

    /// Sends no more packets to the segmenter, lets it hand back what it holds, removes it.
    pub fn stop(mut self, datapath: &mut Datapath) {
        if let Err(e) = datapath.set_segmenter(None) {
            warn!("turning the segmenter of {} off: {e}", self.iface.name);
        }
        self.undo();
    }

    fn undo(&mut self) {
        if std::mem::replace(&mut self.removed, true) {
            return;
        }
        let mut sock = match Socket::open() {
            Ok(s) => s,
            Err(e) => {
                warn!("removing the segmenter of {}: {e}", self.iface.name);
                return;
            }
        };
        remove(&mut sock, &self.iface, &self.state);
        std::thread::sleep(DRAIN);
        if let Err(e) = self.ifb.delete(&mut sock) {
            warn!("deleting {}: {e}", self.ifb.name);
        }
    }
}

impl Drop for Segmenter {
    fn drop(&mut self) {
        // Not stopped (a failed start, a panic): the data path goes away with its owner.
        self.undo();
    }
}

/// Undoes a crashed shaper's segmenter: its filter, its IFB.
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
    Filter::program(iface.ifindex, Hook::Egress)
}
