//! Lists that stay in device-readable memory for the life of a device: the list arena both GPU
//! backends keep beside their per-call staging.
//!
//! Per-call staging (the CUDA ring, the ROCm staging buffers) reuses its memory once the work that
//! read a list has completed. Two kinds of list must not be treated that way:
//!
//! * **lists of work captured into a graph** (CUDA stream capture, HIP graph capture): the graph's
//!   kernels read the list at *every replay*, long after the call returned and the staging memory
//!   was reused, so the list must stay valid and unchanged for as long as the graph may run — which
//!   the backend cannot know: for the device's life;
//! * **constant lists** ([`crate::plan::PartKind::Constant`]: an index group's layer table, the
//!   same on every call): staging them on every call costs host time (a copy and an event) for
//!   bytes that never change; kept once, a call only passes their address.
//!
//! [`ListArena`] places each distinct list once (content-addressed: equal bytes give the same
//! address, so a layer table or a re-captured list costs nothing the second time) in chunks it
//! never frees or moves, 16-byte aligned as the kernels require. The backend supplies the memory
//! and the copy ([`ArenaStore`]). **Growth:** the arena holds every distinct list placed in it
//! until the device is dropped — the constant lists of a layout (a few kilobytes) and the lists of
//! every distinct captured call; backends stop caching constant lists beyond
//! [`CONSTANT_CACHE_BYTES`] (they are then staged per call, as before) but place every captured
//! list, whatever the size, since a graph cannot work without it.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use crate::plan::PartKind;

/// Alignment of every list the arena places (the kernels read 16-byte vectors and structs).
pub const ARENA_ALIGN: u64 = 16;

/// Smallest chunk the arena asks its store for.
pub const ARENA_CHUNK_BYTES: usize = 64 * 1024;

/// Bytes of arena past which a backend no longer adds constant lists (it stages them per call);
/// captured lists are placed regardless.
pub const CONSTANT_CACHE_BYTES: u64 = 4 << 20;

/// The memory behind a [`ListArena`]: device-readable chunks and a way to fill them.
pub trait ArenaStore {
    /// A chunk of memory, kept (never freed) by the arena.
    type Chunk;
    /// The backend's error.
    type Error;
    /// A new chunk of at least `bytes` bytes and its device address (16-byte aligned).
    fn alloc(&mut self, bytes: usize) -> Result<(Self::Chunk, u64), Self::Error>;
    /// Copies `bytes` to device address `addr` inside a chunk, complete when it returns.
    fn write(&mut self, chunk: &Self::Chunk, addr: u64, bytes: &[u8]) -> Result<(), Self::Error>;
}

/// A placed list: its bytes (to tell lists with the same hash apart) and device address.
#[derive(Debug)]
struct Entry {
    bytes: Vec<u8>,
    addr: u64,
}

/// Content-addressed, append-only storage for lists kernels read (see the module docs).
#[derive(Debug)]
pub struct ListArena<C> {
    /// Every chunk ever allocated: `(chunk, device address, capacity)`; the last one is filled.
    chunks: Vec<(C, u64, usize)>,
    /// Bytes used in the last chunk.
    used: usize,
    /// Placed lists by the FNV-1a hash of their bytes.
    entries: HashMap<u64, Vec<Entry>>,
    /// Bytes of every list placed (without padding).
    placed: u64,
}

impl<C> Default for ListArena<C> {
    fn default() -> Self {
        ListArena {
            chunks: Vec::new(),
            used: 0,
            entries: HashMap::new(),
            placed: 0,
        }
    }
}

/// 64-bit FNV-1a of `bytes`.
fn fnv1a(bytes: &[u8]) -> u64 {
    bytes.iter().fold(0xcbf2_9ce4_8422_2325, |h, &b| {
        (h ^ u64::from(b)).wrapping_mul(0x0100_0000_01b3)
    })
}

impl<C> ListArena<C> {
    /// An empty arena (no memory until the first list).
    pub fn new() -> Self {
        Self::default()
    }

    /// The device address of a list equal to `bytes` already in the arena, if any.
    pub fn find(&self, bytes: &[u8]) -> Option<u64> {
        self.entries
            .get(&fnv1a(bytes))?
            .iter()
            .find(|e| e.bytes == bytes)
            .map(|e| e.addr)
    }

    /// The device address of `bytes` in the arena: the existing copy when an equal list was
    /// placed before, else a new copy written through `store` (a new chunk when the last one is
    /// full). An empty list gets a valid (16-byte) place too, so every list has an address.
    pub fn place<S: ArenaStore<Chunk = C>>(
        &mut self,
        bytes: &[u8],
        store: &mut S,
    ) -> Result<u64, S::Error> {
        if let Some(addr) = self.find(bytes) {
            return Ok(addr);
        }
        let len = bytes.len().max(1);
        let padded = len.next_multiple_of(ARENA_ALIGN as usize);
        let fits = self
            .chunks
            .last()
            .is_some_and(|&(_, _, cap)| self.used + padded <= cap);
        if !fits {
            let cap = padded.next_power_of_two().max(ARENA_CHUNK_BYTES);
            let (chunk, base) = store.alloc(cap)?;
            self.chunks.push((chunk, base, cap));
            self.used = 0;
        }
        let (chunk, base, _) = self.chunks.last().expect("a chunk with room exists");
        let addr = base + self.used as u64;
        if !bytes.is_empty() {
            store.write(chunk, addr, bytes)?;
        }
        self.used += padded;
        self.placed += bytes.len() as u64;
        self.entries.entry(fnv1a(bytes)).or_default().push(Entry {
            bytes: bytes.to_vec(),
            addr,
        });
        Ok(addr)
    }

    /// The arena's address of a staged list of `kind` (placing it if needed), or `None` when it
    /// is to be staged per call: every list of work being captured lives in the arena, and a
    /// constant list while the arena holds less than [`CONSTANT_CACHE_BYTES`] (or holds that
    /// list already). The one rule both GPU backends apply to each part of a plan.
    pub fn lasting_address<S: ArenaStore<Chunk = C>>(
        &mut self,
        bytes: &[u8],
        kind: PartKind,
        capturing: bool,
        store: &mut S,
    ) -> Result<Option<u64>, S::Error> {
        let keep = capturing
            || (kind == PartKind::Constant
                && (self.find(bytes).is_some() || self.placed < CONSTANT_CACHE_BYTES));
        if !keep {
            return Ok(None);
        }
        self.place(bytes, store).map(Some)
    }

    /// Bytes of every distinct list placed so far.
    pub fn placed_bytes(&self) -> u64 {
        self.placed
    }

    /// Bytes of every chunk allocated so far (what the arena holds on the device).
    pub fn chunk_bytes(&self) -> u64 {
        self.chunks.iter().map(|&(_, _, cap)| cap as u64).sum()
    }

    /// Distinct lists placed so far.
    pub fn lists(&self) -> usize {
        self.entries.values().map(Vec::len).sum()
    }

    /// The chunks, for a store that releases its memory itself (when the device goes: every
    /// list's address dies with them).
    pub fn into_chunks(self) -> impl Iterator<Item = C> {
        self.chunks.into_iter().map(|(chunk, _, _)| chunk)
    }
}

/// Objects a captured launch used (a stream's resolver scratch), kept until the device goes: a
/// graph reads them at every replay, however long after its calls their owner is dropped.
#[derive(Debug)]
pub struct Retained<T>(Mutex<Vec<Arc<T>>>);

impl<T> Default for Retained<T> {
    fn default() -> Self {
        Retained(Mutex::new(Vec::new()))
    }
}

impl<T> Retained<T> {
    /// Keeps `item` (once, however often it is retained).
    pub fn retain(&self, item: &Arc<T>) {
        let mut kept = self.0.lock().unwrap_or_else(|p| p.into_inner());
        if !kept.iter().any(|k| Arc::ptr_eq(k, item)) {
            kept.push(item.clone());
        }
    }

    /// Objects kept so far.
    pub fn len(&self) -> usize {
        self.0.lock().unwrap_or_else(|p| p.into_inner()).len()
    }

    /// Whether nothing is kept.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Drops every kept object now (before the memory they use goes).
    pub fn clear(&self) {
        self.0.lock().unwrap_or_else(|p| p.into_inner()).clear();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A store over host vectors standing for device memory, counting what it is asked to do.
    #[derive(Default)]
    struct Fake {
        memory: Vec<(u64, Vec<u8>)>,
        allocs: usize,
        writes: usize,
        fail_alloc: bool,
    }

    impl ArenaStore for Fake {
        type Chunk = usize;
        type Error = &'static str;
        fn alloc(&mut self, bytes: usize) -> Result<(usize, u64), &'static str> {
            if self.fail_alloc {
                return Err("out of memory");
            }
            self.allocs += 1;
            let base = 0x1000_0000 * (self.memory.len() as u64 + 1);
            self.memory.push((base, vec![0xEE; bytes]));
            Ok((self.memory.len() - 1, base))
        }
        fn write(&mut self, chunk: &usize, addr: u64, bytes: &[u8]) -> Result<(), &'static str> {
            self.writes += 1;
            let (base, mem) = &mut self.memory[*chunk];
            let at = (addr - *base) as usize;
            mem[at..at + bytes.len()].copy_from_slice(bytes);
            Ok(())
        }
    }

    fn read(store: &Fake, addr: u64, len: usize) -> Vec<u8> {
        let (base, mem) = store
            .memory
            .iter()
            .find(|(b, m)| *b <= addr && addr < *b + m.len() as u64)
            .expect("an address inside a chunk");
        let at = (addr - base) as usize;
        mem[at..at + len].to_vec()
    }

    #[test]
    fn equal_lists_are_placed_once_and_keep_their_bytes() {
        let (mut arena, mut store) = (ListArena::new(), Fake::default());
        let table = [1u8, 2, 3, 4, 5];
        let a = arena.place(&table, &mut store).unwrap();
        let b = arena.place(&[9u8; 40], &mut store).unwrap();
        // The same table again (a layer table on every call, a list captured twice): no write.
        assert_eq!(arena.place(&table, &mut store).unwrap(), a);
        assert_eq!((store.allocs, store.writes, arena.lists()), (1, 2, 2));
        assert_eq!(a % ARENA_ALIGN, 0);
        assert_eq!(b % ARENA_ALIGN, 0);
        assert!(b >= a + 16, "the lists do not overlap");
        assert_eq!(read(&store, a, 5), table);
        assert_eq!(read(&store, b, 40), [9u8; 40]);
        assert_eq!(arena.find(&[9u8; 40]), Some(b));
        assert_eq!(arena.find(&[9u8; 39]), None);
        assert_eq!(arena.placed_bytes(), 45);
    }

    #[test]
    fn a_full_chunk_is_kept_and_a_new_one_taken() {
        let (mut arena, mut store) = (ListArena::new(), Fake::default());
        let first = arena.place(&[1u8; 16], &mut store).unwrap();
        // Larger than what is left of the first chunk: a second, large enough for it.
        let big = vec![7u8; ARENA_CHUNK_BYTES * 3];
        let at = arena.place(&big, &mut store).unwrap();
        assert_eq!(store.allocs, 2);
        assert_eq!(
            arena.chunk_bytes(),
            (ARENA_CHUNK_BYTES + 4 * ARENA_CHUNK_BYTES) as u64
        );
        // Earlier lists never move: the first is still where it was, with its bytes.
        assert_eq!(read(&store, first, 16), [1u8; 16]);
        assert_eq!(read(&store, at, big.len()), big);
        // An empty list has an address too, and is placed once.
        let e = arena.place(&[], &mut store).unwrap();
        assert_eq!(arena.place(&[], &mut store).unwrap(), e);
    }

    #[test]
    fn captured_lists_always_stay_constant_ones_up_to_the_cap() {
        let (mut arena, mut store) = (ListArena::new(), Fake::default());
        let per_call = arena
            .lasting_address(&[1u8; 8], PartKind::PerCall, false, &mut store)
            .unwrap();
        assert_eq!(
            per_call, None,
            "a per-call list outside a capture is staged"
        );
        let captured = arena
            .lasting_address(&[1u8; 8], PartKind::PerCall, true, &mut store)
            .unwrap();
        let table = arena
            .lasting_address(&[2u8; 8], PartKind::Constant, false, &mut store)
            .unwrap();
        assert!(captured.is_some() && table.is_some());
        // Past the cap new constant lists are staged, known ones still found, captured placed.
        let big = vec![3u8; CONSTANT_CACHE_BYTES as usize];
        arena.place(&big, &mut store).unwrap();
        let new = [4u8; 8];
        assert_eq!(
            arena
                .lasting_address(&new, PartKind::Constant, false, &mut store)
                .unwrap(),
            None
        );
        assert_eq!(
            arena
                .lasting_address(&[2u8; 8], PartKind::Constant, false, &mut store)
                .unwrap(),
            table
        );
        assert!(
            arena
                .lasting_address(&new, PartKind::PerCall, true, &mut store)
                .unwrap()
                .is_some()
        );
        let kept = Retained::default();
        let a = Arc::new(1);
        kept.retain(&a);
        kept.retain(&a.clone());
        kept.retain(&Arc::new(1));
        assert_eq!(kept.len(), 2, "the same object is kept once");
        kept.clear();
        assert!(kept.is_empty());
    }

    #[test]
    fn a_failed_allocation_places_nothing() {
        let (mut arena, mut store) = (ListArena::<usize>::new(), Fake::default());
        store.fail_alloc = true;
        assert_eq!(arena.place(&[1u8; 8], &mut store), Err("out of memory"));
        assert_eq!((arena.lists(), arena.chunk_bytes()), (0, 0));
        store.fail_alloc = false;
        let a = arena.place(&[1u8; 8], &mut store).unwrap();
        assert_eq!(read(&store, a, 8), [1u8; 8]);
    }
}
