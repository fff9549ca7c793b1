//! One handler per op family (XLA's SpmdPartitioningVisitor). Each takes the operands
//! as [`PValue`]s and the value's target sharding, reshards operands to what the local
//! op needs, emits the local op (and any collective the op itself implies), and returns
//! the result — which the driver then reshards to the target if it is not there yet.

mod contraction;
mod convolution;
mod data_movement;
mod dynamic_slicing;
mod elementwise;
mod flow;
mod indexing;
mod random;
mod reduce;
mod scan;
mod shape;
mod sort;

pub(crate) use data_movement::rotate;
pub(crate) use flow::LocalFlow;

use super::emit::Emitter;
use super::value::PValue;
use crate::error::Result;
use crate::ir::{Node, Op};
use crate::sharding::Sharding;

/// Partitions `node` whose operands are `operands`, aiming for `target`.
pub(crate) fn partition_node(
    em: &mut Emitter,
    node: &Node,
    operands: &[PValue],
    target: &Sharding,
) -> Result<PValue> {
    match &node.op {
        Op::Parameter { .. } | Op::Constant(_) | Op::Iota { .. } => {
            data_movement::source(em, node, target)
        }
        Op::RandomBits {
            strides, output, ..
        } => random::random_bits(em, node, (strides, *output), operands, target),
        Op::Unary(_) | Op::Binary(_) | Op::Compare(_) | Op::Select | Op::Convert(_) => {
            elementwise::elementwise(em, node, operands, target)
        }
        // Identities: the operand, resharded where the two sides differ.
        Op::ShardingConstraint | Op::PropagationBarrier(_) => {
            super::reshard::reshard(em, &operands[0], target)
        }
        Op::Broadcast { dims, .. } => shape::broadcast(em, node, dims, &operands[0], target),
        Op::Reshape(_) => shape::reshape(em, node, &operands[0], target),
        Op::Transpose(perm) => shape::transpose(em, perm, &operands[0], target),
        Op::Reduce { kind, dims } => reduce::reduce(em, *kind, dims, &operands[0], target),
        Op::DotGeneral(dims) => {
            contraction::dot_general(em, dims, &operands[0], &operands[1], target)
        }
        Op::Convolution(config) => {
            convolution::convolution(em, node, config, &operands[0], &operands[1], target)
        }
        Op::DynamicSlice(sizes) => {
            dynamic_slicing::dynamic_slice(em, node, sizes, operands, target)
        }
        Op::DynamicUpdateSlice => dynamic_slicing::dynamic_update_slice(em, node, operands, target),
        Op::Cumulative { kind, dim, reverse } => {
            scan::cumulative(em, (*kind, *dim, *reverse), &operands[0], target)
        }
        Op::Argsort { dim, .. } => sort::argsort(em, node, *dim, &operands[0], target),
        Op::Reverse(dims) => data_movement::reverse(em, node, dims, &operands[0], target),
        Op::Slice { .. } | Op::Pad { .. } | Op::Concatenate(_) | Op::ReduceWindow { .. } => {
            data_movement::windowed(em, node, operands, target)
        }
        Op::Gather(dims) => {
            indexing::gather(em, dims, &node.ty, &operands[0], &operands[1], target)
        }
        Op::Scatter { dims, kind } => {
            let xs = [&operands[0], &operands[1], &operands[2]];
            indexing::scatter(em, dims, *kind, xs, target)
        }
        Op::Flow { flow, result } => flow::flow(em, node, flow, *result, operands),
        Op::AxisIndex(_)
        | Op::AllReduce { .. }
        | Op::AllGather { .. }
        | Op::ReduceScatter { .. }
        | Op::AllToAll { .. }
        | Op::CollectivePermute { .. }
        // Only in a manual region's body (`shard_map`), partitioned over automatic axes.
        | Op::CollectiveShift { .. } => super::manual::collective(em, node, operands, target),
    }
}

/// `target` without pending sums: what a non-linear op's result can be.
pub(crate) fn reduced(target: &Sharding) -> Sharding {
    Sharding {
        unreduced: Vec::new(),
        ..target.clone()
    }
}

/// A sharding with `dims` as closed axes per dim and pending sums `unreduced`.
pub(crate) fn with_dims(dims: Vec<Vec<String>>, unreduced: Vec<String>) -> Sharding {
    super::reshard::sharding_of(&dims, unreduced)
}
