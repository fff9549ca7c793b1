//! Runtimes: the [`ThreadMesh`] (one OS thread per device) and the [`Communicator`]
//! trait its per-device programs call for collectives.

mod communicator;
mod thread_mesh;

pub use communicator::Communicator;
pub use thread_mesh::{DeviceContext, ThreadMesh};
