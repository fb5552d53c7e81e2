//! The sizes of a resolve call's buffers ([`ResolveSizes`]) and the call as plain slices
//! ([`ResolveSlices`]), so a backend checks a call without knowing the buffer type.

use super::ResolveArgs;
use crate::ops::BufferLen;

/// Byte sizes of every resolve argument: what [`ResolveDesc::check`](super::ResolveDesc::check) compares against.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
#[allow(missing_docs)] // one field per argument of the same name
pub struct ResolveSizes {
    pub req_id: u64,
    pub topk: u64,
    pub resident_table: u64,
    pub host_table: u64,
    pub hot_table: u64,
    pub slot_host_rows: u64,
    pub lru: u64,
    pub indices: u64,
    pub valid_counts: u64,
    pub hit_counts: u64,
    pub miss_counts: u64,
    pub miss_src: u64,
    pub miss_dst: u64,
    /// `None` when no `idx_mapping` is given.
    pub idx_mapping: Option<u64>,
    /// `None` when no `stats` buffer is given.
    pub stats: Option<u64>,
}

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

macro_rules! sizes_of {
    ($a:expr) => {
        ResolveSizes {
            req_id: $a.req_id.byte_len(),
            topk: $a.topk.byte_len(),
            resident_table: $a.resident_table.byte_len(),
            host_table: $a.host_table.byte_len(),
            hot_table: $a.hot_table.byte_len(),
            slot_host_rows: $a.slot_host_rows.byte_len(),
            lru: $a.lru.byte_len(),
            indices: $a.indices.byte_len(),
            valid_counts: $a.valid_counts.byte_len(),
            hit_counts: $a.hit_counts.byte_len(),
            miss_counts: $a.miss_counts.byte_len(),
            miss_src: $a.miss_src.byte_len(),
            miss_dst: $a.miss_dst.byte_len(),
            idx_mapping: $a.idx_mapping.map(|m| m.byte_len()),
            stats: $a.stats.as_ref().map(|s| s.byte_len()),
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

impl<B: BufferLen + ?Sized> ResolveArgs<'_, B> {
    /// Byte sizes of every argument.
    pub fn sizes(&self) -> ResolveSizes {
        sizes_of!(self)
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
        sizes_of!(self)
    }

    /// The same slices, borrowed for one call (as [`ResolveArgs::reborrow`]).
    pub fn reborrow(&mut self) -> ResolveSlices<'_> {
        reborrow!(self, ResolveSlices)
    }
}
