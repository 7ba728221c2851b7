//! The data path stays readable: no function in shaper-ebpf is longer than
//! [`MAX_FUNCTION_LINES`]. Its decisions are `shaper_common`'s pure functions, tested on the
//! host; what is left in BPF reads and writes the maps in named phases (docs/design.md, "The
//! scheduler's phases").

use std::{fs, path::Path};

/// The longest a function in shaper-ebpf may be, from its signature to its closing brace.
const MAX_FUNCTION_LINES: usize = 80;

/// (name, first line, line count) of every `fn` in `text`, found by matching braces outside
/// comments, strings and character literals.
fn functions(text: &str) -> Vec<(String, usize, usize)> {
    let lines: Vec<&str> = text.lines().collect();
    let mut found = Vec::new();
    let mut i = 0;
    while i < lines.len() {
        let Some(name) = fn_name(lines[i]) else {
            i += 1;
            continue;
        };
        let (mut depth, mut opened, mut j) = (0i64, false, i);
        while j < lines.len() {
            let code = code_of(lines[j]);
            depth += code.matches('{').count() as i64 - code.matches('}').count() as i64;
            opened |= code.contains('{');
            if (opened && depth <= 0) || (!opened && code.trim_end().ends_with(';')) {
                break;
            }
            j += 1;
        }
        if opened {
            found.push((name, i + 1, j - i + 1));
        }
        // Nested functions are counted within their parent.
        i = j + 1;
    }
    found
}

/// The function a line declares, if it does.
fn fn_name(line: &str) -> Option<String> {
    let code = code_of(line);
    let mut words = code.split_whitespace().peekable();
    while let Some(w) = words.next() {
        if w == "fn" {
            let name = words.next()?;
            return Some(name.split(['(', '<']).next()?.to_string());
        }
        let qualifier =
            w.starts_with("pub") || matches!(w, "const" | "unsafe" | "extern" | "async" | "\"C\"");
        if !qualifier {
            return None;
        }
    }
    None
}

/// A line without its comment, strings and character literals.
fn code_of(line: &str) -> String {
    let mut out = String::new();
    let mut chars = line.chars().peekable();
    while let Some(c) = chars.next() {
        match c {
            '/' if chars.peek() == Some(&'/') => break,
            '"' => {
                while let Some(d) = chars.next() {
                    match d {
                        '\\' => {
                            chars.next();
                        }
                        '"' => break,
                        _ => {}
                    }
                }
            }
            '\'' if matches!(chars.clone().nth(1), Some('\'')) => {
                chars.next();
                chars.next();
            }
            _ => out.push(c),
        }
    }
    out
}

#[test]
fn the_length_check_finds_functions_and_ignores_braces_in_text() {
    let src = "pub fn a() {\n    let s = \"{{\"; // }\n    let c = '{';\n}\n\n#[inline(always)]\npub(crate) unsafe fn b<T>(\n    x: T,\n) -> u8 {\n    if true { 1 } else { 2 }\n}\nfn decl();\n";
    assert_eq!(
        functions(src),
        vec![("a".to_string(), 1, 4), ("b".to_string(), 7, 5)]
    );
}

#[test]
fn no_datapath_function_is_longer_than_the_limit() {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("../shaper-ebpf/src");
    let mut long = Vec::new();
    let mut seen = 0;
    for entry in fs::read_dir(&dir).unwrap() {
        let path = entry.unwrap().path();
        if path.extension().is_none_or(|e| e != "rs") {
            continue;
        }
        let text = fs::read_to_string(&path).unwrap();
        for (name, line, count) in functions(&text) {
            seen += 1;
            if count > MAX_FUNCTION_LINES {
                long.push(format!(
                    "{}:{line} {name}: {count} lines",
                    path.file_name().unwrap().to_string_lossy()
                ));
            }
        }
    }
    assert!(
        seen > 50,
        "only {seen} functions found in {}",
        dir.display()
    );
    assert!(
        long.is_empty(),
        "functions over {MAX_FUNCTION_LINES} lines: {long:?}"
    );
}
