//! Cutting a concrete array into the per-device blocks of a sharding, and assembling
//! them back: the runtime's side of tiling. Which device holds which block is decided by
//! [`Sharding::device_block`] (`sharding::tiling`); this module only moves elements.

use std::collections::HashSet;

use ndarray::{ArrayD, AxisDescription, IxDyn, Slice};

use crate::error::{AssembleProblem, Error, Result};
use crate::ir::{Element, Literal, TensorType, by_element, map_literal};
use crate::sharding::{Mesh, Sharding};

/// `device`'s block of `lit` under `sharding` (unpadded: short or empty for the late
/// shards of an uneven dim). Unreduced axes are ignored: each device gets the block.
pub fn shard_literal(lit: &Literal, sharding: &Sharding, mesh: &Mesh, device: usize) -> Literal {
    let block = sharding.device_block(mesh, &lit.shape(), device);
    map_literal!(lit, a => slice_block(a, &block))
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
    let error = |problem: AssembleProblem| Error::Assemble {
        sharding: sharding.to_string(),
        problem,
    };
    if !sharding.unreduced.is_empty() {
        let axes = sharding.unreduced.clone();
        return Err(error(AssembleProblem::Unreduced { axes }));
    }
    if shards.len() != mesh.num_devices() {
        return Err(error(AssembleProblem::ShardCount {
            given: shards.len(),
            devices: mesh.num_devices(),
        }));
    }
    let mut blocks = Vec::with_capacity(shards.len());
    for (device, shard) in shards.iter().enumerate() {
        let block = sharding.device_block(mesh, global_shape, device);
        let expected: Vec<usize> = block.iter().map(|b| b.1).collect();
        if shard.shape() != expected || shard.dtype() != shards[0].dtype() {
            return Err(error(AssembleProblem::Shard {
                device,
                given: TensorType::new(shard.shape(), shard.dtype()),
                expected: TensorType::new(expected, shards[0].dtype()),
            }));
        }
        blocks.push(block);
    }
    fn place<T: Element>(
        shards: &[Literal],
        blocks: &[Vec<(usize, usize)>],
        global_shape: &[usize],
    ) -> Literal {
        T::literal(place_blocks(shards, blocks, global_shape, T::array))
    }
    Ok(by_element!(
        shards[0].dtype(),
        place(shards, &blocks, global_shape)
    ))
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
        let problem = |r: Result<Literal>| match r {
            Err(Error::Assemble { problem, .. }) => problem,
            other => panic!("expected Error::Assemble, got {other:?}"),
        };
        let ty = |shape: &[usize], dtype| TensorType::new(shape.to_vec(), dtype);

        assert_eq!(
            problem(assemble(&shards[..7], &s, &mesh, &[7, 5])),
            AssembleProblem::ShardCount {
                given: 7,
                devices: 8
            }
        );
        let mut wrong_shape = shards.clone();
        wrong_shape[3] = Literal::full(&[2, 3], DType::I32, 0.0);
        let wrong = problem(assemble(&wrong_shape, &s, &mesh, &[7, 5]));
        assert_eq!(
            wrong.to_string(),
            format!(
                "device 3's shard is {}, expected {}",
                ty(&[2, 3], DType::I32),
                ty(&[1, 2], DType::I32)
            )
        );
        assert_eq!(
            wrong,
            AssembleProblem::Shard {
                device: 3,
                given: ty(&[2, 3], DType::I32),
                expected: ty(&[1, 2], DType::I32)
            }
        );
        let mut wrong_dtype = shards.clone();
        wrong_dtype[1] = Literal::full(&[2, 2], DType::F32, 0.0);
        assert_eq!(
            problem(assemble(&wrong_dtype, &s, &mesh, &[7, 5])),
            AssembleProblem::Shard {
                device: 1,
                given: ty(&[2, 2], DType::F32),
                expected: ty(&[2, 2], DType::I32)
            }
        );
        let partial = sharding("(model, _) unreduced={data}");
        let unreduced = problem(assemble(&shards, &partial, &mesh, &[7, 5]));
        assert_eq!(
            unreduced.to_string(),
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
