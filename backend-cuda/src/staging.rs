//! Staging of host-side lists (page pairs, row spans, layer tables) for kernels, without host
//! synchronisation.
//!
//! A ring of pinned host memory and a device ring of the same size share offsets. A list is
//! written into the pinned ring, copied asynchronously into the device ring on the caller's
//! stream, and read by the kernel from device memory. Each region stays reserved until an event
//! recorded after the kernel completes. When the next region would overlap one still in flight,
//! the ring is replaced by one twice as large instead of waiting (the old rings are kept until the
//! device is dropped), so staging never blocks the host.

use std::collections::VecDeque;
use std::sync::Arc;

use crate::ffi::{Context, DevMem, Event, Result, Stream};
use crate::pinned::PinnedMem;

const ALIGN: usize = 256;
const MIN_CAPACITY: usize = 1 << 20;

struct Ring {
    host: PinnedMem,
    device: DevMem,
    head: usize,
    in_flight: VecDeque<(usize, usize, Event)>,
}

/// The staging rings of one device.
pub(crate) struct Staging {
    ctx: Arc<Context>,
    ring: Option<Ring>,
    retired: Vec<Ring>,
}

/// A reserved region: device addresses of each staged part. Pass it to [`Staging::finish`] once
/// every kernel reading it has been enqueued.
pub(crate) struct Lease {
    start: usize,
    end: usize,
    generation: usize,
    /// Device address of each staged part, in order.
    pub ptrs: Vec<u64>,
}

impl Staging {
    pub(crate) fn new(ctx: Arc<Context>) -> Self {
        Staging {
            ctx,
            ring: None,
            retired: Vec::new(),
        }
    }

    fn grow(&mut self, need: usize) -> Result<()> {
        let old = self.ring.as_ref().map_or(0, |r| r.host.len());
        let cap = (2 * old)
            .max(2 * need)
            .max(MIN_CAPACITY)
            .next_power_of_two();
        let ring = Ring {
            host: PinnedMem::alloc_zeroed(&self.ctx, cap)?,
            // Uninitialised and without a host synchronisation: staging never blocks.
            device: DevMem::alloc_uninit(&self.ctx, cap)?,
            head: 0,
            in_flight: VecDeque::new(),
        };
        if let Some(old) = self.ring.replace(ring) {
            self.retired.push(old);
        }
        Ok(())
    }

    /// Copies `parts` to the device on `stream` and reserves them until [`Staging::finish`].
    pub(crate) fn stage(&mut self, stream: &Stream, parts: &[&[u8]]) -> Result<Lease> {
        let need: usize = parts
            .iter()
            .map(|p| p.len().div_ceil(ALIGN) * ALIGN)
            .sum::<usize>()
            .max(ALIGN);
        if self.ring.as_ref().is_none_or(|r| r.host.len() < need) {
            self.grow(need)?;
        }
        let start = loop {
            let ring = self.ring.as_mut().expect("ring allocated above");
            while let Some((_, _, ev)) = ring.in_flight.front() {
                if ev.is_complete()? {
                    ring.in_flight.pop_front();
                } else {
                    break;
                }
            }
            let cap = ring.host.len();
            let start = if ring.head + need > cap { 0 } else { ring.head };
            let end = start + need;
            let busy = ring
                .in_flight
                .iter()
                .any(|(s, e, _)| *s < end && start < *e);
            if !busy {
                break start;
            }
            let cap = ring.host.len();
            self.grow(cap.max(need))?;
        };
        let generation = self.retired.len();
        let ring = self.ring.as_mut().expect("ring allocated above");
        let mut ptrs = Vec::with_capacity(parts.len());
        let mut at = start;
        for p in parts {
            ring.host.as_mut_slice()[at..at + p.len()].copy_from_slice(p);
            stream.copy_htod(&ring.host, at, &ring.device, at, p.len())?;
            ptrs.push(ring.device.ptr() + at as u64);
            at += p.len().div_ceil(ALIGN) * ALIGN;
        }
        ring.head = start + need;
        Ok(Lease {
            start,
            end: start + need,
            generation,
            ptrs,
        })
    }

    /// Keeps the lease's region reserved until the work enqueued so far on `stream` completes.
    pub(crate) fn finish(&mut self, lease: Lease, stream: &Stream) -> Result<()> {
        let ev = Event::new(&self.ctx, false)?;
        ev.record(stream)?;
        let ring = if lease.generation == self.retired.len() {
            self.ring.as_mut()
        } else {
            self.retired.get_mut(lease.generation)
        };
        if let Some(ring) = ring {
            ring.in_flight.push_back((lease.start, lease.end, ev));
        }
        Ok(())
    }
}
