//! Which interfaces one `shaper run` shapes, with which settings: a pure decision, from the
//! command line, the config file and what the system has (its interfaces, its default routes).
//!
//! - Without `[[interface]]` sections, one interface: the command line's or the file's `iface`,
//!   as always.
//! - With them, each section names its interface by `iface`: an exact name, a glob (`*`, `?`,
//!   `[abc]`), or `default-route` (the devices of the IPv4 and IPv6 default routes). An
//!   interface takes the first section (in file order) that names it. Its settings are the
//!   command line's, over the section's, over the file's top level, over the built-in defaults.
//!   A glob never matches the loopback device nor an IFB (shaper's own ingress devices are IFBs).
//! - The settings of the process (`metrics`, `metrics-top-hosts`) are the top level's only; a
//!   section giving one is an error, and so is `--iface` (or a top-level `iface`) beside
//!   sections.
//! - Every section is validated when the file is read, so that a bad value is refused before
//!   anything is touched, naming the file, the line and the field.

use std::{
    collections::{BTreeMap, BTreeSet},
    fmt,
    net::SocketAddr,
    path::{Path, PathBuf},
};

use crate::config::{self, ConfigError, Options, Settings};

/// The name that makes a section follow the default route.
pub const DEFAULT_ROUTE: &str = "default-route";

/// How a section names its interface.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Selector {
    Exact(String),
    Glob(String),
    DefaultRoute,
}

impl Selector {
    pub fn parse(text: &str) -> Self {
        if text == DEFAULT_ROUTE {
            Self::DefaultRoute
        } else if text.contains(['*', '?', '[']) {
            Self::Glob(text.to_string())
        } else {
            Self::Exact(text.to_string())
        }
    }

    /// Whether `link` is named by this selector, `default_route` being the default routes'
    /// devices now.
    pub fn matches(&self, link: &Link, default_route: &BTreeSet<String>) -> bool {
        match self {
            Self::Exact(name) => *name == link.name,
            Self::Glob(pattern) => !link.is_own_kind() && glob_match(pattern, &link.name),
            Self::DefaultRoute => default_route.contains(&link.name),
        }
    }
}

impl fmt::Display for Selector {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Exact(s) | Self::Glob(s) => f.write_str(s),
            Self::DefaultRoute => f.write_str(DEFAULT_ROUTE),
        }
    }
}

/// An interface present on the system.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Link {
    pub name: String,
    pub ifindex: u32,
    /// Its `IFLA_INFO_KIND` (`veth`, `ifb`, ...); `None` for a plain device or loopback.
    pub kind: Option<String>,
}

impl Link {
    /// Loopback and IFBs, which no glob matches.
    fn is_own_kind(&self) -> bool {
        self.name == "lo" || self.kind.as_deref() == Some("ifb")
    }
}

/// Shell-style matching of a whole name: `*` any run, `?` any one character, `[abc]` / `[a-z]`
/// / `[!abc]` one of a set.
pub fn glob_match(pattern: &str, name: &str) -> bool {
    fn class(set: &[char], c: char) -> (bool, usize) {
        // `set` starts after '['; returns whether `c` is in it and the length through ']'.
        let (negated, start) = match set.first() {
            Some('!') | Some('^') => (true, 1),
            _ => (false, 0),
        };
        let mut i = start;
        let mut found = false;
        while i < set.len() && (set[i] != ']' || i == start) {
            if i + 2 < set.len() && set[i + 1] == '-' && set[i + 2] != ']' {
                found |= (set[i]..=set[i + 2]).contains(&c);
                i += 3;
            } else {
                found |= set[i] == c;
                i += 1;
            }
        }
        (found != negated, i + 1)
    }
    fn go(p: &[char], n: &[char]) -> bool {
        match p.first() {
            None => n.is_empty(),
            Some('*') => (0..=n.len()).any(|skip| go(&p[1..], &n[skip..])),
            Some('?') => !n.is_empty() && go(&p[1..], &n[1..]),
            Some('[') if p[1..].contains(&']') => {
                let Some(&c) = n.first() else { return false };
                let (hit, len) = class(&p[1..], c);
                hit && go(&p[1 + len.min(p.len() - 1)..], &n[1..])
            }
            Some(&c) => n.first() == Some(&c) && go(&p[1..], &n[1..]),
        }
    }
    let p: Vec<char> = pattern.chars().collect();
    let n: Vec<char> = name.chars().collect();
    go(&p, &n)
}

/// One `[[interface]]` section.
#[derive(Debug, Clone)]
pub struct Section {
    pub selector: Selector,
    /// Its settings, `iface` included.
    options: Options,
}

/// What the process settles once: where its metrics are served.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Process {
    pub metrics: Option<SocketAddr>,
    pub metrics_top_hosts: u32,
}

/// A config file's error, with where it is.
#[derive(Debug, thiserror::Error)]
#[error("config file {path}{}{}: {source}",
    line.map(|l| format!(", line {l}")).unwrap_or_default(),
    field.as_ref().map(|f| format!(", `{f}`")).unwrap_or_default())]
pub struct FileError {
    pub path: String,
    pub line: Option<usize>,
    pub field: Option<String>,
    pub source: ConfigError,
}

#[derive(Debug, thiserror::Error)]
pub enum PlanError {
    #[error(transparent)]
    Config(#[from] ConfigError),
    #[error(transparent)]
    File(#[from] FileError),
}

/// The interfaces a run shapes and the layers their settings come from.
#[derive(Debug, Clone)]
pub struct Plan {
    command_line: Options,
    path: Option<PathBuf>,
    /// The file's top level (without its sections); all of it without sections.
    top: Options,
    /// Empty: one interface, named by the command line or the top level.
    sections: Vec<Section>,
    process: Process,
}

impl Plan {
    /// Reads the config file at `path` (if any) and validates every section, as `shaper run`
    /// does before touching anything.
    pub fn load(command_line: Options, path: Option<&Path>) -> Result<Self, PlanError> {
        let (text, file) = match path {
            Some(path) => config::read_file(path)?,
            None => (String::new(), Options::default()),
        };
        Self::from_file(command_line, path, &text, file)
    }

    /// [`Plan::load`] with the file already read: its `text` (to name lines) and `file`.
    pub fn from_file(
        command_line: Options,
        path: Option<&Path>,
        text: &str,
        mut file: Options,
    ) -> Result<Self, PlanError> {
        let path_text = path.map(|p| p.display().to_string()).unwrap_or_default();
        let at = |section: Option<usize>, field: Option<&str>, source: ConfigError| FileError {
            path: path_text.clone(),
            line: field.and_then(|f| locate(text, section, f)),
            field: field.map(str::to_string),
            source,
        };
        let sections = file.interface.take().unwrap_or_default();
        if sections.is_empty() {
            // One interface, as ever; validated whole (its name included).
            let settings = Settings::resolve_with(command_line.clone(), file.clone())?;
            return Ok(Self {
                command_line,
                path: path.map(Path::to_path_buf),
                top: file,
                sections: Vec::new(),
                process: Process {
                    metrics: settings.metrics,
                    metrics_top_hosts: settings.metrics_top_hosts,
                },
            });
        }
        if command_line.iface.is_some() {
            return Err(at(None, None, ConfigError::IfaceBesideSections).into());
        }
        if file.iface.is_some() {
            return Err(at(None, Some("iface"), ConfigError::IfaceBesideSections).into());
        }
        let mut process = None;
        let mut parsed = Vec::with_capacity(sections.len());
        for (i, options) in sections.into_iter().enumerate() {
            let own = |field: &'static str, given: bool| {
                if given {
                    Err(at(Some(i), Some(field), ConfigError::ProcessWide(field)))
                } else {
                    Ok(())
                }
            };
            own("metrics", options.metrics.is_some())?;
            own("metrics-top-hosts", options.metrics_top_hosts.is_some())?;
            own("interface", options.interface.is_some())?;
            let Some(iface) = options.iface.clone() else {
                return Err(at(Some(i), None, ConfigError::SectionWithoutIface(i + 1)).into());
            };
            let selector = Selector::parse(&iface);
            // Validated as the interface it will shape would be (the name changes nothing).
            let given = command_line.clone().over(options.clone());
            let settings = Settings::resolve_with(given, file.clone()).map_err(|e| {
                let field = e.field();
                // A value the section does not give is the top level's.
                let section = field.and_then(|f| locate(text, Some(i), f).map(|_| i));
                at(section, field, e)
            })?;
            process.get_or_insert(Process {
                metrics: settings.metrics,
                metrics_top_hosts: settings.metrics_top_hosts,
            });
            parsed.push(Section { selector, options });
        }
        Ok(Self {
            command_line,
            path: path.map(Path::to_path_buf),
            top: file,
            sections: parsed,
            process: process.expect("at least one section"),
        })
    }

    /// With `[[interface]]` sections: the interfaces come and go with the system.
    pub fn has_sections(&self) -> bool {
        !self.sections.is_empty()
    }

    pub fn process(&self) -> Process {
        self.process
    }

    pub fn command_line(&self) -> &Options {
        &self.command_line
    }

    pub fn path(&self) -> Option<&Path> {
        self.path.as_deref()
    }

    /// The one interface of a plan without sections.
    pub fn single_iface(&self) -> Option<String> {
        if self.has_sections() {
            return None;
        }
        self.command_line.iface.clone().or(self.top.iface.clone())
    }

    /// The interfaces to shape among `links`, each with its file layer (its section over the
    /// top level, `iface` its name): what `live::source::Source` resolves under the command
    /// line. Without sections, the one interface if it is present.
    pub fn wanted(
        &self,
        links: &[Link],
        default_route: &BTreeSet<String>,
    ) -> BTreeMap<String, Options> {
        let mut wanted = BTreeMap::new();
        if !self.has_sections() {
            if let Some(name) = self.single_iface()
                && links.iter().any(|l| l.name == name)
            {
                wanted.insert(name, self.top.clone());
            }
            return wanted;
        }
        for link in links {
            if let Some(section) = self
                .sections
                .iter()
                .find(|s| s.selector.matches(link, default_route))
            {
                let mut layer = section.options.clone().over(self.top.clone());
                layer.iface = Some(link.name.clone());
                wanted.insert(link.name.clone(), layer);
            }
        }
        wanted
    }

    /// Whether some section follows the default route (so routes are worth reading).
    pub fn follows_default_route(&self) -> bool {
        self.sections
            .iter()
            .any(|s| s.selector == Selector::DefaultRoute)
    }
}

/// The line (from 1) of `key = ...` in the file's top level (`section` `None`) or its
/// `section`th `[[interface]]` (tables under either included, e.g. `[interface.fq]`).
pub fn locate(text: &str, section: Option<usize>, key: &str) -> Option<usize> {
    let mut current: Option<usize> = None;
    let mut sections_seen = 0;
    for (n, line) in text.lines().enumerate() {
        let line = line.trim();
        if line.starts_with("[[") {
            let name = line.trim_start_matches('[').trim_end_matches(']').trim();
            current = (name == "interface").then(|| {
                sections_seen += 1;
                sections_seen - 1
            });
            continue;
        }
        if line.starts_with('[') {
            let name = line.trim_start_matches('[').trim_end_matches(']').trim();
            if !name.starts_with("interface.") {
                current = None;
            }
            continue;
        }
        if current != section {
            continue;
        }
        if let Some(rest) = line.strip_prefix(key)
            && rest.trim_start().starts_with('=')
        {
            return Some(n + 1);
        }
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;

    fn link(name: &str, ifindex: u32, kind: Option<&str>) -> Link {
        Link {
            name: name.into(),
            ifindex,
            kind: kind.map(Into::into),
        }
    }

    fn plan(text: &str) -> Result<Plan, PlanError> {
        let file = Options::from_toml(text).unwrap();
        Plan::from_file(
            Options::default(),
            Some(Path::new("/etc/shaper.toml")),
            text,
            file,
        )
    }

    #[test]
    fn globs() {
        for (p, n, m) in [
            ("eth*", "eth0", true),
            ("eth*", "eth", true),
            ("eth*", "veth0", false),
            ("*0", "wg0", true),
            ("s?", "s1", true),
            ("s?", "s10", false),
            ("s[0-2]", "s2", true),
            ("s[0-2]", "s3", false),
            ("s[!0]", "s0", false),
            ("s[!0]", "s7", true),
            ("wg[ab]x", "wgbx", true),
            ("a*b*c", "aXbYc", true),
            ("a*b*c", "aXbY", false),
        ] {
            assert_eq!(glob_match(p, n), m, "{p} {n}");
        }
    }

    #[test]
    fn sections_over_the_top_level_first_match_wins_and_globs_skip_lo_and_ifbs() {
        let p = plan(
            r#"
rtt = "metro"
diffserv = "diffserv4"

[[interface]]
iface = "s0"
rate = "8mbit"
rtt = "lan"

[[interface]]
iface = "default-route"
rate = "12mbit"

[[interface]]
iface = "*"
rate = "16mbit"
isolation = "flows"
"#,
        )
        .unwrap();
        assert!(p.has_sections() && p.follows_default_route());
        let links = [
            link("lo", 1, None),
            link("s0", 2, Some("veth")),
            link("s1", 3, Some("veth")),
            link("s2", 4, Some("veth")),
            link("ifb4s0", 5, Some("ifb")),
        ];
        let routes = BTreeSet::from(["s1".to_string()]);
        let wanted = p.wanted(&links, &routes);
        assert_eq!(
            wanted.keys().collect::<Vec<_>>(),
            ["s0", "s1", "s2"],
            "lo and the IFB are not matched by *"
        );
        let settings =
            |name: &str| Settings::resolve_with(Options::default(), wanted[name].clone()).unwrap();
        let (s0, s1, s2) = (settings("s0"), settings("s1"), settings("s2"));
        assert_eq!(
            (s0.iface.as_str(), s0.rate_bps, s0.rtt_ns),
            ("s0", 8_000_000, 1_000_000)
        );
        assert_eq!((s1.rate_bps, s1.rtt_ns), (12_000_000, 10_000_000));
        assert_eq!(s2.rate_bps, 16_000_000);
        assert_eq!(s2.isolation.name(), "flows");
        assert!(
            [&s0, &s1, &s2]
                .iter()
                .all(|s| s.diffserv.name() == "diffserv4")
        );
        // The default route moved: s1 is now the glob's.
        let wanted = p.wanted(&links, &BTreeSet::from(["s2".to_string()]));
        assert_eq!(wanted["s1"].rate.as_deref(), Some("16mbit"));
        assert_eq!(wanted["s2"].rate.as_deref(), Some("12mbit"));
        // An interface not present is not wanted.
        assert!(!p.wanted(&links[..2], &routes).contains_key("s2"));
    }

    #[test]
    fn the_command_line_wins_over_every_section() {
        let text = "[[interface]]\niface = \"a\"\nrate = \"1mbit\"\n[[interface]]\niface = \"b\"\nrate = \"2mbit\"\n";
        let cli = Options {
            rtt: Some("lan".into()),
            ..Default::default()
        };
        let p =
            Plan::from_file(cli.clone(), None, text, Options::from_toml(text).unwrap()).unwrap();
        let wanted = p.wanted(&[link("a", 1, None), link("b", 2, None)], &BTreeSet::new());
        for layer in wanted.into_values() {
            assert_eq!(
                Settings::resolve_with(cli.clone(), layer).unwrap().rtt_ns,
                1_000_000
            );
        }
        let with_iface = Options {
            iface: Some("a".into()),
            ..Default::default()
        };
        let e = Plan::from_file(with_iface, None, text, Options::from_toml(text).unwrap())
            .unwrap_err()
            .to_string();
        assert!(e.contains("[[interface]]"), "{e}");
    }

    #[test]
    fn without_sections_one_interface_as_ever() {
        let p = plan("iface = \"eth0\"\nrate = \"1gbit\"\nmetrics = \"9101\"").unwrap();
        assert!(!p.has_sections());
        assert_eq!(p.single_iface().as_deref(), Some("eth0"));
        assert_eq!(p.process().metrics, Some("127.0.0.1:9101".parse().unwrap()));
        let wanted = p.wanted(
            &[link("eth0", 2, None), link("eth1", 3, None)],
            &BTreeSet::new(),
        );
        assert_eq!(wanted.keys().collect::<Vec<_>>(), ["eth0"]);
        assert!(
            p.wanted(&[link("eth1", 3, None)], &BTreeSet::new())
                .is_empty()
        );
    }

    #[test]
    fn bad_values_name_the_file_the_line_and_the_field() {
        let e = plan("rate = \"1mbit\"\n\n[[interface]]\niface = \"a\"\n\n[[interface]]\niface = \"b\"\nrtt = \"warp\"\n")
            .unwrap_err()
            .to_string();
        assert!(
            e.contains("/etc/shaper.toml, line 8, `rtt`") && e.contains("invalid rtt \"warp\""),
            "{e}"
        );
        // A bad top-level value, found while validating a section, is named where it is.
        let e = plan("rate = \"fast\"\n[[interface]]\niface = \"a\"\n")
            .unwrap_err()
            .to_string();
        assert!(e.contains("line 1, `rate`"), "{e}");
        let e = plan("[[interface]]\niface = \"a\"\nrate = \"1mbit\"\n[interface.fq]\nlimit = 0\n")
            .unwrap_err()
            .to_string();
        assert!(e.contains("line 5, `limit`"), "{e}");
        let e = plan("[[interface]]\niface = \"a\"\nrate = \"1mbit\"\nmetrics = \"9101\"\n")
            .unwrap_err()
            .to_string();
        assert!(
            e.contains("line 4, `metrics`") && e.contains("process"),
            "{e}"
        );
        let e = plan("rate = \"1mbit\"\n[[interface]]\nrtt = \"lan\"\n")
            .unwrap_err()
            .to_string();
        assert!(e.contains("section 1") && e.contains("iface"), "{e}");
        let e = plan("iface = \"x\"\n[[interface]]\niface = \"a\"\nrate = \"1mbit\"\n")
            .unwrap_err()
            .to_string();
        assert!(e.contains("line 1, `iface`"), "{e}");
        let e = plan("[[interface]]\niface = \"a\"\n")
            .unwrap_err()
            .to_string();
        assert!(e.contains("no rate given"), "{e}");
    }

    #[test]
    fn unknown_fields_in_a_section_are_named_with_their_line() {
        let text = "rate = \"1mbit\"\n[[interface]]\niface = \"a\"\nrat = \"2mbit\"\n";
        let e = Options::from_toml(text).unwrap_err().to_string();
        assert!(
            e.contains("line 4") && e.contains("unknown field `rat`"),
            "{e}"
        );
    }
}
