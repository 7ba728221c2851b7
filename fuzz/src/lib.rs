//! What the fuzz targets share: an exact decimal reference for the number parsers, and the
//! spellings of one quantity that every parser must read alike.
//!
//! The reference is written from the units' definitions (tc(8), systemd.network(5)) in a way of
//! its own (decimal digits multiplied as text, as on paper), so that a target compares two
//! independent readings instead of restating the parser's arithmetic.

/// Splits `text` as the parsers do: the leading run of digits and points, and the rest (the
/// unit, with any whitespace before it).
pub fn split_number(text: &str) -> (&str, &str) {
    let end = text
        .find(|c: char| !(c.is_ascii_digit() || c == '.'))
        .unwrap_or(text.len());
    text.split_at(end)
}

/// A non-negative decimal number, exactly: its digits, and how many of them follow the point.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Decimal {
    digits: Vec<u8>,
    fraction_digits: usize,
}

impl Decimal {
    /// Reads digits with at most one point and at least one digit (`5`, `.5`, `5.`, `0.25`).
    pub fn parse(number: &str) -> Option<Self> {
        let (int, frac) = number.split_once('.').unwrap_or((number, ""));
        if int.len() + frac.len() == 0 || frac.contains('.') {
            return None;
        }
        let digits = int.bytes().chain(frac.bytes()).map(|b| b - b'0').collect();
        Some(Self {
            digits,
            fraction_digits: frac.len(),
        })
    }

    pub fn is_zero(&self) -> bool {
        self.digits.iter().all(|&d| d == 0)
    }

    /// The number times `factor`: long multiplication from the last digit up.
    pub fn times(&self, factor: u64) -> Self {
        let mut digits = Vec::with_capacity(self.digits.len() + 20);
        let mut carry: u128 = 0;
        for &d in self.digits.iter().rev() {
            let t = u128::from(d) * u128::from(factor) + carry;
            digits.push((t % 10) as u8);
            carry = t / 10;
        }
        while carry > 0 {
            digits.push((carry % 10) as u8);
            carry /= 10;
        }
        digits.reverse();
        Self {
            digits,
            fraction_digits: self.fraction_digits,
        }
    }

    /// Its integer part, or `None` when that exceeds `cap` (so any length of digits compares).
    pub fn floor_up_to(&self, cap: u64) -> Option<u64> {
        let int = &self.digits[..self.digits.len() - self.fraction_digits];
        let mut value: u64 = 0;
        for &d in int {
            value = value.checked_mul(10)?.checked_add(u64::from(d))?;
            if value > cap {
                return None;
            }
        }
        Some(value)
    }
}

/// Other spellings of `text` that must parse exactly as it does: padded with whitespace, a
/// leading zero, trailing zeros after the point (more digits than 128 bits hold), and the unit
/// in either case (tc's and systemd's units ignore it). Only for a well-formed number: `.` is
/// malformed while `0.` is zero.
pub fn same_quantity(text: &str) -> Vec<String> {
    let mut variants = vec![format!(" \t{text} ")];
    let (number, unit) = split_number(text.trim());
    if Decimal::parse(number).is_some() {
        let point = if number.contains('.') { "" } else { "." };
        variants.extend([
            format!("0{number}{unit}"),
            format!("{number}{point}0{unit}"),
            format!("{number}{point}{}{unit}", "0".repeat(40)),
            format!("{number}{}", unit.to_ascii_uppercase()),
            format!("{number}{}", unit.to_ascii_lowercase()),
        ]);
    }
    variants
}
