//! Arrays from Python: where an object's memory is, how large, of which element type — read
//! from `__cuda_array_interface__` (PyTorch CUDA tensors, CuPy), `__array_interface__` (numpy),
//! or a DLPack capsule from `__dlpack__()` (PyTorch CPU and pinned tensors, any DLPack producer).
//!
//! Only C-contiguous arrays are accepted: the runtime reads them as flat tables. Nothing here
//! copies data or owns memory; an [`Array`] keeps the Python object (and the DLPack capsule)
//! alive while a call uses it.

use core::ffi::c_void;

use pyo3::prelude::*;
use pyo3::types::{PyCapsule, PyCapsuleMethods, PyDict, PyTuple};

use crate::errors::invalid;

/// Where an array's memory is.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Memory {
    /// Host memory (numpy, a CPU or pinned tensor).
    Host,
    /// CUDA device memory of device `0`.
    Cuda(i32),
    /// ROCm device memory of device `0`.
    Rocm(i32),
}

impl Memory {
    fn describe(self) -> String {
        match self {
            Memory::Host => "host memory".into(),
            Memory::Cuda(d) => format!("CUDA device {d} memory"),
            Memory::Rocm(d) => format!("ROCm device {d} memory"),
        }
    }
}

/// A contiguous array lent by Python for the length of a call (or, for pools, of a runtime).
pub struct Array {
    /// Address of the first element.
    pub ptr: u64,
    /// Bytes of the array.
    pub bytes: usize,
    /// Where the memory is.
    pub memory: Memory,
    /// Element kind (`'i'` signed, `'u'` unsigned, `'f'` float, `'b'` bool/other) and size.
    pub kind: char,
    /// Bytes per element.
    pub itemsize: usize,
    /// Shape.
    pub shape: Vec<usize>,
    /// Whether the producer marked the memory read-only.
    pub readonly: bool,
    /// The object (or the DLPack capsule holding it): kept alive with the array.
    #[allow(
        dead_code,
        reason = "held, never read: it keeps the array's memory alive"
    )]
    pub keep: Py<PyAny>,
}

impl Array {
    /// Elements of the array.
    pub fn len(&self) -> usize {
        self.shape.iter().product()
    }

    /// Refuses anything but an `int32` array.
    pub fn expect_i32(&self, what: &str) -> PyResult<()> {
        if self.kind != 'i' || self.itemsize != 4 {
            return Err(invalid(format!(
                "{what} must be an int32 array, not one of {}{}-byte elements; convert it with .astype(numpy.int32) or .to(torch.int32)",
                match self.kind {
                    'i' => "signed ",
                    'u' => "unsigned ",
                    'f' => "floating-point ",
                    _ => "",
                },
                self.itemsize
            )));
        }
        Ok(())
    }

    /// Refuses read-only memory for an output.
    pub fn expect_writable(&self, what: &str) -> PyResult<()> {
        if self.readonly {
            return Err(invalid(format!(
                "{what} is read-only; pass a writable array"
            )));
        }
        Ok(())
    }

    /// Refuses memory that is not where `expected` is.
    pub fn expect_memory(&self, what: &str, expected: &str, ok: bool) -> PyResult<()> {
        if !ok {
            return Err(invalid(format!(
                "{what} is {}, but this runtime needs {expected} there",
                self.memory.describe()
            )));
        }
        Ok(())
    }

    /// `[start, end)` of the array's bytes.
    pub fn range(&self) -> (u64, u64) {
        (self.ptr, self.ptr.saturating_add(self.bytes as u64))
    }
}

/// Refuses two arrays of one call whose bytes overlap (the backends' lending contracts forbid
/// it: an output may not alias an input).
pub fn check_disjoint(arrays: &[(&str, &Array)]) -> PyResult<()> {
    for (i, (a_name, a)) in arrays.iter().enumerate() {
        for (b_name, b) in &arrays[i + 1..] {
            let (a0, a1) = a.range();
            let (b0, b1) = b.range();
            if a0 < b1 && b0 < a1 && a.memory == b.memory {
                return Err(invalid(format!(
                    "{a_name} and {b_name} share memory; pass separate arrays"
                )));
            }
        }
    }
    Ok(())
}

/// Reads `obj` as an array. `what` names it in errors.
pub fn array(obj: &Bound<'_, PyAny>, what: &str) -> PyResult<Array> {
    if let Ok(iface) = obj.getattr("__cuda_array_interface__") {
        let device = cuda_device_of(obj);
        return from_interface(obj, &iface, what, Memory::Cuda(device));
    }
    if let Ok(iface) = obj.getattr("__array_interface__") {
        return from_interface(obj, &iface, what, Memory::Host);
    }
    if obj.hasattr("__dlpack__")? {
        return from_dlpack(obj, what);
    }
    Err(invalid(format!(
        "{what} is a {}, not an array: pass a numpy array or a PyTorch tensor (anything with __cuda_array_interface__, __array_interface__ or __dlpack__)",
        obj.get_type().name()?
    )))
}

/// The CUDA device of a tensor with a `device.index` (PyTorch), else 0.
fn cuda_device_of(obj: &Bound<'_, PyAny>) -> i32 {
    obj.getattr("device")
        .and_then(|d| d.getattr("index"))
        .and_then(|i| i.extract::<i32>())
        .unwrap_or(0)
}

/// An array from an array-interface dict (`__array_interface__`, `__cuda_array_interface__`).
fn from_interface(
    obj: &Bound<'_, PyAny>,
    iface: &Bound<'_, PyAny>,
    what: &str,
    memory: Memory,
) -> PyResult<Array> {
    let bad = |why: &str| invalid(format!("{what}: its array interface {why}"));
    let d = iface.cast::<PyDict>().map_err(|_| bad("is not a dict"))?;
    let data = d.get_item("data")?.ok_or_else(|| bad("has no `data`"))?;
    let data = data
        .cast::<PyTuple>()
        .map_err(|_| bad("`data` is not a (pointer, read-only) tuple"))?;
    let ptr: u64 = data.get_item(0)?.extract()?;
    let readonly: bool = data.get_item(1)?.extract()?;
    let shape: Vec<usize> = d
        .get_item("shape")?
        .ok_or_else(|| bad("has no `shape`"))?
        .extract()?;
    let typestr: String = d
        .get_item("typestr")?
        .ok_or_else(|| bad("has no `typestr`"))?
        .extract()?;
    let (kind, itemsize) = parse_typestr(&typestr).ok_or_else(|| {
        bad(&format!(
            "has element type `{typestr}`, which is not a plain number type"
        ))
    })?;
    let strides: Option<Vec<i64>> = match d.get_item("strides")? {
        Some(s) if !s.is_none() => Some(s.extract()?),
        _ => None,
    };
    if let Some(offset) = d.get_item("offset")? {
        let offset: u64 = offset.extract()?;
        if offset != 0 {
            return Err(bad("has a non-zero `offset`; pass a contiguous array"));
        }
    }
    check_contiguous(what, &shape, itemsize, strides.as_deref())?;
    let bytes = shape.iter().product::<usize>() * itemsize;
    Ok(Array {
        ptr,
        bytes,
        memory,
        kind,
        itemsize,
        shape,
        readonly,
        keep: obj.clone().unbind(),
    })
}

/// `<i4`, `|u1`, `<f2`, … → (kind, bytes).
fn parse_typestr(t: &str) -> Option<(char, usize)> {
    let mut chars = t.chars();
    let order = chars.next()?;
    if !matches!(order, '<' | '>' | '|' | '=') {
        return None;
    }
    if order == '>' && cfg!(target_endian = "little") {
        return None;
    }
    let kind = chars.next()?;
    if !matches!(kind, 'i' | 'u' | 'f' | 'b') {
        return None;
    }
    let size: usize = chars.as_str().parse().ok()?;
    (size > 0).then_some((kind, size))
}

/// Refuses arrays that are not C-contiguous (dimensions of extent 1 may have any stride).
fn check_contiguous(
    what: &str,
    shape: &[usize],
    itemsize: usize,
    strides: Option<&[i64]>,
) -> PyResult<()> {
    let Some(strides) = strides else {
        return Ok(());
    };
    if strides.len() != shape.len() {
        return Err(invalid(format!(
            "{what}: its strides and shape have different lengths"
        )));
    }
    let mut expected = itemsize as i64;
    for (&extent, &stride) in shape.iter().zip(strides).rev() {
        if extent > 1 && stride != expected {
            return Err(invalid(format!(
                "{what} is not C-contiguous (strides {strides:?} for shape {shape:?}); pass a contiguous array (.contiguous(), numpy.ascontiguousarray)"
            )));
        }
        expected *= extent as i64;
    }
    Ok(())
}

// ---- DLPack ---------------------------------------------------------------------------------
// The stable C structs of DLPack (dlpack.h, v0.8 / legacy `dltensor` capsules).

#[repr(C)]
struct DlDevice {
    device_type: i32,
    device_id: i32,
}

#[repr(C)]
struct DlDataType {
    code: u8,
    bits: u8,
    lanes: u16,
}

#[repr(C)]
struct DlTensor {
    data: *mut c_void,
    device: DlDevice,
    ndim: i32,
    dtype: DlDataType,
    shape: *const i64,
    strides: *const i64,
    byte_offset: u64,
}

#[repr(C)]
struct DlManagedTensor {
    dl_tensor: DlTensor,
    manager_ctx: *mut c_void,
    deleter: Option<unsafe extern "C" fn(*mut DlManagedTensor)>,
}

const KDL_CPU: i32 = 1;
const KDL_CUDA: i32 = 2;
const KDL_CUDA_HOST: i32 = 3;
const KDL_ROCM: i32 = 10;
const KDL_ROCM_HOST: i32 = 11;
const KDL_CUDA_MANAGED: i32 = 13;

/// An array from `obj.__dlpack__()`. The capsule stays unconsumed (named `dltensor`), so its
/// own destructor releases the tensor when the array drops.
fn from_dlpack(obj: &Bound<'_, PyAny>, what: &str) -> PyResult<Array> {
    let capsule = obj.call_method0("__dlpack__")?;
    let cap = capsule
        .cast::<PyCapsule>()
        .map_err(|_| invalid(format!("{what}: __dlpack__() did not return a capsule")))?;
    let ptr = cap.pointer_checked(Some(c"dltensor")).map_err(|_| {
        invalid(format!(
            "{what}: __dlpack__() did not return a `dltensor` capsule"
        ))
    })?;
    // SAFETY: a live `dltensor` capsule holds a valid `DLManagedTensor` (the DLPack protocol),
    // and the capsule is referenced by `cap` for as long as this borrow is used; the fields are
    // only read, and the shape and strides arrays hold `ndim` elements each.
    let (data, device, ndim, dtype, shape, strides, byte_offset) = unsafe {
        let t = &ptr.cast::<DlManagedTensor>().as_ref().dl_tensor;
        let ndim = usize::try_from(t.ndim).unwrap_or(0);
        let shape: Vec<i64> = if ndim == 0 || t.shape.is_null() {
            Vec::new()
        } else {
            core::slice::from_raw_parts(t.shape, ndim).to_vec()
        };
        let strides: Option<Vec<i64>> = if ndim == 0 || t.strides.is_null() {
            None
        } else {
            Some(core::slice::from_raw_parts(t.strides, ndim).to_vec())
        };
        (
            t.data as u64,
            (t.device.device_type, t.device.device_id),
            ndim,
            (t.dtype.code, t.dtype.bits, t.dtype.lanes),
            shape,
            strides,
            t.byte_offset,
        )
    };
    let _ = ndim;
    let memory = match device.0 {
        KDL_CPU | KDL_CUDA_HOST | KDL_ROCM_HOST => Memory::Host,
        KDL_CUDA | KDL_CUDA_MANAGED => Memory::Cuda(device.1),
        KDL_ROCM => Memory::Rocm(device.1),
        other => {
            return Err(invalid(format!(
                "{what} lives on DLPack device type {other}, which no HiSparse backend reads"
            )));
        }
    };
    let (code, bits, lanes) = dtype;
    let kind = match code {
        0 => 'i',
        1 => 'u',
        2 => 'f',
        _ => 'b',
    };
    if lanes != 1 || bits % 8 != 0 || bits == 0 {
        return Err(invalid(format!(
            "{what} has a DLPack element type of {bits} bits × {lanes} lanes; pass plain numbers"
        )));
    }
    let itemsize = usize::from(bits / 8);
    let shape: Vec<usize> = shape
        .iter()
        .map(|&s| usize::try_from(s))
        .collect::<Result<_, _>>()
        .map_err(|_| invalid(format!("{what} has a negative extent")))?;
    // DLPack strides count elements, not bytes.
    let byte_strides = strides.map(|s| {
        s.iter()
            .map(|&x| x.saturating_mul(itemsize as i64))
            .collect::<Vec<_>>()
    });
    check_contiguous(what, &shape, itemsize, byte_strides.as_deref())?;
    let bytes = shape.iter().product::<usize>() * itemsize;
    Ok(Array {
        ptr: data.saturating_add(byte_offset),
        bytes,
        memory,
        kind,
        itemsize,
        shape,
        readonly: false,
        keep: capsule.unbind(),
    })
}
