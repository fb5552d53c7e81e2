//! The two sides of the disaggregated path over one [`Endpoint`] each.

use crate::{
    Arrival, DecodeOffer, Endpoint, ImportLedger, MemoryKind, PackedWrite, PageManifest, PdError,
    PoolGeometry, Region, Transfer, WIRE_VERSION, bulk_notice, bulk_spans, plan_packed_write,
    plan_write,
};

/// The decode side: its host pool registered, manifests issued, notifications matched.
#[derive(Debug)]
pub struct DecodeSide {
    endpoint: Endpoint,
    pool: Region,
    host: PoolGeometry,
    ledger: Option<ImportLedger>,
}

impl DecodeSide {
    /// An agent named `name` with the host pool `pool` (of geometry `host`) registered.
    ///
    /// # Safety
    ///
    /// As [`Endpoint::register`] for `pool`: it stays allocated while the side lives, peers may
    /// write it, and only the blocks of an issued manifest are written, which the caller reads
    /// only after [`DecodeSide::poll`] returned that manifest.
    pub unsafe fn new(name: &str, pool: Region, host: PoolGeometry) -> Result<Self, PdError> {
        if pool.memory != MemoryKind::Host {
            return Err(PdError::Region {
                detail: "the decode side imports into its host pool: register host memory".into(),
            });
        }
        host.validate()?;
        pool.check_holds(&host)?;
        let mut endpoint = Endpoint::new(name)?;
        // SAFETY: the caller's contract for `pool` is this function's.
        unsafe { endpoint.register(pool)? };
        Ok(DecodeSide {
            endpoint,
            pool,
            host,
            ledger: None,
        })
    }

    /// What the prefill side needs to write into this side's pool.
    pub fn offer(&self) -> Result<DecodeOffer, PdError> {
        Ok(DecodeOffer {
            version: WIRE_VERSION,
            agent: self.endpoint.name().to_string(),
            metadata: self.endpoint.metadata()?,
            pool: self.pool,
            geometry: self.host.clone(),
        })
    }

    /// Accepts imports from the prefill agent `prefill_agent` only.
    pub fn accept_from(&mut self, prefill_agent: &str) {
        self.ledger = Some(ImportLedger::new(prefill_agent, self.host.clone()));
    }

    fn ledger(&mut self) -> Result<&mut ImportLedger, PdError> {
        self.ledger.as_mut().ok_or(PdError::Malformed {
            what: "import",
            detail: "no prefill agent accepted yet: call accept_from first".into(),
        })
    }

    /// Records a manifest the decode coordinator issued; the prefill side writes exactly it.
    pub fn issue(&mut self, manifest: PageManifest) -> Result<(), PdError> {
        self.ledger()?.issue(manifest)
    }

    /// Requests whose pages are being written.
    pub fn outstanding(&self) -> usize {
        self.ledger.as_ref().map_or(0, ImportLedger::outstanding)
    }

    /// What arrived since the last call: manifests whose pages are in place (each checked
    /// against its notice) and bulk writes; never waits.
    pub fn poll(&mut self) -> Result<Vec<Arrival>, PdError> {
        let notices = self.endpoint.notices()?;
        let ledger = self.ledger()?;
        notices
            .into_iter()
            .map(|(from, bytes)| ledger.arrive(&from, &bytes))
            .collect()
    }

    /// The host pool's geometry.
    pub fn geometry(&self) -> &PoolGeometry {
        &self.host
    }
}

/// The prefill side: its pool registered, connected to one decode side.
#[derive(Debug)]
pub struct PrefillSide {
    endpoint: Endpoint,
    local: Region,
    geometry: PoolGeometry,
    offer: DecodeOffer,
    remote: String,
}

impl PrefillSide {
    /// An agent named `name` with its pool `local` (of geometry `geometry`: the GPU pool's
    /// resident pages) registered, connected to the decode side of `offer`.
    ///
    /// # Safety
    ///
    /// As [`Endpoint::register`] for `local`: it stays allocated while the side lives, and the
    /// pages of a request stay unchanged until its [`Transfer`] completed.
    pub unsafe fn new(
        name: &str,
        local: Region,
        geometry: PoolGeometry,
        offer: DecodeOffer,
    ) -> Result<Self, PdError> {
        offer.check()?;
        geometry.validate()?;
        local.check_holds(&geometry)?;
        geometry.check_compatible(&offer.geometry)?;
        let mut endpoint = Endpoint::new(name)?;
        // SAFETY: the caller's contract for `local` is this function's.
        unsafe { endpoint.register(local)? };
        let remote = endpoint.connect(&offer.metadata)?;
        if remote != offer.agent {
            return Err(PdError::Malformed {
                what: "decode offer",
                detail: format!(
                    "it names agent {:?}, its metadata agent {remote:?}",
                    offer.agent
                ),
            });
        }
        Ok(PrefillSide {
            endpoint,
            local,
            geometry,
            offer,
            remote,
        })
    }

    /// The agent's name (what the decode side accepts imports from).
    pub fn name(&self) -> &str {
        self.endpoint.name()
    }

    /// Writes the request whose page `p` of bucket `k` lies in block `source_blocks[k][p]` of
    /// the local pool into the decode host blocks of `manifest`, with its notice.
    pub fn send(
        &self,
        manifest: &PageManifest,
        source_blocks: &[&[u32]],
    ) -> Result<Transfer, PdError> {
        let plan = plan_write(
            &self.geometry,
            source_blocks,
            &self.offer.geometry,
            manifest,
        )?;
        self.endpoint.write(
            &self.remote,
            (&self.local, &plan.local),
            (&self.offer.pool, &plan.remote),
            &plan.notice.encode(),
        )
    }

    /// Whether `transfer` completed (without waiting).
    pub fn poll(&self, transfer: &mut Transfer) -> Result<bool, PdError> {
        self.endpoint.poll(transfer)
    }

    /// Registers another local region (e.g. a staging buffer for [`PrefillSide::bulk`]).
    ///
    /// # Safety
    ///
    /// As [`Endpoint::register`].
    pub unsafe fn register(&mut self, region: Region) -> Result<(), PdError> {
        // SAFETY: the caller's contract is this function's.
        unsafe { self.endpoint.register(region) }
    }

    /// Plans the packed write of a request (pages as for [`PrefillSide::send`]) through a
    /// staging buffer of `staging_len` bytes: the copies that fill it, then the ranges written.
    pub fn plan_packed(
        &self,
        manifest: &PageManifest,
        source_blocks: &[&[u32]],
        staging_len: u64,
    ) -> Result<PackedWrite, PdError> {
        plan_packed_write(
            &self.geometry,
            source_blocks,
            &self.offer.geometry,
            manifest,
            staging_len,
        )
    }

    /// Writes a packed request from `staging` (registered with [`PrefillSide::register`], its
    /// copies done) into the decode host blocks of its plan, with its notice.
    pub fn send_packed(&self, staging: &Region, plan: &PackedWrite) -> Result<Transfer, PdError> {
        if staging.len < plan.staging_bytes {
            return Err(PdError::StagingBudget {
                needed: plan.staging_bytes,
                budget: staging.len,
            });
        }
        self.endpoint.write(
            &self.remote,
            (staging, &plan.local),
            (&self.offer.pool, &plan.remote),
            &plan.notice.encode(),
        )
    }

    /// The transport's own figure: one plain write of `source`'s first `bytes` bytes into the
    /// first `bytes` bytes of the decode pool, in descriptors of `descriptor_bytes` bytes (the
    /// last one shorter; one descriptor when `descriptor_bytes >= bytes`), announced by a bulk
    /// notice. Only before the decode side issued any manifest: it overwrites whatever the pool
    /// holds there.
    pub fn bulk(
        &self,
        source: &Region,
        bytes: u64,
        descriptor_bytes: u64,
    ) -> Result<Transfer, PdError> {
        let spans = bulk_spans(bytes, descriptor_bytes)?;
        self.endpoint.write(
            &self.remote,
            (source, &spans),
            (&self.offer.pool, &spans),
            &bulk_notice(bytes),
        )
    }
}
