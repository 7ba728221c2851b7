//! DSCP names and numbers (`diffserv::parse_dscp`), and the tin a packet's TOS byte maps to.
//!
//! - A name or number parses to a DSCP (0-63), whatever its case and surrounding whitespace; a
//!   number parses to itself, and every DSCP's decimal form parses back to it.
//! - In every mode, the tin of a DSCP (and of any TOS byte, through the table the data path
//!   reads) is one of the mode's tins, and the ECN bits never change it.
#![no_main]

use libfuzzer_sys::fuzz_target;
use shaper_common::diffserv::{Diffserv, parse_dscp};

fuzz_target!(|data: &[u8]| {
    let Some((&tos, rest)) = data.split_first() else {
        return;
    };
    for mode in Diffserv::ALL {
        let table = mode.table();
        let tin = table[usize::from(tos >> 2)];
        assert!(usize::from(tin) < mode.tins().len(), "{mode:?} {tos:#x}");
        assert_eq!(tin, mode.tin_of(tos >> 2));
        assert_eq!(tin, table[usize::from((tos ^ 0b11) >> 2)], "ECN bits");
    }
    assert_eq!(parse_dscp(&(tos >> 2).to_string()), Some(tos >> 2));

    let Ok(text) = std::str::from_utf8(rest) else {
        return;
    };
    let parsed = parse_dscp(text);
    if let Some(d) = parsed {
        assert!(d < 64, "{text:?}: {d}");
    }
    if let Ok(n) = text.trim().parse::<u8>() {
        assert_eq!(parsed, (n < 64).then_some(n), "{text:?}");
    }
    for variant in [
        text.to_ascii_uppercase(),
        text.to_ascii_lowercase(),
        format!(" {text}\t"),
    ] {
        assert_eq!(parse_dscp(&variant), parsed, "{text:?} read as {variant:?}");
    }
});
