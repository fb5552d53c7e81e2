//! A minimal ELF64 reader for AMDGPU code objects: the machine, the architecture flags and the
//! defined symbols. Enough to check that an embedded code object targets the architecture it is
//! filed under and defines every kernel (`name` and its descriptor `name.kd`), without LLVM tools.
//!
//! Safe code over byte slices; every read is bounds-checked and a malformed image is an error.

/// `EM_AMDGPU`.
pub const EM_AMDGPU: u16 = 224;
/// Mask of the architecture (`EF_AMDGPU_MACH_*`) in `e_flags`.
pub const EF_AMDGPU_MACH: u32 = 0xff;

/// `EF_AMDGPU_MACH_*` value of a processor name (only the targets this project builds), or `None`.
pub fn mach_of(arch: &str) -> Option<u32> {
    match arch {
        "gfx90a" => Some(0x3f),
        "gfx942" => Some(0x4c),
        "gfx1100" => Some(0x41),
        "gfx1201" => Some(0x4e),
        _ => None,
    }
}

/// What [`parse`] reads from an image.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ElfInfo {
    /// `e_machine`.
    pub machine: u16,
    /// `e_flags`.
    pub flags: u32,
    /// Names of the defined symbols (section index ≠ `SHN_UNDEF`) of every symbol table.
    pub symbols: Vec<String>,
}

impl ElfInfo {
    /// Whether `kernel` is defined together with its kernel descriptor `kernel.kd`.
    pub fn has_kernel(&self, kernel: &str) -> bool {
        let kd = format!("{kernel}.kd");
        self.symbols.iter().any(|s| s == kernel) && self.symbols.contains(&kd)
    }
}

fn u16_at(b: &[u8], at: usize) -> Result<u16, String> {
    b.get(at..at + 2)
        .map(|s| u16::from_le_bytes([s[0], s[1]]))
        .ok_or_else(|| format!("truncated at byte {at}"))
}

fn u32_at(b: &[u8], at: usize) -> Result<u32, String> {
    b.get(at..at + 4)
        .map(|s| u32::from_le_bytes([s[0], s[1], s[2], s[3]]))
        .ok_or_else(|| format!("truncated at byte {at}"))
}

fn u64_at(b: &[u8], at: usize) -> Result<u64, String> {
    let s = b
        .get(at..at + 8)
        .ok_or_else(|| format!("truncated at byte {at}"))?;
    let mut a = [0u8; 8];
    a.copy_from_slice(s);
    Ok(u64::from_le_bytes(a))
}

fn usize_of(v: u64) -> Result<usize, String> {
    usize::try_from(v).map_err(|_| format!("offset {v} does not fit the address space"))
}

/// Checks the identification bytes of an ELF64 little-endian header.
pub fn is_elf64_le(header: &[u8]) -> bool {
    header.len() >= 64 && header[..4] == *b"\x7fELF" && header[4] == 2 && header[5] == 1
}

/// Bytes covered by the section header table, read from the 64-byte header alone (the table is
/// at the end of LLVM's output, so this is usually the whole image).
pub fn header_extent(header: &[u8]) -> Result<usize, String> {
    if !is_elf64_le(header) {
        return Err("not an ELF64 little-endian image".into());
    }
    let shoff = usize_of(u64_at(header, 40)?)?;
    let shentsize = usize::from(u16_at(header, 58)?);
    let shnum = usize::from(u16_at(header, 60)?);
    shoff
        .checked_add(shentsize * shnum)
        .map(|e| e.max(64))
        .ok_or_else(|| "section table extent overflows".into())
}

struct Section {
    kind: u32,
    offset: usize,
    size: usize,
    link: usize,
    entsize: usize,
}

fn sections(b: &[u8]) -> Result<Vec<Section>, String> {
    let shoff = usize_of(u64_at(b, 40)?)?;
    let shentsize = usize::from(u16_at(b, 58)?);
    let shnum = usize::from(u16_at(b, 60)?);
    if shnum > 0 && shentsize < 64 {
        return Err(format!("section header size {shentsize} < 64"));
    }
    (0..shnum)
        .map(|i| {
            let h = shoff + i * shentsize;
            Ok(Section {
                kind: u32_at(b, h + 4)?,
                offset: usize_of(u64_at(b, h + 24)?)?,
                size: usize_of(u64_at(b, h + 32)?)?,
                link: u32_at(b, h + 40)? as usize,
                entsize: usize_of(u64_at(b, h + 56)?)?,
            })
        })
        .collect()
}

/// Total bytes of the image: the furthest end of the header table or any section with file
/// contents. `b` must hold at least [`header_extent`] bytes.
pub fn extent(b: &[u8]) -> Result<usize, String> {
    let mut end = header_extent(b)?;
    for s in sections(b)? {
        // SHT_NOBITS (8) has no file contents.
        if s.kind != 8 {
            end = end.max(s.offset.saturating_add(s.size));
        }
    }
    Ok(end)
}

/// Reads the machine, flags and defined symbols of a complete image.
pub fn parse(b: &[u8]) -> Result<ElfInfo, String> {
    header_extent(b)?;
    let secs = sections(b)?;
    let mut symbols = Vec::new();
    for s in &secs {
        // SHT_SYMTAB (2) and SHT_DYNSYM (11).
        if s.kind != 2 && s.kind != 11 {
            continue;
        }
        let strtab = secs
            .get(s.link)
            .ok_or_else(|| format!("symbol table links to missing section {}", s.link))?;
        let strings = b
            .get(strtab.offset..strtab.offset.saturating_add(strtab.size))
            .ok_or("string table outside the image")?;
        let entsize = if s.entsize == 0 { 24 } else { s.entsize };
        let table = b
            .get(s.offset..s.offset.saturating_add(s.size))
            .ok_or("symbol table outside the image")?;
        for sym in table.chunks_exact(entsize) {
            let name = u32_at(sym, 0)? as usize;
            let shndx = u16_at(sym, 6)?;
            if shndx == 0 || name == 0 {
                continue;
            }
            let rest = strings.get(name..).ok_or("symbol name outside its table")?;
            let len = rest.iter().position(|&c| c == 0).unwrap_or(rest.len());
            symbols.push(String::from_utf8_lossy(&rest[..len]).into_owned());
        }
    }
    Ok(ElfInfo {
        machine: u16_at(b, 18)?,
        flags: u32_at(b, 48)?,
        symbols,
    })
}
