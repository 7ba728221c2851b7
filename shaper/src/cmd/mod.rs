//! One module per subcommand.

pub mod doctor;
pub mod reset;
pub mod run;
pub mod stats;
