//! End-to-end multi-step decode pipeline, checked row by row against a pure model that does not
//! use the reference: per step, resolve the top-k of every request (state carried on the device
//! only), gather the miss plan into the hot rows of a leader and its followers, then check that
//! every output index reads exactly the bytes of the token's host row in every layer, that every
//! hot slot holds the bytes of the row its `slot_host_rows` names, and that invalidation after a host rewrite
//! makes the new bytes visible.

use std::collections::HashMap;

use hisparse_core::Device;
use hisparse_core::ops::{
    BlockPair, Direction, GatherArgs, GatherDesc, InvalidateArgs, InvalidateDesc, LayerPair,
    PageCopyDesc, PageLayout, ResolveArgs, ResolveDesc,
};

use crate::util::{Ctx, at_step, dev_bytes, dev_i32, dev_u16, ensure, read_bytes, read_i32};
use crate::{Case, CaseError, CaseResult, SplitMix64};

#[derive(Clone, Copy, Debug)]
struct Pipe {
    k: u32,
    hot_slots: u32,
    requests: u32,
    rows_per_request: u32,
    steps: usize,
    block_size: u32,
    layers: u32,
    row_bytes: u32,
    value_bytes: u32,
    max_ctx: u32,
}

const SMALL: Pipe = Pipe {
    k: 32,
    hot_slots: 96,
    requests: 3,
    rows_per_request: 1,
    steps: 8,
    block_size: 16,
    layers: 3,
    row_bytes: 32,
    value_bytes: 32,
    max_ctx: 400,
};

pub(crate) fn cases<D: Device + 'static>(v: &mut Vec<Case<D>>) {
    let list = [
        ("three-layers", SMALL),
        (
            "speculative",
            Pipe {
                rows_per_request: 2,
                ..SMALL
            },
        ),
        (
            "split-rows",
            Pipe {
                row_bytes: 64,
                value_bytes: 48,
                layers: 2,
                ..SMALL
            },
        ),
        (
            "v32-geometry",
            Pipe {
                k: 2048,
                hot_slots: 4096,
                requests: 1,
                steps: 4,
                block_size: 64,
                layers: 2,
                row_bytes: 656,
                value_bytes: 656,
                max_ctx: 8192,
                ..SMALL
            },
        ),
    ];
    for (name, p) in list {
        v.push(Case::seeded(format!("pipeline/{name}"), move |d: &D, s| {
            run(d, s, p)
        }));
    }
}

/// The bytes of flat host row `g` of `layer` at `version` (a pure function: the model).
fn content(p: &Pipe, seed: u64, layer: u32, g: i32, version: u32) -> Vec<u8> {
    let mut rng =
        SplitMix64::new(seed ^ (u64::from(layer) << 56) ^ ((g as u64) << 16) ^ u64::from(version));
    let mut v = vec![0u8; p.row_bytes as usize];
    rng.fill(&mut v);
    v
}

/// Byte ranges of row `offset` of the page at `page` (values, then scales).
fn parts(p: &Pipe, page: usize, offset: usize) -> [(usize, usize); 2] {
    let (vb, sb) = (
        p.value_bytes as usize,
        (p.row_bytes - p.value_bytes) as usize,
    );
    [
        (page + offset * vb, vb),
        (page + p.block_size as usize * vb + offset * sb, sb),
    ]
}

fn run<D: Device>(dev: &D, seed: u64, p: Pipe) -> CaseResult {
    let mut rng = SplitMix64::new(seed);
    let bs = p.block_size;
    let page = (bs * p.row_bytes) as usize;
    let ctx: Vec<u32> = (0..p.requests)
        .map(|_| rng.u32_in(p.k + 1, p.max_ctx))
        .collect();
    let max_pages = p.max_ctx.div_ceil(bs);
    let total: u32 = ctx.iter().map(|l| l.div_ceil(bs)).sum();
    let host_blocks = total + 1;
    let mut ids: Vec<i32> = (1..host_blocks as i32).collect();
    rng.shuffle(&mut ids);
    let mut ids = ids.into_iter();
    let width = p.hot_slots.div_ceil(bs);
    let hot: Vec<i32> = (0..p.requests * width).map(|i| 1 + i as i32).collect();
    let mut next_gpu = 1 + hot.len() as i32;
    let mut host_table = vec![-1i32; (p.requests * max_pages) as usize];
    let mut resident = vec![0i32; host_table.len()];
    for r in 0..p.requests {
        for pg in 0..ctx[r as usize].div_ceil(bs) {
            let at = (r * max_pages + pg) as usize;
            host_table[at] = ids.next().unwrap_or(-1);
            if rng.percent(25) {
                resident[at] = next_gpu;
                next_gpu += 1;
            }
        }
    }
    let device_blocks = next_gpu as u32;
    let stride = p.layers * bs;
    let n_layers = u64::from(p.layers);
    let layers: Vec<LayerPair> = (0..n_layers)
        .map(|i| LayerPair {
            host: PageLayout {
                base: i * u64::from(host_blocks) * page as u64,
                block_stride: page as u64,
                num_blocks: host_blocks,
                block_size: bs,
                row_bytes: p.row_bytes,
                value_bytes: p.value_bytes,
                index_stride_rows: bs,
            },
            device: PageLayout {
                base: i * page as u64,
                block_stride: n_layers * page as u64,
                num_blocks: device_blocks,
                block_size: bs,
                row_bytes: p.row_bytes,
                value_bytes: p.value_bytes,
                index_stride_rows: stride,
            },
        })
        .collect();

    // The host pool, filled with version 0 of every row, written through the device API.
    let host_len = p.layers as usize * host_blocks as usize * page;
    let mut image = vec![0u8; host_len];
    let mut version: HashMap<i32, u32> = HashMap::new();
    // Writes version `ver` of flat host row `g` (every layer) into the image; returns the byte
    // ranges it wrote.
    let fill_row = |image: &mut [u8], g: i32, ver: u32| -> Vec<(usize, usize)> {
        let mut written = Vec::new();
        for layer in 0..p.layers {
            let base = (layer * host_blocks) as usize * page;
            let (block, off) = ((g / bs as i32) as usize, (g % bs as i32) as usize);
            let bytes = content(&p, seed, layer, g, ver);
            let mut at = 0;
            for (start, len) in parts(&p, base + block * page, off) {
                image[start..start + len].copy_from_slice(&bytes[at..at + len]);
                written.push((start, len));
                at += len;
            }
        }
        written
    };
    for g in 0..(host_blocks * bs) as i32 {
        fill_row(&mut image, g, 0);
    }
    let mut d_host = dev.alloc_pinned(host_len).ctx("alloc_pinned host pool")?;
    dev.write_pinned(&mut d_host, 0, &image)
        .ctx("write_pinned host pool")?;
    // The device pool: garbage, then every resident page restored from the host.
    let dev_len = device_blocks as usize * p.layers as usize * page;
    let mut init = vec![0u8; dev_len];
    rng.fill(&mut init);
    let mut d_pool = dev_bytes(dev, &init)?;
    let s = dev.create_stream().ctx("create_stream")?;
    let restores: Vec<BlockPair> = resident
        .iter()
        .zip(&host_table)
        .filter(|(r, _)| **r > 0)
        .map(|(&r, &h)| BlockPair {
            src: h as u32,
            dst: r as u32,
        })
        .collect();
    dev.copy_pages(
        &s,
        &PageCopyDesc {
            direction: Direction::HostToDevice,
            layers: &layers,
        },
        &restores,
        &mut d_host,
        &mut d_pool,
    )
    .ctx("copy_pages restore of resident pages")?;

    let desc = ResolveDesc {
        num_tokens: 0,
        top_k: p.k,
        num_requests: p.requests,
        max_pages,
        block_size: bs,
        hot_slots: p.hot_slots,
        attention_block_stride: stride,
        host_num_blocks: host_blocks,
        num_state_rows: None,
        stats_slot: 0,
    };
    let n = p.hot_slots as usize;
    let mut d_resident = dev_i32(dev, &resident)?;
    let d_host_table = dev_i32(dev, &host_table)?;
    let d_hot = dev_i32(dev, &hot)?;
    let mut d_slot_host_rows = dev_i32(dev, &vec![-1; p.requests as usize * n])?;
    let lru: Vec<u16> = (0..p.requests as usize * n)
        .map(|i| (i % n) as u16)
        .collect();
    let mut d_lru = dev_u16(dev, &lru)?;

    let mut current: Vec<Vec<i32>> = ctx
        .iter()
        .map(|&l| (0..p.k).map(|_| rng.i32_in(0, l as i32)).collect())
        .collect();
    for step in 0..p.steps {
        // The batch: every request's rows (the speculative ones perturbed), one padding row.
        let mut req_id = Vec::new();
        let mut topk = Vec::new();
        for r in 0..p.requests as usize {
            for tok in current[r].iter_mut() {
                if rng.percent(15) {
                    *tok = rng.i32_in(0, ctx[r] as i32);
                }
            }
            for q in 0..p.rows_per_request {
                req_id.push(r as i32);
                for &tok in &current[r] {
                    topk.push(match rng.below(50) {
                        0 => -1,
                        1 => (max_pages * bs) as i32 + 3,
                        _ if q > 0 && rng.percent(20) => rng.i32_in(0, ctx[r] as i32),
                        _ => tok,
                    });
                }
            }
        }
        req_id.insert(rng.below(req_id.len() as u64 + 1) as usize, -1);
        let at = req_id.iter().position(|&r| r == -1).unwrap_or(0) * p.k as usize;
        topk.splice(at..at, (0..p.k as i32).collect::<Vec<_>>());
        let t = req_id.len();
        let tk = topk.len();

        let d_req = dev_i32(dev, &req_id)?;
        let d_topk = dev_i32(dev, &topk)?;
        let mut outs: Vec<D::Buffer> = [tk, t, t, t, tk, tk]
            .iter()
            .map(|&len| dev_i32(dev, &vec![0; len]))
            .collect::<Result<_, _>>()?;
        let [indices, valid, hits, misses, miss_src, miss_dst] = &mut outs[..] else {
            unreachable!("six outputs")
        };
        dev.resolve(
            &s,
            &ResolveDesc {
                num_tokens: t as u32,
                ..desc
            },
            ResolveArgs {
                req_id: &d_req,
                topk: &d_topk,
                resident_table: &d_resident,
                host_table: &d_host_table,
                hot_table: &d_hot,
                slot_host_rows: &mut d_slot_host_rows,
                lru: &mut d_lru,
                indices,
                valid_counts: valid,
                hit_counts: hits,
                miss_counts: misses,
                miss_src,
                miss_dst,
                idx_mapping: None,
                stats: None,
            },
        )
        .ctx("resolve")?;
        // The leader gathers its layer; the followers apply the same plan to theirs.
        for group in [&layers[..1], &layers[1..]] {
            dev.gather_rows(
                &s,
                &GatherDesc {
                    num_tokens: t as u32,
                    top_k: p.k,
                    layers: group,
                },
                GatherArgs {
                    plan_src: &outs[4],
                    plan_dst: &outs[5],
                    plan_counts: &outs[3],
                    host: &d_host,
                    device: &mut d_pool,
                },
            )
            .ctx("gather_rows")?;
        }
        dev.synchronize(&s).ctx("synchronize")?;

        let model = Model {
            p: &p,
            seed,
            page,
            stride,
            max_pages,
            host_table: &host_table,
            resident: &resident,
            hot: &hot,
            version: &version,
            pool: read_bytes(dev, &d_pool, dev_len)?,
        };
        let got_idx = read_i32(dev, &outs[0], tk)?;
        let got_valid = read_i32(dev, &outs[1], t)?;
        at_step(
            step,
            model.check_outputs(&req_id, &topk, &got_idx, &got_valid),
        )?;
        let slot_host_rows = read_i32(dev, &d_slot_host_rows, p.requests as usize * n)?;
        at_step(step, model.check_slots(&slot_host_rows))?;

        // Between steps: rewrite some host rows the requests are reading (non-resident pages),
        // invalidate them, and reclaim a resident page.
        let mut ranges = Vec::new();
        for _ in 0..3 {
            let r = rng.below(u64::from(p.requests)) as usize;
            let tok = current[r][rng.below(u64::from(p.k)) as usize];
            let at = r * max_pages as usize + (tok as u32 / bs) as usize;
            if resident[at] > 0 || host_table[at] < 0 {
                continue;
            }
            let g = host_table[at] * bs as i32 + tok % bs as i32;
            let ver = version.get(&g).copied().unwrap_or(0) + 1;
            version.insert(g, ver);
            for (start, len) in fill_row(&mut image, g, ver) {
                dev.write_pinned(&mut d_host, start, &image[start..start + len])
                    .ctx("write_pinned a rewritten host row")?;
            }
            ranges.extend_from_slice(&[g, g + 1]);
        }
        let d_ranges = dev_i32(dev, &ranges)?;
        dev.invalidate(
            &s,
            &InvalidateDesc {
                num_requests: p.requests,
                hot_slots: p.hot_slots,
                num_ranges: (ranges.len() / 2) as u32,
            },
            InvalidateArgs {
                ranges: &d_ranges,
                slot_host_rows: &mut d_slot_host_rows,
            },
        )
        .ctx("invalidate")?;
        if let Some(e) = resident.iter_mut().find(|e| **e > 0 && rng.percent(30)) {
            *e = 0;
            dev.upload_i32(&mut d_resident, 0, &resident)
                .ctx("upload resident table")?;
        }
    }
    Ok(())
}

/// What every output must be, computed from the tables and the host contents alone.
struct Model<'a> {
    p: &'a Pipe,
    seed: u64,
    page: usize,
    stride: u32,
    max_pages: u32,
    host_table: &'a [i32],
    resident: &'a [i32],
    hot: &'a [i32],
    version: &'a HashMap<i32, u32>,
    pool: Vec<u8>,
}

impl Model<'_> {
    /// The bytes at flat device row `row` of `layer`.
    fn device_row(&self, layer: u32, row: i32) -> Vec<u8> {
        let (block, off) = (
            (row as u32 / self.stride) as usize,
            (row as u32 % self.stride) as usize,
        );
        let page = block * self.p.layers as usize * self.page + layer as usize * self.page;
        let mut v = Vec::with_capacity(self.p.row_bytes as usize);
        for (start, len) in parts(self.p, page, off) {
            v.extend_from_slice(&self.pool[start..start + len]);
        }
        v
    }

    fn expect_row(&self, row: i32, g: i32, what: &str) -> CaseResult {
        let ver = self.version.get(&g).copied().unwrap_or(0);
        for layer in 0..self.p.layers {
            let want = content(self.p, self.seed, layer, g, ver);
            ensure!(
                self.device_row(layer, row) == want,
                "{what}: device row {row} of layer {layer} does not hold host row {g} (version {ver})"
            );
        }
        Ok(())
    }

    fn check_outputs(
        &self,
        req_id: &[i32],
        topk: &[i32],
        idx: &[i32],
        valid: &[i32],
    ) -> CaseResult {
        let (k, bs) = (self.p.k as usize, self.p.block_size as i32);
        let width = self.p.hot_slots.div_ceil(self.p.block_size) as usize;
        for (t, &r) in req_id.iter().enumerate() {
            let row = &idx[t * k..(t + 1) * k];
            let count = row.iter().filter(|&&v| v != -1).count() as i32;
            ensure!(
                valid[t] == count,
                "row {t}: valid count {} but {count} entries",
                valid[t]
            );
            if r < 0 {
                ensure!(count == 0, "padding row {t} produced indices");
                continue;
            }
            let r = r as usize;
            let hot_blocks = &self.hot[r * width..(r + 1) * width];
            let mut seen: HashMap<i32, i32> = HashMap::new();
            for (j, (&tok, &got)) in topk[t * k..(t + 1) * k].iter().zip(row).enumerate() {
                let what = format!("row {t} (request {r}) entry {j} (token {tok})");
                let pg = if tok < 0 { u32::MAX } else { (tok / bs) as u32 };
                if pg >= self.max_pages {
                    ensure!(got == -1, "{what}: invalid token gave {got}");
                    continue;
                }
                let at = r * self.max_pages as usize + pg as usize;
                let off = tok % bs;
                if self.resident[at] > 0 {
                    let want = self.resident[at] * self.stride as i32 + off;
                    ensure!(
                        got == want,
                        "{what}: resident row {want} expected, got {got}"
                    );
                    self.expect_row(got, self.host_table[at] * bs + off, &what)?;
                    continue;
                }
                if self.host_table[at] < 0 {
                    ensure!(got == -1, "{what}: a page without host block gave {got}");
                    continue;
                }
                let g = self.host_table[at] * bs + off;
                ensure!(got >= 0, "{what}: host row {g} got no hot row");
                let block = got / self.stride as i32;
                ensure!(
                    hot_blocks.contains(&block) && (got % self.stride as i32) < bs,
                    "{what}: index {got} is outside request {r}'s hot region"
                );
                if let Some(&prev) = seen.get(&g) {
                    ensure!(prev == got, "{what}: host row {g} at {got} and at {prev}");
                }
                seen.insert(g, got);
                self.expect_row(got, g, &what)?;
            }
        }
        Ok(())
    }

    /// Every hot slot whose `slot_host_rows` names a host row holds exactly that row's current bytes.
    fn check_slots(&self, slot_host_rows: &[i32]) -> CaseResult {
        let n = self.p.hot_slots as usize;
        let bs = self.p.block_size as usize;
        let width = self.p.hot_slots.div_ceil(self.p.block_size) as usize;
        for (i, &g) in slot_host_rows.iter().enumerate() {
            if g < 0 {
                continue;
            }
            let (r, slot) = (i / n, i % n);
            let block = self.hot[r * width + slot / bs];
            let row = block * self.stride as i32 + (slot % bs) as i32;
            self.expect_row(row, g, &format!("hot slot {slot} of request {r}"))
                .map_err(|e| match e {
                    CaseError::Fail(m) => CaseError::Fail(format!("{m} (stale hot slot)")),
                    other => other,
                })?;
        }
        Ok(())
    }
}
