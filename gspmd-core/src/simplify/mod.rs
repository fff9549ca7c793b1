//! Program-to-program simplification (XLA's `HloCSE` and `HloDCE`): [`simplify`] merges
//! common subexpressions, then removes dead code. `compile` runs it on the global
//! program before propagation and on the per-device program after partitioning. Once
//! shardings are decided ([`Stage::Sharded`]), transposes of products that only swap
//! the operands' roles become the product of the swapped operands first
//! (`product_transposes`; bitwise the same values), and sums of zero-padded slabs that
//! tile a dim become one concatenation (`padded_sums`). The swap is left out before
//! propagation so that the partitioner sees the products as written: made there, it
//! changed which collectives a scanned layer stack's backward scan could take from its
//! forward scan (`tests/loop_collectives.rs`).
//!
//! Both passes keep [`Program`]'s invariants: nodes stay in SSA order and are renumbered
//! so that node `i` defines `%i`; operands, `params`, `outputs` and propagation's
//! `origin` are remapped. Parameters are never removed or merged, so parameter `i` is
//! still `params[i]`; outputs keep their positions (two outputs may become one value).

mod cse;
mod dce;
mod padded_sums;
mod product_transposes;

pub(crate) use cse::same_computation;
pub(crate) use dce::eliminate_dead_code;

use std::borrow::Cow;
use std::collections::HashMap;
use std::convert::Infallible;
use std::sync::Arc;

use crate::error::Result;
use crate::ir::{Flow, Op, Origin, Program, ValueId, verify};

/// Where in the pipeline a program is simplified: whether its shardings are decided,
/// which decides what common-subexpression elimination may merge.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Stage {
    /// A global program before propagation. Values that every device can compute at
    /// any sharding without communication (constants, iotas, broadcasts of scalars,
    /// and ops of such values only) are not merged: each copy keeps the sharding its
    /// own users give it, where one merged copy would serve users wanting different
    /// shardings and need a reshard (XLA's sharding propagation keeps such ops from
    /// being merged for the same reason).
    BeforePropagation,
    /// A propagated global program or a per-device program: every equal pair merges.
    Sharded,
}

/// `program` with common subexpressions merged (as `stage` allows) and dead nodes
/// removed, at [`Stage::Sharded`] after transposes of products that swap the operands'
/// free dims were made products of the swapped operands and sums of zero-padded slabs
/// tiling a dim were made concatenations; it computes the same outputs from the same inputs (equal as
/// IEEE values: such a sum turned `-0.0` into `+0.0`, the concatenation does not). Errors are those of
/// [`verify`], which runs first.
pub fn simplify(program: &Program, stage: Stage) -> Result<Program> {
    verify(program)?;
    Ok(simplify_verified(program, stage))
}

/// [`simplify`] of a program known to pass [`verify`] (`compile` verifies once, and the
/// partitioner's output is well formed by construction).
pub(crate) fn simplify_verified(program: &Program, stage: Stage) -> Program {
    let program = simplify_regions(program, stage);
    let program = match stage {
        Stage::BeforePropagation => program,
        Stage::Sharded => {
            let program =
                product_transposes::swap_transposed_products(&program).map_or(program, Cow::Owned);
            padded_sums::join_padded_sums(&program).map_or(program, Cow::Owned)
        }
    };
    dce::eliminate_dead_code(&cse::eliminate_common_subexpressions(&program, stage))
}

/// `program` with the regions of its control-flow ops simplified (recursively; a
/// region keeps its parameters and outputs, so its signature is unchanged). The result
/// nodes of one instance keep sharing one `Arc<Flow>`. To CSE and DCE a flow op is one
/// pure function of its operands per result: equal instances merge, and the op stays
/// while one of its results is used.
fn simplify_regions(program: &Program, stage: Stage) -> Cow<'_, Program> {
    if !program
        .nodes
        .iter()
        .any(|n| matches!(n.op, Op::Flow { .. }))
    {
        return Cow::Borrowed(program);
    }
    let mut out = program.clone();
    // Keyed by `program`'s regions, which outlive the loop, so no address is reused.
    let mut done: HashMap<*const Flow, Arc<Flow>> = HashMap::new();
    for (node, original) in out.nodes.iter_mut().zip(&program.nodes) {
        if let Op::Flow { flow, result } = &original.op {
            let simplified = done.entry(Arc::as_ptr(flow)).or_insert_with(|| {
                let simplify = |r: &Program| Ok::<_, Infallible>(simplify_verified(r, stage));
                let Ok(f) = flow.try_map_regions(simplify);
                Arc::new(f)
            });
            node.op = Op::Flow {
                flow: simplified.clone(),
                result: *result,
            };
        }
    }
    Cow::Owned(out)
}

/// What becomes of one node when a program is rebuilt.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Fate {
    /// Copied, with its operands renumbered.
    Keep,
    /// Removed; no kept node, output or parameter may use it.
    Drop,
    /// Merged into this earlier kept value: every use of the node uses it instead.
    SameAs(ValueId),
}

/// Rebuilds `program` by `fate` (one per node). Kept nodes keep their op, type,
/// annotation, sharding, location and name; a kept node without a name takes the name
/// of the first node merged into it. A propagation `origin` naming a removed value
/// becomes `None` ("origin unknown"); one naming a merged value names its survivor.
///
/// Panics if a kept node, a parameter or an output uses a dropped value, or a node is
/// merged into a value that is not an earlier kept one: a bug in the pass, not user input.
fn rebuild(program: &Program, fate: &[Fate]) -> Program {
    let mut ids: Vec<Option<ValueId>> = vec![None; program.nodes.len()];
    let mut out = Program::new(program.name.clone());
    for v in program.values() {
        let node = program.node(v);
        match fate[v.index()] {
            Fate::Keep => {
                let mut copy = node.clone();
                copy.operands = node.operands.iter().map(|&o| renumber(&ids, o)).collect();
                ids[v.index()] = Some(out.push(copy));
            }
            Fate::Drop => {}
            Fate::SameAs(first) => {
                let survivor = renumber(&ids, first);
                let kept = out.node_mut(survivor);
                if kept.name.is_none() {
                    kept.name.clone_from(&node.name);
                }
                for why in &node.why {
                    if !kept.why.contains(why) {
                        kept.why.push(why.clone());
                    }
                }
                ids[v.index()] = Some(survivor);
            }
        }
    }
    out.params = program.params.iter().map(|&p| renumber(&ids, p)).collect();
    out.outputs = program.outputs.iter().map(|&o| renumber(&ids, o)).collect();
    for node in &mut out.nodes {
        if let Some(origin) = &node.origin {
            node.origin = Some(Origin {
                dims: origin
                    .dims
                    .iter()
                    .map(|d| d.and_then(|v| ids[v.index()]))
                    .collect(),
            });
        }
    }
    out
}

/// The new id of kept or merged value `v`.
fn renumber(ids: &[Option<ValueId>], v: ValueId) -> ValueId {
    ids[v.index()].unwrap_or_else(|| panic!("simplify: {v} is used but was removed"))
}
