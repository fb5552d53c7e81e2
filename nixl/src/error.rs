//! What can go wrong on the disaggregated path, each error saying what to change.

use core::fmt;

/// An error of the disaggregated prefill → decode path.
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum PdError {
    /// The NIXL C API library could not be loaded.
    LibraryNotFound {
        /// What the dynamic loader said.
        detail: String,
    },
    /// The NIXL C API library lacks a function this crate calls (an older or foreign build).
    MissingSymbol {
        /// The function.
        symbol: String,
        /// What the dynamic loader said.
        detail: String,
    },
    /// NIXL loaded but offers no plugin of the transport this crate uses.
    PluginMissing {
        /// The plugin wanted.
        plugin: String,
        /// The plugins NIXL found.
        available: Vec<String>,
    },
    /// A NIXL call failed.
    Nixl {
        /// What was being done.
        op: &'static str,
        /// NIXL's error.
        detail: String,
    },
    /// The layout cannot be described as pages of a pool.
    Layout {
        /// The layout's complaint.
        detail: String,
    },
    /// A pool's description is inconsistent (a page outside the pool, no layers, ...).
    Geometry {
        /// What is wrong.
        detail: String,
    },
    /// The two sides planned different layouts.
    Incompatible {
        /// What differs.
        detail: String,
    },
    /// A request of no tokens was offered for import.
    EmptyRequest {
        /// The request.
        request: u64,
    },
    /// A manifest lists a number of pages other than its tokens need.
    ManifestPages {
        /// The request.
        request: u64,
        /// Its tokens.
        tokens: u32,
        /// Pages those tokens occupy.
        expected: u32,
        /// Pages the manifest lists.
        given: u32,
    },
    /// A manifest names a block that is not a usable block of the pool.
    ManifestBlock {
        /// The request.
        request: u64,
        /// The page.
        page: u32,
        /// The block named.
        block: u32,
        /// Blocks in the pool (block 0 is the null block).
        num_blocks: u32,
    },
    /// A manifest names one block for two pages.
    ManifestDuplicate {
        /// The request.
        request: u64,
        /// The block named twice.
        block: u32,
    },
    /// A message of another version of this exchange.
    WireVersion {
        /// The version received.
        got: u32,
        /// The version this build speaks.
        want: u32,
    },
    /// A message that does not parse.
    Malformed {
        /// Which message.
        what: &'static str,
        /// The parser's complaint.
        detail: String,
    },
    /// A notification from an agent that is not the prefill side this decode side expects.
    UnknownAgent {
        /// The sender.
        from: String,
        /// The agent expected.
        expected: String,
    },
    /// A notification for a request no manifest was issued for (or one already imported).
    UnexpectedNotice {
        /// The request.
        request: u64,
    },
    /// A notification that disagrees with the manifest it answers.
    NoticeMismatch {
        /// The request.
        request: u64,
        /// The field that differs.
        field: &'static str,
        /// The notification's value.
        notice: u64,
        /// The manifest's value.
        manifest: u64,
    },
    /// A packed write needs more staging memory than its budget allows.
    StagingBudget {
        /// Bytes of staging the request's pages need.
        needed: u64,
        /// Bytes the staging buffer may have.
        budget: u64,
    },
    /// A region that cannot hold what is asked of it.
    Region {
        /// What is wrong.
        detail: String,
    },
    /// A device operation of the prefill side's runtime failed (allocating or filling a
    /// staging buffer).
    Device {
        /// What was being done.
        op: &'static str,
        /// The device's error.
        detail: String,
    },
    /// Something did not complete in the time it was given.
    Timeout {
        /// What did not complete.
        what: String,
        /// Seconds it was given.
        seconds: u64,
    },
    /// The prefill side's pool has no page the manifest needs on its device.
    PageNotResident {
        /// The request.
        request: u64,
        /// Its page.
        page: u32,
        /// The bucket of layers whose resident table lacks it.
        bucket: u32,
    },
}

impl fmt::Display for PdError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            PdError::LibraryNotFound { detail } => write!(
                f,
                "libnixl_capi.so not found ({detail}): pip install nixl-cu13 and put its \
                 .nixl_cu13.mesonpy.libs and nixl_cu13.libs folders on LD_LIBRARY_PATH"
            ),
            PdError::MissingSymbol { symbol, detail } => write!(
                f,
                "libnixl_capi.so has no {symbol} ({detail}): install nixl-cu13 1.5 or newer and \
                 put its libraries first on LD_LIBRARY_PATH"
            ),
            PdError::PluginMissing { plugin, available } => write!(
                f,
                "NIXL has no {plugin} plugin (found: {}): set NIXL_PLUGIN_DIR to the wheel's \
                 .nixl_cu13.mesonpy.libs/plugins folder",
                if available.is_empty() {
                    "none".to_string()
                } else {
                    available.join(", ")
                }
            ),
            PdError::Nixl { op, detail } => write!(f, "NIXL: {op} failed ({detail})"),
            PdError::Layout { detail } => write!(f, "layout: {detail}"),
            PdError::Geometry { detail } => write!(f, "pool description: {detail}"),
            PdError::Incompatible { detail } => write!(
                f,
                "the prefill and decode sides planned different layouts ({detail}): plan both \
                 with the same model, block size and host pool options"
            ),
            PdError::EmptyRequest { request } => write!(
                f,
                "request {request} has no tokens to import: import a request once its prompt is \
                 prefilled"
            ),
            PdError::ManifestPages {
                request,
                tokens,
                expected,
                given,
            } => write!(
                f,
                "manifest of request {request}: {tokens} tokens occupy {expected} pages but it \
                 lists {given} host blocks; assign one block per page"
            ),
            PdError::ManifestBlock {
                request,
                page,
                block,
                num_blocks,
            } => write!(
                f,
                "manifest of request {request}: page {page} names host block {block}, but the \
                 pool's blocks are 1..{num_blocks} (0 is the null block); assign blocks of the \
                 decode pool"
            ),
            PdError::ManifestDuplicate { request, block } => write!(
                f,
                "manifest of request {request}: host block {block} is named for two pages; \
                 assign each page its own block"
            ),
            PdError::WireVersion { got, want } => write!(
                f,
                "a message of exchange version {got}, this build speaks {want}: run the same \
                 hisparse release on both sides"
            ),
            PdError::Malformed { what, detail } => write!(f, "a malformed {what} ({detail})"),
            PdError::UnknownAgent { from, expected } => write!(
                f,
                "a notification from agent {from:?}, but this decode side imports from \
                 {expected:?} only: connect the prefill side this decode side published to"
            ),
            PdError::UnexpectedNotice { request } => write!(
                f,
                "a notification for request {request}, for which no manifest is outstanding: \
                 the prefill side must write only requests the decode side assigned blocks to, \
                 once"
            ),
            PdError::NoticeMismatch {
                request,
                field,
                notice,
                manifest,
            } => write!(
                f,
                "the notification of request {request} says {field} = {notice}, its manifest \
                 {manifest}: the prefill side wrote something else than it was assigned"
            ),
            PdError::StagingBudget { needed, budget } => write!(
                f,
                "a packed write of this request needs {needed} bytes of staging memory, more \
                 than the staging budget of {budget} bytes: raise the budget, shorten the \
                 prompts, or write page by page (one descriptor per layer and page, no staging)"
            ),
            PdError::Region { detail } => write!(f, "memory region: {detail}"),
            PdError::Device { op, detail } => write!(f, "{op}: {detail}"),
            PdError::Timeout { what, seconds } => {
                write!(f, "{what} did not complete in {seconds} s")
            }
            PdError::PageNotResident {
                request,
                page,
                bucket,
            } => write!(
                f,
                "page {page} of request {request} (bucket {bucket}) is not in the prefill \
                 side's GPU pool: give the prefill pool room for a whole request and write a \
                 request once its prefill is done, before its pages are reclaimed"
            ),
        }
    }
}

impl std::error::Error for PdError {}

impl From<hisparse_core::layout::LayoutError> for PdError {
    fn from(e: hisparse_core::layout::LayoutError) -> Self {
        PdError::Layout {
            detail: e.to_string(),
        }
    }
}
