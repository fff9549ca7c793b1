//! [`Mesh`]: named axes with sizes over an ordered list of devices.

use super::sub_axis::{AxisPart, merge_adjacent};
use crate::error::{DeviceOrderProblem, Error, GroupProblem, MeshProblem, Result};

/// A logical n-d array of devices with named axes (JAX's `Mesh`, Shardy's `sdy.mesh`).
///
/// `device_ids[i]` is the device at row-major position `i` of the axes (first axis
/// major); the default order is `0..num_devices`. Any permutation is allowed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Mesh {
    axes: Vec<(String, usize)>,
    device_ids: Vec<usize>,
    /// `positions[d]`: the row-major position of device `d` (the inverse of `device_ids`).
    positions: Vec<usize>,
}

impl Mesh {
    /// A mesh with axes `(name, size)`, major to minor, and the default device order.
    ///
    /// ```
    /// # use gspmd_core::sharding::Mesh;
    /// let mesh = Mesh::new([("data", 2), ("model", 4)]).unwrap();
    /// assert_eq!(mesh.num_devices(), 8);
    /// ```
    pub fn new<S: Into<String>>(axes: impl IntoIterator<Item = (S, usize)>) -> Result<Self> {
        let axes: Vec<(String, usize)> = axes.into_iter().map(|(n, s)| (n.into(), s)).collect();
        let n = num_devices(&axes)?;
        Mesh::with_device_order(axes, (0..n).collect())
    }

    /// A mesh whose row-major position `i` holds device `device_ids[i]`; `device_ids`
    /// must be a permutation of `0..product(sizes)`.
    pub fn with_device_order<S: Into<String>>(
        axes: impl IntoIterator<Item = (S, usize)>,
        device_ids: Vec<usize>,
    ) -> Result<Self> {
        let axes: Vec<(String, usize)> = axes.into_iter().map(|(n, s)| (n.into(), s)).collect();
        for (i, (name, size)) in axes.iter().enumerate() {
            let valid_name = name
                .chars()
                .next()
                .is_some_and(|c| c.is_alphabetic() || c == '_')
                && name.chars().all(|c| c.is_alphanumeric() || c == '_')
                && name != "_";
            if !valid_name {
                return Err(Error::InvalidMesh {
                    problem: MeshProblem::NotAnIdentifier { axis: name.clone() },
                });
            }
            if *size == 0 {
                return Err(Error::InvalidMesh {
                    problem: MeshProblem::ZeroSize { axis: name.clone() },
                });
            }
            if axes[..i].iter().any(|(n, _)| n == name) {
                return Err(Error::InvalidMesh {
                    problem: MeshProblem::RepeatedAxis { axis: name.clone() },
                });
            }
        }
        let num_devices = num_devices(&axes)?;
        if device_ids.len() != num_devices {
            return Err(Error::DeviceOrder {
                num_devices,
                problem: DeviceOrderProblem::Count {
                    given: device_ids.len(),
                },
            });
        }
        let mut positions = vec![usize::MAX; num_devices];
        for (position, &d) in device_ids.iter().enumerate() {
            if d >= num_devices {
                return Err(Error::DeviceOrder {
                    num_devices,
                    problem: DeviceOrderProblem::OutOfRange { id: d },
                });
            }
            if std::mem::replace(&mut positions[d], position) != usize::MAX {
                return Err(Error::DeviceOrder {
                    num_devices,
                    problem: DeviceOrderProblem::Repeated { id: d },
                });
            }
        }
        Ok(Mesh {
            axes,
            device_ids,
            positions,
        })
    }

    /// Axes `(name, size)`, major to minor.
    pub fn axes(&self) -> &[(String, usize)] {
        &self.axes
    }

    /// Axis names, major to minor.
    pub fn axis_names(&self) -> impl Iterator<Item = &str> {
        self.axes.iter().map(|a| a.0.as_str())
    }

    /// Position of axis `name` among the mesh's axes.
    pub fn axis_index(&self, name: &str) -> Option<usize> {
        self.axes.iter().position(|a| a.0 == name)
    }

    /// Size of axis `name`, or of the sub-axis `name` names (see [`Mesh::sub_axis`]).
    pub fn axis_size(&self, name: &str) -> Option<usize> {
        self.part(name).map(|p| p.size)
    }

    /// The name of a sub-axis (Shardy's `axis:(pre)size`): `axis` cut in mixed-radix
    /// digits, the part of `size` devices after the major parts of product `pre`. A
    /// device's coordinate on it is `(c / (axis size / (pre * size))) % size`, where
    /// `c` is its coordinate on `axis`; `size` must be above 1 and `pre * size` divide
    /// the axis size. Collectives, `axis_index` and group indices take sub-axes
    /// wherever they take axes (the partitioner's plans use them for moves on parts of
    /// an axis), and so do shardings.
    ///
    /// ```
    /// # use gspmd_core::sharding::Mesh;
    /// let mesh = Mesh::new([("data", 2), ("model", 4)]).unwrap();
    /// let (major, minor) = (Mesh::sub_axis("model", 1, 2), Mesh::sub_axis("model", 2, 2));
    /// assert_eq!(major, "model:(1)2");
    /// // Device 6 sits at data=1, model=2: model's major digit 1, minor digit 0.
    /// assert_eq!(mesh.group_index(6, &[&minor, &major]).unwrap(), 1);
    /// assert_eq!(mesh.group_index(6, &[&major, "data", &minor]).unwrap(), 1 * 4 + 1 * 2 + 0);
    /// ```
    pub fn sub_axis(axis: &str, pre: usize, size: usize) -> String {
        format!("{axis}:({pre}){size}")
    }

    /// The axis or sub-axis `name` stands for: an axis of the mesh, or a valid
    /// sub-axis of one (`pre` at least 1, `size` at least 2, `pre * size` dividing the
    /// axis size); `None` otherwise. A sub-axis spanning its whole axis (`model:(1)4`
    /// on `model=4`) is the axis.
    ///
    /// ```
    /// # use gspmd_core::sharding::{AxisPart, Mesh};
    /// let mesh = Mesh::new([("data", 2), ("model", 4)]).unwrap();
    /// assert_eq!(mesh.axis_part("model:(2)2"), Some(AxisPart { axis: 1, pre: 2, size: 2 }));
    /// assert_eq!(mesh.axis_part("model:(1)4"), mesh.axis_part("model"));
    /// assert_eq!(mesh.axis_part("model:(2)4"), None);
    /// ```
    pub fn axis_part(&self, name: &str) -> Option<AxisPart> {
        let Some((axis, pre, size)) = split_sub_axis(name) else {
            let position = self.axis_index(name)?;
            return Some(AxisPart::whole(position, self.axes[position].1));
        };
        let position = self.axis_index(axis)?;
        let span = pre.checked_mul(size)?;
        (pre >= 1 && size >= 2 && self.axes[position].1.is_multiple_of(span)).then_some(AxisPart {
            axis: position,
            pre,
            size,
        })
    }

    /// The name of `part`: the axis's own name when the part is the whole axis, else
    /// its [`sub_axis`](Mesh::sub_axis) name. `part.axis` must be a position of the
    /// mesh's axes.
    pub fn part_name(&self, part: AxisPart) -> String {
        let (name, size) = &self.axes[part.axis];
        if part.is_whole(*size) {
            name.clone()
        } else {
            Mesh::sub_axis(name, part.pre, part.size)
        }
    }

    /// `axes` in canonical form: each name as [`part_name`](Mesh::part_name) gives it,
    /// and a part followed directly by the next part of its axis merged with it
    /// (`[model:(1)2, model:(2)2]` is `[model]`). Two lists that cut a dim the same way
    /// have one canonical form. Names that are not (sub-)axes of the mesh are kept as
    /// they are (validate shardings first).
    pub fn canonical_axes<S: AsRef<str>>(&self, axes: &[S]) -> Vec<String> {
        let mut out: Vec<String> = Vec::with_capacity(axes.len());
        let mut run: Vec<AxisPart> = Vec::new();
        let flush = |run: &mut Vec<AxisPart>, out: &mut Vec<String>| {
            out.extend(merge_adjacent(run).into_iter().map(|p| self.part_name(p)));
            run.clear();
        };
        for name in axes {
            match self.axis_part(name.as_ref()) {
                Some(part) => run.push(part),
                None => {
                    flush(&mut run, &mut out);
                    out.push(name.as_ref().to_string());
                }
            }
        }
        flush(&mut run, &mut out);
        out
    }

    /// The digit of the mesh coordinates `name` stands for.
    fn part(&self, name: &str) -> Option<Part> {
        let p = self.axis_part(name)?;
        Some(Part {
            position: p.axis,
            stride: self.axes[p.axis].1 / (p.pre * p.size),
            size: p.size,
            part: p,
        })
    }

    /// Number of devices along `axes` together: the product of their sizes. Names that
    /// are not axes of the mesh count as size 1 (validate shardings first).
    pub fn axes_size<S: AsRef<str>>(&self, axes: &[S]) -> usize {
        axes.iter()
            .map(|a| self.axis_size(a.as_ref()).unwrap_or(1))
            .product()
    }

    /// Total number of devices.
    pub fn num_devices(&self) -> usize {
        self.device_ids.len()
    }

    /// Device ids in row-major mesh order.
    pub fn device_ids(&self) -> &[usize] {
        &self.device_ids
    }

    /// Coordinates of `device` along each axis (major to minor); `None` if no such device.
    pub fn device_coords(&self, device: usize) -> Option<Vec<usize>> {
        let mut pos = *self.positions.get(device)?;
        let mut coords = vec![0; self.axes.len()];
        for (i, (_, size)) in self.axes.iter().enumerate().rev() {
            coords[i] = pos % size;
            pos /= size;
        }
        Some(coords)
    }

    /// The device at `coords` (one per axis, each below the axis size).
    pub fn device_at(&self, coords: &[usize]) -> Option<usize> {
        if coords.len() != self.axes.len() {
            return None;
        }
        let mut pos = 0;
        for (&c, (_, size)) in coords.iter().zip(&self.axes) {
            if c >= *size {
                return None;
            }
            pos = pos * size + c;
        }
        Some(self.device_ids[pos])
    }

    /// The index of `device` in its group over `axes` (the devices that share its
    /// coordinates on every other axis): its coordinates along `axes` read as one
    /// mixed-radix number, first listed axis major. This is JAX's `axis_index` over a
    /// tuple of axes, the order of shard indices along a dim split over `axes`, and the
    /// order of the members of a collective over `axes`. An empty list gives 0.
    ///
    /// Errors ([`Error::AxisGroup`]): an axis that is not in the mesh or is listed twice;
    /// a device that is not in the mesh.
    ///
    /// ```
    /// # use gspmd_core::sharding::Mesh;
    /// let mesh = Mesh::new([("data", 2), ("model", 4)]).unwrap();
    /// // Device 6 sits at data=1, model=2.
    /// assert_eq!(mesh.group_index(6, &["data", "model"]).unwrap(), 6);
    /// assert_eq!(mesh.group_index(6, &["model", "data"]).unwrap(), 5);
    /// ```
    pub fn group_index<S: AsRef<str>>(&self, device: usize, axes: &[S]) -> Result<usize> {
        let parts = self.parts(axes)?;
        let coords = self.coords_in_group(device, axes)?;
        Ok(parts
            .iter()
            .fold(0, |index, p| index * p.size + p.digit(coords[p.position])))
    }

    /// The member at `index` of `device`'s group over `axes`: the device whose
    /// coordinates equal `device`'s on every axis not in `axes` and whose
    /// [`group_index`](Mesh::group_index) over `axes` is `index`. The inverse of
    /// `group_index`: `group_member(d, axes, group_index(d, axes)) == d`.
    ///
    /// Errors ([`Error::AxisGroup`]): as `group_index`, and an `index` not below the
    /// group size [`axes_size`](Mesh::axes_size).
    ///
    /// ```
    /// # use gspmd_core::sharding::Mesh;
    /// let mesh = Mesh::new([("data", 2), ("model", 4)]).unwrap();
    /// let by_model: Vec<usize> =
    ///     (0..4).map(|i| mesh.group_member(6, &["model"], i).unwrap()).collect();
    /// assert_eq!(by_model, [4, 5, 6, 7]);
    /// ```
    pub fn group_member<S: AsRef<str>>(
        &self,
        device: usize,
        axes: &[S],
        index: usize,
    ) -> Result<usize> {
        let parts = self.parts(axes)?;
        let mut coords = self.coords_in_group(device, axes)?;
        let size = self.axes_size(axes);
        if index >= size {
            return Err(self.group_error(axes, GroupProblem::NoSuchMember { index, size }));
        }
        let mut rest = index;
        for p in parts.iter().rev() {
            let c = coords[p.position];
            coords[p.position] = c - p.digit(c) * p.stride + (rest % p.size) * p.stride;
            rest /= p.size;
        }
        let position = coords
            .iter()
            .zip(&self.axes)
            .fold(0, |position, (&c, (_, size))| position * size + c);
        Ok(self.device_ids[position])
    }

    /// The digits `axes` stand for, in the order listed.
    fn parts<S: AsRef<str>>(&self, axes: &[S]) -> Result<Vec<Part>> {
        let mut parts: Vec<Part> = Vec::with_capacity(axes.len());
        for axis in axes {
            let axis = axis.as_ref();
            let part = self.part(axis).ok_or_else(|| {
                let available = self.axis_names().map(str::to_string).collect();
                let axis = axis.to_string();
                self.group_error(axes, GroupProblem::UnknownAxis { axis, available })
            })?;
            if parts.iter().any(|p| p.overlaps(&part)) {
                let axis = axis.to_string();
                return Err(self.group_error(axes, GroupProblem::RepeatedAxis { axis }));
            }
            parts.push(part);
        }
        Ok(parts)
    }

    /// The coordinates of `device`, or an error naming the group over `axes`.
    fn coords_in_group<S: AsRef<str>>(&self, device: usize, axes: &[S]) -> Result<Vec<usize>> {
        self.device_coords(device)
            .ok_or_else(|| self.group_error(axes, GroupProblem::NoSuchDevice { device }))
    }

    fn group_error<S: AsRef<str>>(&self, axes: &[S], problem: GroupProblem) -> Error {
        Error::AxisGroup {
            axes: axes.iter().map(|a| a.as_ref().to_string()).collect(),
            mesh: self.to_string(),
            problem,
        }
    }

    /// Comma-separated axis names, for error messages.
    pub fn axis_list(&self) -> String {
        self.axis_names().collect::<Vec<_>>().join(", ")
    }
}

/// A mixed-radix digit of one mesh coordinate: an axis (`stride` 1, its whole size) or
/// a sub-axis of one.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Part {
    /// The axis's position among the mesh's axes.
    position: usize,
    /// Product of the sizes of the axis's digits minor to this one.
    stride: usize,
    /// Number of values of the digit.
    size: usize,
    /// The same digit as an axis part.
    part: AxisPart,
}

impl Part {
    /// The digit of coordinate `c` on the part's axis.
    fn digit(&self, c: usize) -> usize {
        (c / self.stride) % self.size
    }

    /// True if the two cannot be listed together ([`AxisPart::overlaps`]).
    fn overlaps(&self, other: &Part) -> bool {
        self.part.overlaps(&other.part)
    }
}

/// `(axis, pre, size)` of a sub-axis name `axis:(pre)size`; `None` for a plain name or
/// malformed digits.
pub(super) fn split_sub_axis(name: &str) -> Option<(&str, usize, usize)> {
    let (axis, rest) = name.split_once(":(")?;
    let (pre, size) = rest.split_once(')')?;
    Some((axis, pre.parse().ok()?, size.parse().ok()?))
}

/// The product of the axis sizes, or an error if it overflows.
fn num_devices(axes: &[(String, usize)]) -> Result<usize> {
    axes.iter()
        .try_fold(1usize, |n, (_, size)| n.checked_mul(*size))
        .ok_or(Error::InvalidMesh {
            problem: MeshProblem::TooManyDevices,
        })
}

impl std::fmt::Display for Mesh {
    /// `mesh[data=2, model=4]`, with `devices=[...]` when the order is not the default.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let axes: Vec<String> = self.axes.iter().map(|(n, s)| format!("{n}={s}")).collect();
        write!(f, "mesh[{}]", axes.join(", "))?;
        if self.device_ids.iter().enumerate().any(|(i, &d)| i != d) {
            let ids: Vec<String> = self.device_ids.iter().map(ToString::to_string).collect();
            write!(f, " devices=[{}]", ids.join(","))?;
        }
        Ok(())
    }
}
