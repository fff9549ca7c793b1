//! Gather and scatter on a mesh: golden collectives of the vocabulary-parallel
//! embedding (Megatron's: one all-reduce of the looked-up rows, no gather of the
//! table) and of its gradient (a scatter-add into each device's own rows), the
//! index-parallel lookup (no collective), and ids out of range and negative, every run
//! compared with the reference interpreter.

mod differential;

use differential::compile_and_check;
use gspmd_core::Executable;
use gspmd_core::autodiff::grad;
use gspmd_core::ir::{Builder, CollectiveKind, DType, Literal, Program, ScatterDims, Tensor};
use gspmd_core::sharding::{Mesh, Sharding};
use ndarray::{ArrayD, IxDyn};

fn s(text: &str) -> Sharding {
    text.parse().unwrap()
}

/// f32 values on a grid in [-1.5, 1.5), bools, i32 ids in `-3 ..= vocab + 3`: out of range at
/// both ends for a vocabulary of `vocab` rows.
fn input(shape: &[usize], dtype: DType, seed: usize, vocab: i32) -> Literal {
    let n: usize = shape.iter().product();
    match dtype {
        DType::I32 => {
            let v: Vec<i32> = (0..n)
                .map(|i| ((i * 7 + seed * 13) as i32 % (vocab + 7)) - 3)
                .collect();
            Literal::I32(ArrayD::from_shape_vec(IxDyn(shape), v).unwrap())
        }
        DType::Bool => {
            let v: Vec<bool> = (0..n).map(|i| (i * 7 + seed).is_multiple_of(3)).collect();
            Literal::Bool(ArrayD::from_shape_vec(IxDyn(shape), v).unwrap())
        }
        DType::F32 => {
            let v: Vec<f32> = (0..n)
                .map(|i| ((i * 7 + seed * 13) % 29) as f32 / 9.0 - 1.5)
                .collect();
            Literal::F32(ArrayD::from_shape_vec(IxDyn(shape), v).unwrap())
        }
        DType::BF16 | DType::F16 => input(shape, DType::F32, seed, vocab).convert(dtype),
        other => panic!("not covered by this test: {other:?}"),
    }
}

fn inputs(program: &Program, vocab: i32) -> Vec<Literal> {
    (program.params.iter().enumerate())
        .map(|(i, &p)| input(&program.ty(p).shape, program.ty(p).dtype, i, vocab))
        .collect()
}

fn build(name: &str, f: impl FnOnce(&Builder) -> Vec<Tensor>) -> Program {
    let b = Builder::new(name);
    let outs = f(&b);
    let refs: Vec<&Tensor> = outs.iter().collect();
    b.finish(&refs).unwrap()
}

/// Compiles `program` for `mesh`, runs it on threads with [`inputs`] for `vocab` and
/// compares every output with the interpreter (f32 within 1e-4 of the largest value,
/// others exactly).
fn run_and_compare(program: &Program, mesh: &Mesh, vocab: i32) -> Executable {
    compile_and_check(program, mesh, &inputs(program, vocab), 1e-4)
}

fn mesh24() -> Mesh {
    Mesh::new([("data", 2), ("model", 4)]).unwrap()
}

const B: usize = 4;
const S: usize = 6;
const V: usize = 32;
const D: usize = 8;

/// `[B, S]` ids split over `data` looked up in a `[V, D]` table split over `model`.
fn embedding(b: &Builder, vocab: usize) -> (Tensor, Tensor) {
    let table = b
        .parameter("table", [vocab, D], DType::F32)
        .annotate(s("(model, _)"));
    let ids = b
        .parameter("ids", [B, S], DType::I32)
        .annotate(s("(data, _)"));
    let rows = table.embedding(&ids);
    (table, rows)
}

#[test]
fn vocabulary_parallel_embedding_is_one_all_reduce_of_the_local_rows() {
    let p = build("embedding", |b| vec![embedding(b, V).1]);
    let exe = run_and_compare(&p, &mesh24(), V as i32);
    let stats = exe.spmd().collectives();
    assert_eq!(
        (stats.count(CollectiveKind::AllReduce), stats.total()),
        (1, 1),
        "{}",
        exe.report()
    );
    let reduce = (exe.spmd().program.nodes.iter())
        .find(|n| n.op.is_collective())
        .unwrap();
    // The local rows [B/data, S, D], summed over `model`.
    assert_eq!(reduce.ty.shape, vec![B / 2, S, D], "{}", exe.report());
    assert_eq!(
        reduce.op.collective_group().unwrap().axes,
        vec!["model".to_string()]
    );
}

#[test]
fn the_embedding_gradient_adds_into_the_local_vocabulary_with_no_collective_on_the_table() {
    let p = build("embedding_loss", |b| {
        let (_, rows) = embedding(b, V);
        let w = b
            .parameter("w", [B, S, D], DType::F32)
            .annotate(s("(data, _, _)"));
        vec![rows.mul(&w).sum(&[0, 1, 2])]
    });
    let g = grad(&p, 0, &[0]).unwrap();
    let exe = run_and_compare(&g, &mesh24(), V as i32);
    let stats = exe.spmd().collectives();
    let report = exe.report();
    assert_eq!(stats.count(CollectiveKind::AllGather), 0, "{report}");
    // The scatter-add runs on the local vocabulary block [V/model, D].
    let program = &exe.spmd().program;
    let scatter = (program.nodes.iter())
        .find(|n| n.op.name() == "scatter_add")
        .unwrap();
    assert_eq!(scatter.ty.shape, vec![V / 4, D], "{report}");
    // Collectives: the forward's all-reduce of the rows (or of the loss) over `model`,
    // and one over `data` combining the loss's and the table gradient's data-parallel
    // sum of the local block — never a collective over `model` of a table-sized value.
    for node in program.nodes.iter().filter(|n| n.op.is_collective()) {
        let axes = &node.op.collective_group().unwrap().axes;
        let elements: usize = node.ty.shape.iter().product();
        // A block of the table, alone or combined with the loss, or the whole table.
        let table_sized = [V / 4 * D, V / 4 * D + 1, V * D].contains(&elements);
        assert!(
            !(table_sized && axes.contains(&"model".to_string())),
            "{report}"
        );
        if table_sized {
            assert_eq!(node.op.name(), "all_reduce", "{report}");
            assert_eq!(node.ty.shape, vec![1, V / 4 * D + 1], "{report}");
        }
    }
    assert_eq!(stats.total(), 2, "{report}");
}

#[test]
fn index_parallel_gather_with_a_replicated_table_needs_no_collective() {
    let p = build("lookup", |b| {
        let table = b
            .parameter("table", [V, D], DType::F32)
            .annotate(s("(_, _)"));
        let ids = b
            .parameter("ids", [B, S], DType::I32)
            .annotate(s("(data, model)"));
        let x = b
            .parameter("x", [B, S, 5], DType::F32)
            .annotate(s("(data, model, _)"));
        let picks = b.parameter("picks", [B, S, 2], DType::I32);
        vec![table.embedding(&ids), x.take_along_dim(&picks, -1)]
    });
    let exe = run_and_compare(&p, &mesh24(), V as i32);
    assert_eq!(exe.spmd().collectives().total(), 0, "{}", exe.report());
}

#[test]
fn ids_out_of_range_agree_with_the_reference_on_uneven_vocabularies() {
    // 30 rows over 4 devices: blocks of 8, 8, 8 and 6; ids in -3..=33.
    let meshes = [
        Mesh::new([("data", 2), ("model", 4)]).unwrap(),
        Mesh::new([("data", 1), ("model", 3)]).unwrap(),
        Mesh::with_device_order([("data", 4), ("model", 2)], vec![5, 2, 7, 0, 3, 6, 1, 4]).unwrap(),
    ];
    let vocab = 30;
    let p = build("uneven", |b| {
        let (table, rows) = embedding(b, vocab);
        let index = b.parameter("index", [7], DType::I32);
        let updates = b
            .parameter("updates", [7, D], DType::F32)
            .annotate(s("(model, _)"));
        let added = table.index_add(0, &index, &updates);
        // Distinct rows 29, 25, .., 5 and two past the end.
        let four = b.full([9], DType::I32, 4.0);
        let distinct = b
            .iota([9], 0, DType::I32)
            .reverse(&[0])
            .mul(&four)
            .sub(&b.full([9], DType::I32, 3.0));
        let rows_at = ScatterDims::along(0, 2);
        let replacement = b.parameter("replacement", [9, D], DType::F32);
        let replaced = table.scatter(&distinct, &replacement, &rows_at);
        vec![rows, added, replaced]
    });
    for mesh in &meshes {
        run_and_compare(&p, mesh, vocab as i32);
        let loss = build("uneven_loss", |b| {
            let (_, rows) = embedding(b, vocab);
            vec![rows.mul(&rows).sum(&[0, 1, 2])]
        });
        run_and_compare(&grad(&loss, 0, &[0]).unwrap(), mesh, vocab as i32);
    }
}

/// A pending sum of bools is their `or` (the collectives' sum for bool): the rows a
/// device does not hold are `false`, so the vocabulary-parallel lookup holds for bools.
#[test]
fn bool_lookups_are_vocabulary_parallel_too() {
    let p = build("flags", |b| {
        let flags = b
            .parameter("flags", [V, 2], DType::Bool)
            .annotate(s("(model, _)"));
        let ids = b.parameter("ids", [3], DType::I32);
        vec![flags.embedding(&ids)]
    });
    let exe = run_and_compare(&p, &mesh24(), V as i32);
    let stats = exe.spmd().collectives();
    assert_eq!(
        (stats.count(CollectiveKind::AllReduce), stats.total()),
        (1, 1),
        "{}",
        exe.report()
    );
}
