//! One module per subcommand.

pub mod reset;
pub mod run;
pub mod stats;
