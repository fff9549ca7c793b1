//! Tiling: which device holds which block of a sharded tensor.
//!
//! This is the one place that maps (sharding, mesh, device) to a block; the partitioner
//! and the runtimes use it rather than recomputing offsets. A dim of size `n` split in
//! `k` shards is cut in chunks of `ceil(n / k)`; trailing shards may be short or empty
//! (uneven dims), and every device's buffer has the padded shape
//! [`Sharding::local_shape`].

use super::mesh::Mesh;
use super::spec::Sharding;

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

    /// Which shard of dim `dim` `device` holds: its [`Mesh::group_index`] `g` over the
    /// dim's axes (its coordinates along them as a mixed-radix number, first axis
    /// major), or `n - 1 - g` of the `n` shards when the dim's device order is
    /// [`reversed`](super::DimSharding::reversed). A sharding that does not fit `mesh`
    /// (an unknown or repeated axis) or a device not in `mesh` gives shard 0; call
    /// [`Sharding::validate`] first.
    pub fn shard_index(&self, dim: usize, mesh: &Mesh, device: usize) -> usize {
        let Ok(g) = mesh.group_index(device, self.dim_axes(dim)) else {
            return 0;
        };
        match self.dims.get(dim) {
            Some(d) if d.reversed => self.num_shards(dim, mesh) - 1 - g,
            _ => g,
        }
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

#[cfg(test)]
mod tests {
    use proptest::prelude::*;

    use super::*;

    /// 2x4 mesh (data=2, model=4) whose row-major positions hold these device ids.
    fn permuted_mesh() -> Mesh {
        Mesh::with_device_order([("data", 2), ("model", 4)], vec![2, 5, 0, 7, 4, 1, 6, 3]).unwrap()
    }

    fn sharding(text: &str) -> Sharding {
        text.parse().unwrap()
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
    fn reversed_dims_count_shards_from_the_last_device() {
        let mesh = permuted_mesh();
        let s = sharding("(-model, data)");
        let forward = sharding("(model, data)");
        for (position, &device) in mesh.device_ids().iter().enumerate() {
            let model = position % 4;
            assert_eq!(s.shard_index(0, &mesh, device), 3 - model);
            assert_eq!(
                s.shard_index(1, &mesh, device),
                forward.shard_index(1, &mesh, device)
            );
        }
        // The shard device 2 (position 0, model 0) holds is the last: rows 6.. of 7.
        assert_eq!(s.device_block(&mesh, &[7, 5], 2), [(6, 1), (0, 3)]);
        let both = sharding("(-(data, model))");
        for (position, &device) in mesh.device_ids().iter().enumerate() {
            assert_eq!(both.shard_index(0, &mesh, device), 7 - position);
        }
    }

    #[test]
    fn sub_axes_cut_dims_by_digits_of_an_axis() {
        let mesh = permuted_mesh();
        let split = sharding("(model:(1)2, (data, model:(2)2))");
        let reversed = sharding("((model:(2)2, model:(1)2))");
        let whole = sharding("(model)");
        for (position, &device) in mesh.device_ids().iter().enumerate() {
            let (data, model) = (position / 4, position % 4);
            assert_eq!(split.shard_index(0, &mesh, device), model / 2);
            assert_eq!(split.shard_index(1, &mesh, device), data * 2 + model % 2);
            assert_eq!(
                reversed.shard_index(0, &mesh, device),
                (model % 2) * 2 + model / 2
            );
            assert_eq!(
                sharding("((model:(1)2, model:(2)2))").device_block(&mesh, &[8], device),
                whole.device_block(&mesh, &[8], device)
            );
        }
        assert_eq!(split.local_shape(&mesh, &[6, 8]), [3, 2]);
        assert_eq!(reversed.num_shards(0, &mesh), 4);
    }
}
