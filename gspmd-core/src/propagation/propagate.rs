//! The propagation driver: orders the per-op steps and runs them to a fixed point.
//!
//! Loops, outermost first:
//! 1. user priority: round `r` lets annotation dims of the `r`-th smallest priority (and
//!    all earlier ones) act as sources; dims without a priority come last;
//! 2. op priority ([`OP_PRIORITY_LEVELS`]): elementwise ops, then all ops with
//!    broadcasts only backward, then all ops both ways;
//! 3. strategy: first only what tensors agree on, then conflicts resolved for the
//!    largest tensor;
//! 4. alternating forward and backward sweeps over the nodes until a sweep changes
//!    nothing.
//!
//! Every step only appends (sub-)axes to open dims (see [`super::factor_sharding`]),
//! overlapping none the value already uses: a whole axis of size 1 at most once, and
//! otherwise parts of at least 2 devices, each change at least doubling the number of
//! blocks the value is cut in. So each loop ends after at most
//! `values × (log2(devices) + mesh axes)` changes ([`max_refinements`]). Propagation
//! terminates, and its cost depends on the number of mesh axes and the logarithm of
//! the number of devices.

use std::borrow::Cow;

use super::factor_propagation::{Step, Strategy, propagate_op};
use super::registry::{OP_PRIORITY_LEVELS, direction_at, sharding_rule};
use super::rule::OpShardingRule;
use super::state::{Rounds, final_sharding, initial_states, origin};
use crate::error::{Error, Result};
use crate::ir::{Program, ValueId, verify};
use crate::sharding::Mesh;

/// Completes the shardings of `program` on `mesh`.
///
/// Checks every annotation against the mesh (unknown axis, axis used twice, rank) and
/// reports all problems together, each with the value's source location; then verifies
/// the program. Returns a copy of the program in which every node has
/// - `sharding`: the final sharding, all dims closed and without priorities. An
///   annotated value keeps its annotation's axes; open (`?`) dims may have gained
///   minor axes.
/// - `origin`: per dim, the annotated value whose annotation supplied the dim's axes.
///
/// Control flow (see `regions`): a loop's carried values take the shardings their
/// initial values and the loop body give them (a fixed point across the region
/// boundary); then each region is propagated with that boundary fixed.
///
/// Unannotated values start open and unsplit. When tensors disagree on a factor, the
/// largest one keeps its axes and the others are left to be resharded by the
/// partitioner.
pub fn propagate(program: &Program, mesh: &Mesh) -> Result<Program> {
    propagate_program(program, mesh, true)
}

/// [`propagate`] of a manual region's body (`shard_map`), whose collectives and
/// `axis_index` are per-device ops over manual axes: only annotations of automatic axes
/// reach its values, so they are propagated over those.
pub(super) fn propagate_manual_body(body: &Program, mesh: &Mesh) -> Result<Program> {
    propagate_program(body, mesh, false)
}

/// [`propagate`]; per-device ops are an error in a `global` program.
fn propagate_program(program: &Program, mesh: &Mesh, global: bool) -> Result<Program> {
    // Shardings regions give the flow results go back to them as open annotations
    // (`regions::result_hints`), and the moved split of a sort along a split dim to the
    // sort (`registry::moved_sort_splits`), until there are none; each round only
    // appends axes to some result, so there are at most `values x max_refinements`
    // rounds.
    let mut hinted = Cow::Borrowed(program);
    let mut out = propagate_flat(&hinted, mesh, global)?;
    for _ in 0..program.nodes.len() * max_refinements(mesh) {
        let mut hints = super::regions::result_hints(&out, mesh)?;
        hints.extend(super::registry::moved_sort_splits(&out, mesh));
        // A flow result the user annotated keeps the user's sharding.
        hints.retain(|(v, _)| program.node(*v).annotation.is_none());
        if hints.is_empty() {
            break;
        }
        let h = hinted.to_mut();
        for (v, s) in hints {
            h.node_mut(v).annotation = Some(s);
        }
        out = propagate_flat(&hinted, mesh, global)?;
    }
    super::regions::propagate_regions(&mut out, program, mesh)?;
    // The hints were this function's own annotations, not the user's.
    for (node, original) in out.nodes.iter_mut().zip(&program.nodes) {
        node.annotation.clone_from(&original.annotation);
    }
    Ok(out)
}

/// How many times one value's sharding can be refined on `mesh`: each refinement
/// appends (sub-)axes that overlap none it has, so at most `log2(devices)` times by
/// parts of at least 2 devices plus once per axis of size 1.
fn max_refinements(mesh: &Mesh) -> usize {
    mesh.num_devices().ilog2() as usize + mesh.axes().len()
}

/// [`propagate`] of the enclosing program alone (regions untouched); per-device ops
/// are an error in a `global` program.
fn propagate_flat(program: &Program, mesh: &Mesh, global: bool) -> Result<Program> {
    validate_annotations(program, mesh)?;
    verify(program)?;
    if global {
        reject_per_device_ops(program)?;
    }
    let rounds = Rounds::of(program);
    let mut states = initial_states(program, mesh, &rounds);
    let rules: Vec<OpShardingRule> = program
        .values()
        .map(|v| sharding_rule(program, v))
        .collect();
    // Ops with operands; the others have nothing to propagate across.
    let ops: Vec<ValueId> = (program.values())
        .filter(|&v| !program.node(v).operands.is_empty())
        .collect();
    for round in 0..rounds.len() {
        for level in 0..OP_PRIORITY_LEVELS {
            for strategy in [Strategy::ConflictFree, Strategy::PreferLargest] {
                let visit = |v: ValueId| -> bool {
                    let node = program.node(v);
                    let Some(direction) = direction_at(&node.op, level) else {
                        return false;
                    };
                    let step = Step {
                        round,
                        strategy,
                        direction,
                    };
                    let rule = &rules[v.index()];
                    let elementwise = node.op.is_elementwise();
                    propagate_op(&mut states, rule, elementwise, &node.operands, v, step)
                };
                sweep_to_fixed_point(&ops, visit);
            }
        }
    }
    let mut out = program.clone();
    for (node, state) in out.nodes.iter_mut().zip(&states) {
        node.sharding = Some(final_sharding(state, node.annotation.as_ref(), mesh));
        node.origin = Some(origin(state));
    }
    Ok(out)
}

/// Visits `ops` in alternating forward and backward sweeps until a whole sweep changes
/// nothing; `visit` returns true if it changed a value.
fn sweep_to_fixed_point(ops: &[ValueId], mut visit: impl FnMut(ValueId) -> bool) {
    let mut forward = true;
    loop {
        let mut changed = false;
        for i in 0..ops.len() {
            let v = if forward {
                ops[i]
            } else {
                ops[ops.len() - 1 - i]
            };
            changed |= visit(v);
        }
        if !changed {
            return;
        }
        forward = !forward;
    }
}

/// Checks each annotation of `program` against `mesh`; all errors together.
fn validate_annotations(program: &Program, mesh: &Mesh) -> Result<()> {
    let mut errors = Vec::new();
    for v in program.values() {
        let node = program.node(v);
        if let Some(annotation) = &node.annotation {
            let context = format!("{}: {v}: ", node.location);
            if let Err(e) = annotation.validate(mesh, node.ty.rank(), &context) {
                errors.push(e);
            }
        }
    }
    Error::from_list(errors)
}

/// Propagation works on global programs; per-device ops mean the program was already
/// partitioned.
fn reject_per_device_ops(program: &Program) -> Result<()> {
    let errors = (program.values())
        .filter(|&v| program.node(v).op.is_spmd_only())
        .map(|v| crate::error::Error::Verify {
            value: v,
            location: program.node(v).location,
            message: format!(
                "{} is a per-device op: propagate a global program",
                program.node(v).op.name()
            ),
        })
        .collect();
    crate::error::Error::from_list(errors)
}
