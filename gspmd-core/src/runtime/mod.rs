//! Runtimes. The reference interpreter ([`interpret`]) runs an unpartitioned program on
//! one device: it is the oracle every differential test compares the partitioned,
//! multi-device run against. [`kernels`] computes each primitive op on host arrays and
//! is shared with the per-device runtime.

mod interpreter;
pub mod kernels;

pub use interpreter::interpret;
