//! What an engine's own kernels read, through the C API on the CPU backend (where a device
//! address is host memory): the step's slot mapping against the views and the block tables, a
//! forward pass that writes every KV row through the slot mapping and a decode that reads them
//! back, the batch table padded for a graph, streams per call, and the refusals around them.

// The `c!` macro wraps each C call in `unsafe`: the tests are C callers.
#![allow(clippy::macro_metavars_in_unsafe)]

mod common;

use std::ffi::c_void;
use std::ptr;

use common::*;
use hisparse_capi::*;

/// The int32 elements of a CPU-backend device array.
fn host_view(a: &HsDeviceArray) -> &[i32] {
    // SAFETY: on the CPU backend a device array's address is host memory holding `rows * cols`
    // int32s that the runtime keeps for its life; the tests read it only between calls.
    unsafe {
        std::slice::from_raw_parts(a.address as usize as *const i32, (a.rows * a.cols) as usize)
    }
}

/// The bytes a forward pass writes for (request, position, layer).
fn kv_row(id: u64, pos: u32, layer: u32) -> Vec<u8> {
    (0..ROW_BYTES)
        .map(|i| {
            ((id * 131 + u64::from(pos) * 7 + u64::from(layer) * 31 + u64::from(i) * 3) % 251) as u8
        })
        .collect()
}

fn views_of(layout: *const HsLayout, group: usize) -> Vec<HsLayerView> {
    let mut g = std::mem::MaybeUninit::<HsGroupInfo>::uninit();
    ok!(hs_layout_group(layout, group, g.as_mut_ptr()));
    // SAFETY: `hs_layout_group` succeeded, so every field is written.
    let g = unsafe { g.assume_init() };
    (0..g.num_layers as usize)
        .map(|i| {
            let mut v = HsLayerView::default();
            ok!(hs_layout_layer_view(layout, group, i, &mut v));
            v
        })
        .collect()
}

/// The byte offset of view row `row` in the device pool.
fn row_offset(v: &HsLayerView, row: u64) -> usize {
    let rows = u64::from(v.rows_per_page);
    (v.offset + (row / rows) * v.page_stride + (row % rows) * u64::from(v.value_bytes)) as usize
}

#[test]
fn the_views_are_the_layouts_offsets_and_the_flat_attention_view() {
    let layout = tiny_layout(200, 4 * 64, 256, 1);
    let info = layout_info(layout);
    assert_eq!(info.num_groups as usize, 2 + 2 * info.num_buckets as usize);
    let mut kinds = Vec::new();
    for g in 0..info.num_groups as usize {
        let mut gi = std::mem::MaybeUninit::<HsGroupInfo>::uninit();
        ok!(hs_layout_group(layout, g, gi.as_mut_ptr()));
        // SAFETY: written by the successful call.
        kinds.push(unsafe { gi.assume_init() }.kind);
    }
    assert_eq!(kinds[..2], [HsGroupKind::Source, HsGroupKind::Indexer]);
    for layer in 0..LAYERS {
        let (mut bucket, mut offset) = (0, 0);
        ok!(hs_layout_layer_offset(
            layout,
            layer,
            &mut bucket,
            &mut offset
        ));
        for group in [
            2 + bucket as usize,
            2 + (info.num_buckets + bucket) as usize,
        ] {
            let v = views_of(layout, group)[0];
            assert_eq!((v.layer, v.offset, v.row_bytes), (layer, offset, ROW_BYTES));
            assert_eq!(
                v.pages_per_block * v.rows_per_page,
                info.attention_block_stride
            );
            // Attention row `r` of the layer starts at `offset + r * row_bytes`.
            assert_eq!(
                row_offset(&v, 37),
                (offset + 37 * u64::from(ROW_BYTES)) as usize
            );
        }
    }
    let v = views_of(layout, 1)[2];
    assert_eq!(
        (v.page_stride, v.pages_per_block),
        (info.bytes_per_block, 1)
    );
    let mut v = HsLayerView::default();
    expect_error(
        c!(hs_layout_layer_view(layout, 0, 0, &mut v)),
        HsStatus::InvalidArgument,
        "no device-pool view",
    );
    expect_error(
        c!(hs_layout_layer_view(layout, 99, 0, &mut v)),
        HsStatus::InvalidArgument,
        "group 99",
    );
    c!(hs_layout_free(layout));
}

#[test]
fn a_forward_pass_writes_through_the_slot_mapping_and_decode_reads_every_row_back() {
    let w = World::new(tiny_layout(200, 4 * 64, 256, 1), 3, 3);
    let (layout, coord, rt) = (w.layout, w.coord, w.rt);
    let info = layout_info(layout);
    let prompt: Vec<u32> = (0..37).collect();
    for id in 1..=3 {
        ok!(hs_coordinator_admit(
            coord,
            id,
            prompt.as_ptr(),
            prompt.len()
        ));
    }
    let mut count = 0;
    ok!(hs_runtime_slot_mapping_groups(
        rt,
        ptr::null_mut(),
        0,
        &mut count
    ));
    let mut groups = vec![0usize; count];
    ok!(hs_runtime_slot_mapping_groups(
        rt,
        groups.as_mut_ptr(),
        count,
        &mut count
    ));
    assert_eq!(
        groups,
        [1, 2, 3, 4],
        "the indexer group, then every resident bucket"
    );
    let (mut topk, mut rows) = (ptr::null_mut(), ptr::null_mut());
    ok!(hs_buffer_alloc(rt, 3 * TOP_K as usize * 4, &mut topk));
    ok!(hs_buffer_alloc(rt, 3 * TOP_K as usize * 4, &mut rows));
    let mut verified = 0;
    for step in 0..6u32 {
        let mut cmd = ptr::null_mut();
        ok!(hs_coordinator_step(coord, &mut cmd));
        ok!(hs_runtime_begin_step(rt, cmd, ptr::null_mut()));
        let sched = scheduled(cmd);
        let mut slots = HsDeviceArray::default();
        let mut tokens = 0;
        ok!(hs_runtime_slot_mapping(rt, &mut slots, &mut tokens));
        assert_eq!((slots.rows as usize, slots.cols), (groups.len(), 512));
        let want_tokens: u32 = sched.iter().map(|s| s.num_tokens).sum();
        assert_eq!(tokens, want_tokens);
        let mapping = host_view(&slots).to_vec();
        let mut copy = vec![0; mapping.len()];
        ok!(hs_runtime_read_slot_mapping(
            rt,
            copy.as_mut_ptr(),
            copy.len()
        ));
        assert_eq!(copy, mapping, "the host copy reads what the address holds");
        // Every token's row in every write group is the view's row of the request's block.
        for (w, &g) in groups.iter().enumerate() {
            let row = &mapping[w * slots.cols as usize..][..slots.cols as usize];
            let v = views_of(layout, g)[0];
            let mut t = 0usize;
            for s in &sched {
                let mut table = vec![0i32; info.max_pages_per_request as usize];
                ok!(hs_coordinator_block_table_row(
                    coord,
                    s.id,
                    g,
                    table.as_mut_ptr(),
                    table.len()
                ));
                for pos in s.first_token..s.first_token + s.num_tokens {
                    let block = table[(pos / info.block_size) as usize];
                    let want = u64::from(block as u32)
                        * u64::from(v.pages_per_block * v.rows_per_page)
                        + u64::from(pos % info.block_size);
                    assert_eq!(
                        row[t], want as i32,
                        "group {g}, request {}, token {pos}",
                        s.id
                    );
                    t += 1;
                }
            }
            assert!(
                row[t..].iter().all(|&r| r == -1),
                "beyond the step's tokens"
            );
        }
        // The forward pass: each token's KV row of every layer, at its slot-mapping row.
        let mut t = 0usize;
        for s in &sched {
            for pos in s.first_token..s.first_token + s.num_tokens {
                for (w, &g) in groups.iter().enumerate() {
                    let r = mapping[w * slots.cols as usize + t];
                    // The sparse KV rows (the indexer keys are the engine's own).
                    if g == 1 {
                        continue;
                    }
                    for v in views_of(layout, g) {
                        let bytes = kv_row(s.id, pos, v.layer);
                        ok!(hs_runtime_write_device_pool(
                            rt,
                            row_offset(&v, r as u64),
                            bytes.as_ptr(),
                            bytes.len()
                        ));
                    }
                }
                t += 1;
            }
        }
        // Decode: every top-k entry's row holds what the forward pass wrote.
        let batch: Vec<i32> = sched.iter().map(|s| s.slot as i32).collect();
        ok!(hs_runtime_set_batch(
            rt,
            batch.as_ptr(),
            batch.len(),
            0,
            ptr::null_mut()
        ));
        let positions: Vec<i32> = sched
            .iter()
            .flat_map(|s| {
                let end = s.first_token + s.num_tokens;
                (0..TOP_K).map(move |j| {
                    if j == 0 {
                        -1
                    } else {
                        ((j * 5 + step) % end) as i32
                    }
                })
            })
            .collect();
        ok!(hs_buffer_upload_i32(
            rt,
            topk,
            0,
            positions.as_ptr(),
            positions.len()
        ));
        for group in 0..info.num_index_groups as usize {
            let call = HsLayerCall {
                group,
                swap: HsSwap::IndexGroup as u32,
                topk,
                num_tokens: sched.len() as u32,
                state_rows: ptr::null(),
                rows,
                counts: ptr::null_mut(),
                stream: ptr::null_mut(),
            };
            ok!(hs_runtime_decode(rt, &call));
            let mut out = vec![0i32; positions.len()];
            ok!(hs_buffer_download_i32(
                rt,
                rows,
                0,
                out.as_mut_ptr(),
                out.len()
            ));
            let mut gi = HsIndexGroupInfo::default();
            ok!(hs_layout_index_group(layout, group, &mut gi));
            let v = views_of(layout, 2 + gi.bucket as usize);
            for (i, s) in sched.iter().enumerate() {
                for j in 0..TOP_K as usize {
                    let (pos, r) = (
                        positions[i * TOP_K as usize + j],
                        out[i * TOP_K as usize + j],
                    );
                    if pos < 0 {
                        assert_eq!(r, -1);
                        continue;
                    }
                    for view in &v {
                        let mut got = vec![0u8; ROW_BYTES as usize];
                        ok!(hs_runtime_read_device_pool(
                            rt,
                            row_offset(view, r as u64),
                            got.as_mut_ptr(),
                            got.len()
                        ));
                        assert_eq!(
                            got,
                            kv_row(s.id, pos as u32, view.layer),
                            "step {step} request {} token {pos}",
                            s.id
                        );
                        verified += 1;
                    }
                }
            }
        }
        ok!(hs_runtime_end_step(rt, cmd, ptr::null_mut()));
        ok!(hs_runtime_poll_and_report(rt, coord, ptr::null_mut()));
        c!(hs_command_free(cmd));
        for id in 1..=3 {
            ok!(hs_coordinator_append_tokens(coord, id, &7, 1));
        }
    }
    assert!(verified > 500, "{verified} rows verified");
    c!(hs_buffer_free(topk));
    c!(hs_buffer_free(rows));
}

#[test]
fn the_device_tables_hold_what_the_coordinator_assigned() {
    let w = World::new(tiny_layout(200, 4 * 64, 256, 1), 2, 2);
    let (layout, coord, rt) = (w.layout, w.coord, w.rt);
    let info = layout_info(layout);
    w.admit(5, 40);
    let mut cmd = ptr::null_mut();
    ok!(hs_coordinator_step(coord, &mut cmd));
    ok!(hs_runtime_begin_step(rt, cmd, ptr::null_mut()));
    let slot = scheduled(cmd)[0].slot as usize;
    for group in [0usize, 1, 2, 4] {
        let mut t = HsDeviceArray::default();
        ok!(hs_runtime_block_table(rt, group, &mut t));
        assert_eq!((t.rows, t.cols), (2, info.max_pages_per_request));
        let device = &host_view(&t)[slot * t.cols as usize..][..t.cols as usize];
        let mut copy = vec![0i32; (t.rows * t.cols) as usize];
        ok!(hs_runtime_read_block_table(
            rt,
            group,
            copy.as_mut_ptr(),
            copy.len()
        ));
        assert_eq!(&copy[slot * t.cols as usize..][..t.cols as usize], device);
        let mut want = vec![0i32; t.cols as usize];
        ok!(hs_coordinator_block_table_row(
            coord,
            5,
            group,
            want.as_mut_ptr(),
            want.len()
        ));
        if group == 0 {
            // The host table marks pages beyond the request -1, the coordinator's row 0.
            let pages = 3;
            assert_eq!(device[..pages], want[..pages]);
            assert!(device[pages..].iter().all(|&b| b == -1));
        } else {
            assert_eq!(device, &want[..], "group {group}");
        }
    }
    let hot_group = 2 + info.num_buckets as usize;
    let mut t = HsDeviceArray::default();
    ok!(hs_runtime_block_table(rt, hot_group, &mut t));
    assert_eq!(t.cols, info.hot_blocks_per_request);
    assert!(host_view(&t).iter().all(|&b| b == -1), "no hot region yet");
    expect_error(
        c!(hs_runtime_block_table(rt, 99, &mut t)),
        HsStatus::InvalidArgument,
        "layout group 99",
    );
    let mut copy = vec![0i32; 100_000];
    expect_error(
        c!(hs_runtime_read_block_table(
            rt,
            1,
            copy.as_mut_ptr(),
            copy.len()
        )),
        HsStatus::InvalidArgument,
        "100000",
    );
    c!(hs_command_free(cmd));
}

#[test]
fn a_batch_is_padded_for_a_graph_and_a_bad_padding_is_a_graph_shape_status() {
    let w = World::new(tiny_layout(200, 4 * 64, 256, 1), 4, 4);
    let (coord, rt) = (w.coord, w.rt);
    let prompt: Vec<u32> = (0..20).collect();
    for id in [1, 2] {
        ok!(hs_coordinator_admit(
            coord,
            id,
            prompt.as_ptr(),
            prompt.len()
        ));
    }
    let mut cmd = ptr::null_mut();
    ok!(hs_coordinator_step(coord, &mut cmd));
    ok!(hs_runtime_begin_step(rt, cmd, ptr::null_mut()));
    let slots: Vec<i32> = scheduled(cmd).iter().map(|s| s.slot as i32).collect();
    ok!(hs_runtime_set_batch(
        rt,
        slots.as_ptr(),
        2,
        4,
        ptr::null_mut()
    ));
    let mut batch = HsDeviceArray::default();
    ok!(hs_runtime_batch_table(rt, &mut batch));
    assert_eq!((batch.rows, batch.cols), (1, 4));
    assert_eq!(host_view(&batch), [slots[0], slots[1], -1, -1]);
    expect_error(
        c!(hs_runtime_set_batch(
            rt,
            slots.as_ptr(),
            2,
            1,
            ptr::null_mut()
        )),
        HsStatus::GraphShape,
        "padded to 1",
    );
    // A state row no scheduled request holds.
    expect_error(
        c!(hs_runtime_set_batch(
            rt,
            [3].as_ptr(),
            1,
            0,
            ptr::null_mut()
        )),
        HsStatus::InvalidArgument,
        "state row 3",
    );
    c!(hs_command_free(cmd));
}

#[test]
fn a_per_layer_call_refuses_outputs_that_alias_its_inputs_and_unknown_swaps() {
    let w = World::new(tiny_layout(200, 4 * 64, 256, 1), 2, 2);
    let (coord, rt) = (w.coord, w.rt);
    w.admit(1, 20);
    let mut cmd = ptr::null_mut();
    ok!(hs_coordinator_step(coord, &mut cmd));
    ok!(hs_runtime_begin_step(rt, cmd, ptr::null_mut()));
    let slot = scheduled(cmd)[0].slot as i32;
    ok!(hs_runtime_set_batch(rt, &slot, 1, 0, ptr::null_mut()));
    let (mut a, mut b) = (ptr::null_mut(), ptr::null_mut());
    ok!(hs_buffer_alloc(rt, TOP_K as usize * 4, &mut a));
    ok!(hs_buffer_alloc(rt, TOP_K as usize * 4, &mut b));
    let call = HsLayerCall {
        group: 0,
        swap: HsSwap::IndexGroup as u32,
        topk: a,
        num_tokens: 1,
        state_rows: ptr::null(),
        rows: b,
        counts: ptr::null_mut(),
        stream: ptr::null_mut(),
    };
    ok!(hs_runtime_decode(rt, &call));
    for (bad, what) in [
        (HsLayerCall { rows: a, ..call }, "`rows`"),
        (HsLayerCall { counts: a, ..call }, "`counts`"),
        (HsLayerCall { counts: b, ..call }, "`rows`"),
        (
            HsLayerCall {
                state_rows: b,
                ..call
            },
            "`rows`",
        ),
    ] {
        expect_error(
            c!(hs_runtime_decode(rt, &bad)),
            HsStatus::InvalidArgument,
            what,
        );
    }
    expect_error(
        c!(hs_runtime_decode(rt, &HsLayerCall { swap: 7, ..call })),
        HsStatus::InvalidArgument,
        "call.swap = 7",
    );
    expect_error(
        c!(hs_runtime_decode(
            rt,
            &HsLayerCall {
                rows: ptr::null_mut(),
                ..call
            }
        )),
        HsStatus::NullArgument,
        "call.rows",
    );
    ok!(hs_runtime_remap_prefill(rt, &call));
    c!(hs_buffer_free(a));
    c!(hs_buffer_free(b));
    c!(hs_command_free(cmd));
}

#[test]
fn each_stream_a_call_passes_is_lent_once_and_the_runtime_holds_a_bounded_number() {
    let w = World::new(tiny_layout(200, 4 * 64, 256, 1), 2, 2);
    let (coord, rt) = (w.coord, w.rt);
    w.admit(1, 20);
    let mut cmd = ptr::null_mut();
    ok!(hs_coordinator_step(coord, &mut cmd));
    // The CPU backend runs every call to completion on the calling thread, whatever stream
    // handle it is given: any value names a stream.
    let stream = |k: usize| k as *mut c_void;
    ok!(hs_runtime_begin_step(rt, cmd, stream(0x10)));
    let slot = scheduled(cmd)[0].slot as i32;
    ok!(hs_runtime_set_batch(rt, &slot, 1, 0, stream(0x10)));
    ok!(hs_runtime_end_step(rt, cmd, stream(0x10)));
    // 64 streams in all; the same handle again is the same stream.
    for k in 1..64 {
        ok!(hs_runtime_synchronize(rt, stream(0x100 + k)));
        ok!(hs_runtime_synchronize(rt, stream(0x100 + k)));
    }
    expect_error(
        c!(hs_runtime_synchronize(rt, stream(0x999))),
        HsStatus::InvalidArgument,
        "64 lent streams",
    );
    ok!(hs_runtime_synchronize(rt, ptr::null_mut()));
    c!(hs_command_free(cmd));
}

#[test]
fn lent_pools_that_overlap_are_refused_before_the_runtime_is_built() {
    let layout = tiny_layout(200, 4 * 64, 256, 1);
    let info = layout_info(layout);
    let bytes = (info.gpu_pool_bytes + info.host_pool_bytes) as usize + 4096;
    let mut memory = vec![0u8; bytes + 4096];
    let base = memory
        .as_mut_ptr()
        .wrapping_add(memory.as_ptr().align_offset(4096));
    let mut rc = std::mem::MaybeUninit::<HsRuntimeConfig>::uninit();
    ok!(hs_runtime_config_default(rc.as_mut_ptr()));
    // SAFETY: written by the successful call.
    let rc = unsafe { rc.assume_init() };
    let lent = HsLentResources {
        device_pool: base.cast(),
        device_pool_bytes: info.gpu_pool_bytes as usize,
        host_pool: base.wrapping_add(4096).cast(),
        host_pool_bytes: info.host_pool_bytes as usize,
        has_stream: false,
        stream: ptr::null_mut(),
    };
    let mut rt = ptr::null_mut();
    expect_error(
        c!(hs_runtime_new_with_pools(
            layout,
            c"cpu".as_ptr(),
            ptr::null(),
            &rc,
            &lent,
            &mut rt
        )),
        HsStatus::InvalidArgument,
        "overlap",
    );
    assert!(rt.is_null());
    c!(hs_layout_free(layout));
}

/// An int32 buffer of the runtime's device holding `values`.
fn int_buffer(rt: *mut HsRuntime, values: &[i32]) -> *mut HsBuffer {
    let mut b = ptr::null_mut();
    ok!(hs_buffer_alloc(rt, values.len().max(1) * 4, &mut b));
    ok!(hs_buffer_upload_i32(
        rt,
        b,
        0,
        values.as_ptr(),
        values.len()
    ));
    b
}

/// The int32 contents of `b`.
fn ints(rt: *mut HsRuntime, b: *mut HsBuffer, len: usize) -> Vec<i32> {
    let mut out = vec![0; len];
    ok!(hs_buffer_download_i32(rt, b, 0, out.as_mut_ptr(), len));
    out
}

#[test]
fn the_remap_with_modes_and_the_compressed_slot_mapping_follow_their_rules() {
    let w = World::new(tiny_layout(200, 4 * 64, 256, 1), 2, 2);
    let (coord, rt) = (w.coord, w.rt);
    w.admit(1, 40);
    let mut cmd = ptr::null_mut();
    ok!(hs_coordinator_step(coord, &mut cmd));
    ok!(hs_runtime_begin_step(rt, cmd, ptr::null_mut()));
    let s = scheduled(cmd)[0];
    let slot = s.slot as i32;
    let info = layout_info(w.layout);
    let k = TOP_K as usize;
    // Resident row of the request, group 2 (bucket 0).
    let mut table = vec![0; info.max_pages_per_request as usize];
    ok!(hs_coordinator_block_table_row(
        coord,
        1,
        2,
        table.as_mut_ptr(),
        table.len()
    ));
    let topk_host: Vec<i32> = (0..2 * k as i32).map(|i| (i * 5) % 43 - 2).collect();
    let topk = int_buffer(rt, &topk_host);
    let states = int_buffer(rt, &[slot, slot]);
    let rows = int_buffer(rt, &vec![0; 2 * k]);
    let call = HsLayerCall {
        group: 0,
        swap: HsSwap::IndexGroup as u32,
        topk,
        num_tokens: 2,
        state_rows: states,
        rows,
        counts: ptr::null_mut(),
        stream: ptr::null_mut(),
    };
    let resident = |tok: i32| -> i32 {
        match table.get((tok / BLOCK as i32) as usize) {
            Some(&block) if tok >= 0 && block >= 0 => {
                block * info.attention_block_stride as i32 + tok % BLOCK as i32
            }
            _ => -1,
        }
    };
    // Context parallelism over 2 ranks in runs of 4 tokens; this is rank 1.
    let dcp = HsRemapModes {
        dcp_size: 2,
        dcp_rank: 1,
        dcp_interleave: 4,
        workspace_requests: 0,
        request_of_row: ptr::null(),
        workspace_starts: ptr::null(),
    };
    ok!(hs_runtime_remap_modes(rt, &call, &dcp));
    let want: Vec<i32> = topk_host
        .iter()
        .map(|&t| {
            if t < 0 || (t / 4) % 2 != 1 {
                -1
            } else {
                resident((t / 8) * 4 + t % 4)
            }
        })
        .collect();
    assert_eq!(ints(rt, rows, 2 * k), want);
    assert!(want.iter().any(|&r| r >= 0) && want.iter().any(|&r| r < 0));
    // Row 1 reads workspace request 0, which starts at workspace row 500.
    let ids = int_buffer(rt, &[-1, 0]);
    let starts = int_buffer(rt, &[500]);
    let ws = HsRemapModes {
        dcp_size: 0,
        workspace_requests: 1,
        request_of_row: ids,
        workspace_starts: starts,
        ..dcp
    };
    ok!(hs_runtime_remap_modes(rt, &call, &ws));
    let want: Vec<i32> = topk_host
        .iter()
        .enumerate()
        .map(|(i, &t)| match (i / k, t) {
            (_, t) if t < 0 => -1,
            (0, t) => resident(t),
            (_, t) => 500 + t,
        })
        .collect();
    assert_eq!(ints(rt, rows, 2 * k), want);
    expect_error(
        c!(hs_runtime_remap_modes(
            rt,
            &call,
            &HsRemapModes {
                workspace_starts: rows,
                ..ws
            }
        )),
        HsStatus::InvalidArgument,
        "modes.workspace_starts",
    );
    // The compressed slot mapping: this model's indexer writes a row per token, a page of rows
    // per block, in the indexer block (group 1) or the host block (group 0) of its page.
    let positions: Vec<i32> = (s.first_token..s.first_token + s.num_tokens)
        .map(|p| p as i32)
        .collect();
    let n = positions.len();
    let pos = int_buffer(rt, &positions);
    let own = int_buffer(rt, &vec![0; n]);
    let st = int_buffer(rt, &vec![slot; n]);
    let out = int_buffer(rt, &vec![7; n]);
    for (host, group) in [(0, 1), (1, 0)] {
        ok!(hs_runtime_compressed_slot_mapping(
            rt,
            host,
            n as u32,
            pos,
            own,
            st,
            out,
            ptr::null_mut()
        ));
        let mut blocks = vec![0; info.max_pages_per_request as usize];
        ok!(hs_coordinator_block_table_row(
            coord,
            1,
            group,
            blocks.as_mut_ptr(),
            blocks.len()
        ));
        let want: Vec<i32> = positions
            .iter()
            .map(|&p| blocks[(p / BLOCK as i32) as usize] * BLOCK as i32 + p % BLOCK as i32)
            .collect();
        assert_eq!(ints(rt, out, n), want, "host {host}");
    }
    expect_error(
        c!(hs_runtime_compressed_slot_mapping(
            rt,
            0,
            n as u32,
            pos,
            own,
            out.cast_const(),
            out,
            ptr::null_mut()
        )),
        HsStatus::InvalidArgument,
        "`out`",
    );
    for b in [topk, states, rows, ids, starts, pos, own, st, out] {
        c!(hs_buffer_free(b));
    }
    ok!(hs_runtime_end_step(rt, cmd, ptr::null_mut()));
    c!(hs_command_free(cmd));
}
