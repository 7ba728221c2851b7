//! shaper: a CAKE-class traffic shaper built on eBPF. The BPF data path stamps each packet's
//! Earliest Departure Time and `fq` releases it then; this library is the control plane.

pub mod bpf;
pub mod cli;
pub mod clsact;
pub mod cmd;
pub mod config;
pub mod control;
pub mod cost;
pub mod deploy;
pub mod doctor;
pub mod fairness;
pub mod filter;
pub mod handover;
pub mod health;
pub mod ingress;
pub mod interfaces;
pub mod kernel_btf;
pub mod link;
pub mod linkwatch;
pub mod live;
pub mod mapmem;
pub mod metrics;
pub mod netlink;
pub mod notify;
pub mod probe;
pub mod qdisc;
pub mod record;
pub mod reset;
pub mod runtime;
pub mod sampling;
pub mod segmenter;
pub mod shape;
pub mod spares;
pub mod stats;
pub mod tune;
pub mod watch;
