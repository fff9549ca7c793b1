//! Core of gspmd: the IR, named-axis shardings, sharding propagation, the SPMD
//! partitioner and the runtimes (reference interpreter, thread mesh).
//!
//! The pipeline is `trace → verify → propagate → partition → run`; every stage maps one
//! value to the next and every intermediate prints as text. See `ARCHITECTURE.md`.

pub mod analysis;
pub mod autodiff;
pub mod error;
mod executable;
pub mod export;
pub mod import;
pub mod ir;
pub mod partition;
pub mod propagation;
mod report_html;
pub mod runtime;
pub mod sharding;
pub mod simplify;
pub mod train;
pub mod types;

pub use error::{Error, Result};
pub use executable::{
    Comparison, CompileOptions, CompileTimes, Executable, GatherChoice, GatherPlan, GatherReuse,
    ScanRemat, compile, compile_for, compile_with,
};

/// Hooks for this crate's own tests, not part of the API: they may change or go
/// without notice.
#[doc(hidden)]
pub mod test_hooks {
    pub use crate::executable::compilations_on_this_thread;
}
/// The 16-bit float element types of `DType::BF16` and `DType::F16`.
pub use half::{bf16, f16};
