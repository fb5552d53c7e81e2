//! The ceilings every other section divides by: bulk pinned copies both ways, a device-to-device
//! copy, and an empty kernel inside a graph.

use hisparse_backend_cuda::CudaError;
use hisparse_core::Device;

use crate::{Bench, Res, Row};

pub(crate) fn section(b: &mut Bench) -> Res<()> {
    let bulk = 256usize << 20;
    let mut pinned = b.dev.alloc_pinned(bulk)?;
    let mut dbuf = b.dev.alloc(bulk)?;
    let it = if b.quick { 3 } else { 10 };
    let h2d_ms = b.stream_ms(2, it, &mut |d, s, _| {
        d.copy_to_device(s, &pinned, 0, &mut dbuf, 0, bulk)
    })?;
    let h2d_mhz = b.clock.get();
    let d2h_ms = b.stream_ms(2, it, &mut |d, s, _| {
        d.copy_to_host(s, &dbuf, 0, &mut pinned, 0, bulk)
    })?;
    let d2h_mhz = b.clock.get();
    drop(pinned);
    drop(dbuf);
    let dd = 1usize << 30;
    let src = b.dev.alloc(dd)?;
    let mut dst = b.dev.alloc(dd)?;
    let d2d_ms = b.stream_ms(2, it, &mut |d, s, _| {
        d.copy_on_device(s, &src, 0, &mut dst, 0, dd)
    })?;
    let d2d_mhz = b.clock.get();
    drop(src);
    drop(dst);
    b.h2d = bulk as f64 / h2d_ms / 1e6;
    b.d2h = bulk as f64 / d2h_ms / 1e6;
    b.d2d = 2.0 * dd as f64 / d2d_ms / 1e6;
    let n = 100;
    let probes = b.probes.clone();
    b.empty_us = b.graph_us(n, if b.quick { 5 } else { 50 }, &mut |_, s| {
        for _ in 0..n {
            probes
                .launch_empty(s)
                .map_err(|e| CudaError::Unsupported(e.to_string()))?;
        }
        Ok(())
    })?;
    let empty_mhz = b.clock.get();
    for (name, v, unit, mhz) in [
        ("bulk pinned H2D, 256 MiB", b.h2d, "GB/s", h2d_mhz),
        ("bulk pinned D2H, 256 MiB", b.d2h, "GB/s", d2h_mhz),
        (
            "device-to-device, read+write, 1 GiB",
            b.d2d,
            "GB/s",
            d2d_mhz,
        ),
        ("empty kernel in a graph", b.empty_us, "us", empty_mhz),
    ] {
        b.push(Row {
            section: "ceiling",
            name: name.into(),
            path: "-".into(),
            value: v,
            unit,
            ceiling: v,
            ceiling_name: "itself",
            target: "-".into(),
            sm_mhz: mhz,
            ..Row::default()
        });
    }
    Ok(())
}
