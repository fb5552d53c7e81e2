//! A backend chosen at run time by name: [`AnyDevice`], an enum over the backends compiled into
//! this build (one Cargo feature each: `cpu`, `cuda`, `vulkan`, `rocm`), itself a [`Device`].
//!
//! Its buffers, streams and events are enums too; an operation matches the device's variant and
//! hands each argument to that backend, so a buffer of one backend passed to another is a typed
//! error ([`AnyError::BackendMismatch`]), never a crash. The dispatch is one `match` per call.
//!
//! For code generic over [`Device`] that wants one static instantiation per backend instead (the
//! CLI), [`open_with`] opens the named backend and calls a [`DeviceVisitor`] with the concrete
//! device.
//!
//! ```
//! use hisparse_core::Device;
//! use hisparse_runtime::{AnyDevice, BackendKind};
//!
//! let kind: BackendKind = "cpu".parse().unwrap();
//! let dev = AnyDevice::open(kind, "").unwrap();
//! assert_eq!(dev.backend(), "cpu");
//! let mut buf = dev.alloc(16).unwrap();
//! dev.upload_i32(&mut buf, 0, &[1, 2, 3, 4]).unwrap();
//! let mut back = [0; 4];
//! dev.download_i32(&buf, 0, &mut back).unwrap();
//! assert_eq!(back, [1, 2, 3, 4]);
//! ```

use core::fmt;

use crate::kind::BackendKind;

use hisparse_core::ops::{
    BlockPair, BufferLen, GatherArgs, GatherDesc, HotResetDesc, IndexerBackupArgs,
    IndexerBackupDesc, InvalidateArgs, InvalidateDesc, LayerPair, PageCopyDesc, PageLayout,
    RemapArgs, RemapDesc, RemapModesArgs, RemapModesDesc, ResolveArgs, ResolveDesc, RowCopyDesc,
    RowSpan, SlotMappingArgs, SlotMappingDesc, TableWrite, TableWriteDesc,
};
use hisparse_core::{Device, Error, ErrorKind, MemoryInfo, OpError};

#[cfg(feature = "cpu")]
use hisparse_backend_cpu::{CpuBuffer, CpuDevice, CpuError, CpuEvent, CpuStream};
#[cfg(feature = "cuda")]
use hisparse_backend_cuda::{
    CudaBuffer, CudaDevice, CudaError, CudaEvent, CudaHostBuffer, CudaStream,
};
#[cfg(feature = "rocm")]
use hisparse_backend_rocm::{
    RocmBuffer, RocmDevice, RocmError, RocmEvent, RocmHostBuffer, RocmStream,
};
#[cfg(feature = "vulkan")]
use hisparse_backend_vulkan::{
    VulkanBuffer, VulkanDevice, VulkanError, VulkanEvent, VulkanHostBuffer, VulkanStream,
};

/// Runs `$body` with `$d` bound to the concrete device inside an [`AnyDevice`].
macro_rules! dispatch {
    ($s:expr, $d:ident => $body:expr) => {
        match $s {
            #[cfg(feature = "cpu")]
            AnyDevice::Cpu($d) => $body,
            #[cfg(feature = "cuda")]
            AnyDevice::Cuda($d) => $body,
            #[cfg(feature = "vulkan")]
            AnyDevice::Vulkan($d) => $body,
            #[cfg(feature = "rocm")]
            AnyDevice::Rocm($d) => $body,
        }
    };
}

/// Why a backend could not be opened.
#[derive(Debug)]
pub enum OpenError {
    /// The backend is not compiled into this build.
    NotCompiled(BackendKind),
    /// The device selector is not valid for the backend (CUDA and ROCm take an ordinal).
    BadSelector {
        /// The backend.
        backend: BackendKind,
        /// The selector given.
        selector: String,
    },
    /// The backend failed to open the device (no driver, no such device, …).
    Device {
        /// The backend.
        backend: BackendKind,
        /// The backend's error.
        source: AnyError,
    },
}

impl fmt::Display for OpenError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            OpenError::NotCompiled(k) => write!(
                f,
                "the {k} backend is not compiled into this build; enable the `{k}` feature"
            ),
            OpenError::BadSelector { backend, selector } => write!(
                f,
                "device `{selector}` is not a device number; {backend} devices are chosen by ordinal (0, 1, ...)"
            ),
            OpenError::Device { backend, source } => {
                write!(f, "cannot open a {backend} device: {source}")
            }
        }
    }
}

impl std::error::Error for OpenError {}

impl Error for OpenError {
    fn kind(&self) -> ErrorKind {
        match self {
            OpenError::NotCompiled(_) => ErrorKind::NotFound,
            OpenError::BadSelector { .. } => ErrorKind::InvalidArgument,
            OpenError::Device { source, .. } => source.kind(),
        }
    }
}

/// Calls [`DeviceVisitor::visit`] with a concrete device: static dispatch over whichever
/// backend [`open_with`] opens.
pub trait DeviceVisitor {
    /// What the visit returns.
    type Output;
    /// Runs with the opened device.
    fn visit<D: Device + 'static>(self, dev: D) -> Self::Output;
}

#[cfg_attr(not(any(feature = "cuda", feature = "rocm")), allow(dead_code))]
fn ordinal(kind: BackendKind, selector: &str) -> Result<usize, OpenError> {
    let s = selector.trim();
    if s.is_empty() {
        return Ok(0);
    }
    s.parse().map_err(|_| OpenError::BadSelector {
        backend: kind,
        selector: selector.to_string(),
    })
}

/// Opens backend `kind` with device `selector` (see [`AnyDevice::open`]) and runs `visitor`
/// with the concrete device.
pub fn open_with<V: DeviceVisitor>(
    kind: BackendKind,
    selector: &str,
    visitor: V,
) -> Result<V::Output, OpenError> {
    let dev = AnyDevice::open(kind, selector)?;
    Ok(dispatch!(dev, d => visitor.visit(d)))
}

/// Declares the enums over the compiled-in backends and their conversions.
macro_rules! any_enums {
    ($( $feat:literal $var:ident { dev: $dev:ty, buf: $buf:ty, host: $host:ty, stream: $stream:ty, event: $event:ty, err: $err:ty } )*) => {
        /// A device of any compiled-in backend.
        // A process holds a few devices; boxing the larger variants would cost an indirection
        // on every call for no memory worth saving.
        #[allow(clippy::large_enum_variant)]
        #[derive(Debug)]
        #[non_exhaustive]
        pub enum AnyDevice {
            $( #[cfg(feature = $feat)] #[doc = concat!("The `", $feat, "` backend.")] $var($dev), )*
        }
        /// Device memory of an [`AnyDevice`].
        #[derive(Debug)]
        #[non_exhaustive]
        pub enum AnyBuffer {
            $( #[cfg(feature = $feat)] #[doc = concat!("The `", $feat, "` backend's.")] $var($buf), )*
        }
        /// Pinned host memory of an [`AnyDevice`].
        #[derive(Debug)]
        #[non_exhaustive]
        pub enum AnyHostBuffer {
            $( #[cfg(feature = $feat)] #[doc = concat!("The `", $feat, "` backend's.")] $var($host), )*
        }
        /// A stream of an [`AnyDevice`].
        #[allow(clippy::large_enum_variant)]
        #[derive(Debug)]
        #[non_exhaustive]
        pub enum AnyStream {
            $( #[cfg(feature = $feat)] #[doc = concat!("The `", $feat, "` backend's.")] $var($stream), )*
        }
        /// An event of an [`AnyDevice`].
        #[derive(Debug)]
        #[non_exhaustive]
        pub enum AnyEvent {
            $( #[cfg(feature = $feat)] #[doc = concat!("The `", $feat, "` backend's.")] $var($event), )*
        }
        /// An error of an [`AnyDevice`].
        #[derive(Debug)]
        #[non_exhaustive]
        pub enum AnyError {
            $( #[cfg(feature = $feat)] #[doc = concat!("The `", $feat, "` backend's.")] $var($err), )*
            /// A malformed descriptor or argument.
            Op(OpError),
            /// The backend lacks a capability the call needs; the message names it.
            Unsupported(String),
            /// A buffer, stream or event of one backend was passed to a device of another.
            BackendMismatch {
                /// What was passed ("buffer", "host buffer", "stream", "event").
                what: &'static str,
                /// The device's backend.
                device: &'static str,
                /// The backend the argument belongs to.
                argument: &'static str,
            },
        }

        impl AnyDevice {
            /// The backend of this device.
            pub fn kind(&self) -> BackendKind {
                match self { $( #[cfg(feature = $feat)] AnyDevice::$var(_) => $feat.parse().expect("a backend name"), )* }
            }
        }

        $(
            #[cfg(feature = $feat)]
            impl From<$dev> for AnyDevice {
                fn from(d: $dev) -> Self { AnyDevice::$var(d) }
            }
            #[cfg(feature = $feat)]
            impl From<$buf> for AnyBuffer {
                fn from(b: $buf) -> Self { AnyBuffer::$var(b) }
            }
            #[cfg(feature = $feat)]
            impl From<$host> for AnyHostBuffer {
                fn from(b: $host) -> Self { AnyHostBuffer::$var(b) }
            }
            #[cfg(feature = $feat)]
            impl From<$stream> for AnyStream {
                fn from(s: $stream) -> Self { AnyStream::$var(s) }
            }
            #[cfg(feature = $feat)]
            impl From<$event> for AnyEvent {
                fn from(e: $event) -> Self { AnyEvent::$var(e) }
            }
            #[cfg(feature = $feat)]
            impl From<$err> for AnyError {
                fn from(e: $err) -> Self { AnyError::$var(e) }
            }
            #[cfg(feature = $feat)]
            impl Pick<$buf> for AnyBuffer {
                fn pick(&self, device: &'static str) -> Result<&$buf, AnyError> {
                    match self { AnyBuffer::$var(b) => Ok(b), #[allow(unreachable_patterns)] other => Err(mismatch("buffer", device, other.backend())) }
                }
                fn pick_mut(&mut self, device: &'static str) -> Result<&mut $buf, AnyError> {
                    match self { AnyBuffer::$var(b) => Ok(b), #[allow(unreachable_patterns)] other => Err(mismatch("buffer", device, other.backend())) }
                }
            }
            #[cfg(feature = $feat)]
            impl Pick<$host> for AnyHostBuffer {
                fn pick(&self, device: &'static str) -> Result<&$host, AnyError> {
                    match self { AnyHostBuffer::$var(b) => Ok(b), #[allow(unreachable_patterns)] other => Err(mismatch("host buffer", device, other.backend())) }
                }
                fn pick_mut(&mut self, device: &'static str) -> Result<&mut $host, AnyError> {
                    match self { AnyHostBuffer::$var(b) => Ok(b), #[allow(unreachable_patterns)] other => Err(mismatch("host buffer", device, other.backend())) }
                }
            }
            #[cfg(feature = $feat)]
            impl Pick<$stream> for AnyStream {
                fn pick(&self, device: &'static str) -> Result<&$stream, AnyError> {
                    match self { AnyStream::$var(s) => Ok(s), #[allow(unreachable_patterns)] other => Err(mismatch("stream", device, other.backend())) }
                }
                fn pick_mut(&mut self, device: &'static str) -> Result<&mut $stream, AnyError> {
                    match self { AnyStream::$var(s) => Ok(s), #[allow(unreachable_patterns)] other => Err(mismatch("stream", device, other.backend())) }
                }
            }
            #[cfg(feature = $feat)]
            impl Pick<$event> for AnyEvent {
                fn pick(&self, device: &'static str) -> Result<&$event, AnyError> {
                    match self { AnyEvent::$var(e) => Ok(e), #[allow(unreachable_patterns)] other => Err(mismatch("event", device, other.backend())) }
                }
                fn pick_mut(&mut self, device: &'static str) -> Result<&mut $event, AnyError> {
                    match self { AnyEvent::$var(e) => Ok(e), #[allow(unreachable_patterns)] other => Err(mismatch("event", device, other.backend())) }
                }
            }
        )*

        impl AnyBuffer {
            fn backend(&self) -> &'static str {
                match self { $( #[cfg(feature = $feat)] AnyBuffer::$var(_) => $feat, )* }
            }
        }
        impl AnyHostBuffer {
            fn backend(&self) -> &'static str {
                match self { $( #[cfg(feature = $feat)] AnyHostBuffer::$var(_) => $feat, )* }
            }
        }
        impl AnyStream {
            fn backend(&self) -> &'static str {
                match self { $( #[cfg(feature = $feat)] AnyStream::$var(_) => $feat, )* }
            }
        }
        impl AnyEvent {
            fn backend(&self) -> &'static str {
                match self { $( #[cfg(feature = $feat)] AnyEvent::$var(_) => $feat, )* }
            }
        }
        impl BufferLen for AnyBuffer {
            fn byte_len(&self) -> u64 {
                match self { $( #[cfg(feature = $feat)] AnyBuffer::$var(b) => b.byte_len(), )* }
            }
        }
        impl BufferLen for AnyHostBuffer {
            fn byte_len(&self) -> u64 {
                match self { $( #[cfg(feature = $feat)] AnyHostBuffer::$var(b) => b.byte_len(), )* }
            }
        }
        impl fmt::Display for AnyError {
            fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                match self {
                    $( #[cfg(feature = $feat)] AnyError::$var(e) => e.fmt(f), )*
                    AnyError::Op(e) => e.fmt(f),
                    AnyError::Unsupported(m) => f.write_str(m),
                    AnyError::BackendMismatch { what, device, argument } => write!(
                        f,
                        "a {what} of the {argument} backend was passed to a {device} device; use buffers, streams and events of the device they are given to"
                    ),
                }
            }
        }
        impl Error for AnyError {
            fn kind(&self) -> ErrorKind {
                match self {
                    $( #[cfg(feature = $feat)] AnyError::$var(e) => e.kind(), )*
                    AnyError::Op(e) => e.kind(),
                    AnyError::Unsupported(_) => ErrorKind::Unsupported,
                    AnyError::BackendMismatch { .. } => ErrorKind::InvalidArgument,
                }
            }
        }

    };
}

/// Borrows the variant of an argument that belongs to the device's backend.
trait Pick<T> {
    fn pick(&self, device: &'static str) -> Result<&T, AnyError>;
    fn pick_mut(&mut self, device: &'static str) -> Result<&mut T, AnyError>;
}

fn mismatch(what: &'static str, device: &'static str, argument: &'static str) -> AnyError {
    AnyError::BackendMismatch {
        what,
        device,
        argument,
    }
}

any_enums! {
    "cpu" Cpu { dev: CpuDevice, buf: CpuBuffer, host: CpuBuffer, stream: CpuStream, event: CpuEvent, err: CpuError }
    "cuda" Cuda { dev: CudaDevice, buf: CudaBuffer, host: CudaHostBuffer, stream: CudaStream, event: CudaEvent, err: CudaError }
    "vulkan" Vulkan { dev: VulkanDevice, buf: VulkanBuffer, host: VulkanHostBuffer, stream: VulkanStream, event: VulkanEvent, err: VulkanError }
    "rocm" Rocm { dev: RocmDevice, buf: RocmBuffer, host: RocmHostBuffer, stream: RocmStream, event: RocmEvent, err: RocmError }
}

impl std::error::Error for AnyError {}

impl From<OpError> for AnyError {
    fn from(e: OpError) -> Self {
        AnyError::Op(e)
    }
}

impl AnyDevice {
    /// Opens backend `kind` with device `selector`: CUDA and ROCm take an ordinal (empty = 0),
    /// Vulkan an index or a case-insensitive name substring (empty = the first GPU); the CPU
    /// ignores it.
    pub fn open(kind: BackendKind, selector: &str) -> Result<Self, OpenError> {
        let _ = selector;
        let failed = |source: AnyError| OpenError::Device {
            backend: kind,
            source,
        };
        match kind {
            #[cfg(feature = "cpu")]
            BackendKind::Cpu => Ok(AnyDevice::Cpu(CpuDevice::new())),
            #[cfg(feature = "cuda")]
            BackendKind::Cuda => CudaDevice::open(ordinal(kind, selector)?)
                .map(AnyDevice::Cuda)
                .map_err(|e| failed(e.into())),
            #[cfg(feature = "vulkan")]
            BackendKind::Vulkan => VulkanDevice::open(selector)
                .map(AnyDevice::Vulkan)
                .map_err(|e| failed(e.into())),
            #[cfg(feature = "rocm")]
            BackendKind::Rocm => RocmDevice::open(ordinal(kind, selector)?)
                .map(AnyDevice::Rocm)
                .map_err(|e| failed(e.into())),
            #[allow(unreachable_patterns)]
            other => {
                let _ = failed;
                Err(OpenError::NotCompiled(other))
            }
        }
    }
}

/// The resolve arguments' variants that belong to the device's backend.
fn pick_resolve<'a, T>(
    a: ResolveArgs<'a, AnyBuffer>,
    b: &'static str,
) -> Result<ResolveArgs<'a, T>, AnyError>
where
    AnyBuffer: Pick<T>,
{
    Ok(ResolveArgs {
        req_id: a.req_id.pick(b)?,
        topk: a.topk.pick(b)?,
        resident_table: a.resident_table.pick(b)?,
        host_table: a.host_table.pick(b)?,
        hot_table: a.hot_table.pick(b)?,
        slot_host_rows: a.slot_host_rows.pick_mut(b)?,
        lru: a.lru.pick_mut(b)?,
        indices: a.indices.pick_mut(b)?,
        valid_counts: a.valid_counts.pick_mut(b)?,
        hit_counts: a.hit_counts.pick_mut(b)?,
        miss_counts: a.miss_counts.pick_mut(b)?,
        miss_src: a.miss_src.pick_mut(b)?,
        miss_dst: a.miss_dst.pick_mut(b)?,
        idx_mapping: a.idx_mapping.map(|m| m.pick(b)).transpose()?,
        stats: a.stats.map(|s| s.pick_mut(b)).transpose()?,
    })
}

/// `x.pick(backend)?` for an argument.
macro_rules! p {
    ($x:expr, $b:expr) => {
        Pick::pick($x, $b)?
    };
}
/// `x.pick_mut(backend)?` for an argument.
macro_rules! pm {
    ($x:expr, $b:expr) => {
        Pick::pick_mut($x, $b)?
    };
}

/// A remap's buffers, each as backend `b`'s own (for [`Device::remap`] and
/// [`Device::remap_modes`]).
fn remap_args<'a, B>(
    a: RemapArgs<'a, AnyBuffer>,
    b: &'static str,
) -> Result<RemapArgs<'a, B>, AnyError>
where
    AnyBuffer: Pick<B>,
{
    Ok(RemapArgs {
        req_id: p!(a.req_id, b),
        block_table: p!(a.block_table, b),
        topk: p!(a.topk, b),
        idx_mapping: match a.idx_mapping {
            Some(m) => Some(p!(m, b)),
            None => None,
        },
        out: pm!(a.out, b),
        counts: match a.counts {
            Some(c) => Some(pm!(c, b)),
            None => None,
        },
        stats: match a.stats {
            Some(s) => Some(pm!(s, b)),
            None => None,
        },
    })
}

// Dispatch arms: every method forwards to the same method of the variant's backend through
// `dispatch!` (accepted twins, CONTRIBUTING.md, "One rule, one place": methods of one signature
// shape, such as the three bulk copies, read alike).
impl Device for AnyDevice {
    type Error = AnyError;
    type Buffer = AnyBuffer;
    type HostBuffer = AnyHostBuffer;
    type Stream = AnyStream;
    type Event = AnyEvent;

    fn backend(&self) -> &'static str {
        dispatch!(self, d => d.backend())
    }

    fn device_name(&self) -> &str {
        dispatch!(self, d => d.device_name())
    }

    fn alloc(&self, bytes: usize) -> Result<AnyBuffer, AnyError> {
        dispatch!(self, d => Ok(d.alloc(bytes)?.into()))
    }

    fn alloc_pinned(&self, bytes: usize) -> Result<AnyHostBuffer, AnyError> {
        dispatch!(self, d => Ok(d.alloc_pinned(bytes)?.into()))
    }

    fn pinned_address(&self, buf: &AnyHostBuffer) -> usize {
        dispatch!(self, d => match Pick::pick(buf, d.backend()) {
            Ok(b) => d.pinned_address(b),
            // Another backend's buffer has no address on this device: report one no pool can start at.
            Err(_) => 1,
        })
    }

    fn upload(&self, dst: &mut AnyBuffer, offset: usize, src: &[u8]) -> Result<(), AnyError> {
        dispatch!(self, d => Ok(d.upload(pm!(dst, d.backend()), offset, src)?))
    }

    fn download(&self, src: &AnyBuffer, offset: usize, dst: &mut [u8]) -> Result<(), AnyError> {
        dispatch!(self, d => Ok(d.download(p!(src, d.backend()), offset, dst)?))
    }

    fn write_pinned(
        &self,
        dst: &mut AnyHostBuffer,
        offset: usize,
        src: &[u8],
    ) -> Result<(), AnyError> {
        dispatch!(self, d => Ok(d.write_pinned(pm!(dst, d.backend()), offset, src)?))
    }

    fn read_pinned(
        &self,
        src: &AnyHostBuffer,
        offset: usize,
        dst: &mut [u8],
    ) -> Result<(), AnyError> {
        dispatch!(self, d => Ok(d.read_pinned(p!(src, d.backend()), offset, dst)?))
    }

    fn read_pinned_after(
        &self,
        event: &AnyEvent,
        src: &AnyHostBuffer,
        offset: usize,
        dst: &mut [u8],
    ) -> Result<(), AnyError> {
        dispatch!(self, d => Ok(d.read_pinned_after(p!(event, d.backend()), p!(src, d.backend()), offset, dst)?))
    }

    fn create_stream(&self) -> Result<AnyStream, AnyError> {
        dispatch!(self, d => Ok(d.create_stream()?.into()))
    }

    fn record_event(&self, stream: &AnyStream) -> Result<AnyEvent, AnyError> {
        dispatch!(self, d => Ok(d.record_event(p!(stream, d.backend()))?.into()))
    }

    fn wait_event(&self, stream: &AnyStream, event: &AnyEvent) -> Result<(), AnyError> {
        dispatch!(self, d => Ok(d.wait_event(p!(stream, d.backend()), p!(event, d.backend()))?))
    }

    fn synchronize(&self, stream: &AnyStream) -> Result<(), AnyError> {
        dispatch!(self, d => Ok(d.synchronize(p!(stream, d.backend()))?))
    }

    fn is_capturing(&self, stream: &AnyStream) -> Result<bool, AnyError> {
        dispatch!(self, d => Ok(d.is_capturing(p!(stream, d.backend()))?))
    }

    fn query_event(&self, event: &AnyEvent) -> Result<bool, AnyError> {
        dispatch!(self, d => Ok(d.query_event(p!(event, d.backend()))?))
    }

    fn memory_info(&self) -> Option<MemoryInfo> {
        dispatch!(self, d => Device::memory_info(d))
    }

    fn upload_i32(&self, dst: &mut AnyBuffer, offset: usize, src: &[i32]) -> Result<(), AnyError> {
        dispatch!(self, d => Ok(d.upload_i32(pm!(dst, d.backend()), offset, src)?))
    }

    fn download_i32(
        &self,
        src: &AnyBuffer,
        offset: usize,
        dst: &mut [i32],
    ) -> Result<(), AnyError> {
        dispatch!(self, d => Ok(d.download_i32(p!(src, d.backend()), offset, dst)?))
    }

    fn upload_u16(&self, dst: &mut AnyBuffer, offset: usize, src: &[u16]) -> Result<(), AnyError> {
        dispatch!(self, d => Ok(d.upload_u16(pm!(dst, d.backend()), offset, src)?))
    }

    fn download_u16(
        &self,
        src: &AnyBuffer,
        offset: usize,
        dst: &mut [u16],
    ) -> Result<(), AnyError> {
        dispatch!(self, d => Ok(d.download_u16(p!(src, d.backend()), offset, dst)?))
    }

    fn copy_to_device(
        &self,
        stream: &AnyStream,
        src: &AnyHostBuffer,
        src_offset: usize,
        dst: &mut AnyBuffer,
        dst_offset: usize,
        bytes: usize,
    ) -> Result<(), AnyError> {
        dispatch!(self, d => {
            let b = d.backend();
            Ok(d.copy_to_device(p!(stream, b), p!(src, b), src_offset, pm!(dst, b), dst_offset, bytes)?)
        })
    }

    fn copy_to_host(
        &self,
        stream: &AnyStream,
        src: &AnyBuffer,
        src_offset: usize,
        dst: &mut AnyHostBuffer,
        dst_offset: usize,
        bytes: usize,
    ) -> Result<(), AnyError> {
        dispatch!(self, d => {
            let b = d.backend();
            Ok(d.copy_to_host(p!(stream, b), p!(src, b), src_offset, pm!(dst, b), dst_offset, bytes)?)
        })
    }

    fn copy_on_device(
        &self,
        stream: &AnyStream,
        src: &AnyBuffer,
        src_offset: usize,
        dst: &mut AnyBuffer,
        dst_offset: usize,
        bytes: usize,
    ) -> Result<(), AnyError> {
        dispatch!(self, d => {
            let b = d.backend();
            Ok(d.copy_on_device(p!(stream, b), p!(src, b), src_offset, pm!(dst, b), dst_offset, bytes)?)
        })
    }

    fn copy_within_device(
        &self,
        stream: &AnyStream,
        buf: &mut AnyBuffer,
        src_offset: usize,
        dst_offset: usize,
        bytes: usize,
    ) -> Result<(), AnyError> {
        dispatch!(self, d => {
            let b = d.backend();
            Ok(d.copy_within_device(p!(stream, b), pm!(buf, b), src_offset, dst_offset, bytes)?)
        })
    }

    fn write_table(
        &self,
        stream: &AnyStream,
        desc: &TableWriteDesc,
        writes: &[TableWrite],
        table: &mut AnyBuffer,
    ) -> Result<(), AnyError> {
        dispatch!(self, d => {
            let b = d.backend();
            Ok(d.write_table(p!(stream, b), desc, writes, pm!(table, b))?)
        })
    }

    fn reset_hot_state(
        &self,
        stream: &AnyStream,
        desc: &HotResetDesc,
        rows: &[u32],
        slot_host_rows: &mut AnyBuffer,
        lru: &mut AnyBuffer,
    ) -> Result<(), AnyError> {
        dispatch!(self, d => {
            let b = d.backend();
            Ok(d.reset_hot_state(p!(stream, b), desc, rows, pm!(slot_host_rows, b), pm!(lru, b))?)
        })
    }

    fn remap(
        &self,
        stream: &AnyStream,
        desc: &RemapDesc,
        a: RemapArgs<'_, AnyBuffer>,
    ) -> Result<(), AnyError> {
        dispatch!(self, d => {
            let b = d.backend();
            Ok(d.remap(p!(stream, b), desc, remap_args(a, b)?)?)
        })
    }

    fn remap_modes(
        &self,
        stream: &AnyStream,
        desc: &RemapModesDesc,
        a: RemapModesArgs<'_, AnyBuffer>,
    ) -> Result<(), AnyError> {
        dispatch!(self, d => {
            let b = d.backend();
            let args = RemapModesArgs {
                remap: remap_args(a.remap, b)?,
                prefill_req_id: match a.prefill_req_id { Some(x) => Some(p!(x, b)), None => None },
                workspace_starts: match a.workspace_starts {
                    Some(x) => Some(p!(x, b)),
                    None => None,
                },
            };
            Ok(d.remap_modes(p!(stream, b), desc, args)?)
        })
    }

    fn indexer_backup(
        &self,
        stream: &AnyStream,
        desc: &IndexerBackupDesc<'_>,
        a: IndexerBackupArgs<'_, AnyBuffer, AnyHostBuffer>,
    ) -> Result<(), AnyError> {
        dispatch!(self, d => {
            let b = d.backend();
            let args = IndexerBackupArgs {
                device_slots: p!(a.device_slots, b),
                host_slots: p!(a.host_slots, b),
                device: p!(a.device, b),
                host: pm!(a.host, b),
            };
            Ok(d.indexer_backup(p!(stream, b), desc, args)?)
        })
    }

    fn resolve(
        &self,
        stream: &AnyStream,
        desc: &ResolveDesc,
        a: ResolveArgs<'_, AnyBuffer>,
    ) -> Result<(), AnyError> {
        dispatch!(self, d => {
            let b = d.backend();
            Ok(d.resolve(p!(stream, b), desc, pick_resolve(a, b)?)?)
        })
    }

    fn resolve_and_gather(
        &self,
        stream: &AnyStream,
        desc: &ResolveDesc,
        a: ResolveArgs<'_, AnyBuffer>,
        layers: &[LayerPair],
        host: &AnyHostBuffer,
        device: &mut AnyBuffer,
    ) -> Result<(), AnyError> {
        dispatch!(self, d => {
            let b = d.backend();
            let args = pick_resolve(a, b)?;
            Ok(d.resolve_and_gather(p!(stream, b), desc, args, layers, p!(host, b), pm!(device, b))?)
        })
    }

    fn gather_rows(
        &self,
        stream: &AnyStream,
        desc: &GatherDesc<'_>,
        a: GatherArgs<'_, AnyBuffer, AnyHostBuffer>,
    ) -> Result<(), AnyError> {
        dispatch!(self, d => {
            let b = d.backend();
            let args = GatherArgs {
                plan_src: p!(a.plan_src, b),
                plan_dst: p!(a.plan_dst, b),
                plan_counts: p!(a.plan_counts, b),
                host: p!(a.host, b),
                device: pm!(a.device, b),
            };
            Ok(d.gather_rows(p!(stream, b), desc, args)?)
        })
    }

    fn copy_pages(
        &self,
        stream: &AnyStream,
        desc: &PageCopyDesc<'_>,
        pairs: &[BlockPair],
        host: &mut AnyHostBuffer,
        device: &mut AnyBuffer,
    ) -> Result<(), AnyError> {
        dispatch!(self, d => {
            let b = d.backend();
            Ok(d.copy_pages(p!(stream, b), desc, pairs, pm!(host, b), pm!(device, b))?)
        })
    }

    fn copy_rows(
        &self,
        stream: &AnyStream,
        desc: &RowCopyDesc<'_>,
        spans: &[RowSpan],
        host: &mut AnyHostBuffer,
        device: &mut AnyBuffer,
    ) -> Result<(), AnyError> {
        dispatch!(self, d => {
            let b = d.backend();
            Ok(d.copy_rows(p!(stream, b), desc, spans, pm!(host, b), pm!(device, b))?)
        })
    }

    fn copy_host_pages(
        &self,
        stream: &AnyStream,
        layers: &[PageLayout],
        pairs: &[BlockPair],
        host: &mut AnyHostBuffer,
    ) -> Result<(), AnyError> {
        dispatch!(self, d => {
            let b = d.backend();
            Ok(d.copy_host_pages(p!(stream, b), layers, pairs, pm!(host, b))?)
        })
    }

    fn invalidate(
        &self,
        stream: &AnyStream,
        desc: &InvalidateDesc,
        a: InvalidateArgs<'_, AnyBuffer>,
    ) -> Result<(), AnyError> {
        dispatch!(self, d => {
            let b = d.backend();
            let args = InvalidateArgs { ranges: p!(a.ranges, b), slot_host_rows: pm!(a.slot_host_rows, b) };
            Ok(d.invalidate(p!(stream, b), desc, args)?)
        })
    }

    fn compressed_slot_mapping(
        &self,
        stream: &AnyStream,
        desc: &SlotMappingDesc,
        a: SlotMappingArgs<'_, AnyBuffer>,
    ) -> Result<(), AnyError> {
        dispatch!(self, d => {
            let b = d.backend();
            let args = SlotMappingArgs {
                positions: p!(a.positions, b),
                slot_mapping: p!(a.slot_mapping, b),
                table_row: p!(a.table_row, b),
                block_table: p!(a.block_table, b),
                out: pm!(a.out, b),
            };
            Ok(d.compressed_slot_mapping(p!(stream, b), desc, args)?)
        })
    }
}

mod address;
mod host_pool;
// The engine-lending entries: the only `unsafe` code of this crate.
#[allow(unsafe_code)]
mod lend;
