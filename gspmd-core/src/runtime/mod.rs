//! Runtimes. The reference interpreter ([`interpret`]) runs an unpartitioned program on
//! one device: it is the oracle every differential test compares the partitioned,
//! multi-device run against. [`kernels`] computes each primitive op on host arrays and
//! is shared with the per-device runtime. The [`ThreadMesh`] runs one OS thread per
//! device; per-device programs call the [`Communicator`] trait for collectives.

mod communicator;
mod device;
mod interpreter;
pub mod kernels;
mod sample;
mod spmd;
mod thread_mesh;

pub use communicator::Communicator;
pub use device::run_on_device;
pub use interpreter::interpret;
pub use sample::{sample_inputs, uniform_f32, uniform_i32};
pub use spmd::{Input, Output, Value};
pub use thread_mesh::{DeviceContext, Resident, ThreadMesh};
