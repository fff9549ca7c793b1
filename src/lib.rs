//! gspmd: GSPMD (Xu et al., arXiv 2105.04663) as an embedded Rust DSL.
//!
//! This facade re-exports [`gspmd_core`] (IR, shardings, propagation, runtimes) and
//! [`gspmd_macros`] (the `#[gspmd::model]` DSL).

pub use gspmd_core::*;
#[allow(unused_imports)]
pub use gspmd_macros::*;
