//! `shaper doctor`: whether this host, and optionally one interface, can run shaper well, as a
//! list of checks that each pass, warn or fail, with a one-line remedy for each that does not
//! pass.
//!
//! Three steps, kept apart so that the judging is plain data in, plain data out:
//! - [`gather`] observes the host into [`facts::Facts`]: files under /proc and /sys, the kernel's
//!   module lists, netlink and ethtool reads of the interface, and [`netns_probe`], which
//!   creates the kernel objects shaper needs in a throwaway network namespace. Nothing of the
//!   host's own interfaces, qdiscs or settings is changed.
//! - [`verdict`] turns facts into [`report::Check`]s: which facts pass, warn or fail, and what
//!   to do about them. It reads nothing and is tested on the host.
//! - [`report`] prints them, for people or as JSON.

pub mod facts;
pub mod gather;
pub mod modules;
pub mod netns_probe;
pub mod report;
pub mod verdict;
