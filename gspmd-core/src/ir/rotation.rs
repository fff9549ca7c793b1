//! The rotation pattern: `concatenate(a[k:], a[:k])`, what `Tensor::roll` builds. The
//! partitioner moves only its boundary pieces (`partition::fusion`), and autodiff
//! sends the cotangent back by the inverse rotation, which partitions the same way.

use super::op::Op;
use super::program::{Node, Program};
use crate::types::ValueId;

/// `concatenate(a[k:], a[:k])` along `dim`: `a` rotated by `k` (jnp.roll by `-k`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Rotation {
    /// The rotated value `a`.
    pub source: ValueId,
    /// The dim it rotates along.
    pub dim: usize,
    /// Result element `p` is `a`'s element `(p + k) mod size`; `0 < k < size`.
    pub k: usize,
}

/// The rotation `node` is, if it is a `concatenate` of two stride-1 slices of one value
/// that take `[k, size)` and `[0, k)` of the concatenated dim and all of every other dim.
pub fn rotation(program: &Program, node: &Node) -> Option<Rotation> {
    let Op::Concatenate(dim) = node.op else {
        return None;
    };
    let [high, low] = node.operands[..] else {
        return None;
    };
    // (source, start, limit, size) of a slice along `dim` only.
    let along_dim = |v: ValueId| {
        let slice = program.node(v);
        let Op::Slice {
            start,
            limit,
            stride,
        } = &slice.op
        else {
            return None;
        };
        let source = *slice.operands.first()?;
        let shape = &program.ty(source).shape;
        let whole = |d: usize| start[d] == 0 && limit[d] == shape[d];
        let other_dims_whole = (0..shape.len()).all(|d| d == dim || whole(d));
        (other_dims_whole && stride.iter().all(|&s| s == 1))
            .then(|| (source, start[dim], limit[dim], shape[dim]))
    };
    let (a, k, end, size) = along_dim(high)?;
    let (b, zero, k_low, _) = along_dim(low)?;
    let rotates = a == b && zero == 0 && k_low == k && end == size && 0 < k && k < size;
    rotates.then_some(Rotation { source: a, dim, k })
}
