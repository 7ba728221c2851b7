//! How the loader finds the BPF object's parts: the names of its maps and programs, and the
//! tail-call slots.

/// Names of the maps, as declared in the BPF object.
pub mod map_names {
    pub const CONFIG: &str = "SHAPER_CONFIG";
    pub const STATS: &str = "SHAPER_STATS";
    pub const LEVELS: &str = "SHAPER_LEVELS";
    pub const HOSTS: &str = "SHAPER_HOSTS";
    pub const HOST_RATES: &str = "SHAPER_HOST_RATES";
    pub const FLOWS: &str = "SHAPER_FLOWS";
    pub const CALENDAR: &str = "SHAPER_CALENDAR";
    /// Programs reached by tail calls, at [`super::program_slots`].
    pub const PROGRAMS: &str = "SHAPER_PROGRAMS";
    pub const ACKS: &str = "SHAPER_ACKS";
    pub const REVERSE: &str = "SHAPER_REVERSE";
    /// The dequeue observer's device and offsets (`overrun::DequeueWatch`).
    pub const DEQUEUE_WATCH: &str = "SHAPER_DEQUEUE_WATCH";
    /// The guards newcomers towards one destination share.
    pub const DESTINATIONS: &str = "SHAPER_DESTINATIONS";
    /// The dequeue meter's account of what left beyond the rate.
    pub const DEPARTURES: &str = "SHAPER_DEPARTURES";
    /// The machine's own addresses (`isolation::own_lookup_key`), each one host
    /// (`isolation::SELF_HOST`). Each process writes its own: not carried.
    pub const OWN_ADDRS: &str = "SHAPER_OWN_ADDRS";
    /// Where a packet's conntrack entry lies (`conntrack::ConntrackLayout`), with `--nat`.
    pub const CONNTRACK: &str = "SHAPER_CONNTRACK";
    /// Flows' addresses before NAT (`conntrack::BeforeNat`) by their 5-tuple as they leave, for
    /// their packets that come without their conntrack entry.
    pub const NAT_FLOWS: &str = "SHAPER_NAT_FLOWS";
    /// Each CPU's budget of debug events (`logs::Buckets`), and aya-log's ring buffer they are
    /// written to: used only with `--log-datapath` (`logs`).
    pub const LOG_BUCKETS: &str = "SHAPER_LOG_BUCKETS";
    pub const LOG_RING: &str = "AYA_LOGS";
    /// The maps that hold the data path's flow and scheduling state, and its counters: what a
    /// process leaving the interface to a successor (`shaper run --keep`) carries over. Not the
    /// tail calls' program array (it names this object's programs), the per-CPU scratch space
    /// or the dequeue observer's device (each process sets its own).
    pub const CARRIED: [&str; 11] = [
        CONFIG,
        STATS,
        LEVELS,
        HOSTS,
        HOST_RATES,
        FLOWS,
        CALENDAR,
        DESTINATIONS,
        ACKS,
        REVERSE,
        DEPARTURES,
    ];
}

/// Names of the BPF programs.
pub mod program_names {
    /// Attached at egress: classifies each packet and hands it to the ACK filter or the
    /// scheduler by a tail call.
    pub const EGRESS: &str = "shaper_egress";
    /// Stamps the departure time; reached by a tail call from the egress program or the ACK
    /// filter.
    pub const SCHEDULE: &str = "shaper_schedule";
    /// Sets CE on packets the AQM picked; reached by a tail call from the egress program.
    pub const MARK: &str = "shaper_mark";
    /// The ACK filter's decision on a pure ACK; tail-called from the egress program, it hands
    /// the ACKs it keeps to the scheduler.
    pub const ACK_FILTER: &str = "shaper_ack_filter";
    /// Records the data direction for the ACK filter (attached at ingress).
    pub const INGRESS: &str = "shaper_ingress";
    /// Picks the packets the segmenter splits: a classifier (not direct-action) whose filter
    /// carries a `mirred` redirect to the segmenter's IFB, after the egress program.
    pub const SEGMENT: &str = "shaper_segment";
    pub const ALL: [&str; 6] = [EGRESS, SCHEDULE, MARK, ACK_FILTER, INGRESS, SEGMENT];
    /// Watches the qdisc's dequeues for packets leaving late (a raw tracepoint on
    /// `qdisc_dequeue`, not a classifier: not in [`ALL`]).
    pub const DEQUEUE: &str = "shaper_dequeue";
}

/// Slots of `SHAPER_PROGRAMS`.
pub mod program_slots {
    pub const MARK: u32 = 0;
    pub const ACK_FILTER: u32 = 1;
    pub const SCHEDULE: u32 = 2;
}
