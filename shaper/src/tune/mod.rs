//! `shaper tune`: the host settings advised for a machine that sends through a shaper (the
//! seeds' servers), and how they are applied, kept across reboots and undone.
//!
//! [`advice`] decides (pure: what to change, from what the host reads now); [`host`] reads and
//! writes the kernel's settings and the files that keep and undo them.

pub mod advice;
pub mod host;
