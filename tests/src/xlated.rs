//! A loaded program as the kernel runs it: its instructions after the verifier, with the dead
//! branches it removed gone (`BPF_OBJ_GET_INFO_BY_FD`'s `xlated_prog_insns`).

use std::os::fd::{AsRawFd, BorrowedFd};

const BPF_OBJ_GET_INFO_BY_FD: libc::c_long = 15;
/// `BPF_LD | BPF_IMM | BPF_DW`: a 64-bit immediate, which names a map when its source register
/// is `BPF_PSEUDO_MAP_FD` (1) or `BPF_PSEUDO_MAP_VALUE` (2): in a dump, by the map's id.
const LD_IMM64: u8 = 0x18;

/// The head of `struct bpf_prog_info` (include/uapi/linux/bpf.h), up to the translated
/// instructions, in 32-bit words: `xlated_prog_len` is word 5, `xlated_prog_insns` words 8-9.
#[repr(C, align(8))]
#[derive(Default)]
struct ProgInfoHead([u32; 10]);

impl ProgInfoHead {
    fn xlated_len(&self) -> u32 {
        self.0[5]
    }

    /// A head that asks for `len` bytes of translated instructions at `insns`.
    fn asking(len: u32, insns: u64) -> Self {
        let mut head = Self::default();
        head.0[5] = len;
        head.0[8] = insns as u32;
        head.0[9] = (insns >> 32) as u32;
        head
    }
}

/// The program's translated instructions, 8 bytes each.
pub fn instructions(program: BorrowedFd<'_>) -> std::io::Result<Vec<[u8; 8]>> {
    let mut head = ProgInfoHead::default();
    get_info(program, &mut head)?;
    let mut insns = vec![[0u8; 8]; head.xlated_len() as usize / 8];
    head = ProgInfoHead::asking((insns.len() * 8) as u32, insns.as_mut_ptr() as u64);
    get_info(program, &mut head)?;
    Ok(insns)
}

/// The ids of the maps the program's instructions name.
pub fn maps_named(program: BorrowedFd<'_>) -> std::io::Result<Vec<u32>> {
    let insns = instructions(program)?;
    let mut ids = Vec::new();
    let mut at = 0;
    while at < insns.len() {
        let insn = insns[at];
        if insn[0] == LD_IMM64 {
            if matches!(insn[1] >> 4, 1 | 2) {
                ids.push(u32::from_le_bytes([insn[4], insn[5], insn[6], insn[7]]));
            }
            at += 1;
        }
        at += 1;
    }
    Ok(ids)
}

fn get_info(program: BorrowedFd<'_>, head: &mut ProgInfoHead) -> std::io::Result<()> {
    // The attribute of `BPF_OBJ_GET_INFO_BY_FD`: `bpf_fd` and `info_len` (u32 each, in the
    // first word, little-endian), then the `info` pointer.
    let fd = program.as_raw_fd() as u32 as u64;
    let len = size_of::<ProgInfoHead>() as u64;
    let mut attr: [u64; 2] = [fd | len << 32, head as *mut ProgInfoHead as u64];
    // SAFETY: a valid attribute of the size given, pointing at a buffer of the size it says.
    let ret = unsafe {
        libc::syscall(
            libc::SYS_bpf,
            BPF_OBJ_GET_INFO_BY_FD,
            attr.as_mut_ptr(),
            size_of::<[u64; 2]>() as u32,
        )
    };
    if ret < 0 {
        return Err(std::io::Error::last_os_error());
    }
    Ok(())
}
