//! gspmd: GSPMD (Xu et al., arXiv 2105.04663) as an embedded Rust DSL.
//!
//! This facade re-exports [`gspmd_core`] (IR, shardings, propagation, runtimes) and the
//! [`macro@model`] and [`macro@params`] attributes of [`gspmd_macros`] (a model function
//! and a struct of its parameters, [`Params`]). Start with `use gspmd::prelude::*;`.
//!
//! ```
//! use gspmd::prelude::*;
//!
//! /// Megatron MLP.
//! #[gspmd::model(mesh = (data, model))]
//! pub fn mlp(
//!     #[shard(data, _)] x: Tensor<B, D>,
//!     #[shard(_, model)] w1: Tensor<D, F>,
//!     #[shard(model, _)] w2: Tensor<F, D>,
//! ) -> Tensor<B, D> {
//!     #[shard(data, model)]
//!     let h = x.matmul(&w1).relu();
//!     h.matmul(&w2)
//! }
//!
//! fn main() -> gspmd::Result<()> {
//!     let program: gspmd::ir::Program = mlp::trace(mlp::Dims { B: 8, D: 16, F: 64 })?;
//!     // Or bind the shape symbols from concrete input shapes:
//!     let same = mlp::trace_shapes(&[&[8, 16], &[16, 64], &[64, 16]])?;
//!     assert_eq!(program, same);
//!     let mesh = mlp::mesh([2, 4])?; // data = 2, model = 4
//!     assert_eq!(mesh.num_devices(), 8);
//!     println!("{program}");
//!     Ok(())
//! }
//! ```
//!
//! The DSL's syntax and generated API are described on [`macro@model`]
//! (and in `docs/dsl.md`).

// Lets the generated `::gspmd::...` paths resolve inside this crate too.
extern crate self as gspmd;

pub mod dsl;
pub mod models;
pub mod params;

pub use gspmd_core::*;
pub use gspmd_macros::{model, params, shard};
pub use params::{Params, Stacked};
/// The README's Rust code blocks, compiled and run as doctests.
#[cfg(doctest)]
#[doc = include_str!("../README.md")]
struct ReadmeDoctests;

/// docs/dsl.md's Rust code blocks, compiled and run as doctests.
#[cfg(doctest)]
#[doc = include_str!("../docs/dsl.md")]
struct DslDocDoctests;

/// The array crate [`Literal`](ir::Literal)s wrap, re-exported so that its version
/// always matches: build inputs with `gspmd::ndarray::ArrayD`.
pub use ndarray;

/// What a model file needs: `use gspmd::prelude::*;` — the DSL (with parameter structs'
/// [`Params`] and [`Stacked`]), the tracer's types,
/// shardings, the collective kinds reports count by, and what compiles and runs a program (`compile`, the `Backend` trait and
/// its `ThreadMesh` and `Reference`, inputs as `Literal`s, and the reference
/// `interpret`er to compare with).
pub mod prelude {
    pub use crate::params::{Params, Stacked};
    pub use crate::{model, params, shard};
    pub use gspmd_core::ir::{
        Builder, CollectiveKind, ConvDimensionNumbers, DType, Literal, Padding, Program, Remat,
        ScanOptions, Tensor, einsum, embedding, random,
    };
    pub use gspmd_core::runtime::{Backend, Reference, ThreadMesh, interpret};
    pub use gspmd_core::sharding::{DimSharding, Mesh, Sharding};
    pub use gspmd_core::{Error, Executable, Result, bf16, compile, f16};
}
