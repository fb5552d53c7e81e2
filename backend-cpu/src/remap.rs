//! Index remap (contract §5.1) over checked slices.

use hisparse_core::ops::{RemapDesc, fill_remap_row, physical_row};

/// Remaps every token row; returns the valid entries of all rows (wrapping), what a stats
/// buffer counts. `desc` must have been checked against these buffers.
pub(crate) fn remap(
    desc: &RemapDesc,
    req_id: &[i32],
    block_table: &[i32],
    topk: &[i32],
    idx_mapping: Option<&[i32]>,
    out: &mut [i32],
    mut counts: Option<&mut [i32]>,
) -> u32 {
    let k = desc.top_k as usize;
    let bs = desc.block_size;
    let m = desc.max_blocks as usize;
    let stride = desc.block_stride_rows;
    let mut valid_total = 0u32;
    for t in 0..desc.num_tokens as usize {
        let out_row = &mut out[t * k..(t + 1) * k];
        let toks = &topk[t * k..(t + 1) * k];
        let valid = match desc.table_row(req_id[t], idx_mapping) {
            None => {
                out_row.fill(-1);
                0
            }
            Some(row) => {
                let table = &block_table[row * m..(row + 1) * m];
                let rows = toks.iter().map(|&tok| match u32::try_from(tok) {
                    Ok(tok) => match table.get((tok / bs) as usize) {
                        Some(&block) => physical_row(block, stride, tok % bs),
                        None => -1,
                    },
                    Err(_) => -1,
                });
                fill_remap_row(out_row, desc.compact, rows)
            }
        };
        if let Some(c) = counts.as_deref_mut() {
            c[t] = valid as i32;
        }
        valid_total = valid_total.wrapping_add(valid as u32);
    }
    valid_total
}
