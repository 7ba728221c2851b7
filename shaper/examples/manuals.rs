//! Writes shaper's man pages (`man/shaper.1`, and `man/shaper-SUBCOMMAND.1` for each
//! subcommand) and shell completions (`completions/shaper.bash`, `_shaper` for zsh,
//! `shaper.fish`) into the directory given, from the command line as `shaper` parses it
//! (`shaper::cli::Cli`). `cargo xtask dist` runs it beside the binary it builds.
//!
//! An example of the library rather than part of the binary or of xtask: the shipped binary
//! carries no generators, and xtask, which installs the BPF toolchain that building the library
//! needs, must build without it.

use std::{
    io,
    path::{Path, PathBuf},
};

use clap::CommandFactory;
use clap_complete::Shell;
use shaper::cli::Cli;

fn main() -> io::Result<()> {
    let Some(dir) = std::env::args_os().nth(1).map(PathBuf::from) else {
        eprintln!("usage: manuals DIR");
        std::process::exit(2);
    };
    for path in write_all(&dir)? {
        println!("{}", path.display());
    }
    Ok(())
}

/// Writes every page and completion under `dir`, returning their paths.
fn write_all(dir: &Path) -> io::Result<Vec<PathBuf>> {
    let man = dir.join("man");
    std::fs::create_dir_all(&man)?;
    // One page per command, subcommands' named `shaper-SUBCOMMAND.1` as git's are.
    clap_mangen::generate_to(Cli::command(), &man)?;
    let mut written = Vec::new();
    for entry in std::fs::read_dir(&man)? {
        written.push(entry?.path());
    }
    written.sort();
    let completions = dir.join("completions");
    std::fs::create_dir_all(&completions)?;
    let mut cmd = Cli::command();
    let name = cmd.get_name().to_string();
    for shell in [Shell::Bash, Shell::Zsh, Shell::Fish] {
        written.push(clap_complete::generate_to(
            shell,
            &mut cmd,
            &name,
            &completions,
        )?);
    }
    Ok(written)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pages_and_completions_describe_the_real_command_line() {
        let dir = std::env::temp_dir().join(format!("shaper-manuals-{}", std::process::id()));
        let written = write_all(&dir).unwrap();
        let read = |rel: &str| std::fs::read_to_string(dir.join(rel)).unwrap();
        let names: Vec<_> = written
            .iter()
            .map(|p| p.file_name().unwrap().to_string_lossy().into_owned())
            .collect();
        for name in [
            "shaper.1",
            "shaper-run.1",
            "shaper-stats.1",
            "shaper-reset.1",
            "shaper-doctor.1",
            "shaper.bash",
            "_shaper",
            "shaper.fish",
        ] {
            assert!(names.iter().any(|n| n == name), "{name} not in {names:?}");
        }
        // roff escapes the hyphens of options: `\-\-rate`.
        let run_page = read("man/shaper-run.1");
        assert!(run_page.contains(r"\-\-rate"), "{run_page}");
        assert!(read("man/shaper.1").contains("stats"));
        assert!(read("man/shaper-stats.1").contains(r"\-\-watch"));
        let bash = read("completions/shaper.bash");
        assert!(bash.contains("--rate") && bash.contains("stats"), "{bash}");
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
