//! Kernel pieces found by creating them where nothing can notice: in a network namespace made
//! for the purpose by a thread of its own (a namespace belongs to a thread, not the process),
//! with its loopback device as the interface. The namespace, and all that was created in it,
//! goes when the thread ends. The kernel knows a qdisc, classifier, action or device kind
//! exactly when it creates one, which module lists cannot always say (a kernel without
//! modules has none).

use super::facts::{Feature, ProbeOutcome};
use crate::{
    config::defaults,
    filter::{self, Filter, Hook},
    link::{Interface, LinkError},
    netlink::{NetlinkError, Socket},
    qdisc::{self, FqParams, QdiscError},
};

/// fq as shaper installs it with its default settings (its horizon a second beyond the data
/// path's 2 s).
const FQ: FqParams = FqParams {
    limit_packets: defaults::FQ_LIMIT_PACKETS,
    flow_limit_packets: defaults::FQ_FLOW_LIMIT_PACKETS,
    horizon_us: 3_000_000,
};

/// Each feature's outcome, in [`Feature::ALL`]'s order; those in `skip` are not tried (a
/// module not loaded, which trying would load).
pub fn probe(skip: &[Feature]) -> Vec<(Feature, ProbeOutcome)> {
    let skip = skip.to_vec();
    std::thread::spawn(move || in_new_namespace(&skip))
        .join()
        .unwrap_or_else(|_| {
            Feature::ALL
                .iter()
                .map(|&f| {
                    (
                        f,
                        ProbeOutcome::Failed("the probe's thread panicked".into()),
                    )
                })
                .collect()
        })
}

fn in_new_namespace(skip: &[Feature]) -> Vec<(Feature, ProbeOutcome)> {
    let mut probes = Probes::default();
    // SAFETY: unshare(2) with a flag; it moves this thread alone, which ends with the probe.
    let mut setup = if unsafe { libc::unshare(libc::CLONE_NEWNET) } != 0 {
        Err(format!(
            "creating a network namespace: {}",
            std::io::Error::last_os_error()
        ))
    } else {
        Socket::open().map_err(|e| e.to_string()).and_then(|sock| {
            let lo = Interface::lookup("lo").map_err(|e| e.to_string())?;
            Ok((sock, lo))
        })
    };
    let mut outcomes = Vec::new();
    for &f in &Feature::ALL {
        let outcome = match &mut setup {
            _ if skip.contains(&f) => ProbeOutcome::Skipped,
            Ok((sock, lo)) => probes.try_one(f, sock, lo),
            Err(e) => ProbeOutcome::Failed(e.clone()),
        };
        outcomes.push((f, outcome));
    }
    outcomes
}

/// What earlier probes left that later ones build on.
#[derive(Default)]
struct Probes {
    clsact: bool,
    ifb: Option<u32>,
}

impl Probes {
    fn try_one(&mut self, feature: Feature, sock: &mut Socket, lo: &Interface) -> ProbeOutcome {
        let kind_missing = |e: NetlinkError, errno| {
            if e.errno() == Some(errno) {
                ProbeOutcome::Missing
            } else {
                ProbeOutcome::Failed(e.to_string())
            }
        };
        match feature {
            Feature::Fq => match qdisc::install(sock, lo.ifindex, &lo.name, 1, &FQ) {
                Ok(()) => ProbeOutcome::Works,
                Err(QdiscError::NoFq) => ProbeOutcome::Missing,
                Err(e) => ProbeOutcome::Failed(e.to_string()),
            },
            Feature::Clsact => match qdisc::add_clsact(sock, lo.ifindex) {
                Ok(()) => {
                    self.clsact = true;
                    ProbeOutcome::Works
                }
                Err(e) => kind_missing(e, libc::ENOENT),
            },
            Feature::ClsBpf | Feature::Matchall => {
                if !self.clsact {
                    return ProbeOutcome::Failed("not probed: it needs clsact".into());
                }
                let filter = Filter {
                    ifindex: lo.ifindex,
                    hook: Hook::Ingress,
                    kind: if feature == Feature::ClsBpf {
                        "bpf"
                    } else {
                        "matchall"
                    },
                };
                match filter.kind_known(sock) {
                    Ok(true) => ProbeOutcome::Works,
                    Ok(false) => ProbeOutcome::Missing,
                    Err(e) => ProbeOutcome::Failed(e.to_string()),
                }
            }
            Feature::Ifb => match Interface::create_ifb(sock, "ifb-probe", 1_500, 1, None) {
                Ok(ifb) => {
                    self.ifb = Some(ifb.ifindex);
                    ProbeOutcome::Works
                }
                // rtnetlink's answer for an unknown device kind.
                Err(LinkError::Netlink { source, .. }) => kind_missing(source, libc::EOPNOTSUPP),
                Err(e) => ProbeOutcome::Failed(e.to_string()),
            },
            Feature::Mirred => {
                match filter::add_standalone_redirect(sock, self.ifb.unwrap_or(lo.ifindex)) {
                    Ok(()) => ProbeOutcome::Works,
                    Err(e) => kind_missing(e, libc::ENOENT),
                }
            }
        }
    }
}
