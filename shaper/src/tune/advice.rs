//! The advised settings and the plan that reaches them. Pure: every decision is a function of
//! the values the host reads now, so that `shaper doctor` (which judges them) and `shaper tune`
//! (which sets them) agree.

use std::fmt;

/// The ceiling on each socket's unsent bytes advised for servers whose latency matters: 128 KiB
/// keeps throughput while bounding how much a connection queues ahead of its newest data.
pub const NOTSENT_LOWAT_BYTES: i64 = 128 * 1024;

/// What `tcp_notsent_lowat` reads when unset (no limit): UINT_MAX, or -1 on old kernels.
pub const NOTSENT_LOWAT_UNSET: i64 = u32::MAX as i64;

/// One advised kernel setting.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum Setting {
    /// fq on every interface shaper does not shape: TCP is paced wherever it leaves.
    DefaultQdisc,
    /// BBR: it keeps the queue it builds at a bottleneck short and does not take random loss
    /// for congestion.
    CongestionControl,
    /// A bounded unsent queue per socket.
    NotsentLowat,
}

impl Setting {
    pub const ALL: [Setting; 3] = [
        Setting::DefaultQdisc,
        Setting::CongestionControl,
        Setting::NotsentLowat,
    ];

    /// Its sysctl name.
    pub fn key(self) -> &'static str {
        match self {
            Setting::DefaultQdisc => "net.core.default_qdisc",
            Setting::CongestionControl => "net.ipv4.tcp_congestion_control",
            Setting::NotsentLowat => "net.ipv4.tcp_notsent_lowat",
        }
    }

    /// The setting whose sysctl name is `key`.
    pub fn from_key(key: &str) -> Option<Setting> {
        Setting::ALL.into_iter().find(|s| s.key() == key)
    }

    /// The value `shaper tune` sets.
    pub fn advised(self) -> String {
        match self {
            Setting::DefaultQdisc => "fq".into(),
            Setting::CongestionControl => "bbr".into(),
            Setting::NotsentLowat => NOTSENT_LOWAT_BYTES.to_string(),
        }
    }

    /// Why, in a few words.
    pub fn why(self) -> &'static str {
        match self {
            Setting::DefaultQdisc => "interfaces shaper does not shape pace TCP too",
            Setting::CongestionControl => {
                "short queues at the bottleneck, and random loss is not taken for congestion"
            }
            Setting::NotsentLowat => {
                "each socket queues at most 128 KiB unsent, ahead of its newest data"
            }
        }
    }

    /// Whether `current` already meets the advice. A lower unsent ceiling than the advised one
    /// is stricter, and is kept.
    pub fn met_by(self, current: &str) -> bool {
        match self {
            Setting::DefaultQdisc => current == "fq",
            Setting::CongestionControl => current == "bbr",
            Setting::NotsentLowat => current
                .parse::<i64>()
                .is_ok_and(|v| notsent_lowat_bounded(v) && v <= NOTSENT_LOWAT_BYTES),
        }
    }
}

impl fmt::Display for Setting {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.key())
    }
}

/// Whether a `tcp_notsent_lowat` value sets a ceiling at all (unset reads as UINT_MAX or -1).
pub fn notsent_lowat_bounded(value: i64) -> bool {
    (0..NOTSENT_LOWAT_UNSET).contains(&value)
}

/// What the host reads now: each setting's value (`None` where it cannot be read here: the
/// default qdisc is global, seen only in the initial network namespace), and whether BBR can be
/// chosen (listed, or a module the kernel loads when it is chosen).
#[derive(Debug, Clone, Default)]
pub struct Current {
    pub values: Vec<(Setting, Option<String>)>,
    pub bbr_available: bool,
}

impl Current {
    fn value(&self, setting: Setting) -> Option<&str> {
        self.values
            .iter()
            .find(|(s, _)| *s == setting)
            .and_then(|(_, v)| v.as_deref())
    }
}

/// One setting's step.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Step {
    /// Already as advised.
    Keep { setting: Setting, value: String },
    /// To change from `from` to the advice.
    Change { setting: Setting, from: String },
    /// Cannot be set here; `why` says what to do instead.
    Unavailable { setting: Setting, why: String },
}

impl Step {
    pub fn setting(&self) -> Setting {
        match self {
            Step::Keep { setting, .. }
            | Step::Change { setting, .. }
            | Step::Unavailable { setting, .. } => *setting,
        }
    }
}

impl fmt::Display for Step {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Step::Keep { setting, value } => write!(f, "{setting}: {value} (as advised)"),
            Step::Change { setting, from } => write!(
                f,
                "{setting}: {from} -> {} ({})",
                setting.advised(),
                setting.why()
            ),
            Step::Unavailable { setting, why } => write!(f, "{setting}: left alone: {why}"),
        }
    }
}

/// Each advised setting's step from `current`.
pub fn plan(current: &Current) -> Vec<Step> {
    Setting::ALL
        .into_iter()
        .map(|setting| match current.value(setting) {
            None => Step::Unavailable {
                setting,
                why: match setting {
                    Setting::DefaultQdisc => {
                        "not here: it is global, set from the host's initial network namespace"
                            .into()
                    }
                    _ => "not readable here".into(),
                },
            },
            Some(value) if setting.met_by(value) => Step::Keep {
                setting,
                value: value.to_string(),
            },
            Some(_) if setting == Setting::CongestionControl && !current.bbr_available => {
                Step::Unavailable {
                    setting,
                    why: "BBR is not in this kernel (CONFIG_TCP_CONG_BBR)".into(),
                }
            }
            Some(value) => Step::Change {
                setting,
                from: value.to_string(),
            },
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn current(qdisc: Option<&str>, cc: &str, lowat: &str, bbr: bool) -> Current {
        Current {
            values: vec![
                (Setting::DefaultQdisc, qdisc.map(Into::into)),
                (Setting::CongestionControl, Some(cc.into())),
                (Setting::NotsentLowat, Some(lowat.into())),
            ],
            bbr_available: bbr,
        }
    }

    #[test]
    fn a_stock_host_changes_all_three() {
        let steps = plan(&current(Some("pfifo_fast"), "cubic", "4294967295", true));
        assert_eq!(
            steps,
            [
                Step::Change {
                    setting: Setting::DefaultQdisc,
                    from: "pfifo_fast".into()
                },
                Step::Change {
                    setting: Setting::CongestionControl,
                    from: "cubic".into()
                },
                Step::Change {
                    setting: Setting::NotsentLowat,
                    from: "4294967295".into()
                },
            ]
        );
        assert_eq!(
            steps[2].to_string(),
            "net.ipv4.tcp_notsent_lowat: 4294967295 -> 131072 (each socket queues at most 128 KiB unsent, ahead of its newest data)"
        );
    }

    #[test]
    fn a_tuned_host_keeps_everything_and_a_stricter_ceiling_stays() {
        let steps = plan(&current(Some("fq"), "bbr", "16384", true));
        assert!(
            steps.iter().all(|s| matches!(s, Step::Keep { .. })),
            "{steps:?}"
        );
        assert!(!Setting::NotsentLowat.met_by("-1"));
        assert!(!Setting::NotsentLowat.met_by("131073"));
        assert!(Setting::NotsentLowat.met_by("131072"));
        assert!(!Setting::NotsentLowat.met_by("lots"));
    }

    #[test]
    fn what_cannot_be_set_here_is_left_alone_with_the_reason() {
        let steps = plan(&current(None, "cubic", "131072", false));
        assert!(
            matches!(&steps[0], Step::Unavailable { why, .. } if why.contains("initial network namespace"))
        );
        assert!(
            matches!(&steps[1], Step::Unavailable { why, .. } if why.contains("CONFIG_TCP_CONG_BBR"))
        );
        assert!(matches!(steps[2], Step::Keep { .. }));
        // BBR already chosen needs no module.
        assert!(matches!(
            plan(&current(None, "bbr", "1", false))[1],
            Step::Keep { .. }
        ));
    }

    #[test]
    fn keys_name_their_settings() {
        for s in Setting::ALL {
            assert_eq!(Setting::from_key(s.key()), Some(s));
        }
        assert_eq!(Setting::from_key("net.core.rmem_max"), None);
    }
}
