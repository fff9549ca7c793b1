//! Patterns over several global nodes that the partitioner handles as one (GSPMD
//! section 4.6): a node whose operands come from such a pattern is partitioned from the
//! pattern's inputs, and a producer that no partitioned node reads any more is not
//! partitioned at all (so it emits no collective).
//!
//! - *rotation*: `concatenate(a[k:], a[:k])` (what `Tensor::roll` builds) is `a` rotated:
//!   on an evenly split dim only the boundary pieces move, with wrapping shifts;
//! - *slice of pad*: `slice(pad(x, v))` with stride 1 and no interior padding is one pad
//!   of `x` (low and high adjusted, negative to crop), so a halo exchange reads `x`'s
//!   neighbours directly (a 3x3 SAME convolution written as a pad and nine slices
//!   exchanges one row each way, not the padded array's).

pub(crate) use crate::ir::Rotation;
use crate::ir::{Node, Op, Program, ValueId, rotation};

/// How a node is partitioned when it ends a pattern.
#[derive(Debug, Clone, PartialEq)]
pub(crate) enum Fusion {
    /// The node is a rotation.
    Rotation(Rotation),
    /// The node is a slice of a pad: partitioned as `node`, one pad of the pad's
    /// operands with the slice's type and location.
    SliceOfPad {
        /// The pad the slice reads.
        pad: ValueId,
        /// The equivalent pad of the pad's operand and padding value.
        node: Box<Node>,
    },
}

impl Fusion {
    /// The global values the fused node reads.
    pub fn inputs(&self) -> Vec<ValueId> {
        match self {
            Fusion::Rotation(r) => vec![r.source],
            Fusion::SliceOfPad { node, .. } => node.operands.clone(),
        }
    }

    /// The global values the fused node no longer reads through.
    fn absorbs(&self, node: &Node) -> Vec<ValueId> {
        match self {
            Fusion::Rotation(_) => node.operands.clone(),
            Fusion::SliceOfPad { pad, .. } => vec![*pad],
        }
    }
}

/// Per value, the pattern it ends (if any).
pub(crate) fn fusions(program: &Program) -> Vec<Option<Fusion>> {
    (program.nodes.iter())
        .map(|n| {
            rotation(program, n)
                .map(Fusion::Rotation)
                .or_else(|| slice_of_pad(program, n))
        })
        .collect()
}

/// Per value, whether no partitioned node reads it: it is absorbed by a pattern and
/// neither a parameter, an output, nor read by any other partitioned node.
pub(crate) fn skipped(program: &Program, fusions: &[Option<Fusion>]) -> Vec<bool> {
    let n = program.nodes.len();
    let mut read = vec![false; n];
    let mut absorbed = vec![false; n];
    for &v in program.outputs.iter().chain(&program.params) {
        read[v.index()] = true;
    }
    let mut skip = vec![false; n];
    // Users come after their operands: one backward sweep decides every value.
    for (i, node) in program.nodes.iter().enumerate().rev() {
        skip[i] = absorbed[i] && !read[i];
        if skip[i] {
            continue;
        }
        match &fusions[i] {
            Some(f) => {
                for v in f.inputs() {
                    read[v.index()] = true;
                }
                for v in f.absorbs(node) {
                    absorbed[v.index()] = true;
                }
            }
            None => {
                for v in &node.operands {
                    read[v.index()] = true;
                }
            }
        }
    }
    skip
}

/// `node` as one pad, if it is a stride-1 slice of a pad without interior padding: the
/// slice keeps `[start, limit)` of `low + n + high` elements, that is the pad with
/// `low - start` and `high - (low + n + high - limit)`.
fn slice_of_pad(program: &Program, node: &Node) -> Option<Fusion> {
    let Op::Slice {
        start,
        limit,
        stride,
    } = &node.op
    else {
        return None;
    };
    let pad = *node.operands.first()?;
    let pad_node = program.node(pad);
    let Op::Pad {
        low,
        high,
        interior,
    } = &pad_node.op
    else {
        return None;
    };
    if stride.iter().any(|&s| s != 1) || interior.iter().any(|&i| i != 0) {
        return None;
    }
    let padded = &pad_node.ty.shape;
    let rank = padded.len();
    let merged = Op::Pad {
        low: (0..rank).map(|d| low[d] - start[d] as i64).collect(),
        high: (0..rank)
            .map(|d| high[d] - (padded[d] - limit[d]) as i64)
            .collect(),
        interior: interior.clone(),
    };
    Some(Fusion::SliceOfPad {
        pad,
        node: Box::new(Node {
            op: merged,
            operands: pad_node.operands.clone(),
            ..node.clone()
        }),
    })
}
