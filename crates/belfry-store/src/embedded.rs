//! Embedded backend (in progress).
use std::path::PathBuf;

use belfry_core::PartitionCount;

/// Options of the embedded store.
#[derive(Debug, Clone)]
pub struct EmbeddedOptions {
    pub data_dir: PathBuf,
    /// Used when the store is created; an existing store keeps its own.
    pub partitions: PartitionCount,
}

/// The embedded store.
#[derive(Debug)]
pub struct EmbeddedStore;
