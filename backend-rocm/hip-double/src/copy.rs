//! The copy kernels (`hs_gather_rows`, the gather of `hs_resolve_gather`, `hs_copy_pages`,
//! `hs_copy_rows`) emulated access by access, exactly as the shared kernel source chunks them:
//! a row's value part in 16-byte chunks, its scale part in words of the layout's `scale_word`
//! bytes (8 or 4; any other value is 16, as the kernels read it), a page in 16-byte chunks and its
//! last `page_bytes % 16` bytes in 4-byte words. Every access must be aligned to its width and lie
//! inside the buffer, or the launch faults; bytes the kernels would not copy (a scale part that is
//! not a whole number of words, a page tail that is not a whole number of 4-byte words) are not
//! copied here either. So a geometry the kernels copy wrong fails here too, instead of passing
//! through a reference implementation.

use hisparse_core::ops::PageLayout;
use hisparse_gpu_kernels as gk;

use crate::exec::{Params, overlap_error, overlaps_between, overlaps_within, range, read_i32};
use crate::state::State;

/// `struct hs_layout` as the kernels read it.
#[derive(Clone, Copy, Debug)]
struct KernelLayout {
    page: PageLayout,
    scale_word: u32,
}

fn u32_at(b: &[u8], at: usize) -> u32 {
    u32::from_ne_bytes(b[at..at + 4].try_into().expect("4 bytes"))
}

fn u64_at(b: &[u8], at: usize) -> u64 {
    u64::from_ne_bytes(b[at..at + 8].try_into().expect("8 bytes"))
}

impl KernelLayout {
    /// Decodes `struct hs_layout` (40 bytes).
    fn decode(b: &[u8]) -> Self {
        KernelLayout {
            page: PageLayout {
                base: u64_at(b, 0),
                block_stride: u64_at(b, 8),
                num_blocks: u32_at(b, 16),
                block_size: u32_at(b, 20),
                row_bytes: u32_at(b, 24),
                value_bytes: u32_at(b, 28),
                index_stride_rows: u32_at(b, 32),
            },
            scale_word: u32_at(b, 36),
        }
    }

    /// The instantiation the kernels branch to: scale words of 8 or 4 bytes, else 16.
    fn word(&self) -> u32 {
        match self.scale_word {
            8 => 8,
            4 => 4,
            _ => 16,
        }
    }

    /// 16-byte value chunks of a row (`value_bytes >> 4`).
    fn value_chunks(&self) -> u32 {
        self.page.value_bytes >> 4
    }

    /// Units of a row (`hs_row_units<W>`): value chunks, then whole scale words.
    fn units(&self) -> u32 {
        let l = &self.page;
        match self.word() {
            16 => l.row_bytes >> 4,
            w => self.value_chunks() + l.row_bytes.wrapping_sub(l.value_bytes) / w,
        }
    }

    /// `hs_locate`: `(block, offset)` of flat row `row`, or `None` outside the pool or in
    /// another layer's part of a block. A zero divisor is a fault (the kernel divides by it).
    fn locate(&self, row: i32) -> Result<Option<(u32, u32)>, String> {
        if row < 0 {
            return Ok(None);
        }
        let l = &self.page;
        if l.index_stride_rows == 0 {
            return Err("index_stride_rows is 0: the kernel divides by it".into());
        }
        let (b, o) = (
            row as u32 / l.index_stride_rows,
            row as u32 % l.index_stride_rows,
        );
        Ok((b < l.num_blocks && o < l.block_size).then_some((b, o)))
    }

    /// `hs_row_parts`: byte offsets of the value part and the scale part of `(block, offset)`.
    fn parts(&self, block: u32, offset: u32) -> (u64, u64) {
        let l = &self.page;
        let page = l
            .base
            .wrapping_add(u64::from(block).wrapping_mul(l.block_stride));
        let values = page.wrapping_add(u64::from(offset) * u64::from(l.value_bytes));
        let scales = page
            .wrapping_add(u64::from(l.block_size) * u64::from(l.value_bytes))
            .wrapping_add(u64::from(offset) * u64::from(l.row_bytes.wrapping_sub(l.value_bytes)));
        (values, scales)
    }
}

/// Unit `c` of a row whose parts start at `(values, scales)`, with `vc` value chunks and scale
/// words of `w` bytes (`hs_load_unit` / `hs_store_unit`): its offset and width.
fn unit(values: u64, scales: u64, vc: u32, w: u32, c: u32) -> (u64, usize) {
    if c < vc {
        (values.wrapping_add(u64::from(c) << 4), 16)
    } else {
        (
            scales.wrapping_add(u64::from(c - vc) * u64::from(w)),
            w as usize,
        )
    }
}

/// A buffer as a kernel sees it: the bytes from its pointer argument to the end of the
/// allocation, and where they start (alignment is of absolute addresses).
struct View {
    what: &'static str,
    addr: usize,
    bytes: Vec<u8>,
}

impl View {
    fn of(st: &State, what: &'static str, addr: usize) -> Result<View, String> {
        let room = st
            .room(addr)
            .ok_or_else(|| format!("`{what}` at {addr:#x} is not inside an allocation"))?;
        Ok(View {
            what,
            addr,
            bytes: crate::mem::read(st, addr, room),
        })
    }

    /// The range of an access of `width` bytes at offset `at`, or the fault it is.
    fn access(&self, at: u64, width: usize) -> Result<std::ops::Range<usize>, String> {
        let end = at.checked_add(width as u64);
        if end.is_none_or(|e| e > self.bytes.len() as u64) {
            return Err(format!(
                "a {width}-byte access at `{}` + {at} runs past its allocation ({} bytes from the \
                 pointer)",
                self.what,
                self.bytes.len()
            ));
        }
        let abs = self.addr as u64 + at;
        if !abs.is_multiple_of(width as u64) {
            return Err(format!(
                "misaligned {width}-byte access at {abs:#x} (`{}` + {at}): a GPU faults on it",
                self.what
            ));
        }
        Ok(at as usize..at as usize + width)
    }

    fn write_back(&self, st: &State) {
        crate::mem::write(st, self.addr, &self.bytes);
    }
}

/// One row copied as `hs_gather_row` or `hs_copy_span` copies it: the source layout's units, read
/// from the source row's parts (or zeros without a source), written to the destination row's
/// parts at the same unit offsets.
fn copy_row(
    units_of: &KernelLayout,
    src: Option<(&View, (u64, u64))>,
    dst: (&mut View, (u64, u64)),
) -> Result<(), String> {
    let (vc, w, n) = (units_of.value_chunks(), units_of.word(), units_of.units());
    let (out, (dv, ds)) = dst;
    for c in 0..n {
        let mut v = [0u8; 16];
        let (at, width) = unit(dv, ds, vc, w, c);
        if let Some((view, (sv, ss))) = src {
            let (from, width) = unit(sv, ss, vc, w, c);
            let r = view.access(from, width)?;
            v[..width].copy_from_slice(&view.bytes[r]);
        }
        let r = out.access(at, width)?;
        out.bytes[r].copy_from_slice(&v[..width]);
    }
    Ok(())
}

/// The gather of `hs_gather_rows`, or the one `hs_resolve_gather` does after its resolve, with
/// the plan in the parameters named `plan` (sources, destinations, counts).
pub(crate) fn gather(
    st: &mut State,
    p: &Params<'_>,
    plan: (&str, &str, &str),
) -> Result<(), String> {
    let g = p.raw("layers");
    let count = u32_at(g, 0) as usize;
    if count == 0 || count > gk::GATHER_MAX_LAYERS {
        return Err(format!(
            "layers.count = {count} is outside 1..={}",
            gk::GATHER_MAX_LAYERS
        ));
    }
    let layers: Vec<(KernelLayout, KernelLayout)> = (0..count)
        .map(|i| {
            let b = &g[16 + 80 * i..16 + 80 * (i + 1)];
            (
                KernelLayout::decode(&b[..40]),
                KernelLayout::decode(&b[40..80]),
            )
        })
        .collect();
    let (t, k) = (p.u32("num_tokens") as usize, p.u32("top_k") as usize);
    let src = read_i32(st, plan.0, p.ptr(plan.0), t * k)?;
    let dst = read_i32(st, plan.1, p.ptr(plan.1), t * k)?;
    let counts = read_i32(st, plan.2, p.ptr(plan.2), t)?;
    let host = View::of(st, "host", p.ptr("host"))?;
    let mut device = View::of(st, "device", p.ptr("device"))?;
    for (lh, ld) in &layers {
        for (row, &count) in counts.iter().enumerate() {
            let n = count.clamp(0, k as i32) as usize;
            for e in row * k..row * k + n {
                let Some((db, doff)) = ld.locate(dst[e])? else {
                    continue;
                };
                let from = lh.locate(src[e])?.map(|(b, o)| (&host, lh.parts(b, o)));
                copy_row(lh, from, (&mut device, ld.parts(db, doff)))?;
            }
        }
    }
    device.write_back(st);
    Ok(())
}

/// `hs_copy_pages`: for every (job, pair) tile, the page's 16-byte chunks and its tail's 4-byte
/// words (`page_bytes` rounded down to 4 bytes; the kernel drops the rest). The kernel's
/// contract: destinations disjoint from each other and from every source of the launch.
pub(crate) fn copy_pages(st: &mut State, p: &Params<'_>) -> Result<(), String> {
    let (nl, np) = (p.u32("num_layers") as usize, p.u32("num_pairs") as usize);
    range(st, "jobs", p.ptr("jobs"), nl * 40)?;
    range(st, "pairs", p.ptr("pairs"), np * 8)?;
    let jobs = crate::mem::read(st, p.ptr("jobs"), nl * 40);
    let pairs = crate::mem::read(st, p.ptr("pairs"), np * 8);
    let (src, dst) = (p.ptr("src"), p.ptr("dst"));
    let mut tiles = Vec::with_capacity(nl * np);
    for pi in 0..np {
        for ji in 0..nl {
            let j = &jobs[40 * ji..40 * (ji + 1)];
            let (ps, pd) = (
                u64::from(u32_at(&pairs, 8 * pi)),
                u64::from(u32_at(&pairs, 8 * pi + 4)),
            );
            let page_bytes = u64_at(j, 32);
            let len = (page_bytes & !3) as usize;
            let s =
                src.wrapping_add(u64_at(j, 0).wrapping_add(ps.wrapping_mul(u64_at(j, 8))) as usize);
            let d = dst
                .wrapping_add(u64_at(j, 16).wrapping_add(pd.wrapping_mul(u64_at(j, 24))) as usize);
            // 16-byte chunks from each page's start (the tail's words are then 4-byte aligned).
            if page_bytes >= 16 {
                for (what, at) in [("source page", s), ("destination page", d)] {
                    if !at.is_multiple_of(16) {
                        return Err(format!(
                            "misaligned 16-byte access at {at:#x} ({what} start): a GPU faults \
                             on it"
                        ));
                    }
                }
            } else if len > 0 && !(s.is_multiple_of(4) && d.is_multiple_of(4)) {
                return Err(format!(
                    "misaligned 4-byte access at {s:#x} or {d:#x} (page tail): a GPU faults on it"
                ));
            }
            range(st, "src page", s, len)?;
            range(st, "dst page", d, len)?;
            tiles.push((s, d, len));
        }
    }
    let srcs: Vec<(usize, usize)> = tiles.iter().map(|t| (t.0, t.2)).collect();
    let dsts: Vec<(usize, usize)> = tiles.iter().map(|t| (t.1, t.2)).collect();
    if overlaps_within(&dsts) {
        return Err(overlap_error("destination pages"));
    }
    if overlaps_between(&dsts, &srcs) {
        return Err(overlap_error("destination and source pages"));
    }
    for (s, d, len) in tiles {
        let bytes = crate::mem::read(st, s, len);
        crate::mem::write(st, d, &bytes);
    }
    Ok(())
}

/// `hs_copy_rows`: for every (layer, span) tile, each row of the span in the source layout's
/// units, from the source row's parts to the destination row's. The kernel's contract:
/// destination rows of one launch are disjoint.
pub(crate) fn copy_rows(st: &mut State, p: &Params<'_>) -> Result<(), String> {
    let (nl, ns) = (p.u32("num_layers") as usize, p.u32("num_spans") as usize);
    range(st, "layers", p.ptr("layers"), nl * 80)?;
    range(st, "spans", p.ptr("spans"), ns * 16)?;
    let lb = crate::mem::read(st, p.ptr("layers"), nl * 80);
    let sb = crate::mem::read(st, p.ptr("spans"), ns * 16);
    let layers: Vec<(KernelLayout, KernelLayout)> = (0..nl)
        .map(|i| {
            let b = &lb[80 * i..80 * (i + 1)];
            (
                KernelLayout::decode(&b[..40]),
                KernelLayout::decode(&b[40..80]),
            )
        })
        .collect();
    // (device_block, host_block, first_row, num_rows)
    let spans: Vec<[u32; 4]> = (0..ns)
        .map(|i| std::array::from_fn(|f| u32_at(&sb, 16 * i + 4 * f)))
        .collect();
    let to_host = match p.u32("direction") {
        gk::DIRECTION_DEVICE_TO_HOST => true,
        gk::DIRECTION_HOST_TO_DEVICE => false,
        d => return Err(format!("direction {d} is neither 0 nor 1")),
    };
    let host = View::of(st, "host", p.ptr("host"))?;
    let device = View::of(st, "device", p.ptr("device"))?;
    let (src, mut dst) = if to_host {
        (device, host)
    } else {
        (host, device)
    };
    let mut written = Vec::new();
    for (lh, ld) in &layers {
        let (sl, dl) = if to_host { (ld, lh) } else { (lh, ld) };
        for &[device_block, host_block, first, rows] in &spans {
            let (sblock, dblock) = if to_host {
                (device_block, host_block)
            } else {
                (host_block, device_block)
            };
            for row in first..first.wrapping_add(rows) {
                let to = dl.parts(dblock, row);
                copy_row(sl, Some((&src, sl.parts(sblock, row))), (&mut dst, to))?;
                let (vc, w) = (sl.value_chunks(), sl.word());
                written.extend((0..sl.units()).map(|c| {
                    let (at, width) = unit(to.0, to.1, vc, w, c);
                    (at as usize, width)
                }));
            }
        }
    }
    if overlaps_within(&written) {
        return Err(overlap_error("destination rows"));
    }
    dst.write_back(st);
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::state::Kind;
    use gk::plan::{self, Target};
    use hisparse_core::ops::copy::gather_rows;
    use hisparse_core::ops::{BlockPair, GatherArgs, GatherDesc, LayerPair};

    const TARGET: Target = Target {
        multiprocessors: 4,
        shared_per_block: 64 * 1024,
        shared_per_multiprocessor: 64 * 1024,
        resolve_blocks_per_multiprocessor: 2,
    };

    /// Runs the planned launches through the double's emulation, the plan's lists staged in
    /// device memory.
    fn execute(st: &mut State, plan: gk::plan::Plan) -> Result<(), String> {
        let staged: Vec<u64> = plan
            .staged
            .iter()
            .map(|p| {
                let at = crate::mem::alloc(st, p.bytes.len().max(16), Kind::Device).expect("alloc");
                crate::mem::write(st, at, &p.bytes);
                at as u64
            })
            .collect();
        for mut l in plan.launches {
            l.args.resolve(&staged, 0, 0)?;
            let abi = l.kernel.abi();
            let args: Vec<Vec<u8>> = (0..abi.params.len())
                .map(|i| l.args.value(i).expect("packed").to_vec())
                .collect();
            let p = Params { abi, args: &args };
            match l.kernel {
                gk::Kernel::CopyPages => copy_pages(st, &p)?,
                gk::Kernel::GatherRows => gather(st, &p, ("plan_src", "plan_dst", "plan_counts"))?,
                k => panic!("{k:?} is not a copy kernel"),
            }
        }
        Ok(())
    }

    fn filled(st: &mut State, len: usize, seed: u8) -> (usize, Vec<u8>) {
        let bytes: Vec<u8> = (0..len)
            .map(|i| (i as u8).wrapping_mul(31) ^ seed)
            .collect();
        let at = crate::mem::alloc(st, len, Kind::Device).expect("alloc");
        crate::mem::write(st, at, &bytes);
        (at, bytes)
    }

    #[test]
    fn page_tails_move_as_words_and_misaligned_pages_fault() {
        let mut st = State::default();
        // Three 20-byte rows (16 + 4): 60-byte pages, 64 bytes apart.
        let l = PageLayout {
            value_bytes: 16,
            ..PageLayout::contiguous(0, 64, 4, 3, 20)
        };
        let (src, s) = filled(&mut st, 256, 1);
        let (dst, mut want) = filled(&mut st, 256, 2);
        let pairs = [BlockPair { src: 1, dst: 2 }];
        let p =
            plan::copy_pages(&TARGET, &[(l, l)], &pairs, src as u64, dst as u64, false).unwrap();
        execute(&mut st, p).unwrap();
        want[128..188].copy_from_slice(&s[64..124]);
        assert_eq!(
            crate::mem::read(&st, dst, 256),
            want,
            "exactly 60 bytes per page"
        );
        // A page at an 8-byte offset: the kernel's first 16-byte access faults.
        let mut p =
            plan::copy_pages(&TARGET, &[(l, l)], &pairs, src as u64, dst as u64, false).unwrap();
        let job = &mut p.staged[0].bytes;
        job[..8].copy_from_slice(&8u64.to_ne_bytes());
        let e = execute(&mut st, p).unwrap_err();
        assert!(e.contains("misaligned 16-byte access"), "{e}");
    }

    #[test]
    fn gathers_copy_what_the_kernel_chunking_copies() {
        // DeepSeek V4 rows: 576 value bytes and an 8-byte scale part, 3 rows a page.
        let l = PageLayout {
            value_bytes: 576,
            ..PageLayout::contiguous(0, 1760, 3, 3, 584)
        };
        let layers = [LayerPair { host: l, device: l }];
        let desc = GatherDesc {
            num_tokens: 1,
            top_k: 3,
            layers: &layers,
        };
        let (src, dst, counts) = ([4i32, -1, 1], [7i32, 3, 5], [3i32]);
        let run = |scale_word: Option<u32>| {
            let mut st = State::default();
            let (host, h) = filled(&mut st, 3 * 1760, 3);
            let (device, d) = filled(&mut st, 3 * 1760, 4);
            let mut plan_of = |v: &[i32]| {
                let at = crate::mem::alloc(&mut st, 16, Kind::Device).expect("alloc");
                let b: Vec<u8> = v.iter().flat_map(|x| x.to_ne_bytes()).collect();
                crate::mem::write(&st, at, &b);
                at as u64
            };
            let addrs = plan::GatherAddrs {
                plan_src: plan_of(&src),
                plan_dst: plan_of(&dst),
                plan_counts: plan_of(&counts),
                host: host as u64,
                device: device as u64,
            };
            let mut p = plan::gather(&TARGET, &desc, &addrs, plan::GatherWalk::Auto).unwrap();
            if let Some(w) = scale_word {
                // What the kernels would be told by a planner that ignored the scale part's
                // width: `struct hs_layout::scale_word` of both layouts of layer 0.
                let mut g = gk::GatherLayers::new(&layers);
                g.layer[0].host.scale_word = w;
                g.layer[0].device.scale_word = w;
                let mut args = gk::args::Args::default();
                for i in 0..7 {
                    let b = p.launches[0].args.value(i).unwrap();
                    match b.len() {
                        8 => args.ptr(u64::from_ne_bytes(b.try_into().unwrap())),
                        _ => args.u32(u32::from_ne_bytes(b.try_into().unwrap())),
                    };
                }
                let walk = p.launches[0].args.value(8).unwrap();
                args.gather_layers(&g)
                    .u32(u32::from_ne_bytes(walk.try_into().unwrap()));
                p.launches[0].args = args;
            }
            execute(&mut st, p).unwrap();
            let got = crate::mem::read(&st, device, d.len());
            let mut want = d.clone();
            gather_rows(
                &desc,
                GatherArgs {
                    plan_src: &src[..],
                    plan_dst: &dst[..],
                    plan_counts: &counts[..],
                    host: &h[..],
                    device: &mut want[..],
                },
            )
            .unwrap();
            (got, want, d)
        };
        let (got, want, _) = run(None);
        assert_eq!(got, want, "8-byte scale words copy every byte");
        // As 16-byte units, a 584-byte row is its 36 value chunks: the scale bytes stay as they
        // were, so the double does not pass what such a kernel would get wrong.
        let (got, want, before) = run(Some(16));
        assert_ne!(got, want);
        let scale_bytes: Vec<usize> = dst
            .iter()
            .flat_map(|&r| {
                let (block, offset) = (r as usize / 3, r as usize % 3);
                let at = block * 1760 + 3 * 576 + offset * 8;
                at..at + 8
            })
            .collect();
        for (i, (&g, &w)) in got.iter().zip(&want).enumerate() {
            if scale_bytes.contains(&i) {
                assert_eq!(g, before[i], "scale byte {i} is not copied");
            } else {
                assert_eq!(g, w, "byte {i}");
            }
        }
    }
}
