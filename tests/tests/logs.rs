//! The data path's debug events (`--log-datapath`, `shaper_common::logs`) in the running kernel:
//! off, the programs the kernel runs hold nothing of them (the verifier removed every branch
//! that sends one); on, the programs that send them do. Needs root.

use std::os::fd::AsFd;

use shaper::config::StateParams;
use shaper_common::names::{map_names, program_names};
use shaper_tests::{Harness, TEST_STATE, config, xlated};

const SECOND: u64 = 1_000_000_000;

/// The ids of the maps that `program` of `h` names, as the kernel runs it.
fn maps_named(h: &Harness, program: &'static str) -> Vec<u32> {
    let program = h.datapath.program(program).expect("program");
    let fd = program.fd().expect("loaded");
    xlated::maps_named(fd.as_fd()).expect("the program's translated instructions")
}

#[test]
fn off_no_program_the_kernel_runs_holds_anything_of_the_events() {
    let off = Harness::new(config(1_000_000, SECOND));
    let buckets = off.datapath.map_id(map_names::LOG_BUCKETS).unwrap();
    let ring = off.datapath.map_id(map_names::LOG_RING).unwrap();
    for program in program_names::ALL {
        let named = maps_named(&off, program);
        assert!(
            !named.contains(&buckets) && !named.contains(&ring),
            "{program} still names the events' maps with --log-datapath off"
        );
    }

    // The same check sees them when they are there.
    let on = Harness::with_state(
        config(1_000_000, SECOND),
        &StateParams {
            log_datapath: true,
            ..TEST_STATE
        },
    );
    let buckets = on.datapath.map_id(map_names::LOG_BUCKETS).unwrap();
    for program in [program_names::SCHEDULE, program_names::ACK_FILTER] {
        assert!(
            maps_named(&on, program).contains(&buckets),
            "{program} sends no event with --log-datapath on"
        );
    }

    // For the record (docs/notebook/logs.md): what each costs the verifier, and the size of
    // what the kernel runs, off and on.
    for program in program_names::ALL {
        let cost = |h: &Harness| {
            let info = h.datapath.program(program).unwrap().info().unwrap();
            (
                info.verified_instruction_count().unwrap_or(0),
                info.size_translated().unwrap_or(0) / 8,
            )
        };
        let ((off_verified, off_size), (on_verified, on_size)) = (cost(&off), cost(&on));
        println!(
            "{program}: verifier {off_verified} off, {on_verified} on; {off_size} instructions off, {on_size} on"
        );
    }
}
