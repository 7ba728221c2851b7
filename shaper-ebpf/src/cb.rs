//! The packet's control block, the one way the data path touches `__sk_buff.cb`. The layout and
//! the meaning of each word are `shaper_common::cb`'s; this is the access.
//!
//! Every access is volatile: a word written here and read back later reads as unknown to the
//! verifier (the compiler cannot hand it the value it stored), which is what keeps the paths
//! a flag would split apart merged (see `shaper_common::cb`).

use core::marker::PhantomData;

use aya_ebpf::programs::TcContext;
use shaper_common::cb::{Slot, WORDS};

/// One word of a packet's control block.
pub struct Word<'a>(*mut u32, PhantomData<&'a mut u32>);

impl Word<'_> {
    #[inline(always)]
    pub fn read(&self) -> u32 {
        // SAFETY: a word of the skb's control block, valid for the program's run.
        unsafe { core::ptr::read_volatile(self.0) }
    }

    #[inline(always)]
    pub fn write(&mut self, value: u32) {
        // SAFETY: as above.
        unsafe { core::ptr::write_volatile(self.0, value) }
    }

    /// Sets `bits` on what the word holds (read back from memory, not from what was written).
    #[inline(always)]
    pub fn insert(&mut self, bits: u32) {
        let value = self.read() | bits;
        self.write(value);
    }
}

/// The words the scheduler reads and writes while it decides (`fair::schedule`).
pub struct Notes<'a> {
    /// [`Slot::Rewrite`].
    pub rewrite: Word<'a>,
    /// [`Slot::Ahead`].
    pub ahead: Word<'a>,
    /// [`Slot::Jump`].
    pub jump: Word<'a>,
}

/// A packet's control block.
pub struct ControlBlock<'a>(&'a mut [u32; WORDS]);

impl<'a> ControlBlock<'a> {
    /// The control block of the packet at hand.
    #[inline(always)]
    pub fn of(ctx: &TcContext) -> Self {
        // SAFETY: the context is a valid __sk_buff for the whole run.
        Self(unsafe { &mut (*ctx.skb.skb).cb })
    }

    /// The control block of an skb borrowed otherwise.
    #[inline(always)]
    pub fn new(words: &'a mut [u32; WORDS]) -> Self {
        Self(words)
    }

    /// The word at `slot`.
    #[inline(always)]
    pub fn word(&mut self, slot: Slot) -> Word<'_> {
        Word(&raw mut self.0[slot as usize], PhantomData)
    }

    /// The scheduler's words, together.
    #[inline(always)]
    pub fn notes(&mut self) -> Notes<'_> {
        let base = self.0.as_mut_ptr();
        // SAFETY: distinct slots below `WORDS` (asserted in `shaper_common::cb`).
        let word = |slot: Slot| Word(unsafe { base.add(slot as usize) }, PhantomData);
        Notes {
            rewrite: word(Slot::Rewrite),
            ahead: word(Slot::Ahead),
            jump: word(Slot::Jump),
        }
    }
}
