//! Kernel arguments packed exactly as the ABI table of `hisparse-gpu-kernels` declares them, and the
//! byte encodings of the `#[repr(C)]` structs kernels read from memory.
//!
//! Everything here is safe code: values are serialised field by field in native byte order, the
//! order and sizes the C structs of the kernel source have (asserted in `hisparse-gpu-kernels`).

use hisparse_gpu_kernels::{
    GatherLayers, KernelAbi, LayerPairAbi, Layout, PageJob, Pair, Param, Span,
};

/// Kernel parameters: each value in its own 8-byte aligned slot of one arena.
#[derive(Debug, Default)]
pub(crate) struct Args {
    words: Vec<u64>,
    slots: Vec<(usize, Param)>,
}

impl Args {
    fn push_bytes(&mut self, ty: Param, bytes: &[u8]) -> &mut Self {
        let at = self.words.len();
        for chunk in bytes.chunks(8) {
            let mut w = [0u8; 8];
            w[..chunk.len()].copy_from_slice(chunk);
            self.words.push(u64::from_ne_bytes(w));
        }
        self.slots.push((at, ty));
        self
    }

    /// A device address.
    pub(crate) fn ptr(&mut self, addr: u64) -> &mut Self {
        self.push_bytes(Param::Ptr, &addr.to_ne_bytes())
    }

    /// A `uint32_t`.
    pub(crate) fn u32(&mut self, v: u32) -> &mut Self {
        self.push_bytes(Param::U32, &v.to_ne_bytes())
    }

    /// A `uint64_t`.
    pub(crate) fn u64(&mut self, v: u64) -> &mut Self {
        self.push_bytes(Param::U64, &v.to_ne_bytes())
    }

    /// A `hs_gather_layers` by value.
    pub(crate) fn gather_layers(&mut self, g: &GatherLayers) -> &mut Self {
        let mut b = Vec::with_capacity(Param::GatherLayers.size());
        gather_layers_bytes(g, &mut b);
        self.push_bytes(Param::GatherLayers, &b)
    }

    /// Checks the parameter types against `abi`; `Err` names the first difference.
    pub(crate) fn matches(&self, abi: &KernelAbi) -> Result<(), String> {
        if self.slots.len() != abi.params.len() {
            return Err(format!(
                "{}: {} arguments packed, the ABI declares {}",
                abi.name,
                self.slots.len(),
                abi.params.len()
            ));
        }
        for (i, ((_, ty), p)) in self.slots.iter().zip(abi.params).enumerate() {
            if *ty != p.ty {
                return Err(format!(
                    "{}: argument {i} (`{}`) packed as {ty:?}, the ABI declares {:?}",
                    abi.name, p.name, p.ty
                ));
            }
        }
        Ok(())
    }

    /// The `void*` array `hipModuleLaunchKernel` takes: one pointer per parameter, into the arena.
    /// The arena must not be touched while the pointers are in use.
    pub(crate) fn pointers(&mut self) -> Vec<*mut std::ffi::c_void> {
        let base = self.words.as_mut_ptr();
        self.slots
            .iter()
            .map(|&(at, _)| base.wrapping_add(at).cast())
            .collect()
    }
}

/// Appends `struct hs_layout` (40 bytes).
pub(crate) fn layout_bytes(l: &Layout, out: &mut Vec<u8>) {
    out.extend_from_slice(&l.base.to_ne_bytes());
    out.extend_from_slice(&l.block_stride.to_ne_bytes());
    for v in [
        l.num_blocks,
        l.block_size,
        l.row_bytes,
        l.value_bytes,
        l.index_stride_rows,
        l.pad,
    ] {
        out.extend_from_slice(&v.to_ne_bytes());
    }
}

/// Appends `struct hs_layer_pair` (80 bytes).
pub(crate) fn layer_pair_bytes(l: &LayerPairAbi, out: &mut Vec<u8>) {
    layout_bytes(&l.host, out);
    layout_bytes(&l.device, out);
}

/// Appends `struct hs_gather_layers` (1296 bytes).
pub(crate) fn gather_layers_bytes(g: &GatherLayers, out: &mut Vec<u8>) {
    out.extend_from_slice(&g.count.to_ne_bytes());
    for p in g.pad {
        out.extend_from_slice(&p.to_ne_bytes());
    }
    for l in &g.layer {
        layer_pair_bytes(l, out);
    }
}

/// Appends `struct hs_page_job` (40 bytes).
pub(crate) fn page_job_bytes(j: &PageJob, out: &mut Vec<u8>) {
    for v in [
        j.src_base,
        j.src_stride,
        j.dst_base,
        j.dst_stride,
        j.page_bytes,
    ] {
        out.extend_from_slice(&v.to_ne_bytes());
    }
}

/// Appends `struct hs_pair` (8 bytes).
pub(crate) fn pair_bytes(p: &Pair, out: &mut Vec<u8>) {
    out.extend_from_slice(&p.src.to_ne_bytes());
    out.extend_from_slice(&p.dst.to_ne_bytes());
}

/// Appends `struct hs_span` (16 bytes).
pub(crate) fn span_bytes(s: &Span, out: &mut Vec<u8>) {
    for v in [s.device_block, s.host_block, s.first_row, s.num_rows] {
        out.extend_from_slice(&v.to_ne_bytes());
    }
}

/// Pads `out` to a multiple of 16 bytes.
pub(crate) fn pad16(out: &mut Vec<u8>) {
    while !out.len().is_multiple_of(16) {
        out.push(0);
    }
}

/// Whether any two ranges `(start, len)` of `a` overlap (empty ranges never do).
pub(crate) fn overlaps_within(a: &[(u64, u64)]) -> bool {
    let mut v: Vec<(u64, u64)> = a.iter().copied().filter(|r| r.1 > 0).collect();
    v.sort_unstable();
    v.windows(2).any(|w| w[0].0 + w[0].1 > w[1].0)
}

/// Whether any range of `a` overlaps any range of `b`.
pub(crate) fn overlaps_between(a: &[(u64, u64)], b: &[(u64, u64)]) -> bool {
    let mut all: Vec<(u64, u64, bool)> = a
        .iter()
        .map(|&(s, l)| (s, l, false))
        .chain(b.iter().map(|&(s, l)| (s, l, true)))
        .filter(|r| r.1 > 0)
        .collect();
    all.sort_unstable();
    // Sweep: the furthest end seen so far in each set.
    let (mut end_a, mut end_b) = (0u64, 0u64);
    for (s, l, in_b) in all {
        if in_b {
            if s < end_a {
                return true;
            }
            end_b = end_b.max(s + l);
        } else {
            if s < end_b {
                return true;
            }
            end_a = end_a.max(s + l);
        }
    }
    false
}

#[cfg(test)]
mod tests {
    use super::*;
    use hisparse_gpu_kernels::Kernel;

    #[test]
    fn struct_encodings_have_the_c_sizes() {
        let mut b = Vec::new();
        layout_bytes(&Layout::default(), &mut b);
        assert_eq!(b.len(), 40);
        b.clear();
        gather_layers_bytes(&GatherLayers::new(&[]), &mut b);
        assert_eq!(b.len(), 1296);
        b.clear();
        page_job_bytes(&PageJob::default(), &mut b);
        pair_bytes(&Pair::default(), &mut b);
        span_bytes(&Span::default(), &mut b);
        assert_eq!(b.len(), 40 + 8 + 16);
    }

    #[test]
    fn layout_encoding_puts_fields_in_c_order() {
        let l = Layout {
            base: 1,
            block_stride: 2,
            num_blocks: 3,
            block_size: 4,
            row_bytes: 5,
            value_bytes: 6,
            index_stride_rows: 7,
            pad: 0,
        };
        let mut b = Vec::new();
        layout_bytes(&l, &mut b);
        assert_eq!(u64::from_ne_bytes(b[8..16].try_into().unwrap()), 2);
        assert_eq!(u32::from_ne_bytes(b[16..20].try_into().unwrap()), 3);
        assert_eq!(u32::from_ne_bytes(b[32..36].try_into().unwrap()), 7);
    }

    #[test]
    fn packing_is_checked_against_the_abi() {
        let mut a = Args::default();
        a.ptr(1).u32(2).ptr(3).u64(4);
        assert!(a.matches(&Kernel::Invalidate.abi()).is_ok());
        let mut wrong = Args::default();
        wrong.ptr(1).u32(2).ptr(3).u32(4);
        let e = wrong.matches(&Kernel::Invalidate.abi()).unwrap_err();
        assert!(e.contains("`total`"), "{e}");
        assert!(Args::default().matches(&Kernel::Remap.abi()).is_err());
    }

    #[test]
    fn argument_values_land_in_their_slots() {
        let mut a = Args::default();
        a.u32(0xdead_beef).ptr(0x1234_5678_9abc).u64(7);
        let p = a.pointers();
        assert_eq!(p.len(), 3);
        let first = a.words[0].to_ne_bytes();
        assert_eq!(
            u32::from_ne_bytes(first[..4].try_into().unwrap()),
            0xdead_beef
        );
        assert_eq!(a.words[1], 0x1234_5678_9abc);
        assert_eq!(a.words[2], 7);
    }

    #[test]
    fn overlap_checks() {
        assert!(!overlaps_within(&[(0, 16), (16, 16), (64, 0), (64, 8)]));
        assert!(overlaps_within(&[(0, 17), (16, 16)]));
        assert!(!overlaps_between(&[(0, 16), (48, 16)], &[(16, 32)]));
        assert!(overlaps_between(&[(0, 16), (40, 16)], &[(16, 32)]));
        assert!(overlaps_between(&[(16, 32)], &[(0, 100)]));
        assert!(!overlaps_between(&[(0, 0)], &[(0, 16)]));
    }
}
