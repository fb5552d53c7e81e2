//! One value per buffer of a resolve call ([`ResolveBuffers`]: their sizes, [`ResolveSizes`], or
//! a backend's device addresses) and the call as plain slices ([`ResolveSlices`]), so a backend
//! checks a call without knowing the buffer type.

use super::ResolveArgs;
use crate::ops::BufferLen;

/// One value per buffer of a resolve call, named as the arguments of [`ResolveArgs`]: their byte
/// sizes ([`ResolveSizes`]), a backend's device addresses ([`ResolveArgs::map`]), …
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
#[allow(missing_docs)] // one field per argument of the same name
pub struct ResolveBuffers<T> {
    pub req_id: T,
    pub topk: T,
    pub resident_table: T,
    pub host_table: T,
    pub hot_table: T,
    pub slot_host_rows: T,
    pub lru: T,
    pub indices: T,
    pub valid_counts: T,
    pub hit_counts: T,
    pub miss_counts: T,
    pub miss_src: T,
    pub miss_dst: T,
    /// `None` when no `idx_mapping` is given.
    pub idx_mapping: Option<T>,
    /// `None` when no `stats` buffer is given.
    pub stats: Option<T>,
}

/// Byte sizes of every resolve argument: what [`ResolveDesc::check`](super::ResolveDesc::check)
/// compares against.
pub type ResolveSizes = ResolveBuffers<u64>;

/// The resolve arguments as typed slices, for the reference implementation.
#[derive(Debug)]
#[allow(missing_docs)] // fields mirror [`ResolveArgs`]
pub struct ResolveSlices<'a> {
    pub req_id: &'a [i32],
    pub topk: &'a [i32],
    pub resident_table: &'a [i32],
    pub host_table: &'a [i32],
    pub hot_table: &'a [i32],
    pub slot_host_rows: &'a mut [i32],
    pub lru: &'a mut [u16],
    pub indices: &'a mut [i32],
    pub valid_counts: &'a mut [i32],
    pub hit_counts: &'a mut [i32],
    pub miss_counts: &'a mut [i32],
    pub miss_src: &'a mut [i32],
    pub miss_dst: &'a mut [i32],
    pub idx_mapping: Option<&'a [i32]>,
    /// The stats words as `i32` (the bits of the `u32` counters, [`CallStats::add_to`](crate::ops::stats::CallStats::add_to)).
    pub stats: Option<&'a mut [i32]>,
}

/// `$f` of every buffer of `$a` (a [`ResolveArgs`] or [`ResolveSlices`]).
macro_rules! map_buffers {
    ($a:expr, $f:expr) => {
        ResolveBuffers {
            req_id: $f(&*$a.req_id),
            topk: $f(&*$a.topk),
            resident_table: $f(&*$a.resident_table),
            host_table: $f(&*$a.host_table),
            hot_table: $f(&*$a.hot_table),
            slot_host_rows: $f(&*$a.slot_host_rows),
            lru: $f(&*$a.lru),
            indices: $f(&*$a.indices),
            valid_counts: $f(&*$a.valid_counts),
            hit_counts: $f(&*$a.hit_counts),
            miss_counts: $f(&*$a.miss_counts),
            miss_src: $f(&*$a.miss_src),
            miss_dst: $f(&*$a.miss_dst),
            idx_mapping: $a.idx_mapping.as_deref().map(|m| $f(m)),
            stats: $a.stats.as_deref().map(|s| $f(s)),
        }
    };
}

/// The same arguments, borrowed from `$a` for a shorter call.
macro_rules! reborrow {
    ($a:expr, $args:ident) => {
        $args {
            req_id: $a.req_id,
            topk: $a.topk,
            resident_table: $a.resident_table,
            host_table: $a.host_table,
            hot_table: $a.hot_table,
            slot_host_rows: &mut *$a.slot_host_rows,
            lru: &mut *$a.lru,
            indices: &mut *$a.indices,
            valid_counts: &mut *$a.valid_counts,
            hit_counts: &mut *$a.hit_counts,
            miss_counts: &mut *$a.miss_counts,
            miss_src: &mut *$a.miss_src,
            miss_dst: &mut *$a.miss_dst,
            idx_mapping: $a.idx_mapping,
            stats: $a.stats.as_deref_mut(),
        }
    };
}

impl<B: ?Sized> ResolveArgs<'_, B> {
    /// `f` of every buffer: a backend's device addresses, say.
    pub fn map<T>(&self, f: impl Fn(&B) -> T) -> ResolveBuffers<T> {
        map_buffers!(self, f)
    }
}

impl<B: BufferLen + ?Sized> ResolveArgs<'_, B> {
    /// Byte sizes of every argument.
    pub fn sizes(&self) -> ResolveSizes {
        self.map(B::byte_len)
    }

    /// The same buffers, borrowed for one call, so the caller keeps them for the next (the
    /// gather of the miss plan the call writes).
    pub fn reborrow(&mut self) -> ResolveArgs<'_, B> {
        reborrow!(self, ResolveArgs)
    }
}

impl ResolveSlices<'_> {
    /// Byte sizes of every argument.
    pub fn sizes(&self) -> ResolveSizes {
        map_buffers!(self, BufferLen::byte_len)
    }

    /// The same slices, borrowed for one call (as [`ResolveArgs::reborrow`]).
    pub fn reborrow(&mut self) -> ResolveSlices<'_> {
        reborrow!(self, ResolveSlices)
    }
}
