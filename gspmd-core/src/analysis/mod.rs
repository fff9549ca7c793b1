//! Insight before running, from the per-device program alone: what each device will
//! hold in memory ([`MemoryAnalysis`], over the runtime's execution plan) and what it
//! will compute and receive ([`CostAnalysis`], with a step time for a
//! [`DeviceModel`]: peak FLOP rate, one fitted efficiency, memory, interconnect; with
//! collectives after the compute, overlapped as a two-stream schedule of the program
//! (`schedule`) or fully, [`Overlap`]).

mod cost;
mod device_model;
mod memory;
mod schedule;

pub use cost::{CostAnalysis, Overlap};
pub use device_model::{DeviceModel, Interconnect};
pub(crate) use memory::bytes;
pub use memory::{MemoryAnalysis, MemoryBreakdown};
