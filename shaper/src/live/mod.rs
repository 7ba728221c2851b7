//! Changing a running shaper's settings in place (`shaper set`, `shaper reload`, SIGHUP):
//! the protocol between the commands and `shaper run`, the control socket it listens on, where
//! the settings come from, and what differs and can change without a restart. Applying a
//! difference is each deployment part's own (`deploy::Part::change`).

pub mod change;
pub mod protocol;
pub mod server;
pub mod source;
