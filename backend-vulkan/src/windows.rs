//! Binding two pools (a source A and a destination B) to a pooled shader (gather, copy) within
//! the device's binding limits.
//!
//! One storage binding covers at most `maxStorageBufferRange` bytes (128 MiB on lavapipe, 4 GiB
//! on most GPUs), so a pool larger than that is bound as *windows*: power-of-two slices of
//! [`Limits::window`] bytes, each its own binding. A shader variant binds `K` windows of each
//! pool ([`Windows`]); `4 + 2K` (gather) or `1 + 2K` (copy) bindings must fit the device's
//! storage buffers per stage. When a pool has more windows than the largest variant that fits,
//! the work is issued as one dispatch per pair of window groups (A windows `[a, a + K)`, B windows
//! `[b, b + K)`); every dispatch sees the whole work list and writes only the words whose source
//! and destination lie in its groups, so each word is written by exactly one dispatch.
//!
//! Addresses are 32-bit counts of 16-byte words, so the shaders address pools up to 64 GiB.

use crate::error::VulkanError;
use crate::shaders::Windows;
use crate::vk::{Binding, Limits, RawBuffer};

type Result<T> = core::result::Result<T, VulkanError>;

/// Bytes the shaders' 32-bit word addresses reach (2^32 16-byte words).
pub const SHADER_ADDRESSABLE: u64 = 16 << 32;

/// How one pooled dispatch list binds its two pools.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct PoolPlan {
    /// The shader variant.
    pub windows: Windows,
    window: u64,
    /// Windows of A and of B.
    a_windows: u64,
    b_windows: u64,
}

impl PoolPlan {
    /// Plans bindings for pools of `a_bytes` and `b_bytes` with `fixed` other bindings; `what`
    /// names the operation for errors.
    pub fn new(
        limits: &Limits,
        a_bytes: u64,
        b_bytes: u64,
        fixed: u32,
        what: &str,
    ) -> Result<PoolPlan> {
        let largest = a_bytes.max(b_bytes);
        if largest > SHADER_ADDRESSABLE {
            return Err(VulkanError::Unsupported(format!(
                "{what}: a pool of {largest} bytes exceeds the 64 GiB the shaders address \
                 (32-bit 16-byte words); use a smaller pool (for `hisparse simulate`: a smaller \
                 --gpu-mem or --host-mem)"
            )));
        }
        let window = limits.window;
        let a_windows = a_bytes.div_ceil(window).max(1);
        let b_windows = b_bytes.div_ceil(window).max(1);
        let need = a_windows.max(b_windows);
        if need == 1 {
            return Ok(PoolPlan {
                windows: Windows::One,
                window,
                a_windows,
                b_windows,
            });
        }
        let fits = |w: Windows| fixed + 2 * w.count() <= limits.max_storage_per_stage;
        let usable: Vec<Windows> = Windows::ALL
            .into_iter()
            .filter(|&w| w != Windows::One && fits(w))
            .collect();
        let windows = usable
            .iter()
            .copied()
            .find(|w| u64::from(w.count()) >= need)
            .or_else(|| usable.last().copied())
            .ok_or_else(|| {
                VulkanError::Unsupported(format!(
                    "{what}: a pool of {largest} bytes needs {need} windows of {window} bytes \
                     (maxStorageBufferRange = {}), but {} storage buffers per stage \
                     (maxPerStageDescriptorStorageBuffers) leave room for fewer than {} windows \
                     per pool; use a smaller pool (for `hisparse simulate`: a smaller --gpu-mem \
                     or --host-mem) or another device",
                    limits.max_storage_range,
                    limits.max_storage_per_stage,
                    Windows::Eight.count()
                ))
            })?;
        Ok(PoolPlan {
            windows,
            window,
            a_windows,
            b_windows,
        })
    }

    fn per_group(&self) -> u64 {
        u64::from(self.windows.count())
    }

    /// The dispatches: first window of A and of B each covers (several only when a pool has
    /// more windows than the variant binds).
    pub fn groups(&self) -> Vec<(u32, u32)> {
        let k = self.per_group();
        let mut v = Vec::new();
        for a in (0..self.a_windows.div_ceil(k)).map(|g| g * k) {
            for b in (0..self.b_windows.div_ceil(k)).map(|g| g * k) {
                v.push((a as u32, b as u32));
            }
        }
        v
    }

    /// `(chunk_shift, chunk_mask)` of a window in 16-byte words (unused by [`Windows::One`]).
    #[cfg(test)]
    pub fn shift_mask(&self) -> (u32, u32) {
        self.shift_mask_words(16)
    }

    /// `(chunk_shift, chunk_mask)` of a window in words of `word_bytes` bytes.
    pub fn shift_mask_words(&self, word_bytes: u64) -> (u32, u32) {
        if self.windows == Windows::One {
            return (31, u32::MAX);
        }
        let words = self.window / word_bytes;
        (words.trailing_zeros(), (words - 1) as u32)
    }

    /// The pool bindings of one dispatch: `K` windows of `a` from window `a_base`, then `K` of
    /// `b` from `b_base` (slots past a pool's end repeat its window 0).
    pub fn bindings(&self, a: &RawBuffer, b: &RawBuffer, a_base: u32, b_base: u32) -> Vec<Binding> {
        if self.windows == Windows::One {
            let whole = |r: &RawBuffer| Binding {
                buffer: r.buffer,
                offset: 0,
                range: r.size,
            };
            return vec![whole(a), whole(b)];
        }
        let k = self.per_group();
        let window = self.window;
        let slice = |r: &RawBuffer, c: u64| {
            let c = if c * window < r.size { c } else { 0 };
            Binding {
                buffer: r.buffer,
                offset: c * window,
                range: (r.size - c * window).min(window),
            }
        };
        let mut v: Vec<Binding> = (0..k).map(|j| slice(a, u64::from(a_base) + j)).collect();
        v.extend((0..k).map(|j| slice(b, u64::from(b_base) + j)));
        v
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn limits(window: u64, per_stage: u32) -> Limits {
        Limits {
            max_storage_range: window,
            window,
            max_storage_per_stage: per_stage,
            storage_offset_alignment: 16,
            max_allocation: u64::MAX,
            timestamp_period: None,
            import_alignment: None,
            gpu: true,
            unified: false,
            memory_budget: false,
            subgroup_arithmetic: false,
            workgroup_resolver: false,
            workgroup_resolver_large: false,
        }
    }

    const MIB: u64 = 1 << 20;

    #[test]
    fn small_pools_bind_whole() {
        let p =
            PoolPlan::new(&limits(2048 * MIB, 1 << 20), 1300 * MIB, 1200 * MIB, 4, "t").unwrap();
        assert_eq!(p.windows, Windows::One);
        assert_eq!(p.groups(), vec![(0, 0)]);
    }

    #[test]
    fn lavapipe_default_pools_fit_one_dispatch_of_twelve_windows() {
        // 128 MiB windows, 32 storage buffers per stage; the default simulation's pools.
        let l = limits(128 * MIB, 32);
        let p = PoolPlan::new(&l, 1280 * MIB, 1350 * MIB, 4, "gather").unwrap();
        assert_eq!(p.windows, Windows::Twelve);
        assert_eq!(p.groups(), vec![(0, 0)]);
        assert_eq!(p.shift_mask(), (23, (1 << 23) - 1));
    }

    #[test]
    fn pools_beyond_the_largest_variant_take_several_dispatches() {
        let l = limits(128 * MIB, 32);
        // 30 windows of A, 13 of B with 12 per group: 3 × 2 dispatches.
        let p = PoolPlan::new(&l, 30 * 128 * MIB, 13 * 128 * MIB, 4, "gather").unwrap();
        assert_eq!(p.windows, Windows::Twelve);
        assert_eq!(
            p.groups(),
            vec![(0, 0), (0, 12), (12, 0), (12, 12), (24, 0), (24, 12)]
        );
    }

    #[test]
    fn too_few_bindings_or_too_large_pools_are_refused_naming_the_limit() {
        let e = PoolPlan::new(&limits(128 * MIB, 16), 2048 * MIB, 16, 4, "gather").unwrap_err();
        assert!(
            e.to_string()
                .contains("maxPerStageDescriptorStorageBuffers"),
            "{e}"
        );
        assert!(e.to_string().contains("--gpu-mem"), "{e}");
        let e = PoolPlan::new(&limits(2048 * MIB, 1 << 20), 65 << 30, 16, 4, "gather").unwrap_err();
        assert!(e.to_string().contains("64 GiB"), "{e}");
    }
}
