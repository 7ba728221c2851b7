//! Slots of the small tables the data path indexes by addresses: an address folded to one
//! word, and a word spread over a table by Fibonacci hashing (the top bits of its product with
//! 2^32 / φ), which keeps neighbouring addresses and ports apart without a loop or a table.

/// An address (IPv4 in the first word, the rest zero; IPv6 in all four) folded to one word.
#[inline(always)]
pub const fn fold(a: &[u32; 4]) -> u32 {
    a[0] ^ a[1].rotate_left(8) ^ a[2].rotate_left(16) ^ a[3].rotate_left(24)
}

/// The slot of `word` in a table of `slots` entries (a power of two, at least 2).
#[inline(always)]
pub const fn slot(word: u32, slots: u32) -> u32 {
    word.wrapping_mul(0x9E37_79B1) >> (32 - slots.trailing_zeros())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn slots_stay_in_the_table_and_neighbours_spread() {
        let mut used = [false; 64];
        for n in 0..64u32 {
            let s = slot(fold(&[0x0a00_0000 + n, 0, 0, 0]), 64);
            assert!(s < 64);
            used[s as usize] = true;
        }
        assert!(used.iter().filter(|u| **u).count() > 32);
    }

    #[test]
    fn every_word_of_an_address_counts() {
        let a = [1, 2, 3, 4];
        for i in 0..4 {
            let mut b = a;
            b[i] ^= 1;
            assert_ne!(fold(&a), fold(&b), "word {i}");
        }
    }
}
