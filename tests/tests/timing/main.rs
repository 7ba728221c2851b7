//! BPF tests that depend on real time, in a binary of their own that runs one test at a time
//! (`cargo xtask test` runs it with `--test-threads=1`; by hand:
//! `cargo test -p shaper-tests --test timing -- --test-threads=1`).
//!
//! Why: each test stamps packets through BPF_PROG_TEST_RUN against CLOCK_MONOTONIC, and its
//! verdict holds only while less real time passes between its runs than its margin: a queue
//! of 24 ms that must still stand after a sleep of 7 ms, a calendar bin's edge with a
//! millisecond to spare, a sleep that must end inside a 3 ms window, a rate measured in runs a
//! second. A neighbouring test on another thread (a program load through the verifier is tens
//! of milliseconds of CPU) is a scheduling delay that moves them; run alone, they do not. The
//! other BPF tests (tests/tests/*.rs) check verdicts and counters that no delay changes, and
//! run in parallel.
//!
//! Not run by a plain `cargo test` (`test = false` in tests/Cargo.toml), which runs tests in
//! parallel.

mod ackfilter;
mod aqm;
mod datapath;
mod diffserv;
mod fairness;
mod overrun;
mod scale;
