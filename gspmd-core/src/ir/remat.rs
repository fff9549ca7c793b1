//! [`Remat`]: the rematerialisation policy of one `scan`, what its backward pass reads
//! from its forward pass instead of recomputing it (JAX's `jax.checkpoint` policies,
//! `jax.checkpoint_policies.*`: `nothing_saveable`, `dots_saveable`,
//! `everything_saveable`, and `save_only_these_names` of the values named with
//! `checkpoint_name`, here [`Tensor::named`](super::Tensor::named)).
//!
//! The backward scan of a differentiated `scan` always gets the carried values each
//! iteration started from (stacked by the forward scan). Under
//! [`Remat::NothingSaveable`] its body recomputes the whole forward body from them;
//! under the others the forward scan also stacks the values the policy saves (new
//! outputs `y`), and the backward body reads each one's slice where it would have
//! recomputed it, so the recomputation that only fed them is dead code. A saved value
//! costs `length` slices of memory from the forward scan to the backward one and saves
//! its recomputation; the gradients are the same values whatever the policy.

use super::op::Op;
use super::program::Node;

/// What the backward pass of a `scan` keeps from its forward pass (see the module docs).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
#[non_exhaustive]
pub enum Remat {
    /// Keep nothing but the carried values; recompute every other forward value
    /// (`nothing_saveable`: JAX's `scan` under `jax.checkpoint`). The default: a
    /// loop's memory is its carried values per iteration.
    #[default]
    NothingSaveable,
    /// Keep the results of matrix products (`dot_general`, `convolution`) and recompute
    /// the rest from them (`dots_saveable`, alias `checkpoint_dots`): the backward pass
    /// redoes only the cheap elementwise work.
    DotsSaveable,
    /// Keep every forward value the backward pass reads (`everything_saveable`, JAX's
    /// `scan` without `jax.checkpoint`): nothing is recomputed.
    EverythingSaveable,
    /// Keep the values named one of these names ([`Tensor::named`](super::Tensor::named),
    /// JAX's `checkpoint_name`) and recompute the rest (`save_only_these_names`).
    SaveOnlyTheseNames(&'static [&'static str]),
}

impl Remat {
    /// Whether the policy keeps the value `node` computes (one depending on the body's
    /// parameters; constants of the body are recomputed under every policy).
    pub fn saves(self, node: &Node) -> bool {
        let op = &node.op;
        match self {
            Remat::NothingSaveable => false,
            Remat::DotsSaveable => matches!(op, Op::DotGeneral(_) | Op::Convolution(_)),
            Remat::EverythingSaveable => !matches!(op, Op::Parameter { .. }),
            Remat::SaveOnlyTheseNames(names) => {
                !matches!(op, Op::Parameter { .. })
                    && (node.name.as_deref()).is_some_and(|n| names.contains(&n))
            }
        }
    }

    /// The policy's name in JAX (`jax.checkpoint_policies.<name>`).
    pub fn name(self) -> &'static str {
        match self {
            Remat::NothingSaveable => "nothing_saveable",
            Remat::DotsSaveable => "dots_saveable",
            Remat::EverythingSaveable => "everything_saveable",
            Remat::SaveOnlyTheseNames(_) => "save_only_these_names",
        }
    }
}

impl std::fmt::Display for Remat {
    /// The name, and the names a `save_only_these_names` keeps: `save_only_these_names(a, b)`.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())?;
        if let Remat::SaveOnlyTheseNames(names) = self {
            write!(f, "({})", names.join(", "))?;
        }
        Ok(())
    }
}
