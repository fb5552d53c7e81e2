//! The prefill node's write executor: what an engine's prefill node calls once a request's
//! prompt is prefilled and the decode node assigned it host blocks ([`PageManifest`]).
//!
//! [`PrefillWriter`] holds the [`PrefillSide`] (the runtime's device pool registered, connected
//! to the decode side of a [`DecodeOffer`]) and, for the packed layouts, a staging buffer of one
//! request, allocated from the runtime's device and registered once. [`PrefillWriter::write`]
//! finds the request's pages in the runtime's resident table, plans the write
//! ([`plan_write`](crate::plan_write) or [`plan_packed_write`](crate::plan_packed_write)), fills
//! the staging buffer on the runtime's copy stream and waits for those copies (device staging:
//! the stream; pinned host staging: one event recorded after the copies, polled), then posts the
//! write with its notification. The caller polls the [`Transfer`] to completion
//! ([`PrefillWriter::wait`]) before it lets the request's pages change.

use std::time::{Duration, Instant};

use hisparse_core::ops::BufferLen;
use hisparse_core::{Device, Error};
use hisparse_runtime::{AnyBuffer, AnyDevice, AnyHostBuffer, BackendKind, Runtime};

use crate::{
    DecodeOffer, MemoryKind, PackedWrite, PageManifest, PdError, PoolGeometry, PrefillSide, Region,
    Transfer, WriteLayout, check_staging_budget, staging_bytes_for,
};

/// A device error of the writer, with what it was doing.
fn device_err<E: Error>(op: &'static str) -> impl Fn(E) -> PdError {
    move |e| PdError::Device {
        op,
        detail: format!("{e} ({})", e.kind()),
    }
}

/// The memory of `buf`, a buffer of `dev`, as a region NIXL registers: host memory on the CPU
/// backend, memory of GPU `ordinal` on CUDA. Other backends' memory is refused: NIXL (UCX)
/// reaches neither.
pub fn device_region(dev: &AnyDevice, buf: &AnyBuffer, ordinal: u32) -> Result<Region, PdError> {
    let memory = match dev.kind() {
        BackendKind::Cpu => MemoryKind::Host,
        BackendKind::Cuda => MemoryKind::Device { ordinal },
        other => {
            return Err(PdError::Region {
                detail: format!(
                    "NIXL writes from host memory (the cpu backend) and CUDA memory (the cuda \
                     backend), not {other} memory; run the prefill side on one of those"
                ),
            });
        }
    };
    let address = buf.address().ok_or_else(|| PdError::Region {
        detail: format!("{} buffers have no address to register", dev.kind()),
    })?;
    Ok(Region {
        address,
        len: buf.byte_len(),
        memory,
    })
}

/// A packed write's staging buffer: on the prefill device, or pinned host memory.
#[derive(Debug)]
enum Staging {
    /// Device memory ([`WriteLayout::Packed`]).
    Device(AnyBuffer),
    /// Pinned host memory ([`WriteLayout::PackedHost`]).
    Host(AnyHostBuffer),
}

/// A write [`PrefillWriter::write`] posted.
#[derive(Debug)]
pub struct PostedWrite {
    /// The transfer: poll it ([`PrefillWriter::poll`], [`PrefillWriter::wait`]) to completion.
    pub transfer: Transfer,
    /// Seconds the packing copies took before the write was posted (0 page by page).
    pub pack_seconds: f64,
}

/// The prefill node's writer (see the module docs).
#[derive(Debug)]
pub struct PrefillWriter {
    // Fields drop in declaration order: the side (its registrations) before the staging buffer
    // it registered.
    side: PrefillSide,
    staging: Option<(Staging, Region)>,
    layout: WriteLayout,
    timeout: Duration,
}

impl PrefillWriter {
    /// An agent named `name` with `rt`'s device pool registered (GPU `ordinal` on CUDA),
    /// connected to the decode side of `offer`, writing requests as `layout` says. A packed
    /// layout allocates its staging buffer here, sized for a request of `max_tokens` tokens and
    /// checked first against [`WriteLayout::staging_limit`] of the device's memory. `timeout`
    /// bounds each wait: the packing copies of a request, and [`PrefillWriter::wait`].
    ///
    /// # Safety
    ///
    /// `rt` outlives the writer and keeps its device pool (registered with NIXL, which peers
    /// read by address); a request's pages are not rewritten, and its blocks not given to
    /// another request, until its write completed; NIXL's contract for registered memory
    /// ([`crate::Endpoint::register`]) holds for the pool.
    pub unsafe fn new(
        name: &str,
        rt: &Runtime<AnyDevice>,
        ordinal: u32,
        offer: DecodeOffer,
        layout: WriteLayout,
        max_tokens: u32,
        timeout: Duration,
    ) -> Result<Self, PdError> {
        let dev = rt.device();
        let geometry = PoolGeometry::device(rt.layout())?;
        let local = device_region(dev, &rt.pools().device, ordinal)?;
        // The budget is checked before any staging memory is taken: the device's free memory
        // for device staging, the host's available memory for pinned host staging
        // (`alloc_pinned` then also checks the pinned share of RAM).
        let needed = staging_bytes_for(&offer.geometry, max_tokens);
        if layout.stages() {
            check_staging_budget(needed, layout.staging_limit(dev.memory_info()))?;
        }
        // SAFETY: the caller's contract for `rt`'s pool is this function's.
        let mut side = unsafe { PrefillSide::new(name, local, geometry, offer) }?;
        let staging = match layout {
            WriteLayout::Pages => None,
            WriteLayout::Packed => {
                let buf = dev
                    .alloc(needed as usize)
                    .map_err(device_err("allocating the staging buffer"))?;
                let r = device_region(dev, &buf, ordinal)?;
                Some((Staging::Device(buf), r))
            }
            WriteLayout::PackedHost => {
                let buf = dev
                    .alloc_pinned(needed as usize)
                    .map_err(device_err("allocating the host staging buffer"))?;
                let r = Region {
                    address: dev.pinned_address(&buf) as u64,
                    len: buf.byte_len(),
                    memory: MemoryKind::Host,
                };
                Some((Staging::Host(buf), r))
            }
        };
        if let Some((_, r)) = &staging {
            // SAFETY: the buffer lives in the writer, dropped after `side` (field order); it is
            // written only by a request's packing copies before its write is posted, and not
            // again until that write completed (`write` takes the writer mutably and packs
            // only after the caller saw the previous transfer complete).
            unsafe { side.register(*r) }?;
        }
        Ok(PrefillWriter {
            side,
            staging,
            layout,
            timeout,
        })
    }

    /// The agent's name (what the decode side accepts imports from).
    pub fn name(&self) -> &str {
        self.side.name()
    }

    /// How requests are written.
    pub fn layout(&self) -> WriteLayout {
        self.layout
    }

    /// The side, for writes besides requests' (the transport's own figures:
    /// [`PrefillSide::bulk`], from memory registered with [`PrefillSide::register`]).
    pub fn side_mut(&mut self) -> &mut PrefillSide {
        &mut self.side
    }

    /// The GPU block of each of the first `pages` pages of the request in state row `slot` of
    /// `rt`, per bucket of layers: every page must be resident.
    pub fn source_blocks(
        rt: &Runtime<AnyDevice>,
        request: u64,
        slot: u32,
        pages: u32,
    ) -> Result<Vec<Vec<u32>>, PdError> {
        (0..rt.layout().num_buckets)
            .map(|bucket| {
                let row = rt.resident_row(bucket, slot).unwrap_or_default();
                (0..pages)
                    .map(|page| match row.get(page as usize) {
                        Some(&block) if block > 0 => Ok(block as u32),
                        _ => Err(PdError::PageNotResident {
                            request,
                            page,
                            bucket,
                        }),
                    })
                    .collect()
            })
            .collect()
    }

    /// Posts the write of the request in state row `slot` of `rt` (prefilled, its pages
    /// resident) into the decode host blocks of `manifest`, with its notification. The packed
    /// layouts first fill the staging buffer and wait for those copies. The previous write must
    /// have completed.
    pub fn write(
        &mut self,
        rt: &Runtime<AnyDevice>,
        slot: u32,
        manifest: &PageManifest,
    ) -> Result<PostedWrite, PdError> {
        let sources = Self::source_blocks(rt, manifest.request, slot, manifest.pages())?;
        let lists: Vec<&[u32]> = sources.iter().map(|v| &v[..]).collect();
        match &mut self.staging {
            None => Ok(PostedWrite {
                transfer: self.side.send(manifest, &lists)?,
                pack_seconds: 0.0,
            }),
            Some((buf, region)) => {
                let plan = self.side.plan_packed(manifest, &lists, region.len)?;
                let pack_seconds = pack(rt, &plan, buf, manifest.request, self.timeout)?;
                Ok(PostedWrite {
                    transfer: self.side.send_packed(region, &plan)?,
                    pack_seconds,
                })
            }
        }
    }

    /// Whether `transfer` completed (without waiting; the polls make it progress).
    pub fn poll(&self, transfer: &mut Transfer) -> Result<bool, PdError> {
        self.side.poll(transfer)
    }

    /// Polls `transfer` until it completed, at most the writer's timeout; `what` names it in
    /// the error.
    pub fn wait(&self, transfer: &mut Transfer, what: &str) -> Result<(), PdError> {
        wait_for(&self.side, transfer, what, self.timeout)
    }
}

/// Polls `transfer` of `side` until it completed (its polls are what make it progress), at most
/// `timeout`.
pub fn wait_for(
    side: &PrefillSide,
    transfer: &mut Transfer,
    what: &str,
    timeout: Duration,
) -> Result<(), PdError> {
    let since = Instant::now();
    while !side.poll(transfer)? {
        if since.elapsed() > timeout {
            return Err(PdError::Timeout {
                what: what.to_string(),
                seconds: timeout.as_secs(),
            });
        }
        std::hint::spin_loop();
    }
    Ok(())
}

/// Fills `staging` with request `request`'s pages as `plan` lays them out, on the runtime's copy
/// stream, and returns once the copies completed: the seconds they took. Device staging waits
/// for the stream; host staging records one event after the device → host copies and polls it
/// (at most `timeout`).
fn pack(
    rt: &Runtime<AnyDevice>,
    plan: &PackedWrite,
    staging: &mut Staging,
    request: u64,
    timeout: Duration,
) -> Result<f64, PdError> {
    let op = "packing a request's pages";
    let packing = Instant::now();
    let (dev, pool, stream) = (rt.device(), &rt.pools().device, rt.copy_stream());
    for c in &plan.copies {
        let (src, dst, len) = (c.src as usize, c.dst as usize, c.len as usize);
        match staging {
            Staging::Device(buf) => dev.copy_on_device(stream, pool, src, buf, dst, len),
            Staging::Host(buf) => dev.copy_to_host(stream, pool, src, buf, dst, len),
        }
        .map_err(device_err(op))?;
    }
    match staging {
        Staging::Device(_) => dev.synchronize(stream).map_err(device_err(op))?,
        Staging::Host(_) => {
            let copied = dev.record_event(stream).map_err(device_err(op))?;
            while !dev.query_event(&copied).map_err(device_err(op))? {
                if packing.elapsed() > timeout {
                    return Err(PdError::Timeout {
                        what: format!("the device → host staging copies of request {request}"),
                        seconds: timeout.as_secs(),
                    });
                }
                std::hint::spin_loop();
            }
        }
    }
    Ok(packing.elapsed().as_secs_f64())
}
