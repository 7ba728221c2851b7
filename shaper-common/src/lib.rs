//! Shared between the BPF data path (`no_std`) and the userspace control plane: the pure
//! arithmetic (rates, EDT) and the `#[repr(C)]` map types.
#![no_std]

pub mod abi;
pub mod ackfilter;
pub mod aqm;
pub mod autorate;
pub mod branchless;
pub mod calendar;
pub mod cb;
pub mod conntrack;
pub mod diffserv;
pub mod edt;
pub mod framing;
pub mod hash;
pub mod isolation;
pub mod logs;
pub mod names;
pub mod overrun;
pub mod rate;
pub mod schedule;
pub mod segmenter;
pub mod sizing;
pub mod stats;
pub mod time;
