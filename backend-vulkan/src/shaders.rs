//! The compute shaders: WGSL sources in `shaders/`, compiled to SPIR-V by `build.rs` (naga) and
//! embedded here, 4-byte aligned.

/// Bytes embedded with 4-byte alignment, as SPIR-V words require.
#[repr(C, align(4))]
pub struct Aligned<T: ?Sized>(pub T);

macro_rules! spirv {
    ($name:literal) => {{
        static BYTES: &Aligned<[u8]> = &Aligned(*include_bytes!(concat!(
            env!("OUT_DIR"),
            "/",
            $name,
            ".spv"
        )));
        &BYTES.0
    }};
}

/// Windows per pool of a pooled shader (gather, copy): how many storage buffers each of its two
/// pools is bound as. Keep in sync with `WINDOWS` in `build.rs`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Windows {
    /// Each pool bound whole (it fits one binding).
    One,
    /// 8 windows per pool.
    Eight,
    /// 12 windows per pool (fits devices with 32 storage buffers per stage, such as lavapipe).
    Twelve,
    /// 32 windows per pool.
    ThirtyTwo,
}

impl Windows {
    /// Every variant, fewest windows first.
    pub const ALL: [Windows; 4] = [
        Windows::One,
        Windows::Eight,
        Windows::Twelve,
        Windows::ThirtyTwo,
    ];

    /// Windows per pool.
    pub const fn count(self) -> u32 {
        match self {
            Windows::One => 1,
            Windows::Eight => 8,
            Windows::Twelve => 12,
            Windows::ThirtyTwo => 32,
        }
    }

    const fn slot(self) -> usize {
        match self {
            Windows::One => 0,
            Windows::Eight => 1,
            Windows::Twelve => 2,
            Windows::ThirtyTwo => 3,
        }
    }
}

/// One compute shader of the backend.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Shader {
    /// Index remap.
    Remap,
    /// Compressed slot mapping.
    SlotMapping,
    /// Hot-entry invalidation.
    Invalidate,
    /// Resolve pass 1: group token rows by request.
    ResolvePrep,
    /// Resolve in batch-row order, pass 0: the owning batch row of every token row.
    ResolveOrder,
    /// A resolve call's stats: its row counts summed into the call's stats slot.
    ResolveStats,
    /// Resolve pass 2: one workgroup per request.
    Resolve,
    /// Resolve pass 2 with its workgroup scans on subgroup arithmetic (devices that have it).
    ResolveSubgroup,
    /// Resolve in one dispatch of 1024-invocation workgroups, state in workgroup memory (a
    /// 2560-entry hash table: 32 KiB of workgroup memory).
    ResolveWg,
    /// [`Shader::ResolveWg`] with its scans on subgroup arithmetic.
    ResolveWgSubgroup,
    /// [`Shader::ResolveWg`] with a 4096-entry hash table (44 KiB of workgroup memory).
    ResolveWgLarge,
    /// [`Shader::ResolveWgLarge`] with its scans on subgroup arithmetic.
    ResolveWgLargeSubgroup,
    /// Sparse `i32` table writes.
    TableWrite,
    /// Hot-state reset (`slot_host_rows` to -1, LRU to the identity).
    HotReset,
    /// Miss-plan gather, host pool → device pool: 16 plan entries per workgroup, 8 loads in
    /// flight per invocation (the default on GPUs).
    Gather(Windows),
    /// Miss-plan gather, first design: 32 lanes per plan entry (the default on CPU devices).
    GatherPerEntry(Windows),
    /// [`Shader::GatherPerEntry`] over 4-byte pool words, for split rows whose scale part is not a
    /// multiple of 16 bytes (DeepSeek V4's 576 + 8).
    GatherPerEntryWords(Windows),
    /// Region copies between two pools (or within one), in 16-byte words.
    Copy(Windows),
    /// [`Shader::Copy`] in 4-byte words, for regions that are not 16-byte aligned.
    CopyWords(Windows),
    /// Indexer backup, device pool → indexer host cache, in 4-byte words.
    IndexerBackup(Windows),
}

impl Shader {
    /// Every shader, in pipeline-table order.
    pub const ALL: [Shader; 38] = [
        Shader::Remap,
        Shader::SlotMapping,
        Shader::Invalidate,
        Shader::ResolvePrep,
        Shader::Resolve,
        Shader::ResolveSubgroup,
        Shader::TableWrite,
        Shader::HotReset,
        Shader::ResolveWg,
        Shader::ResolveWgSubgroup,
        Shader::ResolveWgLarge,
        Shader::ResolveWgLargeSubgroup,
        Shader::Gather(Windows::One),
        Shader::Gather(Windows::Eight),
        Shader::Gather(Windows::Twelve),
        Shader::Gather(Windows::ThirtyTwo),
        Shader::GatherPerEntry(Windows::One),
        Shader::GatherPerEntry(Windows::Eight),
        Shader::GatherPerEntry(Windows::Twelve),
        Shader::GatherPerEntry(Windows::ThirtyTwo),
        Shader::GatherPerEntryWords(Windows::One),
        Shader::GatherPerEntryWords(Windows::Eight),
        Shader::GatherPerEntryWords(Windows::Twelve),
        Shader::GatherPerEntryWords(Windows::ThirtyTwo),
        Shader::Copy(Windows::One),
        Shader::Copy(Windows::Eight),
        Shader::Copy(Windows::Twelve),
        Shader::Copy(Windows::ThirtyTwo),
        Shader::CopyWords(Windows::One),
        Shader::CopyWords(Windows::Eight),
        Shader::CopyWords(Windows::Twelve),
        Shader::CopyWords(Windows::ThirtyTwo),
        Shader::ResolveOrder,
        Shader::ResolveStats,
        Shader::IndexerBackup(Windows::One),
        Shader::IndexerBackup(Windows::Eight),
        Shader::IndexerBackup(Windows::Twelve),
        Shader::IndexerBackup(Windows::ThirtyTwo),
    ];

    /// Index in [`Shader::ALL`].
    pub fn index(self) -> usize {
        match self {
            Shader::Remap => 0,
            Shader::SlotMapping => 1,
            Shader::Invalidate => 2,
            Shader::ResolvePrep => 3,
            Shader::Resolve => 4,
            Shader::ResolveSubgroup => 5,
            Shader::TableWrite => 6,
            Shader::HotReset => 7,
            Shader::ResolveWg => 8,
            Shader::ResolveWgSubgroup => 9,
            Shader::ResolveWgLarge => 10,
            Shader::ResolveWgLargeSubgroup => 11,
            Shader::Gather(w) => 12 + w.slot(),
            Shader::GatherPerEntry(w) => 16 + w.slot(),
            Shader::GatherPerEntryWords(w) => 20 + w.slot(),
            Shader::Copy(w) => 24 + w.slot(),
            Shader::CopyWords(w) => 28 + w.slot(),
            Shader::ResolveOrder => 32,
            Shader::ResolveStats => 33,
            Shader::IndexerBackup(w) => 34 + w.slot(),
        }
    }

    /// Name of the embedded module (file stem of the SPIR-V).
    pub fn name(self) -> &'static str {
        match self {
            Shader::Remap => "remap",
            Shader::SlotMapping => "slot_mapping",
            Shader::Invalidate => "invalidate",
            Shader::ResolvePrep => "resolve_prep",
            Shader::ResolveOrder => "resolve_order",
            Shader::ResolveStats => "resolve_stats",
            Shader::Resolve => "resolve",
            Shader::ResolveSubgroup => "resolve_sg",
            Shader::TableWrite => "table_write",
            Shader::HotReset => "hot_reset",
            Shader::ResolveWg => "resolve_wg",
            Shader::ResolveWgSubgroup => "resolve_wg_sg",
            Shader::ResolveWgLarge => "resolve_wg_large",
            Shader::ResolveWgLargeSubgroup => "resolve_wg_large_sg",
            Shader::Gather(Windows::One) => "gather_1",
            Shader::Gather(Windows::Eight) => "gather_8",
            Shader::Gather(Windows::Twelve) => "gather_12",
            Shader::Gather(Windows::ThirtyTwo) => "gather_32",
            Shader::GatherPerEntry(Windows::One) => "gather_per_entry_1",
            Shader::GatherPerEntry(Windows::Eight) => "gather_per_entry_8",
            Shader::GatherPerEntry(Windows::Twelve) => "gather_per_entry_12",
            Shader::GatherPerEntry(Windows::ThirtyTwo) => "gather_per_entry_32",
            Shader::GatherPerEntryWords(Windows::One) => "gather_per_entry_words_1",
            Shader::GatherPerEntryWords(Windows::Eight) => "gather_per_entry_words_8",
            Shader::GatherPerEntryWords(Windows::Twelve) => "gather_per_entry_words_12",
            Shader::GatherPerEntryWords(Windows::ThirtyTwo) => "gather_per_entry_words_32",
            Shader::Copy(Windows::One) => "copy_1",
            Shader::Copy(Windows::Eight) => "copy_8",
            Shader::Copy(Windows::Twelve) => "copy_12",
            Shader::Copy(Windows::ThirtyTwo) => "copy_32",
            Shader::CopyWords(Windows::One) => "copyw_1",
            Shader::CopyWords(Windows::Eight) => "copyw_8",
            Shader::CopyWords(Windows::Twelve) => "copyw_12",
            Shader::CopyWords(Windows::ThirtyTwo) => "copyw_32",
            Shader::IndexerBackup(Windows::One) => "indexer_backup_1",
            Shader::IndexerBackup(Windows::Eight) => "indexer_backup_8",
            Shader::IndexerBackup(Windows::Twelve) => "indexer_backup_12",
            Shader::IndexerBackup(Windows::ThirtyTwo) => "indexer_backup_32",
        }
    }

    /// The SPIR-V bytes (little-endian words).
    pub fn spirv(self) -> &'static [u8] {
        match self {
            Shader::Remap => spirv!("remap"),
            Shader::SlotMapping => spirv!("slot_mapping"),
            Shader::Invalidate => spirv!("invalidate"),
            Shader::ResolvePrep => spirv!("resolve_prep"),
            Shader::ResolveOrder => spirv!("resolve_order"),
            Shader::ResolveStats => spirv!("resolve_stats"),
            Shader::Resolve => spirv!("resolve"),
            Shader::ResolveSubgroup => spirv!("resolve_sg"),
            Shader::TableWrite => spirv!("table_write"),
            Shader::HotReset => spirv!("hot_reset"),
            Shader::ResolveWg => spirv!("resolve_wg"),
            Shader::ResolveWgSubgroup => spirv!("resolve_wg_sg"),
            Shader::ResolveWgLarge => spirv!("resolve_wg_large"),
            Shader::ResolveWgLargeSubgroup => spirv!("resolve_wg_large_sg"),
            Shader::Gather(Windows::One) => spirv!("gather_1"),
            Shader::Gather(Windows::Eight) => spirv!("gather_8"),
            Shader::Gather(Windows::Twelve) => spirv!("gather_12"),
            Shader::Gather(Windows::ThirtyTwo) => spirv!("gather_32"),
            Shader::GatherPerEntry(Windows::One) => spirv!("gather_per_entry_1"),
            Shader::GatherPerEntry(Windows::Eight) => spirv!("gather_per_entry_8"),
            Shader::GatherPerEntry(Windows::Twelve) => spirv!("gather_per_entry_12"),
            Shader::GatherPerEntry(Windows::ThirtyTwo) => spirv!("gather_per_entry_32"),
            Shader::GatherPerEntryWords(Windows::One) => spirv!("gather_per_entry_words_1"),
            Shader::GatherPerEntryWords(Windows::Eight) => spirv!("gather_per_entry_words_8"),
            Shader::GatherPerEntryWords(Windows::Twelve) => spirv!("gather_per_entry_words_12"),
            Shader::GatherPerEntryWords(Windows::ThirtyTwo) => spirv!("gather_per_entry_words_32"),
            Shader::Copy(Windows::One) => spirv!("copy_1"),
            Shader::Copy(Windows::Eight) => spirv!("copy_8"),
            Shader::Copy(Windows::Twelve) => spirv!("copy_12"),
            Shader::Copy(Windows::ThirtyTwo) => spirv!("copy_32"),
            Shader::CopyWords(Windows::One) => spirv!("copyw_1"),
            Shader::CopyWords(Windows::Eight) => spirv!("copyw_8"),
            Shader::CopyWords(Windows::Twelve) => spirv!("copyw_12"),
            Shader::CopyWords(Windows::ThirtyTwo) => spirv!("copyw_32"),
            Shader::IndexerBackup(Windows::One) => spirv!("indexer_backup_1"),
            Shader::IndexerBackup(Windows::Eight) => spirv!("indexer_backup_8"),
            Shader::IndexerBackup(Windows::Twelve) => spirv!("indexer_backup_12"),
            Shader::IndexerBackup(Windows::ThirtyTwo) => spirv!("indexer_backup_32"),
        }
    }

    /// Storage-buffer bindings `0..n` of the shader's single descriptor set.
    pub fn bindings(self) -> u32 {
        match self {
            Shader::Remap => 7,
            Shader::SlotMapping => 5,
            Shader::Invalidate => 2,
            Shader::ResolvePrep | Shader::ResolveOrder => 3,
            Shader::ResolveStats => 4,
            Shader::Resolve | Shader::ResolveSubgroup => 22,
            Shader::ResolveWg
            | Shader::ResolveWgSubgroup
            | Shader::ResolveWgLarge
            | Shader::ResolveWgLargeSubgroup => 15,
            Shader::TableWrite => 2,
            Shader::HotReset => 3,
            Shader::Gather(w) | Shader::GatherPerEntry(w) | Shader::GatherPerEntryWords(w) => {
                4 + 2 * w.count()
            }
            Shader::Copy(w) | Shader::CopyWords(w) => 1 + 2 * w.count(),
            Shader::IndexerBackup(w) => 3 + 2 * w.count(),
        }
    }

    /// Whether the shader writes binding `b` (the others it only reads): what the recorder's
    /// hazard tracking needs to place barriers.
    pub fn writes(self, b: u32) -> bool {
        match self {
            Shader::Remap => b >= 4,
            Shader::SlotMapping => b == 4,
            Shader::Invalidate | Shader::TableWrite => b == 1,
            Shader::ResolvePrep | Shader::HotReset => b >= 1,
            Shader::ResolveOrder => b == 2,
            Shader::ResolveStats => b == 3,
            // Binding 21 (idx_mapping) is read only.
            Shader::Resolve | Shader::ResolveSubgroup => {
                (5..=12).contains(&b) || (15..=20).contains(&b)
            }
            // Binding 14 (idx_mapping) is read only.
            Shader::ResolveWg
            | Shader::ResolveWgSubgroup
            | Shader::ResolveWgLarge
            | Shader::ResolveWgLargeSubgroup => (5..=13).contains(&b),
            Shader::Gather(w) | Shader::GatherPerEntry(w) | Shader::GatherPerEntryWords(w) => {
                b >= 4 + w.count()
            }
            // Binding 0 is the tile list, then `count` source windows.
            Shader::Copy(w) | Shader::CopyWords(w) => b > w.count(),
            // The slots and the layer table, then `count` device-pool windows (read).
            Shader::IndexerBackup(w) => b >= 3 + w.count(),
        }
    }

    /// Bytes of push constants.
    pub fn push_bytes(self) -> u32 {
        4 * match self {
            Shader::Remap => 9,
            Shader::SlotMapping => 5,
            Shader::Invalidate
            | Shader::ResolvePrep
            | Shader::ResolveStats
            | Shader::TableWrite => 2,
            Shader::ResolveOrder => 3,
            Shader::Resolve
            | Shader::ResolveSubgroup
            | Shader::ResolveWg
            | Shader::ResolveWgSubgroup
            | Shader::ResolveWgLarge
            | Shader::ResolveWgLargeSubgroup => 10,
            Shader::HotReset
            | Shader::Copy(_)
            | Shader::CopyWords(_)
            | Shader::IndexerBackup(_) => 6,
            Shader::Gather(_) | Shader::GatherPerEntry(_) | Shader::GatherPerEntryWords(_) => 8,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn embedded_spirv_is_aligned_and_starts_with_the_magic_word() {
        for s in Shader::ALL {
            let bytes = s.spirv();
            assert_eq!(bytes.as_ptr() as usize % 4, 0, "{}", s.name());
            assert_eq!(bytes.len() % 4, 0, "{}", s.name());
            assert_eq!(&bytes[..4], &0x0723_0203u32.to_le_bytes(), "{}", s.name());
        }
    }

    #[test]
    fn pipeline_table_indices_follow_all() {
        for (i, s) in Shader::ALL.into_iter().enumerate() {
            assert_eq!(s.index(), i, "{}", s.name());
        }
    }
}
