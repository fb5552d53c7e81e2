//! The double's device: allocations, stream queues, events, modules, the sticky error.
//!
//! Streams *queue* their work; nothing runs until something waits for it (a stream or device
//! synchronisation, a synchronous copy, a free). A wait on an event runs the recorded stream up to
//! the recorded point first. This is stricter than eager execution: a backend that reads results
//! before synchronising, frees memory still in use, or passes memory that dies before the work
//! runs gets wrong data or an error here, as it could on a GPU.
//!
//! A stream being captured (`hipStreamBeginCapture`) records its work into the capture instead
//! of queueing it (see `crate::graph`); while a capture in global mode is open, the calls HIP
//! deems unsafe are refused on threads that are not in relaxed mode, and the capture is
//! invalidated, as on a GPU.

use std::collections::{BTreeMap, HashMap, VecDeque};

use crate::status::*;

/// Which API allocated a range.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Kind {
    /// `hipMalloc`.
    Device,
    /// `hipHostMalloc` (pinned, mapped: the same address on host and device).
    Pinned,
    /// Host memory someone else allocated, registered with `hipHostRegister` (pinned and mapped
    /// at the same address; never allocated or freed by the double).
    Registered,
}

impl Kind {
    /// Pinned host memory of either origin (what host-side copies and mapped kernels accept).
    pub const HOST: &'static [Kind] = &[Kind::Pinned, Kind::Registered];
}

/// One live allocation.
#[derive(Debug)]
pub struct Alloc {
    /// Bytes asked for.
    pub len: usize,
    /// Which API made it.
    pub kind: Kind,
    /// Bytes actually reserved (at least 1, for the layout).
    pub reserved: usize,
}

/// Work queued on a stream.
#[derive(Clone, Debug)]
pub enum Op {
    /// `memmove(dst, src, len)` between validated ranges.
    Copy {
        /// Destination address.
        dst: usize,
        /// Source address.
        src: usize,
        /// Bytes.
        len: usize,
    },
    /// `memset(dst, value, len)` on a validated device range.
    Fill {
        /// Destination address.
        dst: usize,
        /// Byte value.
        value: u8,
        /// Bytes.
        len: usize,
    },
    /// Run the recorded stream up to the recorded point.
    Wait {
        /// Stream id.
        stream: usize,
        /// Sequence number to reach.
        seq: u64,
    },
    /// A kernel launch: the index of the kernel and its decoded parameters.
    Launch(crate::exec::Launch),
}

/// A stream's queue.
#[derive(Debug, Default)]
pub struct Stream {
    /// Pending work with its sequence number.
    pub queue: VecDeque<(u64, Op)>,
    /// Sequence number of the last enqueued op (0 = none yet).
    pub enqueued: u64,
    /// The capture open on the stream, if any: its work goes there instead of the queue.
    pub capture: Option<Capture>,
}

/// An open stream capture.
#[derive(Debug, Default)]
pub struct Capture {
    /// `hipStreamCaptureMode` it was begun with (0 global, 1 thread-local, 2 relaxed).
    pub mode: i32,
    /// The work recorded so far, in stream order.
    pub ops: Vec<Op>,
    /// An operation the capture cannot record ran: ending it fails.
    pub invalidated: bool,
}

/// A loaded module: the kernel names it defines.
#[derive(Debug)]
pub struct Module {
    /// Defined kernel names.
    pub kernels: Vec<String>,
}

/// Everything the double knows.
#[derive(Debug, Default)]
pub struct State {
    /// Live allocations by start address.
    pub allocs: BTreeMap<usize, Alloc>,
    /// Bytes of device memory allocated now.
    pub device_bytes: usize,
    /// Streams by handle (0 = the null stream, always present).
    pub streams: HashMap<usize, Stream>,
    /// Events by handle: `(stream, seq)` when recorded.
    pub events: HashMap<usize, Option<(usize, u64)>>,
    /// Modules by handle.
    pub modules: HashMap<usize, Module>,
    /// Functions by handle: index into the kernel ABI table.
    pub functions: HashMap<usize, usize>,
    /// A launch failed: every later synchronising call reports this status.
    pub sticky: Option<(u32, String)>,
    /// Next handle value.
    next_handle: usize,
    /// Kernel launches executed, by kernel name (for tests of the double itself).
    pub launches: BTreeMap<String, u64>,
    /// Graphs and their instantiations by handle: the recorded work each replay enqueues.
    pub graphs: HashMap<usize, Vec<Op>>,
    /// Events recorded on a stream being captured (they belong to the graph: querying or
    /// waiting for them outside it is `hipErrorCapturedEvent`).
    pub captured_events: std::collections::HashSet<usize>,
}

impl State {
    /// A fresh opaque handle (never 0, never reused).
    pub fn handle(&mut self) -> usize {
        if self.next_handle == 0 {
            self.next_handle = 0x1000;
        }
        self.next_handle += 16;
        self.next_handle
    }

    /// The allocation holding `[addr, addr + len)`, with the offset of `addr` in it.
    pub fn find(&self, addr: usize, len: usize) -> Option<(usize, &Alloc)> {
        let (&start, a) = self.allocs.range(..=addr).next_back()?;
        let off = addr - start;
        (off <= a.len && len <= a.len - off).then_some((start, a))
    }

    /// Bytes from `addr` to the end of its allocation, if `addr` lies in one.
    pub fn room(&self, addr: usize) -> Option<usize> {
        let (start, a) = self.find(addr, 0)?;
        Some(a.len - (addr - start))
    }

    /// Checks that `[addr, addr + len)` lies in one allocation of an allowed kind.
    pub fn check_range(&self, addr: usize, len: usize, kinds: &[Kind]) -> Result<(), u32> {
        if len == 0 {
            return Ok(());
        }
        match self.find(addr, len) {
            Some((_, a)) if kinds.contains(&a.kind) => Ok(()),
            _ => Err(HIP_ERROR_INVALID_VALUE),
        }
    }

    /// The stream for a handle (the null stream is created on first use).
    pub fn stream(&mut self, handle: usize) -> Result<&mut Stream, u32> {
        if handle == 0 {
            return Ok(self.streams.entry(0).or_default());
        }
        self.streams
            .get_mut(&handle)
            .ok_or(HIP_ERROR_INVALID_HANDLE)
    }

    /// Queues `op` on `stream`, or records it in the stream's capture (a cross-stream wait
    /// cannot be recorded: it invalidates the capture).
    pub fn enqueue(&mut self, stream: usize, op: Op) -> Result<(), u32> {
        let s = self.stream(stream)?;
        if let Some(c) = s.capture.as_mut() {
            if matches!(op, Op::Wait { .. }) {
                c.invalidated = true;
                return Err(HIP_ERROR_STREAM_CAPTURE_UNSUPPORTED);
            }
            c.ops.push(op);
            return Ok(());
        }
        s.enqueued += 1;
        let seq = s.enqueued;
        s.queue.push_back((seq, op));
        Ok(())
    }

    /// Runs `stream` until its op `seq` has completed.
    pub fn run_until(&mut self, stream: usize, seq: u64) {
        loop {
            let Some(s) = self.streams.get_mut(&stream) else {
                return;
            };
            match s.queue.front() {
                Some(&(next, _)) if next <= seq => {}
                _ => return,
            }
            let (_, op) = s.queue.pop_front().expect("front checked above");
            self.execute(op);
        }
    }

    /// Runs every queued op of `stream`.
    pub fn drain(&mut self, stream: usize) {
        let end = self.streams.get(&stream).map_or(0, |s| s.enqueued);
        self.run_until(stream, end);
    }

    /// Runs every queued op of every stream (a device synchronisation).
    pub fn drain_all(&mut self) {
        let mut ids: Vec<usize> = self.streams.keys().copied().collect();
        ids.sort_unstable();
        for id in ids {
            self.drain(id);
        }
    }

    fn execute(&mut self, op: Op) {
        match op {
            Op::Copy { dst, src, len } => {
                // Ranges were validated at enqueue time and frees drain every queue first, so
                // both are still live allocations.
                let bytes = crate::mem::read(self, src, len);
                crate::mem::write(self, dst, &bytes);
            }
            Op::Fill { dst, value, len } => crate::mem::write(self, dst, &vec![value; len]),
            Op::Wait { stream, seq } => self.run_until(stream, seq),
            Op::Launch(launch) => {
                let name = crate::exec::kernel_name(&launch).to_owned();
                *self.launches.entry(name.clone()).or_default() += 1;
                if self.sticky.is_some() {
                    return;
                }
                if let Err(message) = crate::exec::run(self, &launch) {
                    // A GPU reports only the status; the double also says why, once.
                    eprintln!("hip-double: {name} faulted: {message}");
                    self.sticky = Some((HIP_ERROR_ILLEGAL_ADDRESS, format!("{name}: {message}")));
                }
            }
        }
    }

    /// Whether a capture in global mode is open on some stream.
    pub fn global_capture_open(&self) -> bool {
        self.streams
            .values()
            .any(|s| s.capture.as_ref().is_some_and(|c| c.mode == 0))
    }

    /// Invalidates every open capture in global mode (an unsafe call ran while they were open).
    pub fn invalidate_global_captures(&mut self) {
        for c in self.streams.values_mut().filter_map(|s| s.capture.as_mut()) {
            if c.mode == 0 {
                c.invalidated = true;
            }
        }
    }

    /// The sticky error status, or success.
    pub fn sticky_status(&self) -> u32 {
        self.sticky.as_ref().map_or(HIP_SUCCESS, |(s, _)| *s)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::mem;

    fn copy(st: &mut State, stream: usize, dst: usize, src: usize) {
        st.enqueue(stream, Op::Copy { dst, src, len: 4 }).unwrap();
    }

    #[test]
    fn queued_work_runs_only_when_waited_for_and_waits_follow_events() {
        let mut st = State::default();
        let (a, b) = (st.handle(), st.handle());
        st.streams.insert(a, Stream::default());
        st.streams.insert(b, Stream::default());
        let x = mem::alloc(&mut st, 4, Kind::Pinned).unwrap();
        let y = mem::alloc(&mut st, 4, Kind::Device).unwrap();
        let z = mem::alloc(&mut st, 4, Kind::Pinned).unwrap();
        mem::write(&st, x, &[1, 2, 3, 4]);
        copy(&mut st, a, y, x);
        let recorded = st.streams[&a].enqueued;
        st.enqueue(
            b,
            Op::Wait {
                stream: a,
                seq: recorded,
            },
        )
        .unwrap();
        copy(&mut st, b, z, y);
        assert_eq!(mem::read(&st, z, 4), [mem::GARBAGE; 4], "nothing ran yet");
        st.drain(b);
        assert_eq!(
            mem::read(&st, z, 4),
            [1, 2, 3, 4],
            "the wait ran stream a first"
        );
        assert!(st.streams[&a].queue.is_empty());
        for addr in [x, y, z] {
            mem::free(&mut st, addr).unwrap();
        }
        assert!(st.allocs.is_empty());
    }

    #[test]
    fn ranges_must_lie_in_one_allocation_of_the_right_kind() {
        let mut st = State::default();
        let d = mem::alloc(&mut st, 64, Kind::Device).unwrap();
        assert!(st.check_range(d, 64, &[Kind::Device]).is_ok());
        assert!(st.check_range(d + 60, 8, &[Kind::Device]).is_err());
        assert!(st.check_range(d, 8, &[Kind::Pinned]).is_err());
        assert!(st.check_range(d - 1, 1, &[Kind::Device]).is_err());
        assert_eq!(st.room(d + 10), Some(54));
        mem::free(&mut st, d).unwrap();
        assert!(st.check_range(d, 1, &[Kind::Device]).is_err());
    }
}
