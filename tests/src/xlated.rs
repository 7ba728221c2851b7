//! A loaded program as the kernel runs it: its instructions after the verifier, with the dead
//! branches it removed gone (`BPF_OBJ_GET_INFO_BY_FD`'s `xlated_prog_insns`).

use std::os::fd::{AsRawFd, BorrowedFd};

const BPF_OBJ_GET_INFO_BY_FD: libc::c_long = 15;
/// `BPF_LD | BPF_IMM | BPF_DW`: a 64-bit immediate, which names a map when its source register
/// is `BPF_PSEUDO_MAP_FD` (1) or `BPF_PSEUDO_MAP_VALUE` (2): in a dump, by the map's id.
const LD_IMM64: u8 = 0x18;

/// The head of `struct bpf_prog_info` (include/uapi/linux/bpf.h), up to the translated
/// instructions.
#[repr(C)]
#[derive(Default)]
struct ProgInfoHead {
    prog_type: u32,
    id: u32,
    tag: [u8; 8],
    jited_prog_len: u32,
    xlated_prog_len: u32,
    jited_prog_insns: u64,
    xlated_prog_insns: u64,
}

#[repr(C)]
struct InfoByFd {
    bpf_fd: u32,
    info_len: u32,
    info: u64,
}

/// The program's translated instructions, 8 bytes each.
pub fn instructions(program: BorrowedFd<'_>) -> std::io::Result<Vec<[u8; 8]>> {
    let mut head = ProgInfoHead::default();
    get_info(program, &mut head)?;
    let mut insns = vec![[0u8; 8]; head.xlated_prog_len as usize / 8];
    head = ProgInfoHead {
        xlated_prog_len: (insns.len() * 8) as u32,
        xlated_prog_insns: insns.as_mut_ptr() as u64,
        ..Default::default()
    };
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
    let mut attr = InfoByFd {
        bpf_fd: program.as_raw_fd() as u32,
        info_len: size_of::<ProgInfoHead>() as u32,
        info: head as *mut ProgInfoHead as u64,
    };
    // SAFETY: a valid attribute of the size given, pointing at a buffer of the size it says.
    let ret = unsafe {
        libc::syscall(
            libc::SYS_bpf,
            BPF_OBJ_GET_INFO_BY_FD,
            &mut attr as *mut InfoByFd,
            size_of::<InfoByFd>() as u32,
        )
    };
    if ret < 0 {
        return Err(std::io::Error::last_os_error());
    }
    Ok(())
}
