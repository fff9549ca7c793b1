//! The intermediate representation: an SSA [`Program`] of primitive [`Op`]s over typed
//! values, the [`Builder`] that traces it, its verifier and its text printer.

mod along_dim;
mod append;
mod builder;
mod collective_kind;
mod control_flow;
mod convolution;
mod dynamic_slicing;
mod einsum;
mod flow;
pub(crate) mod index_arithmetic;
pub(crate) mod indexing;
mod infer;
mod literal;
mod lookup;
mod manual;
mod math;
mod op;
mod operators;
mod pooling;
mod printer;
mod program;
pub mod random;
mod remat;
mod rotation;
mod verifier;
mod why;

pub use crate::types::{DType, Location, Shape, TensorType, ValueId, num_elements};
pub(crate) use append::Appender;
pub use builder::{Builder, Tensor};
pub use collective_kind::CollectiveKind;
pub use control_flow::ScanOptions;
pub use einsum::einsum;
pub use flow::{Flow, FlowInstance, distinct_flows, flow_instances};
pub(crate) use index_arithmetic::EmitOps;
pub(crate) use indexing::Indexing;
pub use indexing::{GatherDims, ScatterDims, ScatterKind};
pub use infer::infer_type;
pub use literal::{Element, Literal};
pub(crate) use literal::{by_element, map_literal, with_literal};
pub use lookup::embedding;
pub use manual::{ManualSpec, moved_dims};
pub use op::{
    Arity, AxisGroup, BinaryOp, CompareOp, ConvConfig, ConvDimensionNumbers, CumulativeKind,
    DotDims, Op, OpKind, Padding, PropagationDirection, ReduceKind, UnaryOp, WindowDim,
};
pub use program::{Node, Origin, Program};
pub use remat::Remat;
pub(crate) use rotation::{Rotation, rotation};
pub use verifier::verify;
pub use why::{Purpose, Source, Why};
