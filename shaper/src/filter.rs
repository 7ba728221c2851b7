//! The tc filters shaper adds by netlink itself, beside the programs aya attaches: the ingress
//! redirect to the IFB (`matchall` + `mirred`) and the segmenter's (a classifier program that
//! is not direct-action, + `mirred`). Each sits at the lowest priority of its clsact hook, so
//! shaper's programs and anyone else's filters see a packet first.

use std::os::fd::{AsRawFd, BorrowedFd};

use crate::{
    netlink::{
        Attrs, NLM_F_CREATE, NLM_F_EXCL, NetlinkError, RTM_DELTFILTER, RTM_GETTFILTER,
        RTM_NEWACTION, RTM_NEWTFILTER, Socket, TCA_KIND, TCA_OPTIONS, parse_attrs,
    },
    qdisc,
};

/// The last priority consulted.
pub const LAST_PRIORITY: u32 = 0xFFFF;
const ETH_P_ALL: u16 = 0x0003;
/// clsact's hooks (TC_H_MAKE(TC_H_CLSACT, TC_H_MIN_INGRESS / TC_H_MIN_EGRESS)).
const CLSACT_INGRESS: u32 = 0xFFFF_FFF2;
const CLSACT_EGRESS: u32 = 0xFFFF_FFF3;
const TCA_MATCHALL_ACTIONS: u16 = 2;
const TCA_BPF_ACT: u16 = 1;
const TCA_BPF_FD: u16 = 6;
const TCA_BPF_NAME: u16 = 7;
const TCA_BPF_FLAGS: u16 = 8;
const TCA_BPF_ID: u16 = 11;
const TCA_ACT_TAB: u16 = 1;
const TCA_ACT_KIND: u16 = 1;
const TCA_ACT_OPTIONS: u16 = 2;
const TCA_MIRRED_PARMS: u16 = 2;
const TCA_EGRESS_REDIR: i32 = 1;
const TC_ACT_STOLEN: i32 = 4;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Hook {
    Ingress,
    Egress,
}

/// A filter of one kind at the last priority of an interface's clsact hook.
#[derive(Debug, Clone, Copy)]
pub struct Filter {
    pub ifindex: u32,
    pub hook: Hook,
    pub kind: &'static str,
}

/// What a filter matches: everything, or what a classifier program says.
pub enum Matcher<'a> {
    All,
    /// A program in classid mode (returns -1 to match, 0 not to), named for `tc filter show`.
    Program {
        fd: BorrowedFd<'a>,
        name: &'a str,
    },
}

impl Matcher<'_> {
    fn kind(&self) -> &'static str {
        match self {
            Self::All => "matchall",
            Self::Program { .. } => "bpf",
        }
    }
}

impl Filter {
    fn tcmsg(&self) -> Vec<u8> {
        self.tcmsg_handle(0)
    }

    fn tcmsg_handle(&self, handle: u32) -> Vec<u8> {
        let info = (LAST_PRIORITY << 16) | u32::from(ETH_P_ALL.to_be());
        qdisc::tcmsg_info(self.ifindex, handle, parent(self.hook), info)
    }

    /// `tc filter add dev IF {ingress|egress} prio P {matchall | bpf obj ...} action mirred
    /// egress redirect dev TO`: what matches leaves by `to_ifindex`'s transmit path.
    pub fn add_redirect(
        &self,
        sock: &mut Socket,
        matcher: Matcher,
        to_ifindex: u32,
    ) -> Result<(), NetlinkError> {
        self.put_redirect(sock, matcher, to_ifindex, None)
    }

    /// [`Filter::add_redirect`] in place of the filter of this kind that is there (`tc filter
    /// change ... handle H`): the kernel swaps the two at once, so every packet meets one or
    /// the other. Adds it when there is none.
    pub fn replace_redirect(
        &self,
        sock: &mut Socket,
        matcher: Matcher,
        to_ifindex: u32,
    ) -> Result<(), NetlinkError> {
        let handle = list(sock, self.ifindex, self.hook)?
            .into_iter()
            // The kernel lists the priority's head too, with handle 0.
            .find(|f| f.priority == LAST_PRIORITY && f.kind == self.kind && f.handle != 0)
            .map(|f| f.handle);
        self.put_redirect(sock, matcher, to_ifindex, handle)
    }

    /// Adds the redirect, or with `replacing` changes the filter of that handle.
    fn put_redirect(
        &self,
        sock: &mut Socket,
        matcher: Matcher,
        to_ifindex: u32,
        replacing: Option<u32>,
    ) -> Result<(), NetlinkError> {
        debug_assert_eq!(matcher.kind(), self.kind);
        let actions = mirred_redirect(to_ifindex);
        let mut options = Attrs::default();
        match matcher {
            Matcher::All => {
                options.put(TCA_MATCHALL_ACTIONS, &actions.0);
            }
            Matcher::Program { fd, name } => {
                options
                    .put(TCA_BPF_ACT, &actions.0)
                    .put_u32(TCA_BPF_FD, fd.as_raw_fd() as u32)
                    .put_str(TCA_BPF_NAME, name)
                    // Not TCA_BPF_FLAG_ACT_DIRECT: the program's verdict is a class, the
                    // actions run on a match.
                    .put_u32(TCA_BPF_FLAGS, 0);
            }
        }
        let mut attrs = Attrs::default();
        attrs
            .put_str(TCA_KIND, self.kind)
            .put(TCA_OPTIONS, &options.0);
        let (mut body, flags) = match replacing {
            // Without NLM_F_EXCL an existing handle is changed, not refused.
            Some(handle) => (self.tcmsg_handle(handle), 0),
            None => (self.tcmsg(), NLM_F_CREATE | NLM_F_EXCL),
        };
        body.extend_from_slice(&attrs.0);
        sock.request(RTM_NEWTFILTER, flags, &body).map(drop)
    }

    /// Removes the filter, or with `clsact_added` the clsact qdisc its owner added for it (and
    /// the filter with it). One that is not there (never added, or already gone) is no error.
    pub fn remove(&self, sock: &mut Socket, clsact_added: bool) -> Result<(), NetlinkError> {
        let removed = if clsact_added {
            qdisc::delete_clsact(sock, self.ifindex)
        } else {
            self.delete(sock)
        };
        match removed {
            Err(e) if e.errno() == Some(libc::ENOENT) => Ok(()),
            other => other,
        }
    }

    fn delete(&self, sock: &mut Socket) -> Result<(), NetlinkError> {
        let mut attrs = Attrs::default();
        attrs.put_str(TCA_KIND, self.kind);
        let mut body = self.tcmsg();
        body.extend_from_slice(&attrs.0);
        sock.request(RTM_DELTFILTER, 0, &body).map(drop)
    }
}

/// A filter as the kernel lists it on a clsact hook.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Listed {
    pub priority: u32,
    pub handle: u32,
    pub kind: String,
    /// The program of a `bpf` filter.
    pub program_id: Option<u32>,
}

/// clsact's `hook`, as a filter's parent.
fn parent(hook: Hook) -> u32 {
    match hook {
        Hook::Ingress => CLSACT_INGRESS,
        Hook::Egress => CLSACT_EGRESS,
    }
}

/// The filters on `ifindex`'s clsact `hook`; none when there is no clsact.
pub fn list(sock: &mut Socket, ifindex: u32, hook: Hook) -> Result<Vec<Listed>, NetlinkError> {
    let parent = parent(hook);
    let replies = match sock.dump(RTM_GETTFILTER, &qdisc::tcmsg_info(ifindex, 0, parent, 0)) {
        Ok(r) => r,
        // No clsact (or no device): no filters there.
        Err(e) if matches!(e.errno(), Some(libc::EINVAL | libc::ENOENT)) => return Ok(Vec::new()),
        Err(e) => return Err(e),
    };
    let mut out = Vec::new();
    for reply in replies.iter().filter(|r| r.len() >= 20) {
        let field = |at: usize| u32::from_ne_bytes(reply[at..at + 4].try_into().unwrap());
        if field(4) != ifindex || field(12) != parent {
            continue;
        }
        let mut listed = Listed {
            priority: field(16) >> 16,
            handle: field(8),
            kind: String::new(),
            program_id: None,
        };
        for (kind, _, value) in parse_attrs(&reply[20..]) {
            match kind {
                TCA_KIND => {
                    listed.kind = String::from_utf8_lossy(value).trim_end_matches('\0').into()
                }
                TCA_OPTIONS => {
                    listed.program_id = parse_attrs(value)
                        .find(|(k, _, v)| *k == TCA_BPF_ID && v.len() == 4)
                        .map(|(_, _, v)| u32::from_ne_bytes(v.try_into().unwrap()));
                }
                _ => {}
            }
        }
        // The kernel lists a filter chain's head (no kind) before its filters.
        if !listed.kind.is_empty() {
            out.push(listed);
        }
    }
    Ok(out)
}

impl Filter {
    /// Whether the kernel has this filter's kind (classifier): asks for one without options,
    /// which the kernel refuses after finding the kind (EINVAL) or for want of it (ENOENT).
    /// Needs the hook's clsact. `bpf` and `matchall` refuse a filter without options, so
    /// nothing is added.
    pub fn kind_known(&self, sock: &mut Socket) -> Result<bool, NetlinkError> {
        let mut attrs = Attrs::default();
        attrs.put_str(TCA_KIND, self.kind);
        let mut body = self.tcmsg();
        body.extend_from_slice(&attrs.0);
        match sock.request(RTM_NEWTFILTER, NLM_F_CREATE | NLM_F_EXCL, &body) {
            Ok(_) => Ok(true),
            Err(e) if e.errno() == Some(libc::EINVAL) => Ok(true),
            Err(e) if e.errno() == Some(libc::ENOENT) => Ok(false),
            Err(e) => Err(e),
        }
    }

    /// Whether this filter is on its hook (with `program_id`, running that program).
    pub fn is_present(
        &self,
        sock: &mut Socket,
        program_id: Option<u32>,
    ) -> Result<bool, NetlinkError> {
        Ok(list(sock, self.ifindex, self.hook)?.iter().any(|f| {
            f.priority == LAST_PRIORITY
                && f.kind == self.kind
                && (program_id.is_none() || f.program_id == program_id)
        }))
    }
}

/// Adds a `mirred` redirect to `to_ifindex` on its own (`tc action add mirred egress redirect
/// dev TO`), which a kernel without the action refuses (ENOENT). It stays until its network
/// namespace goes: for a namespace made to ask the question (`doctor::netns_probe`).
pub fn add_standalone_redirect(sock: &mut Socket, to_ifindex: u32) -> Result<(), NetlinkError> {
    // struct tcamsg: the family and padding.
    let mut body = vec![libc::AF_UNSPEC as u8, 0, 0, 0];
    let mut attrs = Attrs::default();
    attrs.put(TCA_ACT_TAB, &mirred_redirect(to_ifindex).0);
    body.extend_from_slice(&attrs.0);
    sock.request(RTM_NEWACTION, NLM_F_CREATE | NLM_F_EXCL, &body)
        .map(drop)
}

/// An action list of one `mirred egress redirect dev TO`.
fn mirred_redirect(to_ifindex: u32) -> Attrs {
    // struct tc_mirred: tc_gen (index, capab, action, refcnt, bindcnt), eaction, ifindex.
    let mut parms = Vec::with_capacity(28);
    for v in [
        0i32,
        0,
        TC_ACT_STOLEN,
        0,
        0,
        TCA_EGRESS_REDIR,
        to_ifindex as i32,
    ] {
        parms.extend_from_slice(&v.to_ne_bytes());
    }
    let mut mirred = Attrs::default();
    mirred.put(TCA_MIRRED_PARMS, &parms);
    let mut action = Attrs::default();
    action
        .put_str(TCA_ACT_KIND, "mirred")
        .put(TCA_ACT_OPTIONS, &mirred.0);
    let mut actions = Attrs::default();
    actions.put(1, &action.0);
    actions
}
