//! Reads of kernel memory at offsets the loader found in the running kernel's BTF (the dequeue
//! observer's `sk_buff` and device, a packet's conntrack entry): only ever reads, through the
//! helper, which fails cleanly on a bad address.

use aya_ebpf::helpers::bpf_probe_read_kernel;

/// The `T` at `offset` bytes into the kernel object at `base`; none if the read faults.
#[inline(always)]
pub fn read<T>(base: *const u8, offset: u32) -> Option<T> {
    // SAFETY: the helper checks the address and fails instead of faulting.
    unsafe { bpf_probe_read_kernel(base.wrapping_add(offset as usize) as *const T) }.ok()
}
