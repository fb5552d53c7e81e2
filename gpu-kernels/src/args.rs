//! Kernel arguments packed exactly as the ABI table declares them, for `cuLaunchKernel` and
//! `hipModuleLaunchKernel` alike (both take an array of pointers, one per parameter, each to a
//! value of the parameter's type).
//!
//! Every value sits in its own 8-byte aligned slot of one arena. Pointer arguments may be
//! *symbolic*: an address inside a list the backend stages for the launch ([`Args::staged`]) or
//! inside the stream's resolver workspace ([`Args::workspace`]). The backend resolves them once
//! it knows where those live ([`Args::resolve`]); [`Args::pointers`] refuses to hand out an
//! unresolved argument.

use crate::{GatherLayers, KernelAbi, Param};

/// A pointer argument whose address is known only once the backend has placed its data.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Place {
    /// Byte `offset` of staged part `part` (see [`crate::plan::Plan::staged`]).
    Staged {
        /// Index of the part.
        part: usize,
        /// Byte offset inside it.
        offset: u64,
    },
    /// Byte `offset` of the stream's workspace (see [`crate::plan::Plan::workspace_bytes`]).
    Workspace {
        /// Byte offset inside it.
        offset: u64,
    },
    /// The stream's resolver counters ([`crate::WORKSPACE_COUNTER_BYTES`], see
    /// [`crate::plan::Plan::workspace_bytes`]).
    Counters,
}

/// Kernel parameters of one launch.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Args {
    words: Vec<u64>,
    /// `(first word, type)` of each parameter, in order.
    slots: Vec<(usize, Param)>,
    /// Pointer parameters still to place: `(slot, place)`.
    pending: Vec<(usize, Place)>,
}

impl Args {
    fn push_bytes(&mut self, ty: Param, bytes: &[u8]) -> &mut Self {
        let at = self.words.len();
        // One copy into zeroed words (a by-value struct is over a kilobyte): the bytes in native
        // order, the last word's tail zero.
        self.words.resize(at + bytes.len().div_ceil(8), 0);
        bytemuck::cast_slice_mut::<u64, u8>(&mut self.words[at..])[..bytes.len()]
            .copy_from_slice(bytes);
        if self.slots.capacity() == 0 {
            // A kernel has up to about thirty parameters: grow once.
            self.slots.reserve(32);
        }
        self.slots.push((at, ty));
        self
    }

    /// A device address (0 for a null pointer the kernel does not dereference).
    pub fn ptr(&mut self, addr: u64) -> &mut Self {
        self.push_bytes(Param::Ptr, &addr.to_ne_bytes())
    }

    /// A device address inside data the backend places for this launch.
    pub fn placed(&mut self, place: Place) -> &mut Self {
        self.pending.push((self.slots.len(), place));
        self.ptr(0)
    }

    /// Byte `offset` of staged part `part`.
    pub fn staged(&mut self, part: usize, offset: u64) -> &mut Self {
        self.placed(Place::Staged { part, offset })
    }

    /// Byte `offset` of the stream's workspace.
    pub fn workspace(&mut self, offset: u64) -> &mut Self {
        self.placed(Place::Workspace { offset })
    }

    /// The stream's resolver counters.
    pub fn counters(&mut self) -> &mut Self {
        self.placed(Place::Counters)
    }

    /// A `uint32_t`.
    pub fn u32(&mut self, v: u32) -> &mut Self {
        self.push_bytes(Param::U32, &v.to_ne_bytes())
    }

    /// A `uint64_t`.
    pub fn u64(&mut self, v: u64) -> &mut Self {
        self.push_bytes(Param::U64, &v.to_ne_bytes())
    }

    /// A `hs_gather_layers` by value.
    pub fn gather_layers(&mut self, g: &GatherLayers) -> &mut Self {
        self.push_bytes(Param::GatherLayers, bytemuck::bytes_of(g))
    }

    /// Whether some pointer argument still waits for its place.
    pub fn has_pending(&self) -> bool {
        !self.pending.is_empty()
    }

    /// Places every symbolic pointer: `staged[part]` is the device address of staged part
    /// `part`, `workspace` that of the workspace and `counters` that of the stream's resolver
    /// counters (each 0 when the plan needs none).
    pub fn resolve(&mut self, staged: &[u64], workspace: u64, counters: u64) -> Result<(), String> {
        for (slot, place) in std::mem::take(&mut self.pending) {
            let addr = match place {
                Place::Staged { part, offset } => staged
                    .get(part)
                    .ok_or_else(|| format!("staged part {part} was not placed"))?
                    .checked_add(offset),
                Place::Workspace { offset } => {
                    if workspace == 0 {
                        return Err("the launch needs a workspace but none was placed".into());
                    }
                    workspace.checked_add(offset)
                }
                Place::Counters => {
                    if counters == 0 {
                        return Err(
                            "the launch needs the resolver counters but none were placed".into(),
                        );
                    }
                    Some(counters)
                }
            }
            .ok_or("placed address overflows")?;
            let word = self.slots[slot].0;
            self.words[word] = addr;
        }
        Ok(())
    }

    /// Checks the parameter types against `abi`; `Err` names the first difference.
    pub fn matches(&self, abi: &KernelAbi) -> Result<(), String> {
        if self.slots.len() != abi.params.len() {
            return Err(format!(
                "{}: {} arguments packed, the ABI declares {}",
                abi.name,
                self.slots.len(),
                abi.params.len()
            ));
        }
        for (i, ((_, ty), p)) in self.slots.iter().zip(abi.params).enumerate() {
            if *ty != p.ty {
                return Err(format!(
                    "{}: argument {i} (`{}`) packed as {ty:?}, the ABI declares {:?}",
                    abi.name, p.name, p.ty
                ));
            }
        }
        Ok(())
    }

    /// The raw bytes of parameter `i` (its slot, as many bytes as its type has).
    pub fn value(&self, i: usize) -> Option<&[u8]> {
        let &(at, ty) = self.slots.get(i)?;
        let bytes: &[u8] = bytemuck::cast_slice(&self.words[at..]);
        Some(&bytes[..ty.size()])
    }

    /// The `void*` array `cuLaunchKernel` / `hipModuleLaunchKernel` take: one pointer per
    /// parameter, into this value's arena (which must then not be touched until the launch call
    /// returned). Refused while a symbolic pointer is unresolved.
    pub fn pointers(&mut self) -> Result<Vec<*mut std::ffi::c_void>, String> {
        if self.has_pending() {
            return Err("a pointer argument was never placed (staged list or workspace)".into());
        }
        let base = self.words.as_mut_ptr();
        Ok(self
            .slots
            .iter()
            .map(|&(at, _)| base.wrapping_add(at).cast())
            .collect())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::Kernel;

    #[test]
    fn packing_is_checked_against_the_abi() {
        let mut a = Args::default();
        a.ptr(1).u32(2).ptr(3).u64(4);
        assert!(a.matches(&Kernel::Invalidate.abi()).is_ok());
        let mut wrong = Args::default();
        wrong.ptr(1).u32(2).ptr(3).u32(4);
        let e = wrong.matches(&Kernel::Invalidate.abi()).unwrap_err();
        assert!(e.contains("`total`"), "{e}");
        assert!(Args::default().matches(&Kernel::Remap.abi()).is_err());
    }

    #[test]
    fn values_land_in_their_slots() {
        let mut a = Args::default();
        a.u32(0xdead_beef).ptr(0x1234_5678_9abc).u64(7);
        assert_eq!(a.value(0).unwrap(), &0xdead_beef_u32.to_ne_bytes());
        assert_eq!(a.value(1).unwrap(), &0x1234_5678_9abc_u64.to_ne_bytes());
        assert_eq!(a.pointers().unwrap().len(), 3);
        let g = GatherLayers::new(&[]);
        let mut b = Args::default();
        b.gather_layers(&g).u32(5);
        assert_eq!(b.value(0).unwrap().len(), 1296);
        assert_eq!(b.value(1).unwrap(), &5u32.to_ne_bytes());
    }

    #[test]
    fn symbolic_pointers_must_be_placed() {
        let mut a = Args::default();
        a.staged(1, 16).u32(3).workspace(32).counters();
        assert!(a.pointers().is_err());
        assert!(a.clone().resolve(&[100], 0, 8).is_err(), "part 1 missing");
        assert!(
            a.clone().resolve(&[100, 200], 0, 8).is_err(),
            "no workspace"
        );
        assert!(
            a.clone().resolve(&[100, 200], 1000, 0).is_err(),
            "no counters"
        );
        a.resolve(&[100, 200], 1000, 8).unwrap();
        assert_eq!(a.value(0).unwrap(), &216u64.to_ne_bytes());
        assert_eq!(a.value(2).unwrap(), &1032u64.to_ne_bytes());
        assert_eq!(a.value(3).unwrap(), &8u64.to_ne_bytes());
        assert!(a.pointers().is_ok());
    }
}
