//! [`AxisPart`]: a mesh axis or a sub-axis of one (Shardy's `axis:(pre)size`), as
//! numbers, and the arithmetic on parts that shardings, propagation and the reshard
//! planner share: overlap, merging adjacent parts, splitting a part in two.
//!
//! An axis of size `n` is read as mixed-radix digits, major first. The part `(pre)size`
//! is the digit of `size` values after the major digits of product `pre`; its stride
//! (the product of the digits minor to it) is `n / (pre * size)`. The whole axis is
//! `(1)n`. Names: [`Mesh::sub_axis`](super::Mesh::sub_axis) and
//! [`Mesh::part_name`](super::Mesh::part_name).

/// A mesh axis (by position among the mesh's axes) or a sub-axis of one.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct AxisPart {
    /// The axis's position among the mesh's axes.
    pub axis: usize,
    /// Product of the sizes of the axis's digits major to this part (1: the major part).
    pub pre: usize,
    /// Number of values of the part (the axis size for the whole axis).
    pub size: usize,
}

impl AxisPart {
    /// The whole axis at position `axis`, of size `size`.
    pub fn whole(axis: usize, size: usize) -> Self {
        AxisPart { axis, pre: 1, size }
    }

    /// True if the part is its whole axis of size `axis_size`.
    pub fn is_whole(&self, axis_size: usize) -> bool {
        self.pre == 1 && self.size == axis_size
    }

    /// True if the two parts cannot both be used: they are parts of one axis and are
    /// not one entirely major to the other (the minor one's `pre` a multiple of the
    /// major one's `pre * size`). An axis and any part of it overlap; `model:(1)2` and
    /// `model:(2)2` do not.
    pub fn overlaps(&self, other: &AxisPart) -> bool {
        self.axis == other.axis
            && (self == other
                || !(other.pre.is_multiple_of(self.pre * self.size)
                    || self.pre.is_multiple_of(other.pre * other.size)))
    }

    /// True if every digit of `other` is a digit of `self`: the same axis, `other`
    /// starting at or after `self` and ending at or before it, on one mixed-radix
    /// reading (`model` contains `model:(2)2`; `model:(1)2` does not).
    pub fn contains(&self, other: &AxisPart) -> bool {
        self.axis == other.axis
            && other.pre.is_multiple_of(self.pre)
            && (self.pre * self.size).is_multiple_of(other.pre * other.size)
    }

    /// The part made of `self` followed directly by `minor` (`model:(1)2` then
    /// `model:(2)2` is `model:(1)4`); `None` unless `minor` starts where `self` ends.
    pub fn merge(&self, minor: &AxisPart) -> Option<AxisPart> {
        (self.axis == minor.axis && minor.pre == self.pre * self.size).then_some(AxisPart {
            size: self.size * minor.size,
            ..*self
        })
    }

    /// The part cut after its major digits of product `major` (which must divide
    /// `size`, and lie strictly between 1 and `size`): `(major part, minor part)`.
    pub fn split(&self, major: usize) -> (AxisPart, AxisPart) {
        debug_assert!(major > 1 && major < self.size && self.size.is_multiple_of(major));
        (
            AxisPart {
                size: major,
                ..*self
            },
            AxisPart {
                pre: self.pre * major,
                size: self.size / major,
                ..*self
            },
        )
    }
}

/// `parts` with each part followed directly by the next part of its axis merged into
/// one ([`AxisPart::merge`]): the canonical form of a dim's axes, so that two lists that
/// cut a dim the same way are equal.
pub fn merge_adjacent(parts: &[AxisPart]) -> Vec<AxisPart> {
    let mut out: Vec<AxisPart> = Vec::with_capacity(parts.len());
    for &p in parts {
        if let Some(last) = out.last_mut()
            && let Some(merged) = last.merge(&p)
        {
            *last = merged;
        } else {
            out.push(p);
        }
    }
    out
}

/// `parts` with each part cut into smaller parts at the digit boundaries (`pre` and
/// `pre * size`) that parts of `others` on its axis have inside it: two lists over the
/// same digits, each cut at the other's boundaries, list the same parts (in their own
/// orders). `[model]` cut at `[model:(2)2, model:(1)2]` is `[model:(1)2, model:(2)2]`.
pub fn cut_at(parts: &[AxisPart], others: &[AxisPart]) -> Vec<AxisPart> {
    let mut out = Vec::with_capacity(parts.len());
    for p in parts {
        let end = p.pre * p.size;
        let mut bounds: Vec<usize> = (others.iter())
            .filter(|q| q.axis == p.axis)
            .flat_map(|q| [q.pre, q.pre * q.size])
            .filter(|&b| b > p.pre && b < end && end.is_multiple_of(b))
            .collect();
        bounds.sort_unstable();
        let mut start = p.pre;
        for b in bounds.into_iter().chain([end]) {
            if b > start && b.is_multiple_of(start) {
                out.push(AxisPart {
                    pre: start,
                    size: b / start,
                    ..*p
                });
                start = b;
            }
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn part(pre: usize, size: usize) -> AxisPart {
        AxisPart { axis: 1, pre, size }
    }

    #[test]
    fn overlap_needs_nested_digits() {
        assert!(!part(1, 2).overlaps(&part(2, 2)));
        assert!(!part(2, 2).overlaps(&part(1, 2)));
        assert!(part(1, 4).overlaps(&part(2, 2)));
        assert!(part(1, 2).overlaps(&part(1, 2)));
        // On an axis of 12, (1)2 and (3)2 are not digits of one mixed-radix reading.
        assert!(part(1, 2).overlaps(&part(3, 2)));
        assert!(!part(1, 2).overlaps(&AxisPart {
            axis: 0,
            pre: 1,
            size: 2
        }));
        assert!(part(1, 4).contains(&part(2, 2)) && part(1, 4).contains(&part(1, 4)));
        assert!(!part(1, 2).contains(&part(2, 2)) && !part(2, 2).contains(&part(1, 4)));
    }

    #[test]
    fn cutting_at_another_lists_boundaries() {
        let swapped = [part(2, 2), part(1, 2)];
        assert_eq!(cut_at(&[part(1, 4)], &swapped), [part(1, 2), part(2, 2)]);
        assert_eq!(cut_at(&swapped, &[part(1, 4)]), swapped);
        assert_eq!(
            cut_at(
                &[part(1, 8), AxisPart::whole(0, 2)],
                &[part(2, 2), part(4, 2)]
            ),
            [part(1, 2), part(2, 2), part(4, 2), AxisPart::whole(0, 2)]
        );
        let whole = AxisPart::whole(0, 1);
        assert!(whole.overlaps(&whole));
    }

    #[test]
    fn merge_and_split_are_inverse() {
        let (major, minor) = part(1, 8).split(2);
        assert_eq!((major, minor), (part(1, 2), part(2, 4)));
        assert_eq!(major.merge(&minor), Some(part(1, 8)));
        assert_eq!(minor.merge(&major), None);
        assert_eq!(
            merge_adjacent(&[part(1, 2), part(2, 2), part(4, 2), AxisPart::whole(0, 2)]),
            [part(1, 8), AxisPart::whole(0, 2)]
        );
        assert_eq!(
            merge_adjacent(&[part(2, 2), part(1, 2)]),
            [part(2, 2), part(1, 2)]
        );
        assert!(part(1, 4).is_whole(4) && !part(2, 2).is_whole(4));
    }
}
