//! The SPMD partitioner (GSPMD section 4; XLA's SPMD partitioner): rewrites a propagated
//! global program into ONE per-device program, parameterised by the device's position
//! in the mesh (`axis_index`), with explicit collectives.
//!
//! The per-device program's size and the time to build it depend only on the global
//! program and the number of mesh axes, never on the number of devices: collectives
//! name mesh axes, offsets are computed from `axis_index` at run time.
//!
//! Every global value becomes a `PValue` (local block + global type + sharding). Each
//! op's handler (one per op family, in `handlers/`) reshards its operands as the local
//! op needs, emits it, and the driver reshards the result to the value's propagated
//! sharding (`reshard` picks the cheapest composition of collectives).

mod accumulate;
mod combine;
mod emit;
mod fusion;
mod halo;
mod handlers;
mod hoist;
mod manual;
mod mask;
mod order;
pub(crate) mod regather;
mod report;
mod reshard;
mod residuals;
mod value;

pub(crate) use combine::combine_collectives;
pub use report::{CollectiveStats, Runs, bytes_received};
pub(crate) use report::{collective_line, visit_collectives};
pub(crate) use residuals::save_residual_collectives;
pub(crate) use value::PValue;

use crate::error::Result;
use crate::ir::{Node, Op, Program, TensorType, ValueId};
use crate::sharding::{Mesh, Sharding};
use emit::Emitter;
use fusion::Fusion;

/// A partitioned program: the per-device program plus how its inputs and outputs map to
/// global arrays.
#[derive(Debug, Clone)]
pub struct SpmdProgram {
    /// The per-device program; its parameters and outputs are local (padded) blocks.
    pub program: Program,
    /// The mesh it was partitioned for.
    pub mesh: Mesh,
    /// Global type and sharding of each parameter.
    pub inputs: Vec<(TensorType, Sharding)>,
    /// Global type and sharding of each output.
    pub outputs: Vec<(TensorType, Sharding)>,
    /// Costly choices the partitioner made (e.g. a dim gathered whole), with locations.
    pub warnings: Vec<String>,
}

impl SpmdProgram {
    /// `program` unpartitioned, as the one device of `mesh` runs it: every input and
    /// output whole (replicated). What the reference interpreter runs.
    pub fn whole(program: &Program, mesh: &Mesh) -> Self {
        let whole = |v: ValueId| {
            let ty = program.ty(v).clone();
            let sharding = Sharding::replicated(ty.rank());
            (ty, sharding)
        };
        SpmdProgram {
            program: program.clone(),
            mesh: mesh.clone(),
            inputs: program.params.iter().map(|&p| whole(p)).collect(),
            outputs: program.outputs.iter().map(|&o| whole(o)).collect(),
            warnings: Vec::new(),
        }
    }
}

/// `target` extended with the pending sums that every user of `v` keeps, when `v` is a
/// contraction or a sum whose only users are `sharding_constraint`s asking for those
/// pending sums: the partial result then flows to them without an all-reduce and back.
fn keep_sums_for_users(
    program: &Program,
    users: &[ValueId],
    v: ValueId,
    mut target: Sharding,
) -> Sharding {
    let makes_sums = program.node(v).op.kind().makes_partial_sums();
    if !makes_sums || users.is_empty() || program.outputs.contains(&v) {
        return target;
    }
    let kept = |u: &ValueId| -> Option<&[String]> {
        let node = program.node(*u);
        (node.op == Op::ShardingConstraint).then_some(())?;
        Some(node.annotation.as_ref()?.unreduced.as_slice())
    };
    let Some(first) = kept(&users[0]) else {
        return target;
    };
    if users.iter().any(|u| kept(u) != Some(first)) {
        return target;
    }
    let used: Vec<String> = target.axes().map(String::from).collect();
    for axis in first {
        if !used.contains(axis) && !target.unreduced.contains(axis) {
            target.unreduced.push(axis.clone());
        }
    }
    target
}

/// `target` and the shardings of `operands` relabelled with every (sub-)axis cut at
/// the digit boundaries any of them has ([`Sharding::cut_at`]): the same tilings, named
/// so that handlers comparing axes by name compare digits (`x` beside `x:(2)2` becomes
/// `x:(1)2, x:(2)2`). Whole axes everywhere stay as they are.
fn in_common_parts(
    mesh: &Mesh,
    target: &Sharding,
    mut operands: Vec<PValue>,
) -> (Sharding, Vec<PValue>) {
    let parts: Vec<_> = (operands.iter().map(|o| &o.sharding))
        .chain([target])
        .flat_map(|s| s.parts(mesh))
        .collect();
    for o in &mut operands {
        o.sharding = o.sharding.cut_at(mesh, &parts);
    }
    (target.cut_at(mesh, &parts), operands)
}

/// Partitions a propagated program (every node has a `sharding`) for `mesh`. Its
/// outputs may be in a device order other than the mesh's (a reversed dim: see
/// [`DimSharding::reversed`](crate::sharding::DimSharding::reversed));
/// [`SpmdProgram::outputs`] says which.
pub fn partition(program: &Program, mesh: &Mesh) -> Result<SpmdProgram> {
    partition_program(program, mesh, false)
}

/// [`partition`] for a region of a flow op: its outputs are in their targets' order.
pub(crate) fn partition_region(region: &Program, mesh: &Mesh) -> Result<SpmdProgram> {
    partition_program(region, mesh, true)
}

/// [`partition`]; a `region`'s outputs are put in their targets' order.
fn partition_program(program: &Program, mesh: &Mesh, region: bool) -> Result<SpmdProgram> {
    let mut em = Emitter::new(program, mesh);
    let mut values: Vec<Option<PValue>> = vec![None; program.nodes.len()];
    let users = program.users();
    let fusions = fusion::fusions(program);
    let skipped = fusion::skipped(program, &fusions);
    for v in program.values() {
        if skipped[v.index()] {
            continue;
        }
        let node = program.node(v);
        em.current = (v, node.op.name(), node.location);
        let target = node
            .sharding
            .clone()
            .ok_or_else(|| em.error("the value has no sharding: run propagation first"))?;
        target.validate(mesh, node.ty.rank(), &format!("{}: {v}: ", node.location))?;
        // One name per tiling (sub-axes merged), so handlers comparing axes agree.
        let target = keep_sums_for_users(program, &users[v.index()], v, target.canonical(mesh));
        let operands = |em: &Emitter, ids: &[ValueId]| -> Result<Vec<PValue>> {
            (ids.iter())
                .map(|o| {
                    values[o.index()]
                        .clone()
                        .ok_or_else(|| em.error(format!("operand {o} not partitioned")))
                })
                .collect()
        };
        // The handler's target and operands: in the device order it understands
        // (`order`), then cut into common parts.
        let fused = fusions[v.index()].is_some();
        let inputs = |em: &mut Emitter, n: &Node| -> Result<(Sharding, Vec<PValue>)> {
            let ids = match &fusions[v.index()] {
                Some(Fusion::Rotation(rotation)) => vec![rotation.source],
                _ => n.operands.clone(),
            };
            let ops = operands(em, &ids)?;
            let (want, ops) = order::for_handler(em, n, fused, target.clone(), ops)?;
            Ok(in_common_parts(mesh, &want, ops))
        };
        let result = match &fusions[v.index()] {
            Some(Fusion::Rotation(rotation)) => {
                let (cut, a) = inputs(&mut em, node)?;
                handlers::rotate(&mut em, node, &a[0], *rotation, &cut)?
            }
            Some(Fusion::SliceOfPad { node: pad, .. }) => {
                let (cut, ops) = inputs(&mut em, pad)?;
                handlers::partition_node(&mut em, pad, &ops, &cut)?
            }
            None => {
                let (cut, ops) = inputs(&mut em, node)?;
                handlers::partition_node(&mut em, node, &ops, &cut)?
            }
        };
        let region_output = region && program.outputs.contains(&v);
        let target = order::kept_order(mesh, &result, target, region_output);
        em.globals.entry(result.id).or_insert(v);
        let result = reshard::reshard(&mut em, &result, &target)?;
        em.globals.insert(result.id, v);
        let local = em.program.node_mut(result.id);
        local.sharding = Some(target);
        if local.name.is_none() {
            local.name.clone_from(&node.name);
        }
        values[v.index()] = Some(result);
    }
    let pick = |ids: &[crate::ir::ValueId]| -> Vec<(TensorType, Sharding)> {
        ids.iter()
            .filter_map(|v| values[v.index()].as_ref())
            .map(|p| (p.global.clone(), p.sharding.clone()))
            .collect()
    };
    let inputs = pick(&program.params);
    let outputs = pick(&program.outputs);
    let local_ids = |ids: &[crate::ir::ValueId]| -> Vec<crate::ir::ValueId> {
        ids.iter()
            .filter_map(|v| values[v.index()].as_ref().map(|p| p.id))
            .collect()
    };
    em.program.params = local_ids(&program.params);
    em.program.outputs = local_ids(&program.outputs);
    if inputs.len() != program.params.len() || outputs.len() != program.outputs.len() {
        return Err(em.error("internal: a parameter or output was not partitioned"));
    }
    Ok(SpmdProgram {
        program: em.program,
        mesh: mesh.clone(),
        inputs,
        outputs,
        warnings: em.warnings,
    })
}
