//! A NIXL agent with the UCX backend: what each side of the disaggregated path holds.
//!
//! The decode side registers its host pool ([`Endpoint::register`]) and publishes
//! [`Endpoint::metadata`]; the prefill side registers its GPU (or host) pool, loads that metadata
//! ([`Endpoint::connect`]) and writes pages with a notification ([`Endpoint::write`]); the decode
//! side collects notifications without blocking ([`Endpoint::notices`]).

use std::time::{Duration, Instant};

use nixl_sys::{
    Agent, Backend, NixlError, NotificationMap, OptArgs, RegistrationHandle, XferDescList, XferOp,
    XferRequest, XferStatus,
};

use crate::ffi::{self, RawRegion};
use crate::{PdError, Region, Span};

/// The transport plugin used: UCX (shared memory, TCP, RDMA and CUDA memory as the machine has).
pub const PLUGIN: &str = "UCX";

fn nixl(op: &'static str) -> impl Fn(NixlError) -> PdError {
    move |e| PdError::Nixl {
        op,
        detail: e.to_string(),
    }
}

/// One side's transfer agent.
pub struct Endpoint {
    // Field order is drop order: registrations go before the agent that holds them.
    registrations: Vec<RegistrationHandle>,
    _backend: Backend,
    agent: Agent,
    name: String,
}

impl std::fmt::Debug for Endpoint {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Endpoint")
            .field("name", &self.name)
            .field("registrations", &self.registrations.len())
            .finish()
    }
}

impl Endpoint {
    /// An agent named `name` (unique among the agents that talk to each other) with the UCX
    /// backend. Fails with a typed error when NIXL's libraries or its UCX plugin are missing.
    pub fn new(name: &str) -> Result<Self, PdError> {
        ffi::probe()?;
        let agent = Agent::new(name).map_err(nixl("creating the agent"))?;
        let plugins: Vec<String> = agent
            .get_available_plugins()
            .map_err(nixl("listing plugins"))?
            .iter()
            .filter_map(|p| p.ok().map(str::to_string))
            .collect();
        if !plugins.iter().any(|p| p == PLUGIN) {
            return Err(PdError::PluginMissing {
                plugin: PLUGIN.into(),
                available: plugins,
            });
        }
        let (_mems, params) = agent
            .get_plugin_params(PLUGIN)
            .map_err(nixl("reading the UCX plugin's parameters"))?;
        let backend = agent
            .create_backend(PLUGIN, &params)
            .map_err(nixl("creating the UCX backend"))?;
        Ok(Endpoint {
            registrations: Vec::new(),
            _backend: backend,
            agent,
            name: name.to_string(),
        })
    }

    /// The agent's name.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// Registers `region` with the agent, so that peers may write it (or this side may read it
    /// for its writes). It stays registered until the endpoint is dropped.
    ///
    /// # Safety
    ///
    /// `region` must be memory of this process (host memory, or device memory of the GPU
    /// `region.memory` names, in the current context) that stays allocated until the endpoint
    /// is dropped. Once its metadata is published, a peer may write any byte of it at any time
    /// until then: the caller must hand out only blocks nothing else uses meanwhile (the decode
    /// coordinator's assignment), and read them only after the notice of their transfer arrived.
    pub unsafe fn register(&mut self, region: Region) -> Result<(), PdError> {
        if region.len == 0 || region.address == 0 {
            return Err(PdError::Region {
                detail: "an empty region cannot be registered".into(),
            });
        }
        let handle = self
            .agent
            .register_memory(&RawRegion(region), None)
            .map_err(nixl("registering memory"))?;
        self.registrations.push(handle);
        Ok(())
    }

    /// The agent's metadata, which a peer loads to reach it (and what it registered).
    pub fn metadata(&self) -> Result<Vec<u8>, PdError> {
        self.agent
            .get_local_md()
            .map_err(nixl("reading the agent's metadata"))
    }

    /// Loads a peer's metadata; returns the peer's agent name.
    pub fn connect(&self, metadata: &[u8]) -> Result<String, PdError> {
        self.agent
            .load_remote_md(metadata)
            .map_err(nixl("loading the peer's metadata"))
    }

    /// Writes `local_spans` of `local` into `remote_spans` of the peer `remote_agent`'s
    /// `remote` region (pairwise, equal lengths), with `notice` as the notification the peer
    /// receives once the bytes are in place. Both regions must be registered by their owners.
    pub fn write(
        &self,
        remote_agent: &str,
        (local, local_spans): (&Region, &[Span]),
        (remote, remote_spans): (&Region, &[Span]),
        notice: &[u8],
    ) -> Result<Transfer, PdError> {
        if local_spans.len() != remote_spans.len() || local_spans.is_empty() {
            return Err(PdError::Region {
                detail: format!(
                    "{} local spans for {} remote ones: a transfer pairs one with one",
                    local_spans.len(),
                    remote_spans.len()
                ),
            });
        }
        let mut src = XferDescList::new(ffi::mem_type(local.memory))
            .map_err(nixl("creating a descriptor list"))?;
        let mut dst = XferDescList::new(ffi::mem_type(remote.memory))
            .map_err(nixl("creating a descriptor list"))?;
        let mut bytes = 0u64;
        for (l, r) in local_spans.iter().zip(remote_spans) {
            if l.len != r.len {
                return Err(PdError::Region {
                    detail: format!(
                        "a span of {} bytes paired with one of {}: pages differ in size",
                        l.len, r.len
                    ),
                });
            }
            src.add_desc(
                local.address_of(l.offset, l.len)? as usize,
                l.len as usize,
                ffi::device_id(local.memory),
            );
            dst.add_desc(
                remote.address_of(r.offset, r.len)? as usize,
                r.len as usize,
                ffi::device_id(remote.memory),
            );
            bytes += l.len;
        }
        let mut args = OptArgs::new().map_err(nixl("creating transfer arguments"))?;
        args.set_has_notification(true)
            .and_then(|()| args.set_notification_message(notice))
            .map_err(nixl("attaching the notification"))?;
        let started = Instant::now();
        let request = self
            .agent
            .create_xfer_req(XferOp::Write, &src, &dst, remote_agent, Some(&args))
            .map_err(nixl("preparing the write"))?;
        let in_progress = self
            .agent
            .post_xfer_req(&request, None)
            .map_err(nixl("posting the write"))?;
        Ok(Transfer {
            request,
            bytes,
            descriptors: local_spans.len() as u64,
            started,
            finished: (!in_progress).then(Instant::now),
        })
    }

    /// Whether `transfer` has completed (without waiting).
    pub fn poll(&self, transfer: &mut Transfer) -> Result<bool, PdError> {
        if transfer.finished.is_some() {
            return Ok(true);
        }
        match self
            .agent
            .get_xfer_status(&transfer.request)
            .map_err(nixl("checking a write"))?
        {
            XferStatus::Success => {
                transfer.finished = Some(Instant::now());
                Ok(true)
            }
            XferStatus::InProgress => Ok(false),
        }
    }

    /// Notifications that arrived since the last call, as (sender agent, bytes); never waits.
    pub fn notices(&self) -> Result<Vec<(String, Vec<u8>)>, PdError> {
        let mut map = NotificationMap::new().map_err(nixl("creating a notification map"))?;
        self.agent
            .get_notifications(&mut map, None)
            .map_err(nixl("collecting notifications"))?;
        let agents: Vec<String> = map
            .agents()
            .map(|a| a.map(str::to_string))
            .collect::<Result<_, _>>()
            .map_err(nixl("reading notifications"))?;
        let mut out = Vec::new();
        for a in agents {
            let n = map
                .get_notifications_size(&a)
                .map_err(nixl("reading notifications"))?;
            for i in 0..n {
                let bytes = map
                    .get_notification_bytes(&a, i)
                    .map_err(nixl("reading notifications"))?;
                out.push((a.clone(), bytes));
            }
        }
        Ok(out)
    }
}

/// A posted write.
pub struct Transfer {
    request: XferRequest,
    bytes: u64,
    descriptors: u64,
    started: Instant,
    finished: Option<Instant>,
}

impl std::fmt::Debug for Transfer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Transfer")
            .field("bytes", &self.bytes)
            .field("descriptors", &self.descriptors)
            .field("finished", &self.finished.is_some())
            .finish()
    }
}

impl Transfer {
    /// Bytes it writes.
    pub fn bytes(&self) -> u64 {
        self.bytes
    }

    /// Descriptors (contiguous ranges) it moves.
    pub fn descriptors(&self) -> u64 {
        self.descriptors
    }

    /// From preparing the write to the poll that saw it complete (`None` while in flight).
    pub fn elapsed(&self) -> Option<Duration> {
        self.finished.map(|f| f - self.started)
    }
}
