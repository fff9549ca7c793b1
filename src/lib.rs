//! gspmd: GSPMD (Xu et al., arXiv 2105.04663) as an embedded Rust DSL.
//!
//! This facade re-exports [`gspmd_core`] (IR, shardings, propagation, runtimes) and the
//! [`macro@model`] attribute of [`gspmd_macros`]. Start with `use gspmd::prelude::*;`.

// Lets the generated `::gspmd::...` paths resolve inside this crate too.
extern crate self as gspmd;

pub mod dsl;

pub use gspmd_core::*;
pub use gspmd_macros::model;

/// What a model file needs: `use gspmd::prelude::*;`.
pub mod prelude {
    pub use crate::model;
    pub use gspmd_core::ir::{Builder, DType, Program, Tensor, einsum};
    pub use gspmd_core::sharding::{DimSharding, Mesh, Sharding};
    pub use gspmd_core::{Error, Result};
}
