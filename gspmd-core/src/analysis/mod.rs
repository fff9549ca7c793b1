//! Insight before running, from the per-device program alone: what each device will
//! hold in memory ([`MemoryAnalysis`], over the runtime's execution plan) and what it
//! will compute and receive ([`CostAnalysis`], with a step time for a
//! [`DeviceModel`]).

mod cost;
mod memory;

pub use cost::{CostAnalysis, DeviceModel};
pub(crate) use memory::bytes;
pub use memory::{MemoryAnalysis, MemoryBreakdown};
