//! The embedded BPF object: loading, configuring, attaching, and reading its maps.

use std::{
    collections::BTreeSet,
    os::{
        fd::{AsFd, BorrowedFd},
        unix::fs::MetadataExt,
    },
};

use aya::{
    Ebpf, EbpfLoader,
    maps::{Array, HashMap, Map, MapData, PerCpuArray, ProgramArray},
    programs::{
        RawTracePoint, SchedClassifier, TcAttachType,
        links::FdLink,
        tc::{self, NlOptions, SchedClassifierLink, SchedClassifierLinkId, TcAttachOptions},
    },
};
use shaper_common::{
    abi::{FlowKey, FlowState, HostRate, HostState, Levels, ShaperConfig},
    conntrack::ConntrackLayout,
    logs,
    names::{map_names, program_names, program_slots},
    overrun::{self, DequeueWatch, departures},
    stats::DatapathStats,
};

use crate::{
    batch,
    config::StateParams,
    events::Events,
    filter::Hook,
    handover::{Leaving, Left},
    record::{AttachMode, MapIds},
};

/// The data path, built from `shaper-ebpf` by build.rs.
static OBJECT: &[u8] = aya::include_bytes_aligned!(concat!(env!("OUT_DIR"), "/shaper"));

/// Priority of shaper's netlink filter (kernels without TCX): fixed, so that a filter left by a
/// crashed run can be recognised.
pub const NETLINK_PRIORITY: u16 = 0x5348;

#[derive(Debug, thiserror::Error)]
pub enum BpfError {
    #[error(
        "not enough memory for the BPF map {map} (max-flows {max_flows}, max-hosts {max_hosts}): raise the memory limit of shaper's cgroup (memory.max; RLIMIT_MEMLOCK on kernels before 5.11) or lower max-flows"
    )]
    OutOfMemory {
        map: String,
        max_flows: u32,
        max_hosts: u32,
    },
    #[error("loading the BPF object: {0}")]
    Load(#[from] aya::EbpfError),
    #[error("the kernel rejected the data path program: {0}")]
    Program(#[from] aya::programs::ProgramError),
    #[error("BPF map {name}: {source}")]
    Map {
        name: &'static str,
        source: aya::maps::MapError,
    },
    #[error(
        "opening the running shaper's BPF map {0} by its id needs CAP_SYS_ADMIN, which this process lacks: run it as root"
    )]
    ById(&'static str),
    #[error("the BPF object has no {0}")]
    Missing(&'static str),
    #[error("duplicating a program descriptor: {0}")]
    Io(#[from] std::io::Error),
    #[error(transparent)]
    Btf(#[from] crate::kernel_btf::BtfError),
    #[error("reading this process's network namespace: {0}")]
    Netns(std::io::Error),
    #[error("the embedded BPF object does not parse: {0}")]
    Object(#[from] aya_obj::ParseError),
    #[error("taking over the attached program: {0}")]
    Link(#[from] aya::programs::links::LinkError),
    #[error("forwarding the data path's events (--log-datapath): {0}")]
    Events(#[from] aya_log::Error),
    #[error("pinning {name} for the next shaper: {source}")]
    Pin {
        name: String,
        source: aya::pin::PinError,
    },
}

/// How a predecessor's program is attached, for [`Datapath::take_over`] to replace in place.
pub enum Prior {
    /// A TCX link, taken out of bpffs (`handover::Left::take_link`).
    Link(FdLink),
    /// A netlink filter at [`NETLINK_PRIORITY`], with this handle.
    Filter { handle: u32 },
}

/// A map the kernel could not allocate, named with what sizes it; other load errors as they are.
fn out_of_memory(e: aya::EbpfError, state: &StateParams) -> BpfError {
    match e {
        aya::EbpfError::MapError(aya::maps::MapError::CreateError { name, io_error })
            if matches!(io_error.raw_os_error(), Some(libc::ENOMEM | libc::EPERM)) =>
        {
            BpfError::OutOfMemory {
                map: name,
                max_flows: state.max_flows,
                max_hosts: state.max_hosts,
            }
        }
        e => BpfError::Load(e),
    }
}

impl BpfError {
    /// Whether the kernel refused an insert because the map is full (E2BIG).
    pub fn is_map_full(&self) -> bool {
        matches!(self, BpfError::Map {
            source: aya::maps::MapError::SyscallError(e),
            ..
        } if e.io_error.raw_os_error() == Some(libc::E2BIG))
    }
}

fn map_err(name: &'static str) -> impl FnOnce(aya::maps::MapError) -> BpfError {
    move |source| BpfError::Map { name, source }
}

/// A hash map's data (plain or LRU), for the batched operations.
fn hash_data(map: &Map) -> Option<&MapData> {
    match map {
        Map::HashMap(data) | Map::LruHashMap(data) => Some(data),
        _ => None,
    }
}

/// A batched operation's outcome on the map `name`: its value, `None` where the kernel has no
/// batches (the caller then goes entry by entry), or its failure as aya reports a system call's.
fn batched_or_fallback<T>(
    name: &'static str,
    batched: std::io::Result<T>,
) -> Result<Option<T>, BpfError> {
    match batched {
        Ok(value) => Ok(Some(value)),
        Err(e) if batch::unsupported(&e) => Ok(None),
        Err(io_error) => Err(BpfError::Map {
            name,
            source: aya::maps::MapError::SyscallError(aya::sys::SyscallError {
                call: "bpf_map_batch",
                io_error,
            }),
        }),
    }
}

pub struct Datapath {
    ebpf: Ebpf,
    /// What `configure` wrote last (the control plane derives per-host values from it).
    config: ShaperConfig,
    link: Option<SchedClassifierLinkId>,
    /// The ACK filter's observer at ingress, when attached.
    ingress_link: Option<SchedClassifierLinkId>,
    /// The data path's debug events forwarded to the log, with `--log-datapath`.
    events: Option<Events>,
}

impl Datapath {
    /// Loads the object and the egress program into the kernel (the verifier runs here).
    pub fn load(state: &StateParams) -> Result<Self, BpfError> {
        Self::load_with(state, &[])
    }

    /// [`Datapath::load`] with the maps a predecessor left (`handover`) in place of new ones,
    /// when every one of [`map_names::CARRIED`] was left and fits this object with `state`'s
    /// sizes; otherwise with new maps, and why is logged. Says whether the maps were carried.
    pub fn load_carrying(state: &StateParams, left: &Left) -> Result<(Self, bool), BpfError> {
        let carried = match carried_maps(state, left) {
            Ok(carried) => carried,
            Err(why) => {
                tracing::warn!(
                    "starting with new flow state: the maps the previous shaper left {why}"
                );
                Vec::new()
            }
        };
        let datapath = Self::load_with(state, &carried)?;
        Ok((datapath, !carried.is_empty()))
    }

    /// [`Datapath::load`] with maps another data path of this process pinned for it
    /// ([`Datapath::pin_map`]) in place of new ones.
    pub fn load_sharing(
        state: &StateParams,
        shared: &[(&'static str, std::path::PathBuf)],
    ) -> Result<Self, BpfError> {
        Self::load_with(state, shared)
    }

    /// Pins map `name` at `path`, for another data path to open ([`Datapath::load_sharing`]).
    pub fn pin_map(&self, name: &'static str, path: &std::path::Path) -> Result<(), BpfError> {
        let data = map_data(self.map(name)?).ok_or(BpfError::Missing(name))?;
        data.pin(path).map_err(|source| BpfError::Pin {
            name: name.to_string(),
            source,
        })
    }

    /// Loads the object, the maps named in `pinned` opened from their pins rather than created.
    fn load_with(
        state: &StateParams,
        pinned: &[(&'static str, std::path::PathBuf)],
    ) -> Result<Self, BpfError> {
        raise_memlock_limit();
        let mut loader = EbpfLoader::new();
        // Fixed before the verifier runs: off, it removes every branch that sends an event.
        let log_switch = u32::from(state.log_datapath);
        loader
            .map_max_entries(map_names::FLOWS, state.max_flows)
            .map_max_entries(map_names::HOSTS, state.max_hosts)
            .map_max_entries(map_names::HOST_RATES, state.max_hosts)
            .override_global(logs::SWITCH, &log_switch, true);
        for (name, path) in pinned {
            loader.map_pin_path(name, path.as_path());
        }
        let mut ebpf = loader.load(OBJECT).map_err(|e| out_of_memory(e, state))?;
        egress_program(&mut ebpf)?.load()?;
        install_tail_calls(&mut ebpf)?;
        classifier(&mut ebpf, program_names::INGRESS)?.load()?;
        classifier(&mut ebpf, program_names::SEGMENT)?.load()?;
        log_verifier_cost(&mut ebpf);
        let events = if state.log_datapath {
            Some(Events::forward(&mut ebpf)?)
        } else {
            None
        };
        let mut datapath = Self {
            ebpf,
            config: ShaperConfig::default(),
            link: None,
            ingress_link: None,
            events,
        };
        if !pinned
            .iter()
            .any(|(name, _)| *name == map_names::DEPARTURES)
        {
            // Nothing earns the slack's credit until the dequeue observer watches the device.
            datapath.set_slack_credit(overrun::SLACK_CREDIT_UNLIMITED)?;
        }
        Ok(datapath)
    }

    /// Sets the credit the calendar's bins spend their slack from (`overrun::earned`).
    pub fn set_slack_credit(&mut self, credit: u64) -> Result<(), BpfError> {
        let name = map_names::DEPARTURES;
        let mut array = Array::<_, u64>::try_from(self.map_mut(name)?).map_err(map_err(name))?;
        array
            .set(departures::SLACK_CREDIT, credit, 0)
            .map_err(map_err(name))
    }

    pub fn configure(&mut self, config: &ShaperConfig) -> Result<(), BpfError> {
        let map = self
            .ebpf
            .map_mut(map_names::CONFIG)
            .ok_or(BpfError::Missing(map_names::CONFIG))?;
        let mut array: Array<_, ShaperConfig> =
            Array::try_from(map).map_err(map_err(map_names::CONFIG))?;
        array
            .set(0, *config, 0)
            .map_err(map_err(map_names::CONFIG))?;
        self.config = *config;
        Ok(())
    }

    /// Where the data path reads a packet's conntrack entry (`--nat`); all zero for off.
    pub fn set_conntrack(&mut self, layout: &ConntrackLayout) -> Result<(), BpfError> {
        let name = map_names::CONNTRACK;
        let mut array =
            Array::<_, ConntrackLayout>::try_from(self.map_mut(name)?).map_err(map_err(name))?;
        array.set(0, *layout, 0).map_err(map_err(name))
    }

    /// Turns the segmenter on (`Some((split_segs, ifb_ifindex))`, see
    /// `ShaperConfig::split_gso_segs`) or off, keeping the rest of the configuration.
    pub fn set_segmenter(&mut self, segmenter: Option<(u32, u32)>) -> Result<(), BpfError> {
        let (split_gso_segs, segmenter_ifindex) = segmenter.unwrap_or((0, 0));
        let config = ShaperConfig {
            split_gso_segs,
            segmenter_ifindex,
            ..self.config
        };
        self.configure(&config)
    }

    /// The segmenter's classifier, loaded, for its filter (`segmenter`).
    pub fn segment_program(&self) -> Result<BorrowedFd<'_>, BpfError> {
        Ok(self.program(program_names::SEGMENT)?.fd()?.as_fd())
    }

    /// One of the loaded programs (`program_names`).
    pub fn program(&self, name: &'static str) -> Result<&SchedClassifier, BpfError> {
        self.ebpf
            .program(name)
            .ok_or(BpfError::Missing(name))?
            .try_into()
            .map_err(BpfError::Program)
    }

    /// The configuration the data path runs with.
    pub fn config(&self) -> &ShaperConfig {
        &self.config
    }

    fn map_mut(&mut self, name: &'static str) -> Result<&mut Map, BpfError> {
        self.ebpf.map_mut(name).ok_or(BpfError::Missing(name))
    }

    fn map(&self, name: &'static str) -> Result<&Map, BpfError> {
        self.ebpf.map(name).ok_or(BpfError::Missing(name))
    }

    /// A hash map's data, for the batched operations (`crate::batch`).
    fn hash_map_data(&self, name: &'static str) -> Result<&MapData, BpfError> {
        hash_data(self.map(name)?).ok_or(BpfError::Missing(name))
    }

    /// Every host's state (the control loop reads hosts, never flows).
    pub fn hosts(&self) -> Result<Vec<(FlowKey, HostState)>, BpfError> {
        let name = map_names::HOSTS;
        entries(name, self.map(name)?, usize::MAX)
    }

    /// Writes hosts' rates in one batch (see [`Datapath::set_host_rate`]). A host the map has
    /// no room for (it holds max-hosts entries, as the hosts map does, but a walk of the hosts
    /// map while a flood churns it can return more) stays at the newcomer level; returns how
    /// many did.
    pub fn set_host_rates(&mut self, rates: &[(FlowKey, HostRate)]) -> Result<usize, BpfError> {
        let name = map_names::HOST_RATES;
        let fd = self.hash_map_data(name)?.fd().as_fd();
        let batched = batch::update(fd, rates, |e| e.raw_os_error() == Some(libc::E2BIG));
        if let Some(left_out) = batched_or_fallback(name, batched)? {
            return Ok(left_out);
        }
        let mut left_out = 0;
        for (key, rate) in rates {
            match self.set_host_rate(key, rate) {
                Err(e) if e.is_map_full() => left_out += 1,
                r => r?,
            }
        }
        Ok(left_out)
    }

    /// Removes hosts' rates in one batch: they fall back to the newcomer level.
    pub fn remove_host_rates(&mut self, keys: &[FlowKey]) -> Result<(), BpfError> {
        self.delete_batch::<HostRate>(map_names::HOST_RATES, keys)
    }

    /// Removes hosts' entries, in one batch: they come back, if ever, as new hosts. Their rates
    /// stay: [`Datapath::remove_host_rates`] removes those the control plane wrote (most hosts
    /// a flood brings never had one, and a key the map does not hold costs a system call).
    pub fn remove_hosts(&mut self, keys: &[FlowKey]) -> Result<(), BpfError> {
        self.delete_batch::<HostState>(map_names::HOSTS, keys)
    }

    /// Deletes `keys` from the hash map `name` (values of type `V`): in one batch where the
    /// kernel has them, else one by one.
    fn delete_batch<V: aya::Pod>(
        &mut self,
        name: &'static str,
        keys: &[FlowKey],
    ) -> Result<(), BpfError> {
        if keys.is_empty() {
            return Ok(());
        }
        let batched = batch::delete(self.hash_map_data(name)?.fd().as_fd(), keys);
        if batched_or_fallback(name, batched)?.is_some() {
            return Ok(());
        }
        let mut map =
            HashMap::<_, FlowKey, V>::try_from(self.map_mut(name)?).map_err(map_err(name))?;
        for key in keys {
            removed(map.remove(key)).map_err(map_err(name))?;
        }
        Ok(())
    }

    /// Makes `own` the machine's own addresses the data path keys as one host: adds the new,
    /// removes those gone. Returns how many did not fit (each stays a host of its own).
    pub fn set_own_addresses(&mut self, own: &BTreeSet<[u32; 4]>) -> Result<usize, BpfError> {
        let name = map_names::OWN_ADDRS;
        let mut map =
            HashMap::<_, [u32; 4], u8>::try_from(self.map_mut(name)?).map_err(map_err(name))?;
        let present = map
            .keys()
            .collect::<Result<BTreeSet<_>, _>>()
            .map_err(map_err(name))?;
        for gone in present.difference(own) {
            removed(map.remove(gone)).map_err(map_err(name))?;
        }
        let mut left_out = 0;
        for new in own.difference(&present) {
            match map.insert(new, 1, 0).map_err(map_err(name)) {
                Err(e) if e.is_map_full() => left_out += 1,
                r => r?,
            }
        }
        Ok(left_out)
    }

    /// The hosts whose levels the control plane wrote.
    pub fn host_rates(&self) -> Result<Vec<(FlowKey, HostRate)>, BpfError> {
        let name = map_names::HOST_RATES;
        entries(name, self.map(name)?, usize::MAX)
    }

    /// Up to `limit` flows (for stats; a full walk of a big table takes a while).
    pub fn flows(&self, limit: usize) -> Result<Vec<(FlowKey, FlowState)>, BpfError> {
        let name = map_names::FLOWS;
        entries(name, self.map(name)?, limit)
    }

    /// A host's rates. The data path reads them once per control epoch: they apply from the next
    /// [`Datapath::set_levels`] that starts a new one.
    pub fn set_host_rate(&mut self, key: &FlowKey, rate: &HostRate) -> Result<(), BpfError> {
        let name = map_names::HOST_RATES;
        let mut map = HashMap::<_, FlowKey, HostRate>::try_from(self.map_mut(name)?)
            .map_err(map_err(name))?;
        map.insert(key, rate, 0).map_err(map_err(name))
    }

    pub fn remove_host_rate(&mut self, key: &FlowKey) -> Result<(), BpfError> {
        let name = map_names::HOST_RATES;
        let mut map = HashMap::<_, FlowKey, HostRate>::try_from(self.map_mut(name)?)
            .map_err(map_err(name))?;
        removed(map.remove(key)).map_err(map_err(name))
    }

    pub fn levels(&self) -> Result<Levels, BpfError> {
        read_levels(self.map(map_names::LEVELS)?)
    }

    pub fn set_levels(&mut self, levels: &Levels) -> Result<(), BpfError> {
        let name = map_names::LEVELS;
        let mut array = Array::<_, Levels>::try_from(self.map_mut(name)?).map_err(map_err(name))?;
        array.set(0, *levels, 0).map_err(map_err(name))
    }

    pub fn egress(&mut self) -> Result<&mut SchedClassifier, BpfError> {
        egress_program(&mut self.ebpf)
    }

    /// Attaches at egress: a TCX link, or (kernels < 6.6) a netlink filter under clsact, which
    /// the caller must have put in place.
    pub fn attach_egress(&mut self, iface: &str, mode: AttachMode) -> Result<(), BpfError> {
        self.name_events(iface);
        self.link = Some(self.egress()?.attach_with_options(
            iface,
            TcAttachType::Egress,
            attach_options(mode),
        )?);
        Ok(())
    }

    /// Names `iface` in the data path's events, when they are forwarded.
    fn name_events(&self, iface: &str) {
        if let Some(events) = &self.events {
            events.shaping(iface);
        }
    }

    /// Attaches the ACK filter's observer at ingress (it only reads packets).
    pub fn attach_ingress(&mut self, iface: &str, mode: AttachMode) -> Result<(), BpfError> {
        self.ingress_link = Some(
            classifier(&mut self.ebpf, program_names::INGRESS)?.attach_with_options(
                iface,
                TcAttachType::Ingress,
                attach_options(mode),
            )?,
        );
        Ok(())
    }

    /// Watches the qdisc of the device `ifindex` (in this process's network namespace) for
    /// packets leaving ahead of the rate, and charges the calendar for them
    /// (`shaper_common::overrun`; `behind_bottleneck`: the device is an ingress IFB).
    /// Needs the kernel's BTF for where the observer reads; it detaches with the data path.
    pub fn watch_dequeue(&mut self, ifindex: u32, behind_bottleneck: bool) -> Result<(), BpfError> {
        // Interface indexes are per namespace: ours is the one this process runs in.
        let watch = DequeueWatch {
            ifindex,
            behind_bottleneck: behind_bottleneck as u32,
            netns_inum: std::fs::metadata("/proc/self/ns/net")
                .map_err(BpfError::Netns)?
                .ino() as u32,
            ..dequeue_offsets()?
        };
        let name = map_names::DEQUEUE_WATCH;
        let mut array =
            Array::<_, DequeueWatch>::try_from(self.map_mut(name)?).map_err(map_err(name))?;
        array.set(0, watch, 0).map_err(map_err(name))?;
        self.load_dequeue()?;
        // In front of the bottleneck the observer earns the slack's credit from now on, from
        // what the device idles: the slack then never carries what is lent on top of the rate
        // into the queue behind. Behind it (an ingress IFB) the packets crossed the bottleneck
        // already and the slack catches up the IFB's scheduling delays, as CAKE's shaper sends
        // what was due: unbounded, as with no observer.
        self.set_slack_credit(if behind_bottleneck {
            overrun::SLACK_CREDIT_UNLIMITED
        } else {
            0
        })?;
        self.dequeue_program()?.attach("qdisc_dequeue")?;
        Ok(())
    }

    /// What [`Datapath::watch_dequeue`] needs that does not depend on the interface, done
    /// ahead (a spare data path, `spares`): the kernel's offsets read and the observer verified.
    pub fn prepare_dequeue(&mut self) -> Result<(), BpfError> {
        dequeue_offsets()?;
        self.load_dequeue()
    }

    /// Loads the dequeue observer unless it is loaded.
    fn load_dequeue(&mut self) -> Result<(), BpfError> {
        let program = self.dequeue_program()?;
        if program.fd().is_err() {
            program.load()?;
        }
        Ok(())
    }

    fn dequeue_program(&mut self) -> Result<&mut RawTracePoint, BpfError> {
        Ok(self
            .ebpf
            .program_mut(program_names::DEQUEUE)
            .ok_or(BpfError::Missing(program_names::DEQUEUE))?
            .try_into()?)
    }

    /// The kernel's id of an attached program: the egress scheduler, or (with the ACK filter)
    /// the ingress observer; `None` when it is not attached.
    pub fn attached_id(&self, hook: Hook) -> Result<Option<u32>, BpfError> {
        let (attached, name) = match hook {
            Hook::Egress => (self.link.is_some(), program_names::EGRESS),
            Hook::Ingress => (self.ingress_link.is_some(), program_names::INGRESS),
        };
        if !attached {
            return Ok(None);
        }
        Ok(Some(self.program(name)?.info()?.id()))
    }

    /// Attaches the program at `hook` again after someone else detached it. The old link is
    /// dropped: its detach fails when what it named is already gone.
    pub fn reattach(&mut self, hook: Hook, iface: &str, mode: AttachMode) -> Result<(), BpfError> {
        match hook {
            Hook::Egress => {
                if let Some(link) = self.link.take() {
                    let _ = self.egress()?.detach(link);
                }
                self.attach_egress(iface, mode)
            }
            Hook::Ingress => {
                if let Some(link) = self.ingress_link.take() {
                    let _ = classifier(&mut self.ebpf, program_names::INGRESS)?.detach(link);
                }
                self.attach_ingress(iface, mode)
            }
        }
    }

    /// Attaches the program at `hook` in place of a predecessor's, atomically: a TCX link is
    /// updated to this program, a netlink filter changed at its priority and handle. No packet
    /// passes between the two.
    pub fn take_over(&mut self, hook: Hook, iface: &str, prior: Prior) -> Result<(), BpfError> {
        let attach_type = match hook {
            Hook::Egress => TcAttachType::Egress,
            Hook::Ingress => TcAttachType::Ingress,
        };
        let link = match prior {
            Prior::Link(link) => SchedClassifierLink::try_from(link)?,
            Prior::Filter { handle } => SchedClassifierLink::attached(
                iface,
                attach_type,
                NETLINK_PRIORITY,
                handle.into(),
                None,
            )?,
        };
        if hook == Hook::Egress {
            self.name_events(iface);
        }
        let (name, slot) = match hook {
            Hook::Egress => (program_names::EGRESS, &mut self.link),
            Hook::Ingress => (program_names::INGRESS, &mut self.ingress_link),
        };
        *slot = Some(classifier(&mut self.ebpf, name)?.attach_to_link(link)?);
        Ok(())
    }

    /// Leaves the programs attached and the state for a successor (`handover`): pins the
    /// carried maps and, in TCX mode, the links, which would detach when this process exits. A
    /// netlink filter stays by itself: its link is let go without detaching. The dequeue
    /// observer detaches at exit (the successor attaches its own).
    pub fn leave(&mut self, leaving: &Leaving, mode: AttachMode) -> Result<(), BpfError> {
        // The tail calls' array too, not to be carried: the kernel empties a program array
        // when the last process holding it lets go, and the attached program would then pass
        // every packet unshaped until its successor replaces it. The pin holds it until then.
        for name in map_names::CARRIED.into_iter().chain([map_names::PROGRAMS]) {
            let map = self.map(name)?;
            let data = map_data(map).ok_or(BpfError::Missing(name))?;
            data.pin(leaving.map(name))
                .map_err(|source| BpfError::Pin {
                    name: name.to_string(),
                    source,
                })?;
        }
        for hook in [Hook::Egress, Hook::Ingress] {
            let (name, slot) = match hook {
                Hook::Egress => (program_names::EGRESS, &mut self.link),
                Hook::Ingress => (program_names::INGRESS, &mut self.ingress_link),
            };
            let Some(id) = slot.take() else {
                continue;
            };
            let link = classifier(&mut self.ebpf, name)?.take_link(id)?;
            match mode {
                AttachMode::Tcx => {
                    FdLink::try_from(link)?
                        .pin(leaving.link(hook))
                        .map_err(|source| BpfError::Pin {
                            name: name.to_string(),
                            source,
                        })?;
                }
                // Dropping it would remove the filter.
                AttachMode::Netlink => std::mem::forget(link),
            }
        }
        Ok(())
    }

    /// Detaches the programs (new packets leave unshaped from here on).
    pub fn detach(&mut self) -> Result<(), BpfError> {
        if let Some(link) = self.ingress_link.take() {
            classifier(&mut self.ebpf, program_names::INGRESS)?.detach(link)?;
        }
        if let Some(link) = self.link.take() {
            self.egress()?.detach(link)?;
        }
        Ok(())
    }

    /// The kernel's id of one of the maps (`map_names`).
    pub fn map_id(&self, name: &'static str) -> Result<u32, BpfError> {
        let map = self.map(name)?;
        let data = map_data(map).ok_or(BpfError::Missing(name))?;
        Ok(data.info().map_err(map_err(name))?.id())
    }

    pub fn map_ids(&self) -> Result<MapIds, BpfError> {
        let id = |name| self.map_id(name);
        Ok(MapIds {
            config: id(map_names::CONFIG)?,
            hosts: id(map_names::HOSTS)?,
            flows: id(map_names::FLOWS)?,
            host_rates: id(map_names::HOST_RATES)?,
            stats: id(map_names::STATS)?,
            levels: id(map_names::LEVELS)?,
        })
    }

    /// Counters of this instance (for tests and the control loop).
    pub fn snapshot(&self) -> Result<DatapathView, BpfError> {
        read_view(self.map(map_names::STATS)?)
    }

    /// The maps `shaper stats` reads, for reading them on another thread: duplicates of this
    /// process's own descriptors, which need no privilege beyond holding them (opening a map by
    /// id would need CAP_SYS_ADMIN). They keep the maps alive while held.
    pub fn reader(&self) -> Result<MapReader, BpfError> {
        let dup = |name: &'static str| -> Result<Map, BpfError> {
            let data = map_data(self.map(name)?).ok_or(BpfError::Missing(name))?;
            let fd = data.fd().as_fd().try_clone_to_owned()?;
            MapData::from_fd(fd)
                .and_then(Map::from_map_data)
                .map_err(map_err(name))
        };
        Ok(MapReader {
            stats: dup(map_names::STATS)?,
            levels: Some(dup(map_names::LEVELS)?),
            hosts: dup(map_names::HOSTS)?,
            host_rates: dup(map_names::HOST_RATES)?,
            flows: dup(map_names::FLOWS)?,
        })
    }
}

/// A detached filter named like ours from a crashed run (netlink mode only; TCX links die with
/// their process).
pub fn remove_stale_filter(iface: &str) {
    remove_stale_filter_at(iface, Hook::Egress);
    remove_stale_filter_at(iface, Hook::Ingress);
}

/// [`remove_stale_filter`] at one hook.
pub fn remove_stale_filter_at(iface: &str, hook: Hook) {
    let _ = match hook {
        Hook::Egress => {
            tc::qdisc_detach_program(iface, TcAttachType::Egress, program_names::EGRESS)
        }
        Hook::Ingress => {
            tc::qdisc_detach_program(iface, TcAttachType::Ingress, program_names::INGRESS)
        }
    };
}

fn attach_options(mode: AttachMode) -> TcAttachOptions {
    match mode {
        AttachMode::Tcx => TcAttachOptions::TcxOrder(aya::programs::LinkOrder::default()),
        AttachMode::Netlink => TcAttachOptions::Netlink(NlOptions {
            priority: NETLINK_PRIORITY,
            ..Default::default()
        }),
    }
}

/// Loads the programs reached by tail calls and puts them where the tail calls look for them.
fn install_tail_calls(ebpf: &mut Ebpf) -> Result<(), BpfError> {
    let mut fds = Vec::new();
    for (slot, name) in [
        (program_slots::MARK, program_names::MARK),
        (program_slots::ACK_FILTER, program_names::ACK_FILTER),
        (program_slots::SCHEDULE, program_names::SCHEDULE),
    ] {
        let program = classifier(ebpf, name)?;
        program.load()?;
        fds.push((slot, program.fd()?.try_clone()?));
    }
    let name = map_names::PROGRAMS;
    let mut slots = ProgramArray::try_from(ebpf.map_mut(name).ok_or(BpfError::Missing(name))?)
        .map_err(map_err(name))?;
    for (slot, fd) in &fds {
        slots.set(*slot, fd, 0).map_err(map_err(name))?;
    }
    Ok(())
}

/// The verifier's work per program, in one line: each program must verify within the kernel's
/// 1M processed instructions, and how much a program costs the verifier changes from one
/// kernel to the next (the scheduler takes three times as many on 6.12 as on 6.1), so the
/// margin is worth seeing where shaper runs. The end-to-end tests hold it to a budget.
/// The dequeue observer's offsets into the running kernel's structures, its BTF read once per
/// process (parsing it takes a good part of a second under emulation; it does not change while
/// the kernel runs).
fn dequeue_offsets() -> Result<DequeueWatch, BpfError> {
    static OFFSETS: std::sync::OnceLock<DequeueWatch> = std::sync::OnceLock::new();
    if let Some(offsets) = OFFSETS.get() {
        return Ok(*offsets);
    }
    let btf = crate::kernel_btf::KernelBtf::running()?;
    let offsets = crate::kernel_btf::dequeue_watch(&btf)?;
    Ok(*OFFSETS.get_or_init(|| offsets))
}

fn log_verifier_cost(ebpf: &mut Ebpf) {
    let counts: Vec<String> = program_names::ALL
        .iter()
        .filter_map(|name| {
            let info = classifier(ebpf, name).ok()?.info().ok()?;
            Some(format!("{name} {}", info.verified_instruction_count()?))
        })
        .collect();
    if !counts.is_empty() {
        tracing::info!(
            "data path verified: {} instructions processed (limit 1000000 each)",
            counts.join(", ")
        );
    }
}

/// The pins of [`map_names::CARRIED`] that `left` holds, if each is there and fits the map this
/// object would create with `state`'s sizes (its type, key and value sizes, and entries); why
/// not, otherwise.
fn carried_maps(
    state: &StateParams,
    left: &Left,
) -> Result<Vec<(&'static str, std::path::PathBuf)>, String> {
    let object = aya_obj::Object::parse(OBJECT).map_err(|e| e.to_string())?;
    let mut carried = Vec::new();
    for name in map_names::CARRIED {
        let path = left.map(name).ok_or(format!("lack {name}"))?;
        let ours = object
            .maps
            .get(name)
            .ok_or(format!("include {name}, which this build does not have"))?;
        let entries = match name {
            map_names::FLOWS => state.max_flows,
            map_names::HOSTS | map_names::HOST_RATES => state.max_hosts,
            _ => ours.max_entries(),
        };
        let theirs = aya::maps::MapInfo::from_pin(&path).map_err(|e| format!("{name}: {e}"))?;
        let fits = theirs.map_type().is_ok_and(|t| t as u32 == ours.map_type())
            && theirs.key_size() == ours.key_size()
            && theirs.value_size() == ours.value_size()
            && theirs.max_entries() == entries;
        if !fits {
            return Err(format!(
                "differ from this build's in {name} (type, key or value size, or entries: max-flows and max-hosts must not change across a takeover)"
            ));
        }
        carried.push((name, path));
    }
    Ok(carried)
}

fn classifier<'a>(
    ebpf: &'a mut Ebpf,
    name: &'static str,
) -> Result<&'a mut SchedClassifier, BpfError> {
    ebpf.program_mut(name)
        .ok_or(BpfError::Missing(name))?
        .try_into()
        .map_err(BpfError::Program)
}

fn egress_program(ebpf: &mut Ebpf) -> Result<&mut SchedClassifier, BpfError> {
    classifier(ebpf, program_names::EGRESS)
}

/// The kernel map behind one of the object's (every type the object has).
pub fn map_data(map: &Map) -> Option<&MapData> {
    match map {
        Map::Array(d)
        | Map::RingBuf(d)
        | Map::PerCpuArray(d)
        | Map::HashMap(d)
        | Map::LruHashMap(d)
        | Map::ProgramArray(d) => Some(d),
        _ => None,
    }
}

/// What the data path's maps say right now.
#[derive(Debug, Clone, Copy, Default)]
pub struct DatapathView {
    pub stats: DatapathStats,
    /// How far ahead of now the latest departure is scheduled: the queue, in time.
    pub backlog_ns: u64,
}

/// The counters of a [`map_names::STATS`] map, added up over the CPUs.
fn read_view(map: &Map) -> Result<DatapathView, BpfError> {
    let name = map_names::STATS;
    let stats = PerCpuArray::<_, DatapathStats>::try_from(map).map_err(map_err(name))?;
    let per_cpu = stats.get(&0, 0).map_err(map_err(name))?;
    let mut total = DatapathStats::default();
    for cpu in per_cpu.iter() {
        total.accumulate(cpu);
    }
    Ok(DatapathView {
        stats: total,
        backlog_ns: total.latest_depart_ns.saturating_sub(monotonic_now_ns()),
    })
}

/// What a [`map_names::LEVELS`] map holds.
fn read_levels(map: &Map) -> Result<Levels, BpfError> {
    let name = map_names::LEVELS;
    let array = Array::<_, Levels>::try_from(map).map_err(map_err(name))?;
    array.get(&0, 0).map_err(map_err(name))
}

/// Up to `limit` entries of one of the hash maps keyed by flow or host (`name`, for errors).
fn entries<V: aya::Pod>(
    name: &'static str,
    map: &Map,
    limit: usize,
) -> Result<Vec<(FlowKey, V)>, BpfError> {
    // All of a hash map in batches, where the kernel has them: a few system calls, not two
    // for each entry.
    if let (Some(data), usize::MAX) = (hash_data(map), limit) {
        let max_entries = data.info().map_err(map_err(name))?.max_entries();
        if let Some(all) =
            batched_or_fallback(name, batch::lookup_all(data.fd().as_fd(), max_entries))?
        {
            return Ok(all);
        }
    }
    let map = HashMap::<_, FlowKey, V>::try_from(map).map_err(map_err(name))?;
    // An entry evicted between listing its key and reading it is simply skipped.
    Ok(map.iter().filter_map(Result::ok).take(limit).collect())
}

/// A removal of a key that is not there (any more) is done: aya reports the kernel's ENOENT as a
/// failed syscall, not as [`aya::maps::MapError::KeyNotFound`].
fn removed(result: Result<(), aya::maps::MapError>) -> Result<(), aya::maps::MapError> {
    match result {
        Err(aya::maps::MapError::KeyNotFound) => Ok(()),
        Err(aya::maps::MapError::SyscallError(e))
            if e.io_error.raw_os_error() == Some(libc::ENOENT) =>
        {
            Ok(())
        }
        other => other,
    }
}

/// A data path's maps as read beside its control loop, by the running process (the metrics
/// endpoint, [`Datapath::reader`]) or by `shaper stats` ([`MapReader::by_ids`]): one decoding
/// of each, whoever opened it.
#[derive(Debug)]
pub struct MapReader {
    stats: Map,
    /// `None` from a state file written before the levels' id was recorded.
    levels: Option<Map>,
    hosts: Map,
    host_rates: Map,
    flows: Map,
}

impl MapReader {
    /// Another process's maps by their kernel ids (its state file's): BPF_MAP_GET_FD_BY_ID,
    /// which needs CAP_SYS_ADMIN.
    pub fn by_ids(ids: &MapIds) -> Result<Self, BpfError> {
        let open = |name: &'static str, id: u32| match MapData::from_id(id) {
            Err(aya::maps::MapError::SyscallError(e))
                if e.io_error.raw_os_error() == Some(libc::EPERM) =>
            {
                Err(BpfError::ById(name))
            }
            opened => opened.and_then(Map::from_map_data).map_err(map_err(name)),
        };
        Ok(Self {
            stats: open(map_names::STATS, ids.stats)?,
            levels: match ids.levels {
                0 => None,
                id => Some(open(map_names::LEVELS, id)?),
            },
            hosts: open(map_names::HOSTS, ids.hosts)?,
            host_rates: open(map_names::HOST_RATES, ids.host_rates)?,
            flows: open(map_names::FLOWS, ids.flows)?,
        })
    }

    /// The counters now.
    pub fn view(&self) -> Result<DatapathView, BpfError> {
        read_view(&self.stats)
    }

    /// The levels the control plane wrote last, if the map is known.
    pub fn levels(&self) -> Result<Option<Levels>, BpfError> {
        self.levels.as_ref().map(read_levels).transpose()
    }

    /// Every host and its state.
    pub fn hosts(&self) -> Result<Vec<(FlowKey, HostState)>, BpfError> {
        entries(map_names::HOSTS, &self.hosts, usize::MAX)
    }

    /// The hosts whose levels the control plane wrote.
    pub fn host_rates(&self) -> Result<Vec<(FlowKey, HostRate)>, BpfError> {
        entries(map_names::HOST_RATES, &self.host_rates, usize::MAX)
    }

    /// Up to `limit` flows.
    pub fn flows(&self, limit: usize) -> Result<Vec<(FlowKey, FlowState)>, BpfError> {
        entries(map_names::FLOWS, &self.flows, limit)
    }

    /// One of the per-host and per-flow maps (`map_names::HOSTS`, `HOST_RATES` or `FLOWS`),
    /// for what it costs (`mapmem`).
    pub fn table(&self, name: &'static str) -> Result<&Map, BpfError> {
        match name {
            map_names::HOSTS => Ok(&self.hosts),
            map_names::HOST_RATES => Ok(&self.host_rates),
            map_names::FLOWS => Ok(&self.flows),
            _ => Err(BpfError::Missing(name)),
        }
    }
}

/// The clock the data path stamps with (bpf_ktime_get_ns).
pub fn monotonic_now_ns() -> u64 {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: valid timespec pointer.
    unsafe { libc::clock_gettime(libc::CLOCK_MONOTONIC, &mut ts) };
    ts.tv_sec as u64 * 1_000_000_000 + ts.tv_nsec as u64
}

/// Kernels before 5.11 charge BPF memory to RLIMIT_MEMLOCK; later ones ignore it.
fn raise_memlock_limit() {
    let rlim = libc::rlimit {
        rlim_cur: libc::RLIM_INFINITY,
        rlim_max: libc::RLIM_INFINITY,
    };
    // SAFETY: valid rlimit pointer.
    unsafe { libc::setrlimit(libc::RLIMIT_MEMLOCK, &rlim) };
}
