//! [`OpShardingRule`]: how an op's operand and result dims decompose into shared
//! *factors* (Shardy's `OpShardingRuleAttr`).
//!
//! A factor is one logical loop of the op: the `i`, `j`, `k` of `([i, k], [k, j]) ->
//! ([i, j])`. Every dim of every operand and of the result is a list of factors, major
//! to minor, whose sizes multiply to the dim's size: one factor for most dims, several
//! for a dim a reshape splits or merges (a *compound* dim), none for a size-1 dim that
//! corresponds to nothing in the other tensors. Propagation moves mesh axes along
//! factors and so needs to know nothing else about the op.

use std::fmt;

/// What sharding a factor means for the op, i.e. what the partitioner must do when the
/// factor is split over mesh axes.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum FactorKind {
    /// Each device computes its slice of the result from the same slice of the
    /// operands: no communication.
    PassThrough,
    /// The op sums (or maxes, ...) over the factor: it appears in operands only, and
    /// sharding it leaves a partial result to be all-reduced or reduce-scattered.
    Reduction,
    /// The factor cannot be sharded without changing the result; propagation assigns
    /// it no axes.
    NeedReplication,
    /// The factor can be sharded, but result elements come from operand elements at
    /// other positions (slice, pad, concatenate): the partitioner exchanges halos or
    /// permutes data.
    Permutation,
}

/// One factor of a rule: its size and kind.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Factor {
    /// Number of indices the factor ranges over.
    pub size: usize,
    /// How sharding it affects the op.
    pub kind: FactorKind,
}

/// How one tensor (an operand or the result) maps onto the factors of its op.
#[derive(Debug, Clone, PartialEq, Eq, Hash, Default)]
pub struct TensorFactors {
    /// For each dim of the tensor, the factor indices it is made of, major to minor.
    /// The product of their sizes is the dim's size; empty for a size-1 dim that maps to
    /// no factor.
    pub dims: Vec<Vec<usize>>,
}

/// The sharding rule of one op: its factors and how each operand and the result map
/// onto them.
///
/// Invariants (established by [`crate::propagation::sharding_rule`]): every factor index
/// is below `factors.len()`; a factor appears at most once per tensor; the factor sizes
/// of a dim multiply to the dim's size; [`FactorKind::Reduction`] factors do not appear
/// in the result.
#[derive(Debug, Clone, PartialEq, Eq, Hash, Default)]
pub struct OpShardingRule {
    /// All factors of the op, indexed by factor number.
    pub factors: Vec<Factor>,
    /// One mapping per operand, in operand order.
    pub operands: Vec<TensorFactors>,
    /// The result's mapping.
    pub result: TensorFactors,
}

impl OpShardingRule {
    /// The operand mappings followed by the result's: the order in which propagation
    /// numbers an op's tensors.
    pub fn tensors(&self) -> impl Iterator<Item = &TensorFactors> {
        self.operands.iter().chain(std::iter::once(&self.result))
    }

    /// Adds a factor and returns its index.
    pub fn add_factor(&mut self, size: usize, kind: FactorKind) -> usize {
        self.factors.push(Factor { size, kind });
        self.factors.len() - 1
    }
}

/// Letter naming factor `index` in printed rules: `i`, `j`, ..., `z`, then `z1`, `z2`, ...
fn factor_name(index: usize) -> String {
    const LETTERS: &[u8] = b"ijklmnopqrstuvwxyz";
    match LETTERS.get(index) {
        Some(&c) => char::from(c).to_string(),
        None => format!("z{}", index + 1 - LETTERS.len()),
    }
}

impl fmt::Display for TensorFactors {
    /// `[ij, k, 1]`: one entry per dim, a compound dim as adjacent letters, `1` for a dim
    /// that maps to no factor.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let dims: Vec<String> = self
            .dims
            .iter()
            .map(|fs| match fs.as_slice() {
                [] => "1".to_string(),
                fs => fs.iter().map(|&i| factor_name(i)).collect(),
            })
            .collect();
        write!(f, "[{}]", dims.join(", "))
    }
}

impl fmt::Display for OpShardingRule {
    /// Shardy's notation: `([i, k], [k, j])->([i, j]) {i=8, j=32, k=16} reduction={k}`,
    /// then `need_replication={..}` and `permutation={..}` when not empty.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let operands: Vec<String> = self.operands.iter().map(ToString::to_string).collect();
        let sizes: Vec<String> = (self.factors.iter().enumerate())
            .map(|(i, factor)| format!("{}={}", factor_name(i), factor.size))
            .collect();
        write!(
            f,
            "({})->({}) {{{}}}",
            operands.join(", "),
            self.result,
            sizes.join(", ")
        )?;
        for (kind, label) in [
            (FactorKind::Reduction, "reduction"),
            (FactorKind::NeedReplication, "need_replication"),
            (FactorKind::Permutation, "permutation"),
        ] {
            let names: Vec<String> = (self.factors.iter().enumerate())
                .filter(|(_, factor)| factor.kind == kind)
                .map(|(i, _)| factor_name(i))
                .collect();
            if !names.is_empty() {
                write!(f, " {label}={{{}}}", names.join(", "))?;
            }
        }
        Ok(())
    }
}
