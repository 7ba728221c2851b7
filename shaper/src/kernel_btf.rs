//! Where members of the running kernel's structures lie, from its BTF
//! (`/sys/kernel/btf/vmlinux`): what a BPF program that reads kernel memory needs on kernels
//! whose layouts differ. C programs get this from CO-RE relocations, which the Rust BPF
//! toolchain does not emit; aya keeps its BTF type lookups to itself, and the format is small.

use std::collections::HashMap;

use shaper_common::{conntrack::ConntrackLayout, overrun::DequeueWatch};

/// A struct member's place: byte offset and size.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Member {
    pub offset: u32,
    pub size: u32,
}

#[derive(Debug, thiserror::Error)]
pub enum BtfError {
    #[error("reading the kernel's BTF ({path}): {source}")]
    Read {
        path: &'static str,
        source: std::io::Error,
    },
    #[error("the kernel's BTF is malformed: {0}")]
    Malformed(&'static str),
    #[error("the kernel's BTF has no struct {0}")]
    NoStruct(String),
    #[error("struct {0} has no member {1} in the kernel's BTF")]
    NoMember(String, String),
}

pub const VMLINUX: &str = "/sys/kernel/btf/vmlinux";

const MAGIC: u16 = 0xeb9f;
const KIND_INT: u32 = 1;
const KIND_PTR: u32 = 2;
const KIND_ARRAY: u32 = 3;
const KIND_STRUCT: u32 = 4;
const KIND_UNION: u32 = 5;
const KIND_ENUM: u32 = 6;
const KIND_TYPEDEF: u32 = 8;
const KIND_VOLATILE: u32 = 9;
const KIND_CONST: u32 = 10;
const KIND_RESTRICT: u32 = 11;
const KIND_FUNC_PROTO: u32 = 13;
const KIND_VAR: u32 = 14;
const KIND_DATASEC: u32 = 15;
const KIND_DECL_TAG: u32 = 17;
const KIND_TYPE_TAG: u32 = 18;
const KIND_ENUM64: u32 = 19;

#[derive(Debug, Clone)]
struct Type {
    name_off: u32,
    kind: u32,
    /// Member offsets are (size << 24 | bit offset) for bitfields.
    kind_flag: bool,
    /// Size for sized kinds, the referenced type for the others.
    size_or_type: u32,
    members: Vec<(u32, u32, u32)>,
    /// An array's element type and length.
    array: Option<(u32, u32)>,
}

/// The types of one BTF blob.
pub struct KernelBtf {
    types: Vec<Type>,
    strings: Vec<u8>,
    structs: HashMap<String, u32>,
}

impl KernelBtf {
    /// The running kernel's.
    pub fn running() -> Result<Self, BtfError> {
        let data = std::fs::read(VMLINUX).map_err(|source| BtfError::Read {
            path: VMLINUX,
            source,
        })?;
        Self::parse(&data)
    }

    /// A kernel module's (`/sys/kernel/btf/MODULE`), whose BTF is split: it goes on from the
    /// running kernel's, `base`, in type ids and string offsets. None when the module is not
    /// loaded.
    pub fn module(base: &Self, module: &str) -> Result<Option<Self>, BtfError> {
        let path = format!("/sys/kernel/btf/{module}");
        match std::fs::read(&path) {
            Ok(data) => Self::parse_split(&data, base).map(Some),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(None),
            Err(source) => Err(BtfError::Read {
                path: "/sys/kernel/btf/<module>",
                source,
            }),
        }
    }

    pub fn parse(data: &[u8]) -> Result<Self, BtfError> {
        // Type ids start at 1; id 0 is void.
        let void = Type {
            name_off: 0,
            kind: 0,
            kind_flag: false,
            size_or_type: 0,
            members: Vec::new(),
            array: None,
        };
        Self::parse_onto(data, vec![void], Vec::new())
    }

    /// Split BTF over `base`: its types take the ids after the base's, its strings the offsets
    /// after the base's, so the two read as one.
    pub fn parse_split(data: &[u8], base: &Self) -> Result<Self, BtfError> {
        Self::parse_onto(data, base.types.clone(), base.strings.clone())
    }

    fn parse_onto(
        data: &[u8],
        mut types: Vec<Type>,
        mut strings: Vec<u8>,
    ) -> Result<Self, BtfError> {
        let u16_at = |o: usize| data.get(o..o + 2).map(|b| u16::from_le_bytes([b[0], b[1]]));
        let u32_at = |o: usize| {
            data.get(o..o + 4)
                .map(|b| u32::from_le_bytes([b[0], b[1], b[2], b[3]]))
        };
        let bad = BtfError::Malformed;
        if u16_at(0) != Some(MAGIC) {
            return Err(bad("no BTF magic (or not little-endian)"));
        }
        let header = |i: usize| u32_at(4 + 4 * i).ok_or(bad("short header"));
        let hdr_len = header(0)? as usize;
        let (type_off, type_len) = (header(1)? as usize, header(2)? as usize);
        let (str_off, str_len) = (header(3)? as usize, header(4)? as usize);
        strings.extend_from_slice(
            data.get(hdr_len + str_off..hdr_len + str_off + str_len)
                .ok_or(bad("string section out of bounds"))?,
        );
        let start = hdr_len + type_off;
        let end = start + type_len;
        if data.len() < end {
            return Err(bad("type section out of bounds"));
        }
        let mut o = start;
        while o < end {
            let word = |i: usize| u32_at(o + 4 * i).ok_or(bad("truncated type"));
            let (name_off, info, size_or_type) = (word(0)?, word(1)?, word(2)?);
            let vlen = (info & 0xffff) as usize;
            let kind = (info >> 24) & 0x1f;
            o += 12;
            let mut members = Vec::new();
            let mut array = None;
            let extra = match kind {
                KIND_INT | KIND_VAR | KIND_DECL_TAG => 4,
                KIND_ARRAY => {
                    let at = |i: usize| u32_at(o + 4 * i).ok_or(bad("truncated array"));
                    array = Some((at(0)?, at(2)?));
                    12
                }
                KIND_STRUCT | KIND_UNION => {
                    for m in 0..vlen {
                        let at =
                            |i: usize| u32_at(o + 12 * m + 4 * i).ok_or(bad("truncated member"));
                        members.push((at(0)?, at(1)?, at(2)?));
                    }
                    12 * vlen
                }
                KIND_ENUM | KIND_FUNC_PROTO => 8 * vlen,
                KIND_DATASEC | KIND_ENUM64 => 12 * vlen,
                0..=19 => 0,
                _ => return Err(bad("unknown type kind")),
            };
            o += extra;
            types.push(Type {
                name_off,
                kind,
                kind_flag: info >> 31 != 0,
                size_or_type,
                members,
                array,
            });
        }
        let mut btf = Self {
            types,
            strings,
            structs: HashMap::new(),
        };
        for (id, t) in btf.types.iter().enumerate() {
            if t.kind == KIND_STRUCT && !t.members.is_empty() {
                let name = btf.name(t.name_off).to_owned();
                btf.structs.entry(name).or_insert(id as u32);
            }
        }
        Ok(btf)
    }

    /// Where `member` lies in `struct name`, looking into anonymous structs and unions (the
    /// kernel nests members in them, e.g. `sk_buff`'s `tstamp` in a union).
    pub fn member(&self, name: &str, member: &str) -> Result<Member, BtfError> {
        let id = *self
            .structs
            .get(name)
            .ok_or_else(|| BtfError::NoStruct(name.to_owned()))?;
        self.find(id, member, 0, 0)
            .ok_or_else(|| BtfError::NoMember(name.to_owned(), member.to_owned()))
    }

    /// Where the member reached by `path` lies in `struct name`: each step a member of the
    /// one before (`["dst", "u3"]`), offsets added up.
    pub fn member_path(&self, name: &str, path: &[&str]) -> Result<Member, BtfError> {
        let mut id = *self
            .structs
            .get(name)
            .ok_or_else(|| BtfError::NoStruct(name.to_owned()))?;
        let mut at = Member { offset: 0, size: 0 };
        for step in path {
            let (found, type_id) = self
                .find_typed(id, step, 0, 0)
                .ok_or_else(|| BtfError::NoMember(name.to_owned(), path.join(".")))?;
            at = Member {
                offset: at.offset + found.offset,
                size: found.size,
            };
            id = self.resolve(type_id);
        }
        Ok(at)
    }

    /// The size of `struct name`.
    pub fn struct_size(&self, name: &str) -> Result<u32, BtfError> {
        let id = *self
            .structs
            .get(name)
            .ok_or_else(|| BtfError::NoStruct(name.to_owned()))?;
        Ok(self.types[id as usize].size_or_type)
    }

    fn find(&self, id: u32, member: &str, base_bits: u32, depth: u32) -> Option<Member> {
        self.find_typed(id, member, base_bits, depth)
            .map(|(m, _)| m)
    }

    /// [`Self::find`], with the member's type.
    fn find_typed(
        &self,
        id: u32,
        member: &str,
        base_bits: u32,
        depth: u32,
    ) -> Option<(Member, u32)> {
        let t = self.types.get(id as usize)?;
        if depth > 8 {
            return None;
        }
        for &(name_off, type_id, offset) in &t.members {
            let bits = base_bits
                + if t.kind_flag {
                    offset & 0xff_ffff
                } else {
                    offset
                };
            let name = self.name(name_off);
            if name == member {
                return Some((
                    Member {
                        offset: bits / 8,
                        size: self.size(type_id)?,
                    },
                    type_id,
                ));
            }
            if name.is_empty() {
                let inner = self.resolve(type_id);
                if matches!(
                    self.types.get(inner as usize)?.kind,
                    KIND_STRUCT | KIND_UNION
                ) && let Some(found) = self.find_typed(inner, member, bits, depth + 1)
                {
                    return Some(found);
                }
            }
        }
        None
    }

    /// Through typedefs and qualifiers.
    fn resolve(&self, mut id: u32) -> u32 {
        for _ in 0..16 {
            match self.types.get(id as usize) {
                Some(t)
                    if matches!(
                        t.kind,
                        KIND_TYPEDEF | KIND_VOLATILE | KIND_CONST | KIND_RESTRICT | KIND_TYPE_TAG
                    ) =>
                {
                    id = t.size_or_type
                }
                _ => break,
            }
        }
        id
    }

    /// Of the kinds the data path reads (the rest: unknown).
    fn size(&self, id: u32) -> Option<u32> {
        let t = self.types.get(self.resolve(id) as usize)?;
        match t.kind {
            KIND_PTR => Some(8),
            KIND_INT | KIND_STRUCT | KIND_UNION | KIND_ENUM | KIND_ENUM64 => Some(t.size_or_type),
            KIND_ARRAY => {
                let (element, len) = t.array?;
                self.size(element)?.checked_mul(len)
            }
            _ => None,
        }
    }

    fn name(&self, off: u32) -> &str {
        let rest = self.strings.get(off as usize..).unwrap_or_default();
        let end = rest.iter().position(|&b| b == 0).unwrap_or(rest.len());
        std::str::from_utf8(&rest[..end]).unwrap_or_default()
    }
}

/// What the dequeue observer reads, where it reads it: `sk_buff`'s `tstamp`, `len` and `dev`,
/// `net_device`'s `ifindex` and `nd_net`, and the namespace inode number in `struct net`,
/// checked for the sizes the observer reads them as. The device to watch is the caller's.
pub fn dequeue_watch(btf: &KernelBtf) -> Result<DequeueWatch, BtfError> {
    let expect = |s: &str, m: &str, size: u32| -> Result<u32, BtfError> {
        let found = btf.member(s, m)?;
        if found.size != size {
            return Err(BtfError::Malformed("a member has an unexpected size"));
        }
        Ok(found.offset)
    };
    Ok(DequeueWatch {
        skb_tstamp: expect("sk_buff", "tstamp", 8)?,
        skb_len: expect("sk_buff", "len", 4)?,
        skb_dev: expect("sk_buff", "dev", 8)?,
        dev_ifindex: expect("net_device", "ifindex", 4)?,
        // A `possible_net_t`: a struct holding only the pointer.
        dev_net: expect("net_device", "nd_net", 8)?,
        net_inum: btf.member("net", "ns")?.offset + expect("ns_common", "inum", 4)?,
        ..Default::default()
    })
}

/// Where the data path reads a packet's conntrack entry (`shaper_common::conntrack`):
/// `sk_buff`'s `_nfct` in the kernel's BTF, the entry's tuples in `conntrack`'s (the
/// kernel's own when conntrack is built in, the `nf_conntrack` module's otherwise), each
/// checked for the size it is read as.
pub fn conntrack_layout(
    kernel: &KernelBtf,
    conntrack: &KernelBtf,
) -> Result<ConntrackLayout, BtfError> {
    let sized = |btf: &KernelBtf, s: &str, path: &[&str], size: u32| -> Result<u32, BtfError> {
        let found = btf.member_path(s, path)?;
        if found.size != size {
            return Err(BtfError::Malformed("a member has an unexpected size"));
        }
        Ok(found.offset)
    };
    let hash = conntrack.struct_size("nf_conntrack_tuple_hash")?;
    // `tuplehash[IP_CT_DIR_MAX]`: the original direction's, then the reply's.
    let tuplehash = sized(conntrack, "nf_conn", &["tuplehash"], 2 * hash)?;
    let tuple = conntrack
        .member_path("nf_conntrack_tuple_hash", &["tuple"])?
        .offset;
    Ok(ConntrackLayout {
        skb_nfct: sized(kernel, "sk_buff", &["_nfct"], 8)?,
        ct_tuple: tuplehash + tuple,
        tuple_stride: hash,
        src_addr: sized(conntrack, "nf_conntrack_tuple", &["src", "u3"], 16)?,
        dst_addr: sized(conntrack, "nf_conntrack_tuple", &["dst", "u3"], 16)?,
        replies: 0,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A blob of: int (4 bytes), u64 typedef, a struct { int a; union { u64 t; int x; }; int b;
    /// void *p; }.
    fn blob() -> Vec<u8> {
        let strings = b"\0int\0u64\0s\0a\0t\0x\0b\0p\0long\0".to_vec();
        let name = |s: &str| {
            let pat = [s.as_bytes(), b"\0"].concat();
            strings
                .windows(pat.len())
                .enumerate()
                .find(|(i, w)| *w == pat.as_slice() && strings[i - 1] == 0)
                .unwrap()
                .0 as u32
        };
        let mut types = Vec::new();
        let mut push = |words: &[u32]| types.extend(words.iter().flat_map(|w| w.to_le_bytes()));
        let info = |kind: u32, vlen: u32| (kind << 24) | vlen;
        push(&[name("int"), info(KIND_INT, 0), 4, 32]); // 1
        push(&[name("long"), info(KIND_INT, 0), 8, 64]); // 2
        push(&[name("u64"), info(KIND_TYPEDEF, 0), 2]); // 3
        push(&[0, info(KIND_UNION, 2), 8]); // 4
        push(&[name("t"), 3, 0]);
        push(&[name("x"), 1, 0]);
        push(&[0, info(KIND_PTR, 0), 0]); // 5
        push(&[name("s"), info(KIND_STRUCT, 4), 32]); // 6
        push(&[name("a"), 1, 0]);
        push(&[0, 4, 64]);
        push(&[name("b"), 1, 128]);
        push(&[name("p"), 5, 192]);
        assemble(&types, &strings)
    }

    /// A BTF blob of a type section and a string section.
    fn assemble(types: &[u8], strings: &[u8]) -> Vec<u8> {
        let mut out = Vec::new();
        out.extend(MAGIC.to_le_bytes());
        out.extend([1, 0]);
        for w in [
            24u32,
            0,
            types.len() as u32,
            types.len() as u32,
            strings.len() as u32,
        ] {
            out.extend(w.to_le_bytes());
        }
        out.extend(types);
        out.extend(strings);
        out
    }

    /// A module's split BTF over `blob()`: struct m { int h[2]; struct s inner; } and
    /// struct n { struct m pair[2]; }, naming its members with its own strings (offsets after
    /// the base's) and the base's types by their ids.
    fn module_blob(base_strings: u32) -> Vec<u8> {
        let strings = b"m\0h\0inner\0n\0pair\0";
        let name = |at: u32| base_strings + at;
        let mut types = Vec::new();
        let mut push = |words: &[u32]| types.extend(words.iter().flat_map(|w| w.to_le_bytes()));
        let info = |kind: u32, vlen: u32| (kind << 24) | vlen;
        // Base ids 1..=6; these take 7 on.
        push(&[0, info(KIND_ARRAY, 0), 0, 1, 1, 2]); // 7: int[2]
        push(&[name(0), info(KIND_STRUCT, 2), 40]); // 8: m
        push(&[name(2), 7, 0]);
        push(&[name(4), 6, 64]);
        push(&[0, info(KIND_ARRAY, 0), 0, 8, 1, 2]); // 9: m[2]
        push(&[name(10), info(KIND_STRUCT, 1), 80]); // 10: n
        push(&[name(12), 9, 0]);
        assemble(&types, strings)
    }

    #[test]
    fn a_modules_split_btf_reads_on_from_the_kernels() {
        let base = KernelBtf::parse(&blob()).unwrap();
        let module =
            KernelBtf::parse_split(&module_blob(base.strings.len() as u32), &base).unwrap();
        assert_eq!(
            module.member("m", "h").unwrap(),
            Member { offset: 0, size: 8 }
        );
        assert_eq!(
            module.member_path("m", &["inner", "p"]).unwrap(),
            Member {
                offset: 8 + 24,
                size: 8
            }
        );
        assert_eq!(module.member("n", "pair").unwrap().size, 80);
        assert_eq!(module.struct_size("m").unwrap(), 40);
        // The base's own types are still there.
        assert_eq!(module.member("s", "b").unwrap().offset, 16);
        assert!(matches!(
            module.member_path("m", &["inner", "q"]),
            Err(BtfError::NoMember(..))
        ));
    }

    #[test]
    fn finds_members_through_anonymous_unions_and_typedefs() {
        let btf = KernelBtf::parse(&blob()).unwrap();
        let at = |m| btf.member("s", m).unwrap();
        assert_eq!(at("a"), Member { offset: 0, size: 4 });
        assert_eq!(at("t"), Member { offset: 8, size: 8 });
        assert_eq!(at("x"), Member { offset: 8, size: 4 });
        assert_eq!(
            at("b"),
            Member {
                offset: 16,
                size: 4
            }
        );
        assert_eq!(
            at("p"),
            Member {
                offset: 24,
                size: 8
            }
        );
        assert!(matches!(btf.member("s", "q"), Err(BtfError::NoMember(..))));
        assert!(matches!(btf.member("r", "a"), Err(BtfError::NoStruct(_))));
    }

    #[test]
    fn refuses_what_is_not_btf() {
        assert!(KernelBtf::parse(b"\x7fELF....").is_err());
        let mut short = blob();
        short.truncate(40);
        assert!(KernelBtf::parse(&short).is_err());
    }

    /// The running kernel's layout (every kernel shaper runs on has BTF: its tests need it).
    #[test]
    fn the_running_kernel_has_what_the_dequeue_observer_reads() {
        let btf = KernelBtf::running().unwrap();
        let at = dequeue_watch(&btf).unwrap();
        // sk_buff opens with next, prev and dev (in a union with dev_scratch).
        assert_eq!(at.skb_dev, 16);
        assert!(at.skb_tstamp > at.skb_dev && at.skb_len > at.skb_tstamp);
        assert!(at.dev_ifindex > 0 && at.dev_net > 0 && at.net_inum > 0);
    }

    /// The build machine's kernel has conntrack built in: its layout is in the kernel's own BTF.
    #[test]
    fn the_running_kernel_has_what_the_nat_lookup_reads() {
        let btf = KernelBtf::running().unwrap();
        let conntrack = match KernelBtf::module(&btf, "nf_conntrack").unwrap() {
            Some(module) => module,
            None => KernelBtf::running().unwrap(),
        };
        let at = conntrack_layout(&btf, &conntrack).unwrap();
        assert!(at.skb_nfct > at.tuple_stride.min(16), "{at:?}");
        // Two tuples of two 16-byte addresses and more.
        assert!(at.tuple_stride >= 40 && at.ct_tuple > 0, "{at:?}");
        assert_eq!(
            at.src_addr, 0,
            "the source manip opens with its address: {at:?}"
        );
        assert!(at.dst_addr >= 16 + 2, "{at:?}");
    }
}
