//! Projecting a tensor dim's sharding onto the factors of the dim, and refining the dim
//! through one of its factors.
//!
//! A dim made of factors `[f0, f1]` (major to minor) and split over axes `[a0, a1, ...]`
//! hands its axes to `f0` first, while they cut `f0` evenly, then to `f1`: a minor
//! factor can only be split once the major one is split completely, otherwise the
//! dim's shards would not be contiguous. An axis larger than what is left of a factor,
//! and a multiple of it, is cut in [sub-axes](crate::sharding::Mesh::sub_axis): its
//! major part completes the factor and its minor part goes on to the next one (`[8]`
//! split over `model=4` as factors `[2, 4]` gives `model:(1)2` to the 2 and
//! `model:(2)2` to the 4), as Shardy does. The last factor of a dim also takes axes
//! that cut it unevenly (its shards are padded). Axes that fit no factor *overflow*:
//! they stay on the dim but propagate nowhere.

use super::state::{Axis, ValueState};
use crate::sharding::merge_adjacent;

/// A dim's axes split over the dim's factors.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) struct DimProjection {
    /// For each factor of the dim (in the dim's order), the (sub-)axes it holds, major
    /// to minor; read in order they cut the dim as the dim's axes do.
    pub axes: Vec<Vec<Axis>>,
    /// For each factor, how many pieces each of its shards could still be cut into.
    pub capacity: Vec<usize>,
    /// True if some of the dim's axes fit no factor.
    pub overflow: bool,
}

impl DimProjection {
    /// The position (in the dim's factor list) of the one factor that may receive more
    /// axes: the first one not completely split, provided no axis overflowed.
    pub fn extensible(&self) -> Option<usize> {
        if self.overflow {
            return None;
        }
        self.capacity.iter().position(|&c| c > 1)
    }
}

/// True if a factor whose shards can still be cut `capacity` ways accepts an axis of
/// size `axis`: it must cut the factor evenly unless the factor is the dim's last.
fn accepts(capacity: usize, axis: usize, last: bool) -> bool {
    capacity > 1 && (capacity.is_multiple_of(axis) || last)
}

/// Splits `axes` (of a dim of size `dim_size` made of factors of sizes `factors`) over
/// the factors, major first, cutting an axis in sub-axes where it spans the end of a
/// factor that is not the last. A dim of one factor has the dim's own size as capacity
/// (a permutation factor joins dims of different sizes); a compound dim's factors have
/// the factors' sizes.
pub(super) fn project_dim(axes: &[Axis], dim_size: usize, factors: &[usize]) -> DimProjection {
    let mut capacity: Vec<usize> = match factors {
        [_] => vec![dim_size],
        fs => fs.to_vec(),
    };
    let mut parts = vec![Vec::new(); factors.len()];
    let mut k = 0;
    let mut rest = axes.iter().copied();
    // The axis being placed: the next of `axes`, or the minor part of a cut one.
    let mut pending = rest.next();
    'axes: while let Some(a) = pending {
        while k < factors.len() {
            let last = k + 1 == factors.len();
            if accepts(capacity[k], a.size, last) {
                capacity[k] = capacity[k].div_ceil(a.size);
                parts[k].push(a);
                pending = rest.next();
                continue 'axes;
            }
            if !last && capacity[k] > 1 && a.size.is_multiple_of(capacity[k]) {
                let (major, minor) = a.split(capacity[k]);
                parts[k].push(major);
                capacity[k] = 1;
                pending = Some(minor);
                k += 1;
                continue 'axes;
            }
            if capacity[k] > 1 || last {
                break 'axes;
            }
            k += 1;
        }
        break;
    }
    DimProjection {
        axes: parts,
        capacity,
        overflow: pending.is_some(),
    }
}

/// Appends to `dim` of `value` the axes of `target` that the factor at `position` in
/// the dim's factor list (of sizes `factors`) lacks, as far as the factor can take
/// them: its current axes must be a prefix of `target`, it must be the dim's extensible
/// factor, each axis must overlap no axis the value uses and cut the factor as
/// [`project_dim`] requires. Stops at the first axis that does not fit. The dim's axes
/// stay in canonical form (adjacent parts of one axis merged). Returns true if the dim
/// changed.
pub(super) fn refine_factor(
    value: &mut ValueState,
    dim: usize,
    factors: &[usize],
    position: usize,
    target: &[Axis],
) -> bool {
    let Some(state) = value.dims.get(dim) else {
        return false;
    };
    if state.closed {
        return false;
    }
    let projection = project_dim(&state.axes, value.shape[dim], factors);
    if projection.extensible() != Some(position) {
        return false;
    }
    let current = &projection.axes[position];
    if target.len() <= current.len() || !target.starts_with(current) {
        return false;
    }
    let last = position + 1 == factors.len();
    let mut capacity = projection.capacity[position];
    let mut added = Vec::new();
    for &a in &target[current.len()..] {
        if value.uses(a) || !accepts(capacity, a.size, last) {
            break;
        }
        capacity = capacity.div_ceil(a.size);
        added.push(a);
    }
    if added.is_empty() {
        return false;
    }
    let mut axes = projection.axes.concat();
    axes.extend(added);
    value.dims[dim].axes = merge_adjacent(&axes);
    true
}

#[cfg(test)]
mod tests {
    use super::*;

    // Mesh axes: 0 of size 2, 1 of size 4, 2 of size 2.
    const AXES: [usize; 3] = [2, 4, 2];

    fn project(axes: &[usize], dim_size: usize, factor_sizes: &[usize]) -> DimProjection {
        let axes: Vec<Axis> = axes.iter().map(|&a| whole(a)).collect();
        project_dim(&axes, dim_size, factor_sizes)
    }

    fn whole(a: usize) -> Axis {
        Axis::whole(a, AXES[a])
    }

    fn part(a: usize, pre: usize, size: usize) -> Axis {
        Axis { axis: a, pre, size }
    }

    #[test]
    fn compound_dim_fills_the_major_factor_first() {
        // 8 = 2 x 4 split over (axis0=2, axis1=4): one axis per factor.
        let p = project(&[0, 1], 8, &[2, 4]);
        assert_eq!(p.axes, vec![vec![whole(0)], vec![whole(1)]]);
        assert_eq!(p.capacity, vec![1, 1]);
        assert!(!p.overflow);
        assert_eq!(p.extensible(), None);
    }

    #[test]
    fn an_axis_spanning_a_major_factor_is_cut_in_sub_axes() {
        // 8 = 2 x 4 split over axis1 (size 4): its major digit cuts the factor of 2,
        // its minor digit the factor of 4 (which can take 2 more).
        let p = project(&[1], 8, &[2, 4]);
        assert_eq!(p.axes, vec![vec![part(1, 1, 2)], vec![part(1, 2, 2)]]);
        assert_eq!(p.capacity, vec![1, 2]);
        assert_eq!(p.extensible(), Some(1));
        // 8 = 2 x 2 x 2 over axis1: one digit per factor... of which there are only
        // two: the third factor is not reached.
        let p = project(&[1], 8, &[2, 2, 2]);
        assert_eq!(
            p.axes,
            vec![vec![part(1, 1, 2)], vec![part(1, 2, 2)], vec![]]
        );
        assert_eq!(p.extensible(), Some(2));
    }

    #[test]
    fn an_axis_that_neither_divides_nor_spans_a_factor_overflows() {
        // 12 = 3 x 4 split over axis1 (size 4): 4 neither divides 3 nor is a multiple.
        let p = project(&[1], 12, &[3, 4]);
        assert_eq!(p.axes, vec![vec![], vec![]]);
        assert!(p.overflow);
        assert_eq!(p.extensible(), None);
    }

    #[test]
    fn the_last_factor_takes_uneven_axes() {
        // A dim of 6 split 4 ways: shards of 2, padded.
        let p = project(&[1], 6, &[6]);
        assert_eq!(p.axes, vec![vec![whole(1)]]);
        assert_eq!(p.capacity, vec![2]);
        assert_eq!(p.extensible(), Some(0));
    }

    #[test]
    fn a_partly_split_major_factor_is_the_one_to_extend() {
        // 8 = 4 x 2 split over axis0 (2): factor 0 can take one more axis of 2.
        let p = project(&[0], 8, &[4, 2]);
        assert_eq!(p.axes, vec![vec![whole(0)], vec![]]);
        assert_eq!(p.extensible(), Some(0));
    }
}
