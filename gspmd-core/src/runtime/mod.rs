//! Runtimes. The reference interpreter ([`interpret`]) runs an unpartitioned program on
//! one device: it is the oracle every differential test compares the partitioned,
//! multi-device run against. `kernels` computes each primitive op on host arrays and
//! is shared with the per-device runtime. Devices are reached through one interface,
//! [`Backend`]: the [`Reference`] interpreter, the [`ThreadMesh`] (one OS thread per
//! device) and, with the `mpi` feature, `MpiMesh` (MPI ranks) implement it; per-device
//! programs call the [`Communicator`] trait for collectives. Every run bounds the bytes
//! of its live values by a memory limit ([`available_memory`] by default).

mod backend;
mod binding;
mod blocks;
mod buffers;
mod communicator;
mod deadline;
mod device;
mod flow;
mod folding;
mod fusion;
mod interpreter;
// Public only for the random pipeline test's error bounds; not part of the API.
#[doc(hidden)]
pub mod kernels;
mod liveness;
mod manual;
mod memory;
#[cfg(feature = "mpi")]
mod mpi_mesh;
mod plan;
pub mod profile;
mod reference;
mod sample;
mod thread_mesh;

/// Where a device was when its run passed its deadline (see
/// [`Error::DeadlineExceeded`](crate::Error::DeadlineExceeded)).
pub use crate::error::RunPosition;
pub use backend::{Backend, Input, Loaded, Output, Resident, Value};
pub use blocks::{assemble, shard_literal};
pub(crate) use buffers::headroom as pool_headroom;
pub use buffers::{pooled_bytes, recycle};
pub use communicator::Communicator;
/// Runs one device's program directly, bypassing the input checks of
/// [`Backend::execute`]: for fault-injection tests.
#[doc(hidden)]
pub use device::run_on_device;
/// The fusion groups of a program's execution plan: for tests.
#[doc(hidden)]
pub use fusion::{compiled_chains_source, fusion_groups, fusion_passes};
pub use interpreter::{Prepared, interpret, interpret_with_deadline, interpret_with_memory_limit};
pub(crate) use liveness::{Walk, lent_input_bytes};
pub use memory::{FALLBACK_MEMORY_LIMIT, available_memory};
#[cfg(feature = "mpi")]
pub use mpi_mesh::MpiMesh;
pub(crate) use plan::{Plan, PlannedProgram};
pub use reference::Reference;
pub use sample::{sample_inputs, uniform_f32, uniform_i32};
pub use thread_mesh::{DeviceContext, ThreadMesh};
