//! Division by a layout constant (tokens per page, rows per page, tokens per row) on the
//! step's hot path: a shift and a mask when the constant is a power of two (every layout the
//! presets plan), the division otherwise. A 32-bit division takes tens of cycles and the
//! decode path divides several times per request and step.

/// A fixed divisor, checked once at construction.
#[derive(Clone, Copy, Debug)]
pub(super) struct Divisor {
    /// The divisor (at least 1: the layout validates it as non-zero; a zero would divide by 1
    /// here rather than panic).
    value: u32,
    /// `log2(value)` when `pow2`.
    shift: u32,
    /// Whether `value` is a power of two.
    pow2: bool,
}

impl Divisor {
    /// The divisor `value` (a zero is taken as 1).
    pub(super) fn new(value: u32) -> Self {
        let value = value.max(1);
        Divisor {
            value,
            shift: value.trailing_zeros(),
            pow2: value.is_power_of_two(),
        }
    }

    /// Whether the divisor is a power of two.
    pub(super) fn is_pow2(self) -> bool {
        self.pow2
    }

    /// `x / value`. `POW2` says the divisor is a power of two (the caller checked
    /// [`Divisor::is_pow2`] once for a whole pass): a shift, with no test per division.
    #[inline(always)]
    pub(super) fn div<const POW2: bool>(self, x: u32) -> u32 {
        debug_assert_eq!(POW2, self.pow2);
        if POW2 {
            x >> self.shift
        } else {
            x / self.value
        }
    }

    /// `x % value` (`POW2` as for [`Divisor::div`]).
    #[inline(always)]
    pub(super) fn rem<const POW2: bool>(self, x: u32) -> u32 {
        debug_assert_eq!(POW2, self.pow2);
        if POW2 {
            x & (self.value - 1)
        } else {
            x % self.value
        }
    }
}

#[cfg(test)]
mod tests {
    use super::Divisor;

    #[test]
    fn matches_integer_division() {
        let xs = [
            0u32,
            1,
            2,
            3,
            63,
            64,
            65,
            127,
            128,
            4095,
            32767,
            32768,
            1 << 31,
            u32::MAX,
        ];
        for d in [1u32, 2, 3, 4, 5, 7, 16, 48, 64, 96, 256, 1 << 31, u32::MAX] {
            let div = Divisor::new(d);
            assert_eq!(div.is_pow2(), d.is_power_of_two());
            for &x in &xs {
                let (q, r) = if div.is_pow2() {
                    (div.div::<true>(x), div.rem::<true>(x))
                } else {
                    (div.div::<false>(x), div.rem::<false>(x))
                };
                assert_eq!(q, x / d, "{x} / {d}");
                assert_eq!(r, x % d, "{x} % {d}");
            }
        }
        // Zero is taken as one, not a panic.
        let one = Divisor::new(0);
        assert!(one.is_pow2());
        assert_eq!(one.div::<true>(7), 7);
        assert_eq!(one.rem::<true>(7), 0);
    }
}
