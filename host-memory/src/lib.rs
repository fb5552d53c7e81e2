#![doc = include_str!("../README.md")]
#![deny(missing_docs)]

mod config;
mod error;
mod ffi;
mod limits;
mod mapping;
mod meminfo;
mod numa;
mod parallel;
mod pinner;
mod region;
pub mod release;
mod shared;
mod shm_pages;

pub use config::{HUGE_PAGE, HostPoolConfig, HugePages, PARALLEL_FROM, Placement, Registration};
pub use error::{HostMemoryError, NotOneDeviceRange, SetupError};
pub use limits::{check_after_releases, locked_memory_limit, shared_memory_free};
pub use mapping::{AnonymousMapping, is_mapped};
pub use meminfo::{available_ram, free_huge_pages};
pub use numa::{node_cpus, node_of_pci_device};
pub use pinner::{Mlock, NoPin, Pinner};
pub use region::{HostRegion, Pages, Setup, copy_pieces};
pub use release::{Release, releases_in_flight, wait_for_releases};
pub use shared::{SharedSegment, ShmError};
pub use shm_pages::{ShmHuge, ShmPages};

#[cfg(test)]
mod tests;
