//! Insight before running: what a compiled program will hold in memory
//! ([`MemoryAnalysis`]) on each device, worked out from the per-device program and the
//! runtime's execution plan without running it.

mod memory;

pub use memory::{MemoryAnalysis, MemoryBreakdown};
