//! Device orders in the partitioner ([`DimSharding::reversed`], XLA's permuted tile
//! assignments): which values may be held in an order other than the mesh's, and the
//! one guard that gives every other handler its operands in mesh order.
//!
//! A `reverse` of a dim split evenly alike in operand and result reverses each block
//! where it is and records that the dim's shards are now in reversed device order
//! (`handlers::data_movement`); no data moves. The value keeps that order for as long
//! as its users keep it:
//! - elementwise ops (and `sharding_constraint`s) whose operands of the result's rank
//!   are all in one order keep it on the dims their target splits alike; operands in
//!   different orders are all moved to mesh order (or to the order the user's
//!   annotation names) by the handler's reshard (each one mirrored shift of one block
//!   per device);
//! - `reverse` itself (reversing a reversed dim gives mesh order back);
//! - a parameter annotated in another order (`(-h, _)`) arrives in it;
//! - every other op, and every fused pattern, gets its operands mirrored into mesh
//!   order first and a target in mesh order ([`for_handler`]): handlers compute block
//!   offsets from the device's index along the axes, which holds only in mesh order.
//!
//! A target in mesh order does not pin the order of a value computed in another
//! ([`kept_order`]); the outputs of a region (a loop body's carried state, a branch's
//! results) are put in their target's order, so a region's boundary is one sharding.
//! The program's outputs keep their order: the runtime assembles and splits blocks by
//! [`Sharding::device_block`], which reads it.

use super::emit::Emitter;
use super::reshard::reshard;
use super::value::PValue;
use crate::error::Result;
use crate::ir::{Node, Op};
use crate::sharding::{DimSharding, Mesh, Sharding};

/// The target and operands `node`'s handler gets (see the module doc):
/// - a `reverse` and a parameter (whose block arrives in the target's order): as given;
/// - an elementwise op: its operands as given, and `target` itself when it names an
///   order, else `target` in the common order of its operands of the result's rank on
///   the dims it splits as they do (in mesh order if their orders differ);
/// - every other op, and a fused pattern (`fused`): the operands mirrored into mesh
///   order and `target` in mesh order.
pub(super) fn for_handler(
    em: &mut Emitter,
    node: &Node,
    fused: bool,
    target: Sharding,
    operands: Vec<PValue>,
) -> Result<(Sharding, Vec<PValue>)> {
    // A parameter's block arrives in its target's order; a reverse picks its own.
    if !fused && matches!(node.op, Op::Parameter { .. } | Op::Reverse(_)) {
        return Ok((target, operands));
    }
    // The elementwise ops (and `sharding_constraint`) take operands in any device
    // order and keep a common one.
    if !fused && node.op.is_elementwise() {
        // An order the user asked for (`(-h, _)`) is where the operands go.
        if !target.is_in_mesh_order() {
            return Ok((target, operands));
        }
        let rank = node.ty.rank();
        let orders: Vec<(&Sharding, Vec<usize>)> = (operands.iter())
            .filter(|o| o.global.rank() == rank)
            .map(|o| (&o.sharding, reversed_dims(&o.sharding)))
            .collect();
        let target = match orders.first() {
            Some((s, first)) if orders.iter().all(|(_, o)| o == first) => {
                in_order_of(em.mesh, target, s)
            }
            _ => target,
        };
        return Ok((target, operands));
    }
    let mut ordered = Vec::with_capacity(operands.len());
    for o in operands {
        ordered.push(if o.sharding.is_in_mesh_order() {
            o
        } else {
            reshard(em, &o, &o.sharding.in_mesh_order())?
        });
    }
    Ok((target.in_mesh_order(), ordered))
}

/// The sharding the driver moves `result` to: `target` itself when it names an order
/// other than the mesh's or `in_region_output` (a region's output keeps its target's
/// order); otherwise `target` in `result`'s order on the dims they split alike.
pub(super) fn kept_order(
    mesh: &Mesh,
    result: &PValue,
    target: Sharding,
    in_region_output: bool,
) -> Sharding {
    if in_region_output || !target.is_in_mesh_order() {
        return target;
    }
    in_order_of(mesh, target, &result.sharding)
}

/// `target` with each dim reversed where `s` reverses a dim split over the same
/// (non-empty) axes, and in mesh order elsewhere.
pub(super) fn in_order_of(mesh: &Mesh, target: Sharding, s: &Sharding) -> Sharding {
    let same_split = |a: &DimSharding, b: &DimSharding| {
        !a.axes.is_empty() && mesh.canonical_axes(&a.axes) == mesh.canonical_axes(&b.axes)
    };
    let dims = (target.dims.iter().enumerate())
        .map(|(d, dim)| DimSharding {
            reversed: (s.dims.get(d)).is_some_and(|o| o.reversed && same_split(o, dim)),
            ..dim.clone()
        })
        .collect();
    Sharding { dims, ..target }
}

/// The dims of `s` in reversed device order.
fn reversed_dims(s: &Sharding) -> Vec<usize> {
    (s.dims.iter().enumerate())
        .filter(|(_, d)| d.reversed)
        .map(|(d, _)| d)
        .collect()
}
