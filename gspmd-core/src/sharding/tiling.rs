//! Tiling: which device holds which block of a sharded tensor.
//!
//! This is the one place that maps (sharding, mesh, device) to a block; the partitioner
//! and the runtimes use it rather than recomputing offsets. A dim of size `n` split in
//! `k` shards is cut in chunks of `ceil(n / k)`; trailing shards may be short or empty
//! (uneven dims), and every device's buffer has the padded shape
//! [`Sharding::local_shape`].

use std::collections::HashSet;

use ndarray::{ArrayD, AxisDescription, IxDyn, Slice};

use super::mesh::Mesh;
use super::spec::Sharding;
use crate::error::{Error, Result};
use crate::ir::Literal;

/// Offset and length of shard `index` when a dim of `size` is cut in `num_shards` shards
/// of `ceil(size / num_shards)` (a `num_shards` of 0 counts as 1). Offsets clamp to
/// `size`, so late shards of an uneven dim may be short or empty.
///
/// ```
/// # use gspmd_core::sharding::dim_shard;
/// let lens: Vec<usize> = (0..4).map(|i| dim_shard(10, 4, i).1).collect();
/// assert_eq!(lens, [3, 3, 3, 1]);
/// assert_eq!(dim_shard(2, 4, 3), (2, 0));
/// ```
pub fn dim_shard(size: usize, num_shards: usize, index: usize) -> (usize, usize) {
    let chunk = size.div_ceil(num_shards.max(1));
    let offset = index.saturating_mul(chunk).min(size);
    (offset, chunk.min(size - offset))
}

impl Sharding {
    /// Number of shards dim `dim` is cut in: the product of its axes' sizes (1 for a dim
    /// that is not split or beyond the sharding's rank). Axes not in `mesh` count as size
    /// 1; call [`Sharding::validate`] first.
    pub fn num_shards(&self, dim: usize, mesh: &Mesh) -> usize {
        mesh.axes_size(self.dim_axes(dim))
    }

    /// Which shard of dim `dim` `device` holds: its [`Mesh::group_index`] over the dim's
    /// axes (its coordinates along them as a mixed-radix number, first axis major). A
    /// sharding that does not fit `mesh` (an unknown or repeated axis) or a device not in
    /// `mesh` gives shard 0; call [`Sharding::validate`] first.
    pub fn shard_index(&self, dim: usize, mesh: &Mesh, device: usize) -> usize {
        mesh.group_index(device, self.dim_axes(dim)).unwrap_or(0)
    }

    /// The block of a tensor of `global_shape` that `device` holds: `(offset, len)` per
    /// dim, unpadded (see [`dim_shard`]).
    pub fn device_block(
        &self,
        mesh: &Mesh,
        global_shape: &[usize],
        device: usize,
    ) -> Vec<(usize, usize)> {
        global_shape
            .iter()
            .enumerate()
            .map(|(dim, &size)| {
                dim_shard(
                    size,
                    self.num_shards(dim, mesh),
                    self.shard_index(dim, mesh, device),
                )
            })
            .collect()
    }

    /// The padded per-device shape of a tensor of `global_shape`: `ceil(size /
    /// num_shards)` per dim.
    pub fn local_shape(&self, mesh: &Mesh, global_shape: &[usize]) -> Vec<usize> {
        global_shape
            .iter()
            .enumerate()
            .map(|(dim, &size)| size.div_ceil(self.num_shards(dim, mesh)))
            .collect()
    }

    fn dim_axes(&self, dim: usize) -> &[String] {
        self.dims.get(dim).map_or(&[], |d| d.axes.as_slice())
    }
}

/// `device`'s block of `lit` under `sharding` (unpadded: short or empty for the late
/// shards of an uneven dim). Unreduced axes are ignored: each device gets the block.
pub fn shard_literal(lit: &Literal, sharding: &Sharding, mesh: &Mesh, device: usize) -> Literal {
    let block = sharding.device_block(mesh, &lit.shape(), device);
    match lit {
        Literal::F32(a) => Literal::F32(slice_block(a, &block)),
        Literal::I32(a) => Literal::I32(slice_block(a, &block)),
        Literal::Bool(a) => Literal::Bool(slice_block(a, &block)),
    }
}

/// The global value of `global_shape` from per-device blocks, `shards[d]` being device
/// `d`'s block as [`shard_literal`] cuts it: the inverse of [`shard_literal`]. Of devices
/// holding the same block (replicated copies), the lowest id's is used.
///
/// Errors: the sharding does not fit `mesh` and `global_shape` (as
/// [`Sharding::validate`]); the sharding has unreduced axes (partial sums must be
/// reduced first); not one shard per device; a shard of the wrong shape or dtype.
pub fn assemble(
    shards: &[Literal],
    sharding: &Sharding,
    mesh: &Mesh,
    global_shape: &[usize],
) -> Result<Literal> {
    sharding.validate(mesh, global_shape.len(), "")?;
    let error = |message: String| Error::Assemble {
        sharding: sharding.to_string(),
        message,
    };
    if !sharding.unreduced.is_empty() {
        return Err(error(format!(
            "unreduced over {{{}}}: partial sums must be reduced first",
            sharding.unreduced.join(", ")
        )));
    }
    if shards.len() != mesh.num_devices() {
        return Err(error(format!(
            "{} shards given for {} devices",
            shards.len(),
            mesh.num_devices()
        )));
    }
    let mut blocks = Vec::with_capacity(shards.len());
    for (device, shard) in shards.iter().enumerate() {
        let block = sharding.device_block(mesh, global_shape, device);
        let expected: Vec<usize> = block.iter().map(|b| b.1).collect();
        if shard.shape() != expected || shard.dtype() != shards[0].dtype() {
            return Err(error(format!(
                "device {device}'s shard is {}{:?}, expected {}{expected:?}",
                shard.dtype(),
                shard.shape(),
                shards[0].dtype()
            )));
        }
        blocks.push(block);
    }
    Ok(match &shards[0] {
        Literal::F32(_) => {
            Literal::F32(place_blocks(shards, &blocks, global_shape, Literal::as_f32))
        }
        Literal::I32(_) => {
            Literal::I32(place_blocks(shards, &blocks, global_shape, Literal::as_i32))
        }
        Literal::Bool(_) => Literal::Bool(place_blocks(
            shards,
            &blocks,
            global_shape,
            Literal::as_bool,
        )),
    })
}

/// The sub-array of `a` at `block` (`(offset, len)` per dim).
fn slice_block<T: Clone>(a: &ArrayD<T>, block: &[(usize, usize)]) -> ArrayD<T> {
    a.slice_each_axis(block_slice(block)).to_owned()
}

/// The per-axis slice selecting `block` (`(offset, len)` per dim).
fn block_slice(block: &[(usize, usize)]) -> impl Fn(AxisDescription) -> Slice + '_ {
    |ax| {
        let (offset, len) = block[ax.axis.index()];
        Slice::from(offset..offset + len)
    }
}

/// Writes each distinct block once into a fresh array of `shape`. The caller has checked
/// that every shard has the dtype `typed` extracts and its block's shape.
fn place_blocks<T: Clone + Default>(
    shards: &[Literal],
    blocks: &[Vec<(usize, usize)>],
    shape: &[usize],
    typed: impl Fn(&Literal) -> Option<&ArrayD<T>>,
) -> ArrayD<T> {
    let mut out = ArrayD::<T>::default(IxDyn(shape));
    let mut placed = HashSet::new();
    for (shard, block) in shards.iter().zip(blocks) {
        if let Some(a) = typed(shard).filter(|_| placed.insert(block)) {
            out.slice_each_axis_mut(block_slice(block)).assign(a);
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use ndarray::{Array, ArrayD, IxDyn};
    use proptest::prelude::*;

    use super::*;
    use crate::ir::DType;

    /// 2x4 mesh (data=2, model=4) whose row-major positions hold these device ids.
    fn permuted_mesh() -> Mesh {
        Mesh::with_device_order([("data", 2), ("model", 4)], vec![2, 5, 0, 7, 4, 1, 6, 3]).unwrap()
    }

    fn sharding(text: &str) -> Sharding {
        text.parse().unwrap()
    }

    fn iota(shape: &[usize]) -> ArrayD<i32> {
        let n: usize = shape.iter().product();
        Array::from_iter(0..n as i32)
            .into_shape_with_order(IxDyn(shape))
            .unwrap()
    }

    #[test]
    fn dim_shard_rounds_up_and_clamps() {
        let cut = |size, n| (0..n).map(|i| dim_shard(size, n, i)).collect::<Vec<_>>();
        assert_eq!(cut(10, 4), [(0, 3), (3, 3), (6, 3), (9, 1)]);
        assert_eq!(cut(2, 4), [(0, 1), (1, 1), (2, 0), (2, 0)]);
        assert_eq!(cut(8, 2), [(0, 4), (4, 4)]);
        assert_eq!(cut(0, 3), [(0, 0), (0, 0), (0, 0)]);
        assert_eq!(dim_shard(5, 0, 0), (0, 5));
    }

    proptest! {
        #[test]
        fn dim_shard_covers_each_element_once(size in 0usize..200, n in 1usize..20) {
            let chunk = size.div_ceil(n);
            let mut count = vec![0; size];
            for i in 0..n {
                let (offset, len) = dim_shard(size, n, i);
                prop_assert!(len <= chunk);
                for c in &mut count[offset..offset + len] {
                    *c += 1;
                }
            }
            prop_assert!(count.iter().all(|&c| c == 1), "{:?}", count);
        }
    }

    #[test]
    fn device_block_on_permuted_mesh() {
        // (model, data) on [7, 5]: dim 0 in 4 chunks of 2 (last has 1 row), dim 1 in 2
        // chunks of 3 (last has 2 columns). Position p holds device_ids[p] at
        // (data, model) = (p / 4, p % 4); worked out by hand per device id.
        let mesh = permuted_mesh();
        let s = sharding("(model, data)");
        let expected = [
            [(4, 2), (0, 3)], // d0: position 2 = (data 0, model 2)
            [(2, 2), (3, 2)], // d1: position 5 = (1, 1)
            [(0, 2), (0, 3)], // d2: position 0 = (0, 0)
            [(6, 1), (3, 2)], // d3: position 7 = (1, 3)
            [(0, 2), (3, 2)], // d4: position 4 = (1, 0)
            [(2, 2), (0, 3)], // d5: position 1 = (0, 1)
            [(4, 2), (3, 2)], // d6: position 6 = (1, 2)
            [(6, 1), (0, 3)], // d7: position 3 = (0, 3)
        ];
        for (device, block) in expected.iter().enumerate() {
            assert_eq!(
                s.device_block(&mesh, &[7, 5], device),
                block,
                "device {device}"
            );
        }
        assert_eq!(s.local_shape(&mesh, &[7, 5]), [2, 3]);
        assert_eq!(s.num_shards(0, &mesh), 4);
        assert_eq!(s.num_shards(1, &mesh), 2);
    }

    #[test]
    fn shard_index_reads_axes_major_to_minor() {
        let mesh = Mesh::new([("data", 2), ("model", 4)]).unwrap();
        // Default order: device d is at (data, model) = (d / 4, d % 4).
        let data_major = sharding("((data, model))");
        let model_major = sharding("((model, data))");
        let unsplit = sharding("(_)");
        for device in 0..8 {
            let (data, model) = (device / 4, device % 4);
            assert_eq!(data_major.shard_index(0, &mesh, device), data * 4 + model);
            assert_eq!(model_major.shard_index(0, &mesh, device), model * 2 + data);
            assert_eq!(unsplit.shard_index(0, &mesh, device), 0);
        }
        assert_eq!(model_major.num_shards(0, &mesh), 8);
        assert_eq!(unsplit.num_shards(0, &mesh), 1);
        assert_eq!(sharding("((data, model)?)").local_shape(&mesh, &[10]), [2]);
    }

    #[test]
    fn shard_literal_cuts_the_block() {
        let mesh = permuted_mesh();
        let lit = Literal::from(iota(&[7, 5]));
        let s = sharding("(model, data)");
        // d3 holds rows 6..7 and columns 3..5: elements 6 * 5 + 3 and 6 * 5 + 4.
        let d3 = ArrayD::from_shape_vec(IxDyn(&[1, 2]), vec![33, 34]).unwrap();
        assert_eq!(shard_literal(&lit, &s, &mesh, 3), Literal::I32(d3));
        // d2 holds rows 0..2 and columns 0..3.
        let d2 = ArrayD::from_shape_vec(IxDyn(&[2, 3]), vec![0, 1, 2, 5, 6, 7]).unwrap();
        assert_eq!(shard_literal(&lit, &s, &mesh, 2), Literal::I32(d2));
    }

    fn shard_all(lit: &Literal, s: &Sharding, mesh: &Mesh) -> Vec<Literal> {
        (0..mesh.num_devices())
            .map(|d| shard_literal(lit, s, mesh, d))
            .collect()
    }

    #[test]
    fn assemble_inverts_shard_literal() {
        let mesh = permuted_mesh();
        let f32s = Literal::from(iota(&[7, 5]).mapv(|v| v as f32 * 0.5));
        let bools = Literal::from(iota(&[7, 5]).mapv(|v| v % 3 == 0));
        for text in [
            "(model, data)",
            "(data, model)",
            "((model, data), _)",
            "(_, ?)",
        ] {
            let s = sharding(text);
            for lit in [&f32s, &bools] {
                let shards = shard_all(lit, &s, &mesh);
                assert_eq!(
                    &assemble(&shards, &s, &mesh, &[7, 5]).unwrap(),
                    lit,
                    "{text}"
                );
            }
        }
        let scalar = Literal::full(&[], DType::I32, 3.0);
        let s = Sharding::replicated(0);
        let shards = shard_all(&scalar, &s, &mesh);
        assert_eq!(assemble(&shards, &s, &mesh, &[]).unwrap(), scalar);
    }

    proptest! {
        #[test]
        fn assemble_round_trips(
            shape in prop::collection::vec(0usize..7, 0..4),
            placement in prop::collection::vec(0usize..4, 2),
            model_first in any::<bool>(),
        ) {
            // Each mesh axis goes to dim `placement[i]` if that dim exists.
            let mesh = permuted_mesh();
            let mut dims = vec![Vec::new(); shape.len()];
            let order = if model_first { ["model", "data"] } else { ["data", "model"] };
            for axis in order {
                let dim = placement[usize::from(axis == "model")];
                if let Some(d) = dims.get_mut(dim) {
                    d.push(axis);
                }
            }
            let s = Sharding::new(dims.into_iter().map(crate::sharding::DimSharding::closed));
            let lit = Literal::from(iota(&shape));
            let shards = shard_all(&lit, &s, &mesh);
            prop_assert_eq!(assemble(&shards, &s, &mesh, &shape).unwrap(), lit);
        }
    }

    #[test]
    fn assemble_rejects_mismatched_shards() {
        let mesh = permuted_mesh();
        let s = sharding("(model, data)");
        let shards = shard_all(&Literal::from(iota(&[7, 5])), &s, &mesh);
        assert_eq!(
            assemble(&shards[1..], &s, &mesh, &[7, 5])
                .unwrap_err()
                .to_string(),
            "cannot assemble shards of sharding (model, data): 7 shards given for 8 devices"
        );
        let message = |r: Result<Literal>| match r {
            Err(Error::Assemble { message, .. }) => message,
            other => panic!("expected Error::Assemble, got {other:?}"),
        };

        assert_eq!(
            message(assemble(&shards[..7], &s, &mesh, &[7, 5])),
            "7 shards given for 8 devices"
        );
        let mut wrong_shape = shards.clone();
        wrong_shape[3] = Literal::full(&[2, 3], DType::I32, 0.0);
        assert_eq!(
            message(assemble(&wrong_shape, &s, &mesh, &[7, 5])),
            "device 3's shard is i32[2, 3], expected i32[1, 2]"
        );
        let mut wrong_dtype = shards.clone();
        wrong_dtype[1] = Literal::full(&[2, 2], DType::F32, 0.0);
        assert_eq!(
            message(assemble(&wrong_dtype, &s, &mesh, &[7, 5])),
            "device 1's shard is f32[2, 2], expected i32[2, 2]"
        );
        let partial = sharding("(model, _) unreduced={data}");
        assert_eq!(
            message(assemble(&shards, &partial, &mesh, &[7, 5])),
            "unreduced over {data}: partial sums must be reduced first"
        );
        assert!(matches!(
            assemble(&shards, &s, &mesh, &[7, 5, 1]),
            Err(Error::ShardingRank { .. })
        ));
        assert!(matches!(
            assemble(&shards, &sharding("(x, _)"), &mesh, &[7, 5]),
            Err(Error::UnknownAxis { .. })
        ));
    }
}
