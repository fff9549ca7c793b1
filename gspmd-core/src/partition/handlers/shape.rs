//! Shape ops: broadcast, transpose, reshape.

use std::ops::Range;

use super::super::emit::Emitter;
use super::super::halo::{self, HaloPlan, Window};
use super::super::reshard::reshard;
use super::super::value::PValue;
use super::with_dims;
use crate::error::Result;
use crate::ir::{Node, Op, TensorType};
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
fn reshape_groups(from: &[usize], to: &[usize]) -> Vec<(Range<usize>, Range<usize>)> {
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

/// A group of a reshape whose split moves by halo exchange on the flattened group
/// (XLA's reshape with halo exchange): the target splits one result dim `out` of the
/// group over `axes` (`shards` shards), but the shards do not line up with the
/// operand's dims. The operand is split over the same axes on its dim `din` of the
/// group whose major dims hold as many elements as the result's dims before `out` (the
/// *outer* dims, which stay whole), so that each device's block of the dims from `din`
/// on, flattened (the local `flat` dim), is one contiguous run of `chunk_in` elements
/// from `i * chunk_in` in each outer lane; the result's block is the run of `chunk_out`
/// elements from `i * chunk_out`. Each device's run of the result is a window of the
/// flattened operand; the windows drift one way (`chunk_out - chunk_in` per shard), so
/// when each reaches at most one neighbour one collective shift of at most one block
/// moves the misaligned elements — never more than the `shards - 1` blocks a gather of
/// the dim would move, so it is always the cheaper choice.
struct FlatHalo {
    /// The operand dim split over `axes`.
    din: usize,
    axes: Vec<String>,
    /// The flattened group's dim in the intermediate (locally flattened) operand.
    flat: usize,
    plan: HaloPlan,
}

/// The [`FlatHalo`] of a group `(gi, go)` of a reshape `from -> to` whose result dims
/// `go` the target splits over `t[go]`, or `None` when the split is not on one result
/// dim, no operand dim starts where it does, or a window reaches past a neighbour.
/// `first` is the group's first dim once the dims of each such group from `din` on are
/// flattened.
fn flat_halo(
    mesh: &Mesh,
    (from, to): (&[usize], &[usize]),
    (gi, go): (Range<usize>, Range<usize>),
    t: &[Vec<String>],
    first: usize,
) -> Option<FlatHalo> {
    let out = go.clone().find(|&d| !t[d].is_empty())?;
    if go.clone().any(|d| d != out && !t[d].is_empty()) {
        return None;
    }
    let outer: usize = to[go.start..out].iter().product();
    let starts_there = |&d: &usize| from[gi.start..d].iter().product::<usize>() == outer;
    let din = (gi.clone()).filter(starts_there).find(|&d| from[d] > 1)?;
    let flat = first + (din - gi.start);
    let shards = mesh.axes_size(&t[out]);
    let inner_in: usize = from[din + 1..gi.end].iter().product();
    let inner_out: usize = to[out + 1..go.end].iter().product();
    let chunk_in = from[din].div_ceil(shards) * inner_in;
    let chunk_out = to[out].div_ceil(shards) * inner_out;
    let window = Window {
        dim: flat,
        step: chunk_out,
        offset: 0,
        len: chunk_out,
    };
    let plan = halo::plan(shards * chunk_in, shards, window)?;
    Some(FlatHalo {
        din,
        axes: t[out].clone(),
        flat,
        plan,
    })
}

/// `reshape`: local where each group of merged/split dims keeps every device's block
/// contiguous (the result's axes, spread over the operand's dims, fit evenly); a group
/// split on one result dim whose shards do not line up with the operand's moves the
/// misaligned elements by halo exchange on the flattened group ([`FlatHalo`]); other
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
    // The operand's dims as ranges, each halo group's as one (to be flattened), and
    // the halo groups.
    let mut flat_shape: Vec<Range<usize>> = Vec::new();
    let mut halos: Vec<FlatHalo> = Vec::new();
    for (gi, go) in reshape_groups(from, to) {
        let axes: Vec<String> = go.clone().flat_map(|d| t[d].clone()).collect();
        // Compared canonically: the target may name `model` in parts.
        let fits_out = spread(&axes, &to[go.clone()], em.mesh).is_some_and(|s| {
            (s.iter().zip(&t[go.clone()])).all(|(a, b)| *a == em.mesh.canonical_axes(b))
        });
        let first = flat_shape.len();
        if let (true, Some(spread_in)) = (fits_out, spread(&axes, &from[gi.clone()], em.mesh)) {
            for (k, d) in gi.clone().enumerate() {
                want_in[d] = spread_in[k].clone();
            }
            for d in go {
                got_out[d] = t[d].clone();
            }
            flat_shape.extend(gi.map(|d| d..d + 1));
            continue;
        }
        let groups = (gi.clone(), go.clone());
        if let Some(h) = flat_halo(em.mesh, (from, to), groups, &t, first) {
            want_in[h.din].clone_from(&h.axes);
            for d in go {
                got_out[d] = t[d].clone();
            }
            flat_shape.extend((gi.start..h.din).map(|d| d..d + 1));
            flat_shape.push(h.din..gi.end);
            halos.push(h);
            continue;
        }
        let split_in = gi.clone().flat_map(|d| &x.sharding.dims[d].axes);
        if axes.iter().chain(split_in).next().is_some() {
            em.warn(format!(
                "reshape {:?} -> {:?} gathers dims {gi:?} whole (their sharding does not split evenly into the result's)",
                from, to
            ));
        }
        flat_shape.extend(gi.map(|d| d..d + 1));
    }
    let mut x = reshard(em, x, &with_dims(want_in, target.unreduced.clone()))?;
    if !halos.is_empty() {
        x = flattened(em, x, &flat_shape, &halos)?;
    }
    let result = with_dims(got_out, target.unreduced.clone());
    let local = result.local_shape(em.mesh, to);
    let id = em.emit(Op::Reshape(local), &[x.id])?;
    Ok(PValue {
        id,
        global: node.ty.clone(),
        sharding: result,
    })
}

/// `x` with the dims of each range of `dims` merged into one (locally, each device's
/// block stays contiguous), then each of `halos` exchanged on its flattened dim: the
/// local block then holds, per halo group, the result's run of elements.
fn flattened(
    em: &mut Emitter,
    x: PValue,
    dims: &[Range<usize>],
    halos: &[FlatHalo],
) -> Result<PValue> {
    let local = em.shape(x.id);
    let merged = |sizes: &[usize], r: &Range<usize>| sizes[r.clone()].iter().product::<usize>();
    let flat_local: Vec<usize> = dims.iter().map(|r| merged(&local, r)).collect();
    let mut global: Vec<usize> = dims.iter().map(|r| merged(&x.global.shape, r)).collect();
    let mut axes: Vec<Vec<String>> = dims
        .iter()
        .map(|r| x.sharding.dims[r.start].axes.clone())
        .collect();
    for h in halos {
        // The flattened dim as the blocks tile it: shards times the local run.
        axes[h.flat].clone_from(&h.axes);
        global[h.flat] = em.mesh.axes_size(&h.axes) * flat_local[h.flat];
    }
    let id = em.emit(Op::Reshape(flat_local), &[x.id])?;
    let mut v = PValue {
        id,
        global: TensorType::new(global, x.global.dtype),
        sharding: with_dims(axes, x.sharding.unreduced.clone()),
    };
    for h in halos {
        v.id = halo::exchange(em, &v, &h.plan, None)?;
    }
    Ok(v)
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
