//! Dynamic slices, scans and sorts along split dims, end to end (propagate, partition,
//! run on the thread mesh, compare with the reference interpreter), with golden checks
//! of what they communicate against the plan that gathers the split dim:
//! - `dynamic_slice` of a dim split 4 ways: the devices holding the window contribute
//!   their part (zeros elsewhere) to one all-reduce of the window, no all-gather (none
//!   at all when the user keeps the window's sum pending);
//! - `dynamic_update_slice` into a split dim: each device writes its overlap, no
//!   collective;
//! - `cumsum` / `cumprod` along a split dim: one all-gather of the shard totals (one
//!   element per lane and device), never of the data;
//! - `argsort` along a split dim moves the split to another dim with one all-to-all
//!   (every index depends on the whole lane; `move_split.rs` has the goldens).

mod differential;

use gspmd_core::Executable;
use gspmd_core::ir::{Builder, CollectiveKind, CumulativeKind, DType, Literal, Program, Tensor};
use gspmd_core::sharding::{Mesh, Sharding};
use ndarray::{ArrayD, IxDyn};

fn s(text: &str) -> Sharding {
    text.parse().expect("a sharding")
}

fn mesh14() -> Mesh {
    Mesh::new([("data", 1), ("model", 4)]).expect("a mesh")
}

fn mesh24() -> Mesh {
    Mesh::new([("data", 2), ("model", 4)]).expect("a mesh")
}

/// f32 values on a 1/8 grid in `[-2, 2)`: sums of them are exact in any order.
fn grid(shape: &[usize], seed: usize) -> Literal {
    let n: usize = shape.iter().product();
    let v: Vec<f32> = (0..n)
        .map(|i| ((i * 7 + seed * 13 + i / 5) % 32) as f32 / 8.0 - 2.0)
        .collect();
    Literal::F32(ArrayD::from_shape_vec(IxDyn(shape), v).expect("a shape"))
}

fn i32_scalar(v: i32) -> Literal {
    Literal::I32(ArrayD::from_elem(IxDyn(&[]), v))
}

/// Compiles `program` for `mesh`, runs it on `inputs` and checks every output against
/// the interpreter: within `1e-5` of the largest magnitude for f32, exactly otherwise.
fn compile_and_check(program: &Program, mesh: &Mesh, inputs: &[Literal]) -> Executable {
    differential::compile_and_check(program, mesh, inputs, 1e-5)
}

/// `(count, bytes received per device)` of collectives of `kind`.
fn collective(exe: &Executable, kind: &str) -> (usize, usize) {
    let stats = exe.spmd().collectives();
    let kind: CollectiveKind = kind.parse().expect("a collective kind");
    stats.by_kind.get(&kind).copied().unwrap_or_default()
}

/// `x: f32[rows, 64]` split over `model` along its rows; the `[16, 64]` block at a
/// start parameter; with `gather`, `x` is made replicated first (the plan this handler
/// replaces).
fn row_window(rows: usize, gather: bool) -> Program {
    let b = Builder::new("row_window");
    let x = b
        .parameter("x", [rows, 64], DType::F32)
        .annotate(s("(model, _)"));
    let start = b.parameter("start", [], DType::I32);
    let zero = b.constant(i32_scalar(0));
    let x = if gather { x.shard(s("(_, _)")) } else { x };
    let y = x.dynamic_slice(&[&start, &zero], &[16, 64]);
    b.finish(&[&y.shard(s("(_, _)"))]).expect("traces")
}

#[test]
fn dynamic_slice_of_a_split_dim_all_reduces_the_window_not_the_dim() {
    let rows = 1000;
    let program = row_window(rows, false);
    let x = grid(&[rows, 64], 1);
    // Inside one block, across two blocks (250 rows each), clamped below and above.
    for start in [3, 240, -9, 995, 700] {
        let exe = compile_and_check(&program, &mesh14(), &[x.clone(), i32_scalar(start)]);
        // One all-reduce of the [16, 64] f32 window (4,096 B; a ring all-reduce over 4
        // devices receives 2 * 3/4 of it) and nothing else.
        assert_eq!(
            collective(&exe, "all_reduce"),
            (1, 6144),
            "{}",
            exe.report()
        );
        assert_eq!(exe.spmd().collectives().total(), 1, "{}", exe.report());
    }
    // Gathering the dim instead: each device receives the 3 blocks it lacks.
    let gathered = row_window(rows, true);
    let exe = compile_and_check(&gathered, &mesh14(), &[x, i32_scalar(240)]);
    assert_eq!(
        collective(&exe, "all_gather"),
        (1, 3 * 250 * 64 * 4),
        "{}",
        exe.report()
    );
    println!(
        "dynamic_slice [16, 64] of f32[1000, 64] split 4 ways: 6,144 B/device, against 192,000 B to gather the dim"
    );
}

/// A window whose user asks for the sum over `model` unreduced is left pending: no
/// collective at all, and the output assembles (sums) to the window.
#[test]
fn a_window_kept_pending_needs_no_collective() {
    let b = Builder::new("pending_window");
    let x = b
        .parameter("x", [1000, 64], DType::F32)
        .annotate(s("(model, _)"));
    let i = b.parameter("i", [], DType::I32);
    let zero = b.constant(i32_scalar(0));
    let window = x.dynamic_slice(&[&i, &zero], &[16, 64]);
    let pending = window.shard(s("(_, _) unreduced={model}"));
    let program = b.finish(&[&pending]).expect("traces");
    for i in [245, 990] {
        let inputs = [grid(&[1000, 64], 7), i32_scalar(i)];
        let exe = compile_and_check(&program, &mesh14(), &inputs);
        assert_eq!(exe.spmd().collectives().total(), 0, "{}", exe.report());
    }
}

/// On 2x4, a batch split over `data` passes through; the window along the dim split
/// over `model` is all-reduced over `model` alone. Starts come from parameters, in and
/// out of range.
#[test]
fn dynamic_slice_on_a_2x4_mesh_reduces_over_the_sliced_dims_axes_only() {
    let b = Builder::new("tokens");
    let x = b
        .parameter("x", [8, 100], DType::F32)
        .annotate(s("(data, model)"));
    let (i, j) = (
        b.parameter("i", [], DType::I32),
        b.parameter("j", [], DType::I32),
    );
    let y = x.dynamic_slice(&[&i, &j], &[8, 10]);
    let program = b.finish(&[&y]).expect("traces");
    for (i, j) in [(0, 0), (3, 20), (-1, 93), (9, -50)] {
        let inputs = [grid(&[8, 100], 2), i32_scalar(i), i32_scalar(j)];
        let exe = compile_and_check(&program, &mesh24(), &inputs);
        let propagated = exe.propagated().node(y.id().expect("traced"));
        assert_eq!(
            propagated.sharding.as_ref().map(ToString::to_string),
            Some("(data, _)".to_string())
        );
        // The [4, 10] local window, all-reduced over the 4 `model` devices.
        assert_eq!(collective(&exe, "all_reduce"), (1, 2 * 3 * 160 / 4));
        assert_eq!(exe.spmd().collectives().total(), 1, "{}", exe.report());
    }
}

#[test]
fn dynamic_update_slice_into_a_split_dim_needs_no_collective() {
    let b = Builder::new("write");
    let x = b
        .parameter("x", [1000, 64], DType::F32)
        .annotate(s("(model, _)"));
    let u = b.parameter("u", [16, 64], DType::F32);
    let start = b.parameter("start", [], DType::I32);
    let zero = b.constant(i32_scalar(0));
    let y = x.dynamic_update_slice(&u, &[&start, &zero]);
    let program = b.finish(&[&y.shard(s("(model, _)"))]).expect("traces");
    for start in [0, 240, 990, -3] {
        let inputs = [grid(&[1000, 64], 3), grid(&[16, 64], 4), i32_scalar(start)];
        let exe = compile_and_check(&program, &mesh14(), &inputs);
        assert_eq!(exe.spmd().collectives().total(), 0, "{}", exe.report());
    }
}

/// `x: f32[8, 1000]` split `(data, model)`, scanned along the dim split over `model`
/// (or gathered along it first).
fn scan(kind: CumulativeKind, reverse: bool, gather: bool) -> Program {
    let b = Builder::new("scan");
    let x = b
        .parameter("x", [8, 1000], DType::F32)
        .annotate(s("(data, model)"));
    let y: Tensor = if gather {
        let whole = s("(data, _)");
        x.shard(whole.clone())
            .cumulative(kind, 1, reverse)
            .shard(whole)
    } else {
        x.cumulative(kind, 1, reverse)
    };
    b.finish(&[&y.shard(s("(data, model)"))]).expect("traces")
}

#[test]
fn cumsum_along_a_split_dim_gathers_only_the_shard_totals() {
    let x = grid(&[8, 1000], 5);
    for reverse in [false, true] {
        let exe = compile_and_check(
            &scan(CumulativeKind::Sum, reverse, false),
            &mesh24(),
            std::slice::from_ref(&x),
        );
        // Local totals [4, 1] f32 gathered to [4, 4]: 48 bytes received per device.
        assert_eq!(collective(&exe, "all_gather"), (1, 48), "{}", exe.report());
        assert_eq!(exe.spmd().collectives().total(), 1, "{}", exe.report());
    }
    // Gathering the data: 3 of the 4 [4, 250] blocks arrive, then the local result is
    // sliced back.
    let exe = compile_and_check(&scan(CumulativeKind::Sum, false, true), &mesh24(), &[x]);
    assert_eq!(collective(&exe, "all_gather"), (1, 3 * 4 * 250 * 4));
    println!("cumsum along a dim of 1000 split 4 ways: 48 B/device, against 12,000 B to gather it");
}

#[test]
fn cumprod_along_a_split_dim_is_exact_with_zeros_and_uneven_blocks() {
    // 10 elements over 4 devices: blocks of 3, 3, 3, 1 (the last padded).
    let b = Builder::new("cumprod");
    let x = b
        .parameter("x", [3, 10], DType::F32)
        .annotate(s("(_, model)"));
    let forward = x.cumprod(1);
    let backward = x.cumulative(CumulativeKind::Prod, 1, true);
    let n = b.parameter("n", [10], DType::I32).annotate(s("(model)"));
    let counts = n.cumsum(0);
    let program = b.finish(&[&forward, &backward, &counts]).expect("traces");
    let mut v: Vec<f32> = (0..30).map(|i| [1.5, -0.5, 2.0, 1.0][i % 4]).collect();
    v[13] = 0.0;
    let x = Literal::F32(ArrayD::from_shape_vec(IxDyn(&[3, 10]), v).expect("a shape"));
    let n = Literal::I32(ArrayD::from_shape_vec(IxDyn(&[10]), (0..10).collect()).expect("a shape"));
    let exe = compile_and_check(&program, &mesh14(), &[x, n]);
    // One gather of totals per scan, nothing else; the two f32 scans' gathers are
    // independent and combined into one.
    assert_eq!(collective(&exe, "all_gather").0, 2, "{}", exe.report());
    assert_eq!(exe.spmd().collectives().total(), 2, "{}", exe.report());
}

#[test]
fn argsort_along_a_split_dim_moves_the_split_and_argmax_reduces() {
    let b = Builder::new("sort");
    let x = b
        .parameter("x", [8, 12], DType::F32)
        .annotate(s("(data, model)"));
    let order = x.argsort(1, true);
    let best = x.argmax(1);
    let program = b.finish(&[&order, &best]).expect("traces");
    let exe = compile_and_check(&program, &mesh24(), &[grid(&[8, 12], 6)]);
    // argsort: the split of the sorted dim moves to the rows (one all-to-all of the
    // [4, 3] blocks over `model`, no gather); argmax: reduce max and reduce min of
    // indices, each one all-reduce over `model`.
    assert_eq!(collective(&exe, "all_gather").0, 0, "{}", exe.report());
    assert_eq!(collective(&exe, "all_to_all").0, 1, "{}", exe.report());
    assert_eq!(collective(&exe, "all_reduce").0, 2, "{}", exe.report());
}
