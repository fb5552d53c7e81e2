//! Streams the runtime enqueues on: its own compute stream, or streams the engine lends for the
//! length of the runtime's life (PyTorch's current stream, the side stream a CUDA graph is
//! captured on), named by [`StreamId`].

use hisparse_core::Device;

use crate::error::RuntimeError;
use crate::runtime::Runtime;

/// Streams an engine may lend one runtime ([`Runtime::adopt_stream`]). An engine uses a handful
/// (its main stream, a few capture streams); the bound keeps a binding that lends every stream
/// it sees from growing without end.
pub const MAX_LENT_STREAMS: usize = 64;

/// A stream lent to a runtime by [`Runtime::adopt_stream`]; calls taking `on: Option<StreamId>`
/// enqueue on it (`None`: the runtime's compute stream).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct StreamId(pub(crate) u32);

impl StreamId {
    /// The index of the stream among those lent to its runtime (for bindings that map handles).
    pub fn index(self) -> u32 {
        self.0
    }
}

/// The stream `on` names among `compute` and `lent` (a free function so callers can borrow
/// other fields of the runtime beside it).
pub(crate) fn pick<'s, S>(
    compute: &'s S,
    lent: &'s [S],
    on: Option<StreamId>,
) -> Result<&'s S, StreamError> {
    match on {
        None => Ok(compute),
        Some(StreamId(i)) => lent.get(i as usize).ok_or(StreamError(i)),
    }
}

/// A [`StreamId`] that is not one of the runtime's.
#[derive(Debug)]
pub(crate) struct StreamError(pub(crate) u32);

impl<E> From<StreamError> for RuntimeError<E> {
    fn from(e: StreamError) -> Self {
        RuntimeError::NoSuchStream { id: e.0 }
    }
}

impl<D: Device> Runtime<D> {
    /// Keeps `stream` (an engine's stream lent to the backend, e.g. `AnyDevice::lend_stream` of
    /// `torch.cuda.current_stream().cuda_stream`) for the runtime's life and returns its id,
    /// which step and per-layer calls take to enqueue on it. At most [`MAX_LENT_STREAMS`]; a
    /// binding lends each handle once and keeps the id.
    ///
    /// One step's calls — [`Runtime::begin_step_on`], the per-layer calls (or the replay of a
    /// graph that captured them) and [`Runtime::end_step_on`] — should run on one stream: the
    /// runtime orders a per-layer call on another stream after the step's before-forward work
    /// with an event (except while that stream is being captured, where the replay's order is
    /// the engine's), and orders its own after-forward copies after `end_step_on`'s stream. The
    /// exception is micro-batches ([`TopK::state_rows`]): their calls may run on a side stream.
    /// Outside a capture the runtime orders a resolve on another stream than the step's last
    /// one after it, and `end_step_on` after the last; in a graph the engine joins the side
    /// stream back.
    ///
    /// [`TopK::state_rows`]: crate::TopK::state_rows
    pub fn adopt_stream(&mut self, stream: D::Stream) -> Result<StreamId, RuntimeError<D::Error>> {
        if self.lent_streams.len() >= MAX_LENT_STREAMS {
            return Err(RuntimeError::Config {
                field: "adopt_stream",
                reason: format!(
                    "the runtime already holds {MAX_LENT_STREAMS} lent streams; lend each engine stream once and reuse its id"
                ),
            });
        }
        self.lent_streams.push(stream);
        Ok(StreamId(self.lent_streams.len() as u32 - 1))
    }

    /// The stream `on` names (`None`: the compute stream).
    pub fn stream(&self, on: Option<StreamId>) -> Result<&D::Stream, RuntimeError<D::Error>> {
        Ok(pick(&self.compute, &self.lent_streams, on)?)
    }

    /// Whether stream `on` is being captured into a graph.
    pub(crate) fn capturing(&self, on: Option<StreamId>) -> Result<bool, RuntimeError<D::Error>> {
        self.dev
            .is_capturing(self.stream(on)?)
            .map_err(RuntimeError::device(
                "asking whether a stream is being captured",
            ))
    }

    /// Refuses before-replay work (`call`) on a stream that is being captured into a graph: it
    /// would run only at replay, with this call's arguments frozen into the graph.
    pub(crate) fn refuse_capture(
        &self,
        on: Option<StreamId>,
        call: &'static str,
    ) -> Result<(), RuntimeError<D::Error>> {
        if self.capturing(on)? {
            return Err(RuntimeError::Capture { call });
        }
        Ok(())
    }
}
