//! What the two sides tell each other, besides the KV itself.
//!
//! 1. The decode side publishes a [`DecodeOffer`]: its transfer agent's name and metadata (what
//!    the prefill side's agent loads to reach it), the registered region of its host pool and the
//!    pool's [`PoolGeometry`].
//! 2. Per request, the decode side's coordinator assigns host blocks: a [`PageManifest`].
//! 3. The prefill side writes the pages and, with the same transfer, sends an [`ImportNotice`] as
//!    the transfer's notification; it arrives once the written bytes are in place.
//! 4. The decode side's [`ImportLedger`] matches each notification to its manifest before the
//!    request is imported.
//!
//! The offer and the manifests travel over whatever channel the two processes share (JSON; the
//! simulator uses a pipe); the notice travels with the transfer.

use std::collections::HashMap;

use serde::{Deserialize, Serialize};

use crate::{PageManifest, PdError, PoolGeometry};

/// The version of this exchange; both sides must speak the same.
pub const WIRE_VERSION: u32 = 1;

/// What kind of memory a region is.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum MemoryKind {
    /// Host memory (NIXL's DRAM).
    Host,
    /// GPU memory of device `ordinal` (NIXL's VRAM).
    Device {
        /// The GPU's ordinal.
        ordinal: u32,
    },
}

/// A contiguous region of one process's memory, as registered with the transfer agent.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Region {
    /// Its address in the owning process (a device address for GPU memory).
    pub address: u64,
    /// Its bytes.
    pub len: u64,
    /// Host or GPU memory.
    pub memory: MemoryKind,
}

impl Region {
    /// The absolute address of `span` of this region, checking that the span lies inside it.
    pub fn address_of(&self, offset: u64, len: u64) -> Result<u64, PdError> {
        match offset.checked_add(len) {
            Some(end) if end <= self.len => Ok(self.address + offset),
            _ => Err(PdError::Region {
                detail: format!(
                    "bytes {offset}..+{len} lie outside a region of {} bytes: the pool \
                     registered is smaller than the layout describes",
                    self.len
                ),
            }),
        }
    }

    /// Checks that the region holds a pool of `geometry`.
    pub fn check_holds(&self, geometry: &PoolGeometry) -> Result<(), PdError> {
        if self.len < geometry.pool_bytes {
            return Err(PdError::Region {
                detail: format!(
                    "a region of {} bytes cannot hold a pool of {} bytes: register the whole pool",
                    self.len, geometry.pool_bytes
                ),
            });
        }
        if self.address.checked_add(self.len).is_none() || self.address == 0 {
            return Err(PdError::Region {
                detail: format!(
                    "address {:#x} + {} bytes is not memory",
                    self.address, self.len
                ),
            });
        }
        Ok(())
    }
}

/// What the decode side publishes to the prefill side.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct DecodeOffer {
    /// [`WIRE_VERSION`] of the sender.
    pub version: u32,
    /// The decode side's transfer agent.
    pub agent: String,
    /// Its agent metadata (opaque; the prefill side's agent loads it).
    pub metadata: Vec<u8>,
    /// The registered host pool.
    pub pool: Region,
    /// Where the pool's pages lie.
    pub geometry: PoolGeometry,
}

impl DecodeOffer {
    /// As one line of JSON.
    pub fn to_json(&self) -> String {
        serde_json::to_string(self).unwrap_or_default()
    }

    /// Parses and checks an offer: its version, its geometry, and that its region holds the pool.
    pub fn from_json(text: &str) -> Result<Self, PdError> {
        let offer: DecodeOffer = serde_json::from_str(text).map_err(|e| PdError::Malformed {
            what: "decode offer",
            detail: e.to_string(),
        })?;
        offer.check()?;
        Ok(offer)
    }

    /// Checks a received offer before it is used.
    pub fn check(&self) -> Result<(), PdError> {
        if self.version != WIRE_VERSION {
            return Err(PdError::WireVersion {
                got: self.version,
                want: WIRE_VERSION,
            });
        }
        if self.agent.is_empty() || self.metadata.is_empty() {
            return Err(PdError::Malformed {
                what: "decode offer",
                detail: "no agent name or no agent metadata".into(),
            });
        }
        if self.pool.memory != MemoryKind::Host {
            return Err(PdError::Region {
                detail: "the decode side's pool must be host memory (its host pool)".into(),
            });
        }
        self.geometry.validate()?;
        self.pool.check_holds(&self.geometry)
    }
}

/// The notification a transfer of one request carries.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct ImportNotice {
    /// [`WIRE_VERSION`] of the sender.
    pub version: u32,
    /// The request.
    pub request: u64,
    /// Its tokens.
    pub tokens: u32,
    /// Pages written.
    pub pages: u32,
    /// Bytes written.
    pub bytes: u64,
}

/// What every notice begins with, so a foreign notification is told apart from a malformed one.
const NOTICE_TAG: &[u8] = b"hisparse-import ";

/// What the notification of a bulk write (the transport's own figure) begins with.
const BULK_TAG: &[u8] = b"hisparse-bulk ";

/// The notification of a plain bulk write of `bytes` bytes (no request: it measures the
/// transport).
pub fn bulk_notice(bytes: u64) -> Vec<u8> {
    let mut out = BULK_TAG.to_vec();
    out.extend_from_slice(bytes.to_string().as_bytes());
    out
}

/// What a notification announced.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Arrival {
    /// A request's pages are in place: its manifest, now answered.
    Import(PageManifest),
    /// A bulk write of this many bytes is in place.
    Bulk {
        /// Bytes written.
        bytes: u64,
    },
}

impl ImportNotice {
    /// The notice for `manifest` on a decode pool of `host` geometry.
    pub fn for_manifest(manifest: &PageManifest, host: &PoolGeometry) -> Self {
        ImportNotice {
            version: WIRE_VERSION,
            request: manifest.request,
            tokens: manifest.tokens,
            pages: manifest.pages(),
            bytes: host.request_bytes(manifest.pages()),
        }
    }

    /// As the bytes of a notification.
    pub fn encode(&self) -> Vec<u8> {
        let mut out = NOTICE_TAG.to_vec();
        out.extend_from_slice(serde_json::to_string(self).unwrap_or_default().as_bytes());
        out
    }

    /// Parses a notification.
    pub fn decode(bytes: &[u8]) -> Result<Self, PdError> {
        let malformed = |detail: String| PdError::Malformed {
            what: "import notification",
            detail,
        };
        let body = bytes
            .strip_prefix(NOTICE_TAG)
            .ok_or_else(|| malformed("it is not a hisparse import notice".into()))?;
        let n: ImportNotice = serde_json::from_slice(body).map_err(|e| malformed(e.to_string()))?;
        if n.version != WIRE_VERSION {
            return Err(PdError::WireVersion {
                got: n.version,
                want: WIRE_VERSION,
            });
        }
        Ok(n)
    }
}

/// The decode side's outstanding manifests: each notification is matched to one before its
/// request is imported, and each manifest is answered once.
#[derive(Debug)]
pub struct ImportLedger {
    prefill_agent: String,
    host: PoolGeometry,
    outstanding: HashMap<u64, PageManifest>,
}

impl ImportLedger {
    /// A ledger for imports from agent `prefill_agent` into a host pool of `host` geometry.
    pub fn new(prefill_agent: impl Into<String>, host: PoolGeometry) -> Self {
        ImportLedger {
            prefill_agent: prefill_agent.into(),
            host,
            outstanding: HashMap::new(),
        }
    }

    /// The agent whose notifications are accepted.
    pub fn prefill_agent(&self) -> &str {
        &self.prefill_agent
    }

    /// Records an issued manifest (checked against the pool first).
    pub fn issue(&mut self, manifest: PageManifest) -> Result<(), PdError> {
        manifest.validate(&self.host)?;
        if self.outstanding.contains_key(&manifest.request) {
            return Err(PdError::Malformed {
                what: "manifest",
                detail: format!(
                    "request {} already has an outstanding manifest; wait for its notification",
                    manifest.request
                ),
            });
        }
        self.outstanding.insert(manifest.request, manifest);
        Ok(())
    }

    /// Requests whose pages are still being written.
    pub fn outstanding(&self) -> usize {
        self.outstanding.len()
    }

    /// Matches a notification from `from` to its manifest and returns the manifest, now
    /// answered (or the bulk write it announces).
    pub fn arrive(&mut self, from: &str, bytes: &[u8]) -> Result<Arrival, PdError> {
        if from != self.prefill_agent {
            return Err(PdError::UnknownAgent {
                from: from.to_string(),
                expected: self.prefill_agent.clone(),
            });
        }
        if let Some(count) = bytes.strip_prefix(BULK_TAG) {
            let bytes = std::str::from_utf8(count)
                .ok()
                .and_then(|c| c.parse().ok())
                .ok_or_else(|| PdError::Malformed {
                    what: "bulk notification",
                    detail: "no byte count".into(),
                })?;
            return Ok(Arrival::Bulk { bytes });
        }
        let n = ImportNotice::decode(bytes)?;
        let m = self
            .outstanding
            .get(&n.request)
            .ok_or(PdError::UnexpectedNotice { request: n.request })?;
        let want = ImportNotice::for_manifest(m, &self.host);
        for (field, got, expected) in [
            ("tokens", u64::from(n.tokens), u64::from(want.tokens)),
            ("pages", u64::from(n.pages), u64::from(want.pages)),
            ("bytes", n.bytes, want.bytes),
        ] {
            if got != expected {
                return Err(PdError::NoticeMismatch {
                    request: n.request,
                    field,
                    notice: got,
                    manifest: expected,
                });
            }
        }
        self.outstanding
            .remove(&n.request)
            .map(Arrival::Import)
            .ok_or(PdError::UnexpectedNotice { request: n.request })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn host() -> PoolGeometry {
        PoolGeometry::host(&crate::manifest::tests::kv()).unwrap()
    }

    fn offer(host: &PoolGeometry) -> DecodeOffer {
        DecodeOffer {
            version: WIRE_VERSION,
            agent: "decode".into(),
            metadata: vec![1, 2, 3],
            pool: Region {
                address: 0x1000,
                len: host.pool_bytes,
                memory: MemoryKind::Host,
            },
            geometry: host.clone(),
        }
    }

    #[test]
    fn offers_round_trip_and_are_checked() {
        let host = host();
        let o = offer(&host);
        assert_eq!(DecodeOffer::from_json(&o.to_json()).unwrap(), o);
        let bad = |o: DecodeOffer| DecodeOffer::from_json(&o.to_json()).unwrap_err();
        let mut v = o.clone();
        v.version = 2;
        assert_eq!(bad(v), PdError::WireVersion { got: 2, want: 1 });
        let mut v = o.clone();
        v.pool.len -= 1;
        assert!(matches!(bad(v), PdError::Region { .. }));
        let mut v = o.clone();
        v.pool.memory = MemoryKind::Device { ordinal: 0 };
        assert!(matches!(bad(v), PdError::Region { .. }));
        let mut v = o.clone();
        v.metadata.clear();
        assert!(matches!(bad(v), PdError::Malformed { .. }));
        let mut v = o.clone();
        v.geometry.layers.clear();
        assert!(matches!(bad(v), PdError::Geometry { .. }));
        assert!(matches!(
            DecodeOffer::from_json("{\"version\":1"),
            Err(PdError::Malformed { .. })
        ));
    }

    #[test]
    fn regions_bound_every_address() {
        let r = Region {
            address: 4096,
            len: 100,
            memory: MemoryKind::Host,
        };
        assert_eq!(r.address_of(10, 90).unwrap(), 4106);
        assert!(r.address_of(10, 91).is_err());
        assert!(r.address_of(u64::MAX, 2).is_err());
    }

    #[test]
    fn notices_match_their_manifest_once() {
        let host = host();
        let m = PageManifest {
            request: 3,
            tokens: 100,
            host_blocks: vec![8, 9],
        };
        let mut ledger = ImportLedger::new("prefill", host.clone());
        ledger.issue(m.clone()).unwrap();
        assert!(ledger.issue(m.clone()).is_err());
        let notice = ImportNotice::for_manifest(&m, &host);
        assert_eq!(notice.bytes, 2 * 61 * 64 * 656);
        assert_eq!(ImportNotice::decode(&notice.encode()).unwrap(), notice);
        assert!(matches!(
            ledger.arrive("someone", &notice.encode()),
            Err(PdError::UnknownAgent { .. })
        ));
        let mut wrong = notice;
        wrong.pages = 3;
        assert_eq!(
            ledger.arrive("prefill", &wrong.encode()).unwrap_err(),
            PdError::NoticeMismatch {
                request: 3,
                field: "pages",
                notice: 3,
                manifest: 2
            }
        );
        assert!(matches!(
            ledger.arrive("prefill", b"hello"),
            Err(PdError::Malformed { .. })
        ));
        assert!(matches!(
            ledger.arrive("prefill", b"hisparse-import {"),
            Err(PdError::Malformed { .. })
        ));
        assert_eq!(ledger.outstanding(), 1);
        assert_eq!(
            ledger.arrive("prefill", &bulk_notice(77)).unwrap(),
            Arrival::Bulk { bytes: 77 }
        );
        assert!(ledger.arrive("prefill", b"hisparse-bulk x").is_err());
        assert_eq!(
            ledger.arrive("prefill", &notice.encode()).unwrap(),
            Arrival::Import(m.clone())
        );
        assert_eq!(ledger.outstanding(), 0);
        assert_eq!(
            ledger.arrive("prefill", &notice.encode()).unwrap_err(),
            PdError::UnexpectedNotice { request: 3 }
        );
        // A manifest the pool cannot hold is never issued.
        let bad = PageManifest {
            host_blocks: vec![8, 8],
            ..m
        };
        assert!(ledger.issue(bad).is_err());
    }
}
