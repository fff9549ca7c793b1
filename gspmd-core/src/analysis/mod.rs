//! Insight before running, from the per-device program alone: what each device will
//! hold in memory ([`MemoryAnalysis`], over the runtime's execution plan) and what it
//! will compute and receive ([`CostAnalysis`], with a step time for a
//! [`DeviceModel`]: peak FLOP rate, one fitted efficiency, memory, interconnect).

mod cost;
mod device_model;
mod memory;

pub use cost::CostAnalysis;
pub use device_model::{DeviceModel, Interconnect};
pub(crate) use memory::bytes;
pub use memory::{MemoryAnalysis, MemoryBreakdown};
