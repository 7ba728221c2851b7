//! Refreshing a report (`shaper stats --watch`): in place on a terminal, each report drawn
//! over the last from the top left corner; anywhere else (a pipe, a file, a log) as a stream of
//! whole reports, one after another, separated by a blank line, so that nothing is overwritten.

use std::{io::Write, time::Duration};

/// Move the cursor home, clear from the cursor to the end of the line, to the end of the screen,
/// and the whole screen (ECMA-48).
const HOME: &str = "\x1b[H";
const CLEAR_LINE_END: &str = "\x1b[K";
const CLEAR_SCREEN_END: &str = "\x1b[J";
const CLEAR_SCREEN: &str = "\x1b[2J";

/// How a report is shown on each refresh.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Display {
    /// Drawn over the previous report, line by line, each line cleared to its end (no flicker
    /// of a full clear), and what the previous report had below this one cleared.
    InPlace,
    /// Appended after the previous report and a blank line.
    Stream,
}

/// What to write for the `index`th report (from 0).
pub fn frame(display: Display, index: u64, report: &str) -> String {
    match display {
        Display::Stream if index == 0 => report.to_string(),
        Display::Stream => format!("\n{report}"),
        Display::InPlace => {
            let mut out = String::from(if index == 0 { CLEAR_SCREEN } else { "" });
            out.push_str(HOME);
            for line in report.lines() {
                out.push_str(line);
                out.push_str(CLEAR_LINE_END);
                out.push('\n');
            }
            out.push_str(CLEAR_SCREEN_END);
            out
        }
    }
}

/// Writes `report()` every `interval` (`pause` waits) until a report fails, and ends with that
/// report's error: a watch has no end of its own (an interrupt ends the process).
pub fn run(
    mut report: impl FnMut() -> anyhow::Result<String>,
    out: &mut impl Write,
    display: Display,
    interval: Duration,
    mut pause: impl FnMut(Duration),
) -> anyhow::Result<()> {
    let mut index = 0;
    loop {
        let text = report()?;
        out.write_all(frame(display, index, &text).as_bytes())?;
        out.flush()?;
        index += 1;
        pause(interval);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_stream_separates_whole_reports_by_a_blank_line_and_ends_with_the_error() {
        let mut reports = ["a: 1\n", "a: 2\n"].into_iter();
        let mut out = Vec::new();
        let mut pauses = Vec::new();
        let err = run(
            || {
                reports
                    .next()
                    .map(String::from)
                    .ok_or_else(|| anyhow::anyhow!("gone"))
            },
            &mut out,
            Display::Stream,
            Duration::from_secs(2),
            |d| pauses.push(d),
        )
        .unwrap_err();
        assert_eq!(err.to_string(), "gone");
        assert_eq!(String::from_utf8(out).unwrap(), "a: 1\n\na: 2\n");
        assert_eq!(pauses, [Duration::from_secs(2); 2]);
    }

    #[test]
    fn in_place_the_first_frame_clears_the_screen_and_each_redraws_from_home() {
        let first = frame(Display::InPlace, 0, "a\nb\n");
        assert_eq!(first, "\x1b[2J\x1b[Ha\x1b[K\nb\x1b[K\n\x1b[J");
        let next = frame(Display::InPlace, 1, "c\n");
        assert_eq!(next, "\x1b[Hc\x1b[K\n\x1b[J");
    }
}
