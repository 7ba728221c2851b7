//! One module per subcommand.

pub mod doctor;
mod live_client;
pub mod reload;
pub mod reset;
pub mod run;
pub mod set;
pub mod stats;
pub mod tune;
