//! Projecting a tensor dim's sharding onto the factors of the dim, and refining the dim
//! through one of its factors.
//!
//! A dim made of factors `[f0, f1]` (major to minor) and split over axes `[a0, a1, ...]`
//! hands its axes to `f0` first, while they cut `f0` evenly, then to `f1`: a minor
//! factor can only be split once the major one is split completely, otherwise the
//! dim's shards would not be contiguous. The last factor of a dim also takes axes that
//! cut it unevenly (its shards are padded). Axes that fit no factor *overflow*: they
//! stay on the dim but propagate nowhere.

use std::ops::Range;

use super::state::{Axis, ValueState};

/// Sizes the projection needs: of each factor of the op and of each mesh axis.
#[derive(Debug, Clone, Copy)]
pub(super) struct Sizes<'a> {
    /// Size of each factor of the op's rule.
    pub factors: &'a [usize],
    /// Size of each mesh axis.
    pub axes: &'a [usize],
}

/// A dim's axes split over the dim's factors.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) struct DimProjection {
    /// For each factor of the dim (in the dim's order), the range of the dim's axes it
    /// holds.
    pub ranges: Vec<Range<usize>>,
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

/// Splits `axes` (of a dim of size `dim_size` made of `factors`) over the factors, major
/// first. A dim of one factor has the dim's own size as capacity (a permutation factor
/// joins dims of different sizes); a compound dim's factors have the factors' sizes.
pub(super) fn project_dim(
    axes: &[Axis],
    dim_size: usize,
    factors: &[usize],
    sizes: Sizes<'_>,
) -> DimProjection {
    let mut capacity: Vec<usize> = match factors {
        [_] => vec![dim_size],
        fs => fs.iter().map(|&f| sizes.factors[f]).collect(),
    };
    let mut ranges = vec![0..0; factors.len()];
    let mut k = 0;
    let mut assigned = 0;
    'axes: for &a in axes {
        let size = sizes.axes[a];
        while k < factors.len() {
            let last = k + 1 == factors.len();
            if accepts(capacity[k], size, last) {
                capacity[k] = capacity[k].div_ceil(size);
                ranges[k].end = assigned + 1;
                assigned += 1;
                continue 'axes;
            }
            if capacity[k] > 1 || last {
                break;
            }
            k += 1;
            ranges[k] = assigned..assigned;
        }
        break;
    }
    // Factors not reached hold no axes: empty ranges after the assigned ones.
    for range in ranges.iter_mut().skip(k + 1) {
        *range = assigned..assigned;
    }
    DimProjection {
        ranges,
        capacity,
        overflow: assigned < axes.len(),
    }
}

/// Appends to `dim` of `value` the axes of `target` that the factor at `position` in
/// the dim's factor list lacks, as far as the factor can take them: its current axes
/// must be a prefix of `target`, it must be the dim's extensible factor, each axis must
/// be unused by the value and cut the factor as [`project_dim`] requires. Stops at the
/// first axis that does not fit. Returns true if the dim changed.
pub(super) fn refine_factor(
    value: &mut ValueState,
    dim: usize,
    factors: &[usize],
    position: usize,
    target: &[Axis],
    sizes: Sizes<'_>,
) -> bool {
    let Some(state) = value.dims.get(dim) else {
        return false;
    };
    if state.closed {
        return false;
    }
    let projection = project_dim(&state.axes, value.shape[dim], factors, sizes);
    if projection.extensible() != Some(position) {
        return false;
    }
    let current = &state.axes[projection.ranges[position].clone()];
    if target.len() <= current.len() || !target.starts_with(current) {
        return false;
    }
    let last = position + 1 == factors.len();
    let mut capacity = projection.capacity[position];
    let mut added = Vec::new();
    for &a in &target[current.len()..] {
        let size = sizes.axes[a];
        if value.uses(a) || !accepts(capacity, size, last) {
            break;
        }
        capacity = capacity.div_ceil(size);
        added.push(a);
    }
    if added.is_empty() {
        return false;
    }
    value.dims[dim].axes.extend(added);
    true
}

#[cfg(test)]
mod tests {
    use super::*;

    // Mesh axes: 0 of size 2, 1 of size 4, 2 of size 2.
    const AXES: [usize; 3] = [2, 4, 2];

    fn project(axes: &[Axis], dim_size: usize, factor_sizes: &[usize]) -> DimProjection {
        let factors: Vec<usize> = (0..factor_sizes.len()).collect();
        let sizes = Sizes {
            factors: factor_sizes,
            axes: &AXES,
        };
        project_dim(axes, dim_size, &factors, sizes)
    }

    #[test]
    fn compound_dim_fills_the_major_factor_first() {
        // 8 = 2 x 4 split over (axis0=2, axis1=4): one axis per factor.
        let p = project(&[0, 1], 8, &[2, 4]);
        assert_eq!(p.ranges, vec![0..1, 1..2]);
        assert_eq!(p.capacity, vec![1, 1]);
        assert!(!p.overflow);
        assert_eq!(p.extensible(), None);
    }

    #[test]
    fn an_axis_that_does_not_divide_a_major_factor_overflows() {
        // 8 = 2 x 4 split over axis1 (size 4): it does not cut the factor of 2 evenly.
        let p = project(&[1], 8, &[2, 4]);
        assert_eq!(p.ranges, vec![0..0, 0..0]);
        assert!(p.overflow);
        assert_eq!(p.extensible(), None);
    }

    #[test]
    fn the_last_factor_takes_uneven_axes() {
        // A dim of 6 split 4 ways: shards of 2, padded.
        let p = project(&[1], 6, &[6]);
        assert_eq!(p.ranges, vec![0..1]);
        assert_eq!(p.capacity, vec![2]);
        assert_eq!(p.extensible(), Some(0));
    }

    #[test]
    fn a_partly_split_major_factor_is_the_one_to_extend() {
        // 8 = 4 x 2 split over axis0 (2): factor 0 can take one more axis of 2.
        let p = project(&[0], 8, &[4, 2]);
        assert_eq!(p.ranges, vec![0..1, 1..1]);
        assert_eq!(p.extensible(), Some(0));
    }
}
