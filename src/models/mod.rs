//! Models written with the DSL, ready to trace: the paper's workloads as library code,
//! shared by the examples, the tests and the benches.

pub mod dense;
pub mod moe;
pub mod mu_transformer;
pub mod pipeline;
pub mod transformer;
pub mod unet;
