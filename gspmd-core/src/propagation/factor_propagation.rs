//! One propagation step at one op: project the shardings of its operands and result
//! onto the op's factors, choose each factor's axes, and refine every tensor that may
//! take them. Knows no op: only the [`OpShardingRule`] (and whether the op is
//! elementwise).
//!
//! When two factors of one tensor want the same mesh axis, the factors claim axes in
//! Shardy's order ([`claim_order`]): the factor whose *source* (the largest tensor that
//! already holds the factor's chosen axes) is larger first, so the larger tensor keeps
//! its layout and the smaller one is resharded; on an elementwise op, ties go to the
//! factor split over more devices; then to the source earlier among the op's tensors
//! (operands in order, then the result); then to the factor numbered first.

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
    /// The result only: information flows from the operands to the result.
    Forward,
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
    /// The tensor's position among the op's tensors (operands, then the result).
    tensor: usize,
    origin: Option<ValueId>,
}

/// What a step chose for one factor.
#[derive(Debug, Clone, Default)]
struct Choice {
    /// The axes the factor gets.
    axes: Vec<Axis>,
    /// The annotated value they come from.
    origin: Option<ValueId>,
    /// The factor's source: the largest tensor (in elements, then the earliest) whose
    /// axes for the factor start with `axes`, as (elements, tensor position); `None`
    /// when `axes` is empty.
    source: Option<(usize, usize)>,
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

/// The factor's [`Choice`] from its candidates.
fn choice(candidates: &mut [Candidate], strategy: Strategy) -> Choice {
    let (axes, origin) = choose(candidates, strategy);
    let axes = axes.to_vec();
    // `choose` left the candidates largest first, ties in tensor order.
    let source = (!axes.is_empty())
        .then(|| candidates.iter().find(|c| c.axes.starts_with(&axes)))
        .flatten()
        .map(|c| (c.elements, c.tensor));
    Choice {
        axes,
        origin,
        source,
    }
}

/// The order in which factors claim mesh axes on a tensor (Shardy's conflict rule
/// across factors): the larger source first; on an `elementwise` op, the factor whose
/// axes span more devices; the earlier source tensor; the smaller factor index. Factors
/// without axes come last.
fn claim_order(choices: &[Choice], elementwise: bool) -> Vec<usize> {
    let devices = |c: &Choice| -> usize {
        if elementwise {
            c.axes.iter().map(|a| a.size).product()
        } else {
            1
        }
    };
    let mut order: Vec<usize> = (0..choices.len()).collect();
    order.sort_by_key(|&f| {
        let c = &choices[f];
        let (elements, tensor) = c.source.unwrap_or((0, usize::MAX));
        (
            std::cmp::Reverse(elements),
            std::cmp::Reverse(devices(c)),
            tensor,
            f,
        )
    });
    order
}

/// Propagates once across the op defining `result`, whose operands are `operands` and
/// whose rule is `rule` (`elementwise` if the op is), as `step` allows. Returns true if
/// any value changed.
pub(super) fn propagate_op(
    states: &mut [ValueState],
    rule: &OpShardingRule,
    elementwise: bool,
    operands: &[ValueId],
    result: ValueId,
    step: Step,
) -> bool {
    let sizes = |factors: &[usize]| -> Vec<usize> {
        factors.iter().map(|&f| rule.factors[f].size).collect()
    };
    let values: Vec<ValueId> = operands.iter().copied().chain([result]).collect();

    // Each factor's axes, chosen from every tensor that maps it.
    let mut chosen: Vec<Choice> = vec![Choice::default(); rule.factors.len()];
    {
        let mut candidates: Vec<Vec<Candidate>> =
            (0..rule.factors.len()).map(|_| Vec::new()).collect();
        for (tensor, (&v, mapping)) in values.iter().zip(rule.tensors()).enumerate() {
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
                            tensor,
                            origin: dim.origin,
                        });
                    }
                }
            }
        }
        for (f, factor) in rule.factors.iter().enumerate() {
            if factor.kind != FactorKind::NeedReplication {
                chosen[f] = choice(&mut candidates[f], step.strategy);
            }
        }
    }
    let order = claim_order(&chosen, elementwise);

    // Refine every tensor the direction allows, factor by factor in claim order.
    let mut changed = false;
    for (t, (&v, mapping)) in values.iter().zip(rule.tensors()).enumerate() {
        let is_result = t == operands.len();
        let allowed = match step.direction {
            Direction::Both => true,
            Direction::Backward => !is_result,
            Direction::Forward => is_result,
        };
        if !allowed {
            continue;
        }
        let state = &mut states[v.index()];
        for &f in &order {
            let Choice { axes, origin, .. } = &chosen[f];
            if axes.is_empty() {
                continue;
            }
            let Some((d, position)) = (mapping.dims.iter().enumerate())
                .find_map(|(d, fs)| Some((d, fs.iter().position(|&g| g == f)?)))
            else {
                continue;
            };
            if !refine_factor(state, d, &sizes(&mapping.dims[d]), position, axes) {
                continue;
            }
            changed = true;
            let dim = &mut state.dims[d];
            if dim.origin.is_none() {
                dim.origin = *origin;
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
            tensor: 0,
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

    fn chosen(axes: &[usize], source: Option<(usize, usize)>) -> Choice {
        Choice {
            axes: candidate(axes, 0).axes,
            origin: None,
            source,
        }
    }

    #[test]
    fn factors_claim_axes_by_source_size_devices_tensor_and_index() {
        // Factor 0 from a 32-element lhs, factor 1 from a 64-element rhs: 1 first.
        let cs = [
            chosen(&[0, 1], Some((32, 0))),
            chosen(&[0, 2], Some((64, 1))),
        ];
        assert_eq!(claim_order(&cs, false), [1, 0]);
        // Equal sources: on an elementwise op the factor on more devices first,
        // otherwise the earlier tensor's.
        let cs = [chosen(&[0], Some((64, 0))), chosen(&[1, 0], Some((64, 1)))];
        assert_eq!(claim_order(&cs, true), [1, 0]);
        assert_eq!(claim_order(&cs, false), [0, 1]);
        // Same source tensor: the smaller factor index; factors without axes last.
        let cs = [
            chosen(&[], None),
            chosen(&[0], Some((8, 1))),
            chosen(&[1], Some((8, 1))),
        ];
        assert_eq!(claim_order(&cs, false), [1, 2, 0]);
    }
}
