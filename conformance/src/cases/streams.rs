//! Stream and event semantics (the rules in `hisparse_core::device`): work on one stream runs in
//! order; an event waited on by a second stream orders that stream's later work after the
//! event's; a recorded event completes without the host synchronising.
//!
//! The first stream's work is long enough (a chain of 16 MiB device copies; across streams a
//! chain of [`DELAY_LINKS`] copies before the one the second stream reads) that a backend
//! running the second stream's work without waiting for the event reads stale bytes and fails,
//! however fast its device and however late its host submits the second stream's work.

use std::time::{Duration, Instant};

use hisparse_core::Device;

use crate::util::{Ctx, dev_bytes, ensure, pinned_bytes, read_bytes, read_pinned, same};
use crate::{Case, CaseResult, SplitMix64};

const CHAIN_BYTES: usize = 16 << 20;
const CHAIN_LINKS: usize = 6;
/// Dependent copies the cross-stream case runs on the first stream before the copy the second
/// stream reads: about 0.4 ms of device time on an H200 (16 MiB read and written per copy at
/// ~4 TB/s), where six copies (~55 µs) finished before the second stream's copy started even
/// with its event wait ignored.
const DELAY_LINKS: usize = 48;
/// How long `query_event` may keep answering "not yet" for work that is certainly finite.
const QUERY_TIMEOUT: Duration = Duration::from_secs(60);

pub(crate) fn cases<D: Device + 'static>(v: &mut Vec<Case<D>>) {
    v.push(Case::seeded("streams/in-order-chain", in_order::<D>));
    v.push(Case::seeded(
        "streams/event-orders-streams",
        cross_stream::<D>,
    ));
    v.push(Case::seeded(
        "streams/query-event-completes",
        query_completes::<D>,
    ));
}

fn pattern(seed: u64, len: usize) -> Vec<u8> {
    let mut v = vec![0u8; len];
    SplitMix64::new(seed).fill(&mut v);
    v
}

/// Copies `bufs[0]` into each next buffer in turn on `stream`: `bufs[0] → bufs[1] → …`.
fn chain<D: Device>(dev: &D, stream: &D::Stream, bufs: &mut [D::Buffer]) -> CaseResult {
    for i in 1..bufs.len() {
        let (done, rest) = bufs.split_at_mut(i);
        dev.copy_on_device(stream, &done[i - 1], 0, &mut rest[0], 0, CHAIN_BYTES)
            .ctx("copy_on_device")?;
    }
    Ok(())
}

/// A chain of dependent copies on one stream ends with the first buffer's bytes.
fn in_order<D: Device>(dev: &D, seed: u64) -> CaseResult {
    let data = pattern(seed, CHAIN_BYTES);
    let s = dev.create_stream().ctx("create_stream")?;
    let mut bufs = vec![dev_bytes(dev, &data)?];
    for _ in 0..CHAIN_LINKS {
        bufs.push(dev.alloc(CHAIN_BYTES).ctx("alloc")?);
    }
    chain(dev, &s, &mut bufs)?;
    // Then back to host through pinned memory, still on the same stream.
    let mut host = pinned_bytes(dev, &vec![0u8; CHAIN_BYTES])?;
    dev.copy_to_host(&s, &bufs[CHAIN_LINKS], 0, &mut host, 0, CHAIN_BYTES)
        .ctx("copy_to_host")?;
    dev.synchronize(&s).ctx("synchronize")?;
    same(
        "end of chain",
        &read_pinned(dev, &host, CHAIN_BYTES)?,
        &data,
    )
}

/// Stream A runs a chain of copies and records an event; stream B waits for it, then copies the
/// chain's last buffer. B must see the chain's result, not the zeros the buffer started with.
/// The chain copies the data back and forth between two buffers [`DELAY_LINKS`] times before it
/// writes the last buffer, so that buffer holds zeros for most of the chain's time.
fn cross_stream<D: Device>(dev: &D, seed: u64) -> CaseResult {
    let data = pattern(seed, CHAIN_BYTES);
    let a = dev.create_stream().ctx("create_stream a")?;
    let b = dev.create_stream().ctx("create_stream b")?;
    let mut pair = [dev_bytes(dev, &data)?, dev.alloc(CHAIN_BYTES).ctx("alloc")?];
    let mut last = dev.alloc(CHAIN_BYTES).ctx("alloc")?;
    let mut out = dev.alloc(CHAIN_BYTES).ctx("alloc")?;
    for i in 0..DELAY_LINKS {
        let (lo, hi) = pair.split_at_mut(1);
        let (src, dst) = if i % 2 == 0 {
            (&lo[0], &mut hi[0])
        } else {
            (&hi[0], &mut lo[0])
        };
        dev.copy_on_device(&a, src, 0, dst, 0, CHAIN_BYTES)
            .ctx("copy_on_device")?;
    }
    dev.copy_on_device(&a, &pair[DELAY_LINKS % 2], 0, &mut last, 0, CHAIN_BYTES)
        .ctx("copy_on_device")?;
    let done = dev.record_event(&a).ctx("record_event")?;
    dev.wait_event(&b, &done).ctx("wait_event")?;
    dev.copy_on_device(&b, &last, 0, &mut out, 0, CHAIN_BYTES)
        .ctx("copy_on_device on stream b")?;
    let b_done = dev.record_event(&b).ctx("record_event b")?;
    wait_for(dev, &b_done)?;
    same(
        "stream b's copy",
        &read_bytes(dev, &out, CHAIN_BYTES)?,
        &data,
    )
}

/// An event recorded after real work completes on its own (polled, never synchronised), and an
/// event on an idle stream is complete at once after a synchronise.
fn query_completes<D: Device>(dev: &D, seed: u64) -> CaseResult {
    let data = pattern(seed, CHAIN_BYTES);
    let s = dev.create_stream().ctx("create_stream")?;
    let src = dev_bytes(dev, &data)?;
    let mut dst = dev.alloc(CHAIN_BYTES).ctx("alloc")?;
    dev.copy_on_device(&s, &src, 0, &mut dst, 0, CHAIN_BYTES)
        .ctx("copy_on_device")?;
    let e = dev.record_event(&s).ctx("record_event")?;
    wait_for(dev, &e)?;
    let idle = dev.record_event(&s).ctx("record_event")?;
    dev.synchronize(&s).ctx("synchronize")?;
    ensure!(
        dev.query_event(&idle).ctx("query_event")?,
        "query_event is false for an event of a synchronised stream"
    );
    ensure!(
        dev.query_event(&e).ctx("query_event")?,
        "query_event went back to false for a completed event"
    );
    same("copy", &read_bytes(dev, &dst, CHAIN_BYTES)?, &data)
}

/// Polls `query_event` until it answers `true`, failing after [`QUERY_TIMEOUT`].
fn wait_for<D: Device>(dev: &D, event: &D::Event) -> CaseResult {
    let t0 = Instant::now();
    while !dev.query_event(event).ctx("query_event")? {
        ensure!(
            t0.elapsed() < QUERY_TIMEOUT,
            "query_event still false after {QUERY_TIMEOUT:?}: the event never completes"
        );
        std::thread::sleep(Duration::from_micros(50));
    }
    Ok(())
}
