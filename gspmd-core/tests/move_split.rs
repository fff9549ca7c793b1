//! Moving a split instead of gathering it, end to end (propagate, partition, run on the
//! thread mesh, compare with the reference interpreter), with golden checks of the
//! collectives and bytes per device against the peer's (XLA's) plan on the same program:
//! - a sort along a split dim moves the split to another dim with one all-to-all, sorts
//!   locally and keeps the result split there (XLA's `HandleSort`);
//! - a slice of one stage of a stage-split buffer moves only the slice: the owning
//!   devices' part, summed over the stage axis (XLA: the same masked all-reduce);
//! - a reshape whose shards do not line up with the merged or split dims moves only the
//!   misaligned elements by halo exchange on the flattened dims (XLA's
//!   `ReshapeMergeDimsWithHaloExchange`).

mod differential;

use gspmd_core::Executable;
use gspmd_core::ir::{Builder, CollectiveKind, DType, Literal, Program};
use gspmd_core::sharding::{Mesh, Sharding};
use ndarray::{ArrayD, IxDyn};

fn s(text: &str) -> Sharding {
    text.parse().expect("a sharding")
}

fn mesh(axes: &[(&str, usize)]) -> Mesh {
    Mesh::new(axes.iter().copied()).expect("a mesh")
}

/// Distinct f32 values on a 1/8 grid (no ties to sort, sums exact in any order).
fn grid(shape: &[usize], seed: usize) -> Literal {
    let n: usize = shape.iter().product();
    let v: Vec<f32> = (0..n)
        .map(|i| ((i * 37 + seed * 11) % n) as f32 / 8.0 - 2.0)
        .collect();
    Literal::F32(ArrayD::from_shape_vec(IxDyn(shape), v).expect("a shape"))
}

fn check(program: &Program, mesh: &Mesh, inputs: &[Literal]) -> Executable {
    differential::compile_and_check(program, mesh, inputs, 1e-5)
}

/// `(count, bytes received per device)` of collectives of `kind`.
fn collective(exe: &Executable, kind: &str) -> (usize, usize) {
    let stats = exe.spmd().collectives();
    let kind: CollectiveKind = kind.parse().expect("a collective kind");
    stats.by_kind.get(&kind).copied().unwrap_or_default()
}

/// Asserts that the program's only collectives are `count` of `kind`, receiving `bytes`
/// per device in all.
fn only(exe: &Executable, kind: &str, (count, bytes): (usize, usize)) {
    let stats = exe.spmd().collectives();
    let kinds: Vec<&str> = stats.by_kind.keys().map(|k| k.name()).collect();
    assert_eq!(kinds, [kind], "{}", exe.report());
    assert_eq!(collective(exe, kind), (count, bytes), "{}", exe.report());
}

/// The local shape of output `k`.
fn local_output(exe: &Executable, k: usize) -> Vec<usize> {
    let spmd = exe.spmd();
    spmd.program.ty(spmd.program.outputs[k]).shape.to_vec()
}

/// XLA's `HandleSort` with the sort dim split (its `SortShardedOnSortDim` cases): an
/// f32[16, 64] split 4 ways along the sorted dim 1 moves the split to dim 0 with one
/// all-to-all of the [16, 16] block ((4 - 1) / 4 of 1 KiB = 768 B per device, the
/// all-to-all XLA's handler emits to move the split), sorts [4, 64] lanes locally, and
/// the indices stay split on dim 0: [4, 64] per device, 4x smaller than the gathered
/// [16, 64].
#[test]
fn argsort_along_a_split_dim_moves_the_split_by_all_to_all() {
    let b = Builder::new("argsort_moved");
    let x = b
        .parameter("x", [16, 64], DType::F32)
        .annotate(s("(_, model)"));
    let order = x.argsort(1, false);
    let program = b.finish(&[&order]).expect("traces");
    let m = mesh(&[("model", 4)]);
    let exe = check(&program, &m, &[grid(&[16, 64], 1)]);
    only(&exe, "all_to_all", (1, 768));
    assert_eq!(local_output(&exe, 0), [4, 64]);
    assert_eq!(exe.spmd().outputs[0].1, s("(model, _)"));
}

/// `sort` and `top_k` (argsort, then a gather of the values by the indices) along a
/// split dim on a 2x4 mesh: the values follow the indices' moved split, so neither the
/// sort nor the gather of values gathers the sorted dim; the rows end up split 8 ways.
#[test]
fn sort_and_top_k_along_a_split_dim_never_gather_it() {
    let b = Builder::new("sort_moved");
    let x = b
        .parameter("x", [8, 32], DType::F32)
        .annotate(s("(data, model)"));
    let (values, indices) = x.sort(1, true);
    let (top, top_indices) = x.top_k(5, 1);
    let program = b
        .finish(&[&values, &indices, &top, &top_indices])
        .expect("traces");
    let m = mesh(&[("data", 2), ("model", 4)]);
    let exe = check(&program, &m, &[grid(&[8, 32], 2)]);
    // One all-to-all of the [4, 8] block (3/4 of 128 B) serves the sort, the gathers of
    // the values and top_k (XLA's `HandleSort`: the same all-to-all per sort).
    only(&exe, "all_to_all", (1, 96));
    // [8, 32] split (data, model) on rows: [1, 32] per device.
    assert_eq!(local_output(&exe, 0), [1, 32]);
    assert_eq!(local_output(&exe, 3), [1, 5]);
}

/// The sort's result annotated with the sorted dim whole and nothing else split: the
/// user's sharding wins (no moved split to keep), and the sort gathers as before.
#[test]
fn an_annotated_sort_result_keeps_the_users_sharding() {
    let b = Builder::new("argsort_annotated");
    let x = b
        .parameter("x", [16, 64], DType::F32)
        .annotate(s("(_, model)"));
    let order = x.argsort(1, false).annotate(s("(_, _)"));
    let program = b.finish(&[&order]).expect("traces");
    let exe = check(&program, &mesh(&[("model", 4)]), &[grid(&[16, 64], 3)]);
    assert_eq!(local_output(&exe, 0), [16, 64]);
    assert_eq!(collective(&exe, "all_to_all").0, 0, "{}", exe.report());
}

/// An unrolled pipeline's last stage read out of a `[stages, batch, hidden]` buffer
/// split on stages over `stage` (4): `x[3]` lies in the last device's block, so each
/// device keeps its block's part of the slice where it owns it (zeros elsewhere) and
/// one all-reduce of the [8, 32] f32 slice (1 KiB; 2 * 3/4 of it = 1,536 B per device)
/// replaces the gather of the whole buffer (3 blocks of 1 KiB = 3,072 B). The pattern
/// is XLA's for a block one device holds (`SingleDeviceToReplicated`: a select on the
/// partition id, then an all-reduce).
#[test]
fn a_slice_of_one_stage_moves_only_the_slice() {
    let b = Builder::new("last_stage");
    let x = b
        .parameter("x", [4, 8, 32], DType::F32)
        .annotate(s("(stage, _, _)"));
    let last = x
        .slice(&[3, 0, 0], &[4, 8, 32], &[1, 1, 1])
        .reshape([8, 32]);
    let second = x.slice(&[1, 2, 0], &[2, 6, 32], &[1, 1, 2]);
    let program = b.finish(&[&last, &second]).expect("traces");
    let m = mesh(&[("stage", 4)]);
    let exe = check(&program, &m, &[grid(&[4, 8, 32], 4)]);
    // The last stage ([8, 32] = 1 KiB) and the strided [1, 4, 16] piece (256 B), in one
    // combined all-reduce.
    only(&exe, "all_reduce", (1, 1536 + 384));
}

/// The stage read at a run-time index (`dynamic_slice`, XLA's dynamic-slice of a split
/// dim): every device cuts the part of the window inside its block (zeros elsewhere)
/// and the same one all-reduce of the [8, 32] slice (1,536 B per device) moves it.
#[test]
fn a_stage_at_a_run_time_index_moves_only_the_slice() {
    let b = Builder::new("stage_at");
    let x = b
        .parameter("x", [4, 8, 32], DType::F32)
        .annotate(s("(stage, _, _)"));
    let i = b.parameter("i", [], DType::I32);
    let zero = b.constant(Literal::I32(ArrayD::from_elem(IxDyn(&[]), 0)));
    let stage = x.dynamic_slice(&[&i, &zero, &zero], &[1, 8, 32]);
    let program = b.finish(&[&stage.reshape([8, 32])]).expect("traces");
    let m = mesh(&[("stage", 4)]);
    for at in [0, 2, 3] {
        let index = Literal::I32(ArrayD::from_elem(IxDyn(&[]), at));
        let exe = check(&program, &m, &[grid(&[4, 8, 32], 9), index]);
        only(&exe, "all_reduce", (1, 1536));
    }
}

/// On a 2x4 mesh with the buffer also split on its batch dim over `data`, two stages
/// inside one block whose result propagation keeps split over `stage` (2 rows over 4
/// shards, one row each on the first two): the halo exchange sends each of those
/// devices just its row ([1, 4, 16], 256 B) from the owner, piece by piece — two
/// shifts, 512 B per device — where a reduce-scatter of the owner's block receives
/// 768 B and the gather it replaces 3 blocks (1,536 B).
#[test]
fn a_split_stage_slice_on_a_2x4_mesh_moves_only_the_rows_each_device_keeps() {
    let b = Builder::new("stage_2x4");
    let x = b
        .parameter("x", [8, 8, 16], DType::F32)
        .annotate(s("(stage, data, _)"));
    // Rows 4..6 of 8 in blocks of 2: inside the third block.
    let inside = x.slice(&[4, 0, 0], &[6, 8, 16], &[1, 1, 1]);
    let program = b.finish(&[&inside]).expect("traces");
    let m = mesh(&[("data", 2), ("stage", 4)]);
    let exe = check(&program, &m, &[grid(&[8, 8, 16], 5)]);
    only(&exe, "collective_shift", (2, 512));
}

/// XLA's `ReshapeMergeDimsWithHaloExchange` (spmd_partitioner_test.cc): s32[2,3,7,10]
/// split 2 ways on dim 2 reshaped to s32[3,2,1,14,5] split 2 ways on dim 3. XLA reshapes
/// locally, sends a [3,2,1,1,5] slice (30 s32, 120 B) to the next device with one
/// collective-permute and cuts the window: gspmd moves the same 30 elements with one
/// shift of the flattened group, no gather.
#[test]
fn reshape_merge_dims_with_halo_exchange_mirrors_xla() {
    let b = Builder::new("reshape_halo");
    let x = b
        .parameter("x", [2, 3, 7, 10], DType::I32)
        .annotate(s("(_, _, x, _)"));
    let y = x.reshape([3, 2, 1, 14, 5]).annotate(s("(_, _, _, x, _)"));
    let program = b.finish(&[&y]).expect("traces");
    let n = 2 * 3 * 7 * 10;
    let v: Vec<i32> = (0..n).collect();
    let input = Literal::I32(ArrayD::from_shape_vec(IxDyn(&[2, 3, 7, 10]), v).unwrap());
    let exe = check(&program, &mesh(&[("x", 2)]), &[input]);
    only(&exe, "collective_shift", (1, 120));
    assert_eq!(local_output(&exe, 0), [3, 2, 1, 7, 5]);
}

/// Uneven merges and splits on 4 shards: [6, 4] -> [24] (blocks of 2 rows = 8 elements
/// become runs of 6: each device receives at most 6 elements from its left neighbour,
/// where a gather receives 3 blocks of 8), [24] -> [6, 4], and [2, 10, 3] -> [2, 30]
/// with `data` on the outer dim, on a 2x4 mesh.
#[test]
fn uneven_reshapes_move_only_the_misaligned_elements() {
    let m = mesh(&[("data", 2), ("model", 4)]);
    let b = Builder::new("merge_6x4");
    let x = b
        .parameter("x", [6, 4], DType::F32)
        .annotate(s("(model, _)"));
    let y = x.reshape([24]).annotate(s("(model)"));
    let program = b.finish(&[&y]).expect("traces");
    let exe = check(&program, &m, &[grid(&[6, 4], 6)]);
    // 6 f32 = 24 B per device.
    only(&exe, "collective_shift", (1, 24));

    let b = Builder::new("split_24");
    let x = b.parameter("x", [24], DType::F32).annotate(s("(model)"));
    let y = x.reshape([6, 4]).annotate(s("(model, _)"));
    let program = b.finish(&[&y]).expect("traces");
    let exe = check(&program, &m, &[grid(&[24], 7)]);
    // Runs of 8 from blocks of 6: the third device takes 6 f32 from its right neighbour.
    only(&exe, "collective_shift", (1, 24));

    let b = Builder::new("merge_10x3");
    let x = b
        .parameter("x", [2, 10, 3], DType::F32)
        .annotate(s("(data, model, _)"));
    let y = x.reshape([2, 30]).annotate(s("(data, model)"));
    let program = b.finish(&[&y]).expect("traces");
    let exe = check(&program, &m, &[grid(&[2, 10, 3], 8)]);
    // Blocks of 3 rows (9 elements) become runs of 8: at most 3 f32 from the left, per
    // device's one row of the `data`-split dim.
    only(&exe, "collective_shift", (1, 12));
}
