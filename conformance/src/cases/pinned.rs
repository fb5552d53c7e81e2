//! Pinned allocation (contract §5.6) and the synchronous buffer transfers every other case relies on.

use hisparse_core::ops::PINNED_ALIGNMENT;
use hisparse_core::{Device, Error, ErrorKind};

use crate::util::{Ctx, dev_bytes, ensure, expect_invalid, fail, read_bytes, read_pinned, same};
use crate::{Case, CaseResult, SplitMix64};

pub(crate) fn cases<D: Device + 'static>(v: &mut Vec<Case<D>>) {
    v.push(Case::seeded("pinned/alignment-and-zeroing", alignment::<D>));
    v.push(Case::fixed(
        "pinned/refuses-above-95-percent-of-ram",
        refuse_huge::<D>,
    ));
    v.push(Case::fixed("pinned/refuses-zero-bytes", refuse_zero::<D>));
    v.push(Case::seeded(
        "buffer/alloc-zeroed-upload-download",
        buffers::<D>,
    ));
    v.push(Case::fixed(
        "buffer/transfer-out-of-range-rejected",
        out_of_range::<D>,
    ));
}

fn alignment<D: Device>(dev: &D, seed: u64) -> CaseResult {
    let mut rng = SplitMix64::new(seed);
    for len in [1usize, 15, 4095, 4096, 4097, 65536 + 16, (3 << 20) + 5] {
        let mut b = dev.alloc_pinned(len).ctx(&format!("alloc_pinned({len})"))?;
        let addr = dev.pinned_address(&b);
        ensure!(
            addr.is_multiple_of(PINNED_ALIGNMENT),
            "alloc_pinned({len}) at {addr:#x}, not {PINNED_ALIGNMENT}-aligned"
        );
        let got = read_pinned(dev, &b, len)?;
        ensure!(
            got.iter().all(|&x| x == 0),
            "alloc_pinned({len}) is not zeroed"
        );
        let mut data = vec![0u8; len];
        rng.fill(&mut data);
        dev.write_pinned(&mut b, 0, &data).ctx("write_pinned")?;
        same(
            &format!("pinned round trip ({len} B)"),
            &read_pinned(dev, &b, len)?,
            &data,
        )?;
        // A partial write at an odd offset, then a partial read.
        if len > 8 {
            let off = rng.below(len as u64 - 4) as usize;
            dev.write_pinned(&mut b, off, &[1, 2, 3])
                .ctx("write_pinned at offset")?;
            data[off..off + 3].copy_from_slice(&[1, 2, 3]);
            let mut part = vec![0u8; len - off];
            dev.read_pinned(&b, off, &mut part)
                .ctx("read_pinned at offset")?;
            same("pinned partial read", &part, &data[off..])?;
        }
    }
    Ok(())
}

fn refuse_huge<D: Device>(dev: &D) -> CaseResult {
    // 2^60 bytes is above 95% of the RAM of any machine this runs on.
    let huge = 1usize << 60;
    match dev.alloc_pinned(huge) {
        Ok(_) => Err(fail("alloc_pinned(2^60) succeeded; it must be refused")),
        Err(e) if e.kind() == ErrorKind::OutOfPinnedMemory => Ok(()),
        Err(e) => Err(fail(format!(
            "alloc_pinned(2^60): error kind `{}` ({e}), expected `out of pinned memory`",
            e.kind()
        ))),
    }
}

fn refuse_zero<D: Device>(dev: &D) -> CaseResult {
    expect_invalid("alloc_pinned(0)", dev.alloc_pinned(0))
}

fn buffers<D: Device>(dev: &D, seed: u64) -> CaseResult {
    let mut rng = SplitMix64::new(seed);
    for len in [4usize, 100, 4096, 1 << 20] {
        let mut b = dev.alloc(len).ctx(&format!("alloc({len})"))?;
        ensure!(
            read_bytes(dev, &b, len)?.iter().all(|&x| x == 0),
            "alloc({len}) is not zeroed"
        );
        let mut data = vec![0u8; len];
        rng.fill(&mut data);
        dev.upload(&mut b, 0, &data).ctx("upload")?;
        same("device round trip", &read_bytes(dev, &b, len)?, &data)?;
        let off = rng.below(len as u64) as usize;
        let patch = vec![0xEEu8; (len - off).min(9)];
        dev.upload(&mut b, off, &patch).ctx("upload at offset")?;
        data[off..off + patch.len()].copy_from_slice(&patch);
        let mut tail = vec![0u8; len - off];
        dev.download(&b, off, &mut tail).ctx("download at offset")?;
        same("device partial read", &tail, &data[off..])?;
    }
    let b = dev_bytes(dev, &[9; 64])?;
    let mut empty = [0u8; 0];
    dev.download(&b, 64, &mut empty)
        .ctx("download of 0 bytes at the end")?;
    Ok(())
}

fn out_of_range<D: Device>(dev: &D) -> CaseResult {
    let mut b = dev_bytes(dev, &[7u8; 64])?;
    expect_invalid("upload past the end", dev.upload(&mut b, 60, &[0; 5]))?;
    expect_invalid(
        "upload at usize::MAX",
        dev.upload(&mut b, usize::MAX, &[0; 2]),
    )?;
    let mut dst = [0u8; 8];
    expect_invalid("download past the end", dev.download(&b, 57, &mut dst))?;
    same(
        "buffer after refused upload",
        &read_bytes(dev, &b, 64)?,
        &[7u8; 64],
    )?;
    let mut p = dev.alloc_pinned(64).ctx("alloc_pinned(64)")?;
    expect_invalid(
        "write_pinned past the end",
        dev.write_pinned(&mut p, 64, &[1]),
    )?;
    expect_invalid(
        "read_pinned past the end",
        dev.read_pinned(&p, 1, &mut [0u8; 64]),
    )?;
    same(
        "pinned after refused write",
        &read_pinned(dev, &p, 64)?,
        &[0u8; 64],
    )
}
