//! One propagation step at one op: project the shardings of its operands and result
//! onto the op's factors, choose each factor's axes, and refine every tensor that may
//! take them. Knows no op: only the [`OpShardingRule`].

use super::factor_sharding::{project_dim, refine_factor};
use super::rule::{FactorKind, OpShardingRule};
use super::state::{Axis, ValueState};
use crate::ir::ValueId;

/// How a step treats a factor whose tensors disagree (neither axes list a prefix of the
/// other).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Strategy {
    /// Propagate only what all tensors agree on: the common prefix of their axes.
    ConflictFree,
    /// Resolve the conflict in favour of the largest tensor (in elements): the others
    /// keep their axes and the partitioner reshards them, the cheapest choice.
    PreferLargest,
}

/// Which of an op's tensors a step may refine.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Direction {
    /// Operands and result.
    Both,
    /// Operands only: information flows from the result back to the operands.
    Backward,
}

/// What one step at one op may do.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) struct Step {
    /// The user-priority round: only annotation axes active in it act as sources.
    pub round: usize,
    /// How conflicts are treated.
    pub strategy: Strategy,
    /// Which tensors may be refined.
    pub direction: Direction,
}

/// The axes one tensor offers for a factor.
struct Candidate {
    axes: Vec<Axis>,
    elements: usize,
    origin: Option<ValueId>,
}

/// The axes a factor gets from its candidates, and the annotated value they come from.
fn choose(candidates: &mut [Candidate], strategy: Strategy) -> (&[Axis], Option<ValueId>) {
    // Largest first; the sort is stable, so ties go to the earlier tensor (operands in
    // order, then the result).
    candidates.sort_by_key(|c| std::cmp::Reverse(c.elements));
    let Some(first) = candidates.first() else {
        return (&[], None);
    };
    let (mut axes, mut origin) = (first.axes.as_slice(), first.origin);
    let largest_origin = first.origin;
    let mut common = first.axes.as_slice();
    let mut conflict = false;
    for c in &candidates[1..] {
        let shared = common
            .iter()
            .zip(&c.axes)
            .take_while(|(a, b)| a == b)
            .count();
        common = &common[..shared];
        if c.axes.starts_with(axes) {
            if c.axes.len() > axes.len() {
                (axes, origin) = (&c.axes, c.origin);
            }
        } else if !axes.starts_with(&c.axes) {
            conflict = true;
        }
    }
    match (strategy, conflict) {
        (Strategy::ConflictFree, true) => (common, largest_origin),
        _ => (axes, origin),
    }
}

/// Propagates once across the op defining `result`, whose operands are `operands` and
/// whose rule is `rule`, as `step` allows. Returns true if any value changed.
pub(super) fn propagate_op(
    states: &mut [ValueState],
    rule: &OpShardingRule,
    operands: &[ValueId],
    result: ValueId,
    step: Step,
) -> bool {
    let sizes = |factors: &[usize]| -> Vec<usize> {
        factors.iter().map(|&f| rule.factors[f].size).collect()
    };
    let values: Vec<ValueId> = operands.iter().copied().chain([result]).collect();

    // Each factor's axes, chosen from every tensor that maps it.
    let mut chosen: Vec<(Vec<Axis>, Option<ValueId>)> =
        vec![(Vec::new(), None); rule.factors.len()];
    {
        let mut candidates: Vec<Vec<Candidate>> =
            (0..rule.factors.len()).map(|_| Vec::new()).collect();
        for (&v, mapping) in values.iter().zip(rule.tensors()) {
            let state = &states[v.index()];
            for (d, factors) in mapping.dims.iter().enumerate() {
                let Some(dim) = state.dims.get(d) else {
                    continue;
                };
                let axes = dim.source_axes(step.round);
                if axes.is_empty() {
                    continue;
                }
                let projection = project_dim(axes, state.shape[d], &sizes(factors));
                for (&f, axes) in factors.iter().zip(projection.axes) {
                    if !axes.is_empty() {
                        candidates[f].push(Candidate {
                            axes,
                            elements: state.elements(),
                            origin: dim.origin,
                        });
                    }
                }
            }
        }
        for (f, factor) in rule.factors.iter().enumerate() {
            if factor.kind != FactorKind::NeedReplication {
                let (axes, origin) = choose(&mut candidates[f], step.strategy);
                chosen[f] = (axes.to_vec(), origin);
            }
        }
    }

    // Refine every tensor the direction allows, factor by factor, major to minor.
    let mut changed = false;
    for (t, (&v, mapping)) in values.iter().zip(rule.tensors()).enumerate() {
        let is_result = t == operands.len();
        if step.direction == Direction::Backward && is_result {
            continue;
        }
        let state = &mut states[v.index()];
        for (d, factors) in mapping.dims.iter().enumerate() {
            let factor_sizes = sizes(factors);
            for (position, &f) in factors.iter().enumerate() {
                let (axes, origin) = &chosen[f];
                if axes.is_empty() || !refine_factor(state, d, &factor_sizes, position, axes) {
                    continue;
                }
                changed = true;
                let dim = &mut state.dims[d];
                if dim.origin.is_none() {
                    dim.origin = *origin;
                }
            }
        }
    }
    changed
}

#[cfg(test)]
mod tests {
    use super::*;

    fn candidate(axes: &[usize], elements: usize) -> Candidate {
        Candidate {
            axes: axes.iter().map(|&a| Axis::whole(a, 2)).collect(),
            elements,
            origin: None,
        }
    }

    #[test]
    fn compatible_candidates_give_the_longest() {
        let mut cs = [candidate(&[0], 8), candidate(&[0, 1], 4), candidate(&[], 2)];
        assert_eq!(
            choose(&mut cs, Strategy::ConflictFree).0,
            candidate(&[0, 1], 0).axes
        );
    }

    #[test]
    fn conflicts_give_the_common_prefix_or_the_largest_tensor() {
        let mut cs = [candidate(&[0, 1], 4), candidate(&[0, 2], 16)];
        assert_eq!(
            choose(&mut cs, Strategy::ConflictFree).0,
            candidate(&[0], 0).axes
        );
        let mut cs = [candidate(&[0, 1], 4), candidate(&[0, 2], 16)];
        assert_eq!(
            choose(&mut cs, Strategy::PreferLargest).0,
            candidate(&[0, 2], 0).axes
        );
    }
}
