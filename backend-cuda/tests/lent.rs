//! Engine-owned memory and streams on a GPU (`harness = false`): the "engine" side allocates
//! device memory, pinned host memory, plain host memory and a stream through the raw driver API
//! (as PyTorch would) and lends them to the backend ([`CudaDevice::lend_device_memory`],
//! [`CudaDevice::lend_host_memory`], [`CudaDevice::lend_stream`]), runs remap, resolve, gather,
//! page and row copies, bulk copies, a copy inside one buffer and the table operations on them,
//! and every output must equal, byte for byte, the same work on buffers and a stream the backend
//! owns. Then: the engine's memory is still allocated and its stream alive after the lent buffers
//! and stream drop, memory the backend registered is unregistered, memory pinned by the engine stays pinned,
//! and bad pointers are refused with typed errors.
//!
//! Without a GPU the test says `SKIPPED` and passes, unless `HISPARSE_REQUIRE_DEVICE=1`.

use std::alloc::Layout;
use std::ffi::c_void;

use cudarc::driver::sys::{self, CUresult};
use hisparse_backend_cuda::{CudaBuffer, CudaDevice, CudaError, CudaHostBuffer, CudaStream};
use hisparse_conformance::check::Check;
use hisparse_core::{Device, Error as _, ErrorKind};

use hisparse_conformance::scenarios::Res;
use hisparse_conformance::scenarios::lending::{Lender, Owned, compare, scenario};

fn e(err: CudaError) -> String {
    format!("{err} [{}]", err.kind())
}

fn ok(call: &str, code: CUresult) -> Res<()> {
    if code == CUresult::CUDA_SUCCESS {
        Ok(())
    } else {
        Err(format!("{call}: {code:?}"))
    }
}

// ------------------------------------------------------------------------------------------------
// The engine side: raw driver allocations, freed by the engine itself at the end
// ------------------------------------------------------------------------------------------------

/// Memory and streams the engine allocated through the driver.
#[derive(Default)]
struct Engine {
    device: Vec<sys::CUdeviceptr>,
    pinned: Vec<*mut c_void>,
    plain: Vec<(*mut u8, Layout)>,
    streams: Vec<sys::CUstream>,
}

impl Engine {
    /// `len` zeroed bytes of device memory (`cuMemAlloc` in the current, primary context).
    fn device(&mut self, len: usize) -> Res<sys::CUdeviceptr> {
        let mut p = 0;
        // SAFETY: `p` is an out-pointer; the device's primary context is current (opened first).
        ok("cuMemAlloc", unsafe { sys::cuMemAlloc_v2(&mut p, len) })?;
        self.device.push(p);
        // SAFETY: `p` addresses `len` bytes just allocated.
        ok("cuMemsetD8", unsafe { sys::cuMemsetD8_v2(p, 0, len) })?;
        Ok(p)
    }

    /// `len` zeroed bytes of pinned, mapped host memory (`cuMemHostAlloc`, as PyTorch's pinned
    /// allocator does), page-aligned.
    fn pinned(&mut self, len: usize) -> Res<*mut u8> {
        let mut p = std::ptr::null_mut();
        let flags = sys::CU_MEMHOSTALLOC_PORTABLE | sys::CU_MEMHOSTALLOC_DEVICEMAP;
        // SAFETY: `p` is an out-pointer.
        ok("cuMemHostAlloc", unsafe {
            sys::cuMemHostAlloc(&mut p, len, flags)
        })?;
        self.pinned.push(p);
        if !(p as usize).is_multiple_of(4096) {
            return Err(format!("cuMemHostAlloc returned {p:p}, not page-aligned"));
        }
        // SAFETY: `p` addresses `len` bytes of host memory just allocated.
        unsafe { std::ptr::write_bytes(p.cast::<u8>(), 0, len) };
        Ok(p.cast())
    }

    /// `len` zeroed bytes of ordinary (pageable) host memory, page-aligned.
    fn plain(&mut self, len: usize) -> Res<*mut u8> {
        let layout = Layout::from_size_align(len, 4096).map_err(|e| e.to_string())?;
        // SAFETY: `layout` has a non-zero size.
        let p = unsafe { std::alloc::alloc_zeroed(layout) };
        if p.is_null() {
            return Err("host allocation failed".into());
        }
        self.plain.push((p, layout));
        Ok(p)
    }

    fn stream(&mut self) -> Res<sys::CUstream> {
        let mut s = std::ptr::null_mut();
        // SAFETY: `s` is an out-pointer.
        ok("cuStreamCreate", unsafe {
            sys::cuStreamCreate(&mut s, sys::CUstream_flags::CU_STREAM_NON_BLOCKING as u32)
        })?;
        self.streams.push(s);
        Ok(s)
    }

    /// Frees everything, checking the backend freed none of it.
    fn release(self) -> Res<()> {
        // SAFETY: no arguments; waits for all work of the current context.
        ok("cuCtxSynchronize", unsafe { sys::cuCtxSynchronize() })?;
        for s in self.streams {
            // SAFETY: `s` was created above; a stream the backend destroyed would be an invalid
            // handle here, which the query reports.
            ok("cuStreamQuery after the lent stream dropped", unsafe {
                sys::cuStreamQuery(s)
            })?;
            // SAFETY: destroys the engine's own stream once.
            ok("cuStreamDestroy", unsafe { sys::cuStreamDestroy_v2(s) })?;
        }
        for p in self.device {
            // SAFETY: `p` came from cuMemAlloc above and is freed once; freeing memory the backend
            // had freed already would fail here.
            ok("cuMemFree after the lent buffers dropped", unsafe {
                sys::cuMemFree_v2(p)
            })?;
        }
        for p in self.pinned {
            // SAFETY: `p` came from cuMemHostAlloc above and is freed once.
            ok("cuMemFreeHost after the lent buffers dropped", unsafe {
                sys::cuMemFreeHost(p)
            })?;
        }
        for (p, layout) in self.plain {
            // SAFETY: allocated above with this layout, freed once; nothing uses it any more.
            unsafe { std::alloc::dealloc(p, layout) };
        }
        Ok(())
    }
}

/// The driver's memory type of `ptr`, or `None` when it does not know the address.
fn memory_type(ptr: u64) -> Option<u32> {
    let mut t = 0u32;
    // SAFETY: `t` is a writable u32, the type of CU_POINTER_ATTRIBUTE_MEMORY_TYPE.
    let code = unsafe {
        sys::cuPointerGetAttribute(
            (&raw mut t).cast(),
            sys::CUpointer_attribute::CU_POINTER_ATTRIBUTE_MEMORY_TYPE,
            ptr,
        )
    };
    (code == CUresult::CUDA_SUCCESS).then_some(t)
}

// ------------------------------------------------------------------------------------------------
// The engine as a lender of the shared scenario's buffers and stream
// ------------------------------------------------------------------------------------------------

impl Lender<CudaDevice> for Engine {
    /// The engine's device memory at an offset of 256 bytes into a larger allocation (a tensor
    /// that is a view into a bigger one).
    fn buffer(&mut self, dev: &CudaDevice, len: usize) -> Res<CudaBuffer> {
        let base = self.device(len + 512)?;
        // SAFETY: `[base + 256, base + 256 + len)` lies in an allocation the engine frees only in
        // `release`, after every lent buffer and stream dropped and the context synchronised.
        unsafe { dev.lend_device_memory(base + 256, len) }.map_err(e)
    }

    /// The first host buffer is pinned by the engine (used as it is), the second plain memory
    /// (registered by the backend).
    fn host(&mut self, dev: &CudaDevice, len: usize, second: bool) -> Res<CudaHostBuffer> {
        let p = if second {
            self.plain(len)?
        } else {
            self.pinned(len)?
        };
        // SAFETY: the engine frees the memory only in `release`, after the lent buffers dropped;
        // the test touches it only through the backend meanwhile.
        let buf = unsafe { dev.lend_host_memory(p, len) }.map_err(e)?;
        if dev.registered_here(&buf) != second {
            return Err(format!(
                "{} host memory was {}registered by the backend",
                if second {
                    "plain"
                } else {
                    "the engine's pinned"
                },
                if second { "not " } else { "" }
            ));
        }
        Ok(buf)
    }

    fn stream(&mut self, dev: &CudaDevice) -> Res<CudaStream> {
        let raw = self.stream()?;
        // SAFETY: the engine destroys the stream only in `release`, after the lent stream dropped.
        unsafe { dev.lend_stream(raw) }.map_err(e)
    }

    /// `cuMemcpyHtoDAsync` on the engine's own stream handle.
    fn engine_copy(
        &mut self,
        dev: &CudaDevice,
        stream: &CudaStream,
        src: &CudaHostBuffer,
        dst: &mut CudaBuffer,
        bytes: usize,
    ) -> Res<()> {
        let raw = stream.raw_handle();
        if !self.streams.contains(&raw) {
            return Err("the lent stream's handle is not the engine's".into());
        }
        let src = dev.pinned_address(src) as *const c_void;
        // SAFETY: `src` is a pinned buffer of at least `bytes` bytes (written by the scenario)
        // and `dst` a device buffer of at least `bytes`; both outlive the stream's work.
        ok("cuMemcpyHtoDAsync", unsafe {
            sys::cuMemcpyHtoDAsync_v2(dst.device_address(), src, bytes, raw)
        })
    }
}

/// Bad pointers and streams are refused with typed errors, before anything is kept.
fn refusals(dev: &CudaDevice, engine: &mut Engine) -> Res<()> {
    let expect = |what: &str, r: Result<(), CudaError>| -> Res<()> {
        match r {
            Err(err) if err.kind() == ErrorKind::InvalidArgument => {
                println!("refused as expected: {what}: {err}");
                Ok(())
            }
            Err(err) => Err(format!("{what}: wrong error kind: {}", e(err))),
            Ok(()) => Err(format!("{what}: accepted")),
        }
    };
    let d = engine.device(4096)?;
    let pinned = engine.pinned(8192)?;
    let plain = engine.plain(8192)?;
    // SAFETY: every call below is refused before anything is kept (and a lent buffer accepted by
    // mistake is dropped at once, before the engine frees its memory).
    unsafe {
        expect(
            "device range past its allocation",
            dev.lend_device_memory(d, 4097).map(drop),
        )?;
        expect(
            "misaligned device pointer",
            dev.lend_device_memory(d + 8, 64).map(drop),
        )?;
        expect(
            "host memory passed as device memory",
            dev.lend_device_memory(pinned as u64, 64).map(drop),
        )?;
        expect(
            "pageable memory passed as device memory",
            dev.lend_device_memory(plain as u64, 64).map(drop),
        )?;
        expect(
            "device memory passed as host memory",
            dev.lend_host_memory(d as *mut u8, 4096).map(drop),
        )?;
        // Far past its allocation: whether or not the driver reports the extent of pinned memory,
        // the range ends in memory nobody mapped.
        expect(
            "pinned range far longer than its allocation",
            dev.lend_host_memory(pinned, 8192 + (1 << 40)).map(drop),
        )?;
        expect(
            "misaligned host memory",
            dev.lend_host_memory(plain.add(16), 4096).map(drop),
        )?;
        expect("empty host range", dev.lend_host_memory(plain, 0).map(drop))?;
    }
    if memory_type(plain as u64).is_some() {
        return Err("a refused registration left the memory pinned".into());
    }
    Ok(())
}

fn run(dev: &CudaDevice) -> Res<()> {
    let owned = scenario(dev, &mut Owned)?;
    let mut engine = Engine::default();
    let lent = scenario(dev, &mut engine)?;
    compare(&owned, &lent)?;
    println!(
        "ok: {} outputs identical on owned and on engine-owned memory and stream",
        owned.len()
    );
    // The lent buffers and stream are gone: memory the backend registered is unregistered, the
    // engine's own pinned memory is still pinned.
    for &(p, _) in &engine.plain {
        if memory_type(p as u64).is_some() {
            return Err("host memory registered by the backend is still pinned after drop".into());
        }
    }
    for &p in &engine.pinned {
        if memory_type(p as u64).is_none() {
            return Err("the engine's pinned memory was unpinned by the backend".into());
        }
    }
    refusals(dev, &mut engine)?;
    engine.release()
}

fn main() {
    let check = Check::one("engine_owned_memory_and_streams");
    let dev = check.device(CudaDevice::open(0));
    println!("device: {}", dev.device_name());
    check.finish(run(&dev))
}
