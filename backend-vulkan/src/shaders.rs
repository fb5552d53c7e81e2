//! The compute shaders: WGSL sources in `shaders/`, compiled to SPIR-V by `build.rs` (naga) and
//! embedded here, 4-byte aligned.

/// Bytes embedded with 4-byte alignment, as SPIR-V words require.
#[repr(C, align(4))]
pub struct Aligned<T: ?Sized>(pub T);

macro_rules! spirv {
    ($name:literal) => {{
        static BYTES: &Aligned<[u8]> = &Aligned(*include_bytes!(concat!(
            env!("OUT_DIR"),
            "/",
            $name,
            ".spv"
        )));
        &BYTES.0
    }};
}

/// One compute shader of the backend.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Shader {
    /// Index remap.
    Remap,
    /// Compressed slot mapping.
    SlotMapping,
    /// Hot-entry invalidation.
    Invalidate,
    /// Resolve pass 1: group token rows by request.
    ResolvePrep,
    /// Resolve pass 2: one workgroup per request.
    Resolve,
    /// Gather with one binding per pool.
    Gather1,
    /// Gather with 8 windows per pool.
    Gather8,
    /// Gather with 32 windows per pool.
    Gather32,
}

impl Shader {
    /// Every shader, in pipeline-table order.
    pub const ALL: [Shader; 8] = [
        Shader::Remap,
        Shader::SlotMapping,
        Shader::Invalidate,
        Shader::ResolvePrep,
        Shader::Resolve,
        Shader::Gather1,
        Shader::Gather8,
        Shader::Gather32,
    ];

    /// The gather variants, fewest windows first.
    pub const GATHERS: [Shader; 3] = [Shader::Gather1, Shader::Gather8, Shader::Gather32];

    /// Windows per pool of a gather variant (0 for other shaders).
    pub fn windows(self) -> u64 {
        match self {
            Shader::Gather1 => 1,
            Shader::Gather8 => 8,
            Shader::Gather32 => 32,
            _ => 0,
        }
    }

    /// Index in [`Shader::ALL`].
    pub fn index(self) -> usize {
        self as usize
    }

    /// File name stem of the shader.
    pub fn name(self) -> &'static str {
        match self {
            Shader::Remap => "remap",
            Shader::SlotMapping => "slot_mapping",
            Shader::Invalidate => "invalidate",
            Shader::ResolvePrep => "resolve_prep",
            Shader::Resolve => "resolve",
            Shader::Gather1 => "gather_1",
            Shader::Gather8 => "gather_8",
            Shader::Gather32 => "gather_32",
        }
    }

    /// The SPIR-V bytes (little-endian words).
    pub fn spirv(self) -> &'static [u8] {
        match self {
            Shader::Remap => spirv!("remap"),
            Shader::SlotMapping => spirv!("slot_mapping"),
            Shader::Invalidate => spirv!("invalidate"),
            Shader::ResolvePrep => spirv!("resolve_prep"),
            Shader::Resolve => spirv!("resolve"),
            Shader::Gather1 => spirv!("gather_1"),
            Shader::Gather8 => spirv!("gather_8"),
            Shader::Gather32 => spirv!("gather_32"),
        }
    }

    /// Storage-buffer bindings `0..n` of the shader's single descriptor set.
    pub fn bindings(self) -> u32 {
        match self {
            Shader::Remap => 6,
            Shader::SlotMapping => 5,
            Shader::Invalidate => 2,
            Shader::ResolvePrep => 3,
            Shader::Resolve => 21,
            Shader::Gather1 => 6,
            Shader::Gather8 => 4 + 2 * 8,
            Shader::Gather32 => 4 + 2 * 32,
        }
    }

    /// Bytes of push constants.
    pub fn push_bytes(self) -> u32 {
        4 * match self {
            Shader::Remap => 8,
            Shader::SlotMapping => 5,
            Shader::Invalidate => 2,
            Shader::ResolvePrep => 2,
            Shader::Resolve => 10,
            Shader::Gather1 | Shader::Gather8 | Shader::Gather32 => 6,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn embedded_spirv_is_aligned_and_starts_with_the_magic_word() {
        for s in Shader::ALL {
            let bytes = s.spirv();
            assert_eq!(bytes.as_ptr() as usize % 4, 0, "{}", s.name());
            assert_eq!(bytes.len() % 4, 0, "{}", s.name());
            assert_eq!(&bytes[..4], &0x0723_0203u32.to_le_bytes(), "{}", s.name());
        }
    }
}
