//! The ACK filter's TCP option scan (`ackfilter::scan_options`), given options as the data
//! path hands them over: `len` bytes (0-40) in a zeroed 64-byte buffer.
//!
//! Checked against a walk of the options as a TCP receiver does it (RFC 9293 3.2, Linux's
//! `tcp_parse_options`: kind, length, a malformed length ends the walk):
//! - The scan reads nothing beyond the 40 bytes options can occupy.
//! - Every SACK block it reports is one the sender reads from a SACK option within `len`
//!   (the filter records reported blocks as told to the sender).
//! - When it understands the options, they are NOP/EOL padding, at most one timestamp and at
//!   most one SACK option, and its block count, full flag and reach agree with the walk.
//! - The layouts TCP stacks send on ACKs (timestamps padded before or after, then 1-4 SACK
//!   blocks, then padding) are always understood, with their blocks.
//! - A kept ACK's blocks count as told afterwards (`record`, then `AckState::told`).
#![no_main]

use libfuzzer_sys::fuzz_target;
use shaper_common::ackfilter::{
    AckSeen, AckState, MAX_SACK_BLOCKS, SackBlock, options, record, scan_options,
};

const OPTIONS_MAX: usize = 40;

/// What a receiver's walk finds in the first `len` bytes.
#[derive(Debug, Default)]
struct Walk {
    /// A length field was short or ran past `len`: the walk stopped there.
    malformed: bool,
    timestamps: usize,
    sacks: usize,
    /// Any kind other than NOP, EOL, timestamps, SACK, or those two with a length TCP does not
    /// define.
    other: bool,
    /// The last SACK option's blocks and where it ends.
    sack: Option<(Vec<SackBlock>, usize)>,
}

fn walk(opts: &[u8]) -> Walk {
    let mut w = Walk::default();
    let mut i = 0;
    while i < opts.len() {
        match opts[i] {
            options::EOL => break,
            options::NOP => i += 1,
            kind => {
                let Some(&size) = opts.get(i + 1) else {
                    w.malformed = true;
                    break;
                };
                let size = usize::from(size);
                if size < 2 || i + size > opts.len() {
                    w.malformed = true;
                    break;
                }
                let body = &opts[i + 2..i + size];
                match kind {
                    options::TIMESTAMP if size == 10 => w.timestamps += 1,
                    options::SACK if size >= 10 && (size - 2) % 8 == 0 => {
                        w.sacks += 1;
                        let word = |b: &[u8]| u32::from_be_bytes([b[0], b[1], b[2], b[3]]);
                        let blocks = body
                            .chunks(8)
                            .map(|c| SackBlock {
                                start: word(&c[..4]),
                                end: word(&c[4..]),
                            })
                            .collect();
                        w.sack = Some((blocks, i + size));
                    }
                    _ => w.other = true,
                }
                i += size;
            }
        }
    }
    w
}

fn scan(buf: &[u8], len: usize) -> AckSeen {
    let mut seen = AckSeen::default();
    scan_options(buf, len, &mut seen);
    seen
}

/// A layout TCP stacks send, built from the input: timestamps (none, padded before, padded
/// after), 0-4 SACK blocks (as many as fit), then NOP or EOL padding to a 4-byte boundary.
fn canonical(data: &[u8]) -> (Vec<u8>, Vec<SackBlock>) {
    let byte = |i: usize| data.get(i).copied().unwrap_or(0);
    let word = |i: usize| u32::from_le_bytes([byte(i), byte(i + 1), byte(i + 2), byte(i + 3)]);
    let mut o = Vec::new();
    let timestamp = |o: &mut Vec<u8>| {
        o.extend([options::TIMESTAMP, 10]);
        o.extend((2..10).map(byte));
    };
    match byte(0) % 3 {
        1 => {
            o.extend([options::NOP, options::NOP]);
            timestamp(&mut o);
        }
        2 => {
            timestamp(&mut o);
            o.extend([options::NOP, options::NOP]);
        }
        _ => {}
    }
    let room = (OPTIONS_MAX - o.len() - 4) / 8;
    let blocks: Vec<_> = (0..usize::from(byte(1)) % (MAX_SACK_BLOCKS + 1))
        .take(room)
        .map(|b| SackBlock {
            start: word(10 + 8 * b),
            end: word(14 + 8 * b),
        })
        .collect();
    if !blocks.is_empty() {
        o.extend([
            options::NOP,
            options::NOP,
            options::SACK,
            2 + 8 * blocks.len() as u8,
        ]);
        for b in &blocks {
            o.extend(b.start.to_be_bytes());
            o.extend(b.end.to_be_bytes());
        }
    }
    let pad = if byte(0) & 0x80 != 0 {
        options::EOL
    } else {
        options::NOP
    };
    while o.len() % 4 != 0 {
        o.push(pad);
    }
    (o, blocks)
}

fuzz_target!(|data: &[u8]| {
    let Some((&first, rest)) = data.split_first() else {
        return;
    };
    let (opts, built) = if first & 0x80 != 0 {
        let (o, blocks) = canonical(rest);
        (o, Some(blocks))
    } else {
        let len = usize::from(first) % (OPTIONS_MAX + 1);
        (rest.iter().copied().take(len).collect(), None)
    };
    let len = opts.len();
    let mut buf = [0u8; 64];
    buf[..len].copy_from_slice(&opts);

    let seen = scan(&buf, len);
    assert_eq!(
        scan(&buf[..OPTIONS_MAX], len),
        seen,
        "read beyond the options"
    );

    let w = walk(&opts);
    let count = usize::from(seen.sack_count);
    let reported = &seen.sack[..count];
    if count > 0 {
        let (blocks, end) = w.sack.as_ref().unwrap_or_else(|| {
            panic!("{opts:02x?}: blocks {reported:?} reported, none the sender reads")
        });
        assert_eq!(reported, &blocks[..], "{opts:02x?}");
        assert_eq!(seen.sack_full, end + 8 > OPTIONS_MAX, "{opts:02x?}");
        assert!(reported.iter().any(|b| b.end == seen.sack_reach));
        assert!(!seen.sack_duplicate || count > 1);
    } else {
        assert!(!seen.sack_full && !seen.sack_duplicate && seen.sack_reach == 0);
    }
    if !seen.unknown_option {
        assert!(
            !w.malformed && !w.other && w.timestamps <= 1 && w.sacks <= 1,
            "{opts:02x?} understood as {seen:?}, walked as {w:?}"
        );
        assert_eq!(count, w.sack.as_ref().map_or(0, |(b, _)| b.len()));
    }
    if let Some(blocks) = built {
        assert!(!seen.unknown_option, "{opts:02x?} not understood");
        assert_eq!(reported, &blocks[..]);
    }

    let mut state = AckState::default();
    record(&mut state, &seen, true);
    for b in reported {
        assert!(state.told(*b), "{b:?} of {seen:?}");
    }
});
