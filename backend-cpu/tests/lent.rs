//! Engine-owned memory lent to the CPU backend ([`CpuBuffer::from_raw_parts`]): the backend reads
//! and writes it in place, refuses unusable ranges with a typed error, and never frees it.

use hisparse_backend_cpu::{CpuBuffer, CpuDevice, CpuError};
use hisparse_core::ops::RemapDesc;
use hisparse_core::{Device, Error, ErrorKind};

/// 16-byte aligned engine memory (what numpy hands out for large arrays, rounded to 16).
fn engine_memory(bytes: usize) -> Vec<u128> {
    vec![0u128; bytes.div_ceil(16)]
}

#[test]
fn lent_memory_is_read_and_written_in_place() {
    let dev = CpuDevice::new();
    let mut mem = engine_memory(64);
    // SAFETY: `mem` outlives `buf` (dropped at the end of the block) and is only touched
    // through `buf` meanwhile.
    let mut buf = unsafe { CpuBuffer::from_raw_parts(mem.as_mut_ptr().cast(), 64) }.unwrap();
    assert!(buf.is_lent());
    assert_eq!(buf.address(), mem.as_ptr() as usize);
    dev.upload_i32(&mut buf, 4, &[7, -1, 9]).unwrap();
    let mut back = [0i32; 4];
    dev.download_i32(&buf, 0, &mut back).unwrap();
    assert_eq!(back, [0, 7, -1, 9]);
    drop(buf);
    // The backend wrote the engine's memory and did not free it.
    let words: Vec<i32> = mem
        .iter()
        .flat_map(|w| {
            w.to_ne_bytes()
                .chunks(4)
                .map(|c| i32::from_ne_bytes(c.try_into().unwrap()))
                .collect::<Vec<_>>()
        })
        .collect();
    assert_eq!(&words[..4], &[0, 7, -1, 9]);
}

#[test]
fn lent_buffers_run_operations_like_owned_ones() {
    // A remap over lent tables and outputs gives what the same remap over owned buffers gives.
    let dev = CpuDevice::new();
    let s = dev.create_stream().unwrap();
    let desc = RemapDesc {
        num_tokens: 2,
        top_k: 4,
        table_rows: 2,
        max_blocks: 3,
        block_size: 8,
        block_stride_rows: 8,
        idx_mapping_len: None,
        write_counts: true,
        compact: false,
        stats_slot: 0,
    };
    let req = [1i32, -1];
    let table = [3i32, 4, 5, 6, 7, 8];
    let topk = [0i32, 9, 23, -1, 1, 2, 3, 4];
    let run = |bufs: &mut [CpuBuffer; 5]| {
        let [r, t, k, out, counts] = bufs;
        dev.upload_i32(r, 0, &req).unwrap();
        dev.upload_i32(t, 0, &table).unwrap();
        dev.upload_i32(k, 0, &topk).unwrap();
        dev.remap(
            &s,
            &desc,
            hisparse_core::ops::RemapArgs {
                req_id: r,
                block_table: t,
                topk: k,
                idx_mapping: None,
                out,
                counts: Some(counts),
                stats: None,
            },
        )
        .unwrap();
        let mut o = [0i32; 8];
        let mut c = [0i32; 2];
        dev.download_i32(out, 0, &mut o).unwrap();
        dev.download_i32(counts, 0, &mut c).unwrap();
        (o, c)
    };
    let sizes = [8usize, 24, 32, 32, 8];
    let mut owned = sizes.map(|n| dev.alloc(n).unwrap());
    let mut mems: Vec<Vec<u128>> = sizes.iter().map(|&n| engine_memory(n)).collect();
    // SAFETY: each vector outlives its buffer (both live to the end of the test), the ranges are
    // disjoint, and the vectors are not touched while the buffers exist.
    let mut lent = [0, 1, 2, 3, 4].map(|i| unsafe {
        CpuBuffer::from_raw_parts(mems[i].as_mut_ptr().cast(), sizes[i]).unwrap()
    });
    let expected = run(&mut owned);
    assert_eq!(run(&mut lent), expected);
    // Row 1 of the table is [6, 7, 8]: 6 * 8 + 0, 7 * 8 + 1, 8 * 8 + 7; the padding row is all -1.
    assert_eq!(expected.0, [48, 57, 71, -1, -1, -1, -1, -1]);
    drop(lent);
    drop(mems);
}

#[test]
fn unusable_ranges_are_typed_errors() {
    let mut mem = engine_memory(64);
    let p: *mut u8 = mem.as_mut_ptr().cast();
    let cases: [(*mut u8, usize, &str); 3] = [
        (core::ptr::null_mut(), 64, "null"),
        (p, 0, "length is 0"),
        (p.wrapping_add(8), 32, "multiple of 16"),
    ];
    for (ptr, len, says) in cases {
        // SAFETY: every case is refused before the memory is used; `mem` is live meanwhile.
        let e = unsafe { CpuBuffer::from_raw_parts(ptr, len) }.unwrap_err();
        assert!(matches!(e, CpuError::Lent { .. }), "{e:?}");
        assert_eq!(e.kind(), ErrorKind::InvalidArgument);
        assert!(e.to_string().contains(says), "{e} should say {says}");
    }
}
