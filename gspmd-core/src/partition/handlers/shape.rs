//! Shape ops: broadcast, transpose, reshape.

use super::super::emit::Emitter;
use super::super::reshard::reshard;
use super::super::value::PValue;
use super::with_dims;
use crate::error::Result;
use crate::ir::{Node, Op};
use crate::sharding::{Mesh, Sharding};

fn axes_of(s: &Sharding) -> Vec<Vec<String>> {
    s.dims.iter().map(|d| d.axes.clone()).collect()
}

/// `broadcast_in_dim`: the operand takes the result's axes on the dims it maps to (a
/// size-1 operand dim that expands stays whole), then broadcasts locally.
pub(super) fn broadcast(
    em: &mut Emitter,
    node: &Node,
    dims: &[usize],
    x: &PValue,
    target: &Sharding,
) -> Result<PValue> {
    let t = axes_of(target);
    let want: Vec<Vec<String>> = dims
        .iter()
        .enumerate()
        .map(|(i, &d)| {
            if x.global.shape[i] == node.ty.shape[d] {
                t[d].clone()
            } else {
                Vec::new()
            }
        })
        .collect();
    let x = reshard(em, x, &with_dims(want, target.unreduced.clone()))?;
    let result = target.clone();
    let local = result.local_shape(em.mesh, &node.ty.shape);
    let id = em.emit(
        Op::Broadcast {
            shape: local,
            dims: dims.to_vec(),
        },
        &[x.id],
    )?;
    Ok(PValue {
        id,
        global: node.ty.clone(),
        sharding: result,
    })
}

/// `transpose`: the operand takes the result's axes, permuted back; local transpose.
pub(super) fn transpose(
    em: &mut Emitter,
    perm: &[usize],
    x: &PValue,
    target: &Sharding,
) -> Result<PValue> {
    let t = axes_of(target);
    let mut want = vec![Vec::new(); perm.len()];
    for (i, &p) in perm.iter().enumerate() {
        want[p] = t[i].clone();
    }
    let x = reshard(em, x, &with_dims(want, target.unreduced.clone()))?;
    let id = em.emit(Op::Transpose(perm.to_vec()), &[x.id])?;
    let global = crate::ir::TensorType::new(
        perm.iter().map(|&p| x.global.shape[p]).collect::<Vec<_>>(),
        x.global.dtype,
    );
    Ok(PValue {
        id,
        global,
        sharding: target.clone(),
    })
}

/// Groups of dims that a reshape maps onto each other: `(operand dims, result dims)`
/// ranges with equal element counts, as small as possible.
fn reshape_groups(
    from: &[usize],
    to: &[usize],
) -> Vec<(std::ops::Range<usize>, std::ops::Range<usize>)> {
    let (mut i, mut j, mut groups) = (0, 0, Vec::new());
    while i < from.len() || j < to.len() {
        let (i0, j0) = (i, j);
        let (mut a, mut b) = (1usize, 1usize);
        loop {
            if a <= b && i < from.len() {
                a *= from[i];
                i += 1;
            } else if j < to.len() {
                b *= to[j];
                j += 1;
            } else if i < from.len() {
                a *= from[i];
                i += 1;
            } else {
                break;
            }
            let more_ones = |s: &[usize], k: usize| k < s.len() && s[k] == 1;
            if a == b && !more_ones(from, i) && !more_ones(to, j) {
                break;
            }
        }
        groups.push((i0..i, j0..j));
    }
    groups
}

/// Spreads `axes` over the dims `shape` (major first) so that each device's block is one
/// contiguous run of the flattened dims: every dim but the last split one is split
/// completely, dims after it not at all, and every split is even. An axis spanning the
/// rest of a dim, and a multiple of it, is cut in [sub-axes](Mesh::sub_axis): its major
/// part ends the dim, its minor part goes on to the next (`model`=4 over `[2, 4]` is
/// `model:(1)2`, `model:(2)2`). Each dim's axes come in canonical form
/// ([`Mesh::canonical_axes`]). `None` if impossible.
fn spread(axes: &[String], shape: &[usize], mesh: &Mesh) -> Option<Vec<Vec<String>>> {
    let mut out = vec![Vec::new(); shape.len()];
    let mut d = 0;
    let mut left = shape.first().copied().unwrap_or(1);
    for a in axes {
        let mut part = mesh.axis_part(a)?;
        loop {
            while left == 1 && d + 1 < shape.len() {
                d += 1;
                left = shape[d];
            }
            if left.is_multiple_of(part.size) {
                left /= part.size;
                out.get_mut(d)?.push(mesh.part_name(part));
                break;
            }
            if left == 1 || d + 1 == shape.len() || !part.size.is_multiple_of(left) {
                return None;
            }
            let (major, minor) = part.split(left);
            out[d].push(mesh.part_name(major));
            (part, left) = (minor, 1);
        }
    }
    Some(out.iter().map(|dim| mesh.canonical_axes(dim)).collect())
}

/// `reshape`: local where each group of merged/split dims keeps every device's block
/// contiguous (the result's axes, spread over the operand's dims, fit evenly); other
/// groups are gathered whole, reshaped, and sliced to the target.
pub(super) fn reshape(
    em: &mut Emitter,
    node: &Node,
    x: &PValue,
    target: &Sharding,
) -> Result<PValue> {
    let (from, to) = (&x.global.shape, &node.ty.shape);
    let t = axes_of(target);
    let mut want_in = vec![Vec::new(); from.len()];
    let mut got_out = vec![Vec::new(); to.len()];
    for (gi, go) in reshape_groups(from, to) {
        let axes: Vec<String> = go.clone().flat_map(|d| t[d].clone()).collect();
        // Compared canonically: the target may name `model` in parts.
        let fits_out = spread(&axes, &to[go.clone()], em.mesh).is_some_and(|s| {
            (s.iter().zip(&t[go.clone()])).all(|(a, b)| *a == em.mesh.canonical_axes(b))
        });
        if let (true, Some(spread_in)) = (fits_out, spread(&axes, &from[gi.clone()], em.mesh)) {
            for (k, d) in gi.enumerate() {
                want_in[d] = spread_in[k].clone();
            }
            for d in go {
                got_out[d] = t[d].clone();
            }
        } else if axes
            .iter()
            .chain(gi.clone().flat_map(|d| &x.sharding.dims[d].axes))
            .next()
            .is_some()
        {
            em.warn(format!(
                "reshape {:?} -> {:?} gathers dims {gi:?} whole (their sharding does not split evenly into the result's)",
                from, to
            ));
        }
    }
    let x = reshard(em, x, &with_dims(want_in, target.unreduced.clone()))?;
    let result = with_dims(got_out, target.unreduced.clone());
    let local = result.local_shape(em.mesh, to);
    let id = em.emit(Op::Reshape(local), &[x.id])?;
    Ok(PValue {
        id,
        global: node.ty.clone(),
        sharding: result,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn groups_split_and_merge() {
        assert_eq!(
            reshape_groups(&[8, 16], &[2, 4, 16]),
            vec![(0..1, 0..2), (1..2, 2..3)]
        );
        assert_eq!(
            reshape_groups(&[2, 4, 16], &[8, 16]),
            vec![(0..2, 0..1), (2..3, 1..2)]
        );
        assert_eq!(reshape_groups(&[6, 4], &[4, 6]), vec![(0..2, 0..2)]);
        assert_eq!(
            reshape_groups(&[1, 8], &[8]),
            vec![(0..1, 0..0), (1..2, 0..1)]
        );
        assert_eq!(reshape_groups(&[], &[1, 1]), vec![(0..0, 0..2)]);
    }

    #[test]
    fn spread_fills_major_dims_first() {
        let mesh = Mesh::new([("data", 2), ("model", 4)]).unwrap();
        let ax = |v: &[&str]| v.iter().map(|s| s.to_string()).collect::<Vec<_>>();
        assert_eq!(
            spread(&ax(&["data", "model"]), &[2, 4], &mesh),
            Some(vec![ax(&["data"]), ax(&["model"])])
        );
        assert_eq!(
            spread(&ax(&["data"]), &[2, 4], &mesh),
            Some(vec![ax(&["data"]), vec![]])
        );
        assert_eq!(
            spread(&ax(&["model"]), &[2, 4], &mesh),
            Some(vec![ax(&["model:(1)2"]), ax(&["model:(2)2"])])
        );
        assert_eq!(
            spread(&ax(&["model:(1)2", "model:(2)2"]), &[8], &mesh),
            Some(vec![ax(&["model"])])
        );
        assert_eq!(spread(&ax(&["model"]), &[2, 3], &mesh), None);
        assert_eq!(spread(&ax(&["model"]), &[3, 4], &mesh), None);
        assert_eq!(
            spread(&ax(&["data"]), &[8, 4], &mesh),
            Some(vec![ax(&["data"]), vec![]])
        );
    }
}
