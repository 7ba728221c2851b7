//! `shaper run --metrics ADDR`: the counters of `shaper stats`, the control loop's timing and
//! the process's health over HTTP, for Prometheus and for a service manager's probes.
//!
//! - `text`: the exposition format, a pure function of a [`status::Scrape`];
//! - `status`: what the run loop publishes (its states, ticks, health checks) and the scrape
//!   built from it and the data path's maps;
//! - `http`: the server, on a thread of its own: a slow or stuck client never delays a tick.
//!
//! Nothing listens unless `--metrics` (or `metrics` in the config file) asks for it.

pub mod histogram;
pub mod http;
pub mod status;
pub mod text;

/// Which way a shaped direction's traffic goes on the configured interface.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Direction {
    Egress,
    /// Arriving traffic, shaped on the interface's IFB (`--ingress-rate`).
    Ingress,
}

impl Direction {
    pub fn name(self) -> &'static str {
        match self {
            Direction::Egress => "egress",
            Direction::Ingress => "ingress",
        }
    }
}
