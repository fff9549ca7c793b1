//! DSL models on real meshes: each model written with `#[gspmd::model]` is traced,
//! compiled (propagate + partition) and RUN on a matrix of thread meshes, and its
//! outputs are compared with the reference interpreter's; golden checks pin what
//! propagation and partitioning produce for the shardings the models ask for.
//!
//! The Megatron MLP and the 2-D Transformer are the very models of `examples/mlp.rs`
//! and `examples/transformer.rs` (included below), so the examples cannot drift from
//! what is tested; their `main`s are run too.
//!
//! Tolerance: |got - want| <= 1e-4 * max |want| per output (f32 sums in another order).

use gspmd::ir::{Op, Program};
use gspmd::ndarray::{ArrayD, IxDyn};
use gspmd::prelude::*;

#[path = "../examples/mlp.rs"]
mod mlp_example;
#[path = "../examples/transformer.rs"]
mod transformer_example;

use gspmd::models::transformer::{block, stack as transformer};
use mlp_example::mlp;

// ---- harness ----------------------------------------------------------------------

/// A deterministic input of `shape`, values in [-1, 1), different for each `seed`.
fn input(shape: &[usize], seed: usize) -> Literal {
    let n: usize = shape.iter().product();
    let values: Vec<f32> = (0..n)
        .map(|i| ((i * 37 + seed * 101) % 61) as f32 / 30.5 - 1.0)
        .collect();
    Literal::F32(ArrayD::from_shape_vec(IxDyn(shape), values).unwrap())
}

fn inputs(program: &Program) -> Vec<Literal> {
    program
        .params
        .iter()
        .enumerate()
        .map(|(k, &p)| {
            let ty = program.ty(p);
            match ty.dtype {
                // A random key (the Transformer's dropout).
                DType::I32 => Literal::I32(ArrayD::from_shape_fn(IxDyn(&ty.shape), |i| {
                    (i[0] * 7 + k) as i32
                })),
                _ => input(&ty.shape, k),
            }
        })
        .collect()
}

/// The meshes every two-axis (`data`, `model`) model runs on: 1x1, 1x2, 2x2, 2x4, 4x2
/// with a non-default device order, and 2x2x2 with a `pipe` axis the model never names
/// (everything replicated over it).
fn meshes_2d() -> Vec<Mesh> {
    vec![
        Mesh::new([("data", 1), ("model", 1)]).unwrap(),
        Mesh::new([("data", 1), ("model", 2)]).unwrap(),
        Mesh::new([("data", 2), ("model", 2)]).unwrap(),
        Mesh::new([("data", 2), ("model", 4)]).unwrap(),
        Mesh::with_device_order([("data", 4), ("model", 2)], vec![6, 1, 4, 3, 0, 7, 2, 5]).unwrap(),
        Mesh::new([("pipe", 2), ("data", 2), ("model", 2)]).unwrap(),
    ]
}

/// Compiles `program` for each mesh, runs it on a thread mesh and compares every output
/// with the reference interpreter's.
fn check_on_meshes(program: &Program, meshes: &[Mesh]) {
    let inputs = inputs(program);
    let want = interpret(program, &inputs).unwrap();
    for mesh in meshes {
        let context = format!("{} on {mesh}", program.name);
        let exe = compile(program, mesh).unwrap_or_else(|e| panic!("{context}: {e}"));
        let threads = ThreadMesh::new(mesh.clone()).unwrap();
        let got = exe
            .run(&threads, &inputs)
            .unwrap_or_else(|e| panic!("{context}: {e}"));
        assert_eq!(got.len(), want.len(), "{context}");
        for (k, (w, g)) in want.iter().zip(&got).enumerate() {
            let (w, g) = (w.as_f32().unwrap(), g.as_f32().unwrap());
            assert_eq!(w.shape(), g.shape(), "{context}, output {k}");
            let scale = w.iter().fold(0.0f32, |m, x| m.max(x.abs()));
            let diff = w
                .iter()
                .zip(g.iter())
                .fold(0.0f32, |m, (a, b)| m.max((a - b).abs()));
            assert!(
                diff <= 1e-4 * scale,
                "{context}, output {k}: max diff {diff} (max |value| {scale})\n{}",
                exe.report()
            );
        }
    }
}

/// Propagated shardings of the values named `name`, in program order.
fn shardings_of(p: &Program, name: &str) -> Vec<String> {
    p.nodes
        .iter()
        .filter(|n| n.name.as_deref() == Some(name))
        .map(|n| n.sharding.as_ref().unwrap().to_string())
        .collect()
}

fn output_sharding(p: &Program, k: usize) -> String {
    p.node(p.outputs[k]).sharding.as_ref().unwrap().to_string()
}

/// Mesh axes of each collective of the per-device program, with the op's name.
fn collectives(exe: &Executable) -> Vec<(&'static str, Vec<String>)> {
    exe.spmd()
        .program
        .nodes
        .iter()
        .filter_map(|n| match &n.op {
            Op::AllReduce { group, .. }
            | Op::AllGather { group, .. }
            | Op::ReduceScatter { group, .. }
            | Op::AllToAll { group, .. }
            | Op::CollectivePermute { group, .. } => Some((n.op.name(), group.axes.clone())),
            _ => None,
        })
        .collect()
}

fn mesh24() -> Mesh {
    Mesh::new([("data", 2), ("model", 4)]).unwrap()
}

// ---- Megatron MLP -------------------------------------------------------------------

fn mlp_program() -> Program {
    mlp::trace(mlp::Dims { B: 8, D: 16, F: 32 }).unwrap()
}

#[test]
fn mlp_runs_on_every_mesh() {
    check_on_meshes(&mlp_program(), &meshes_2d());
}

#[test]
fn mlp_shardings_after_propagation() {
    let exe = compile(&mlp_program(), &mesh24()).unwrap();
    let p = exe.propagated();
    assert_eq!(shardings_of(p, "h"), ["(data, model)"]);
    assert_eq!(shardings_of(p, "x"), ["(data, _)"]);
    assert_eq!(shardings_of(p, "w1"), ["(_, model)"]);
    assert_eq!(shardings_of(p, "w2"), ["(model, _)"]);
    assert_eq!(output_sharding(p, 0), "(data, _)");
}

#[test]
fn mlp_on_2x4_has_exactly_one_all_reduce_over_model() {
    let exe = compile(&mlp_program(), &mesh24()).unwrap();
    // h is split over `model` on its contracted dim, so the second matmul gives partial
    // sums over `model`: one all-reduce of the local [B/2, D] output, nothing else.
    assert_eq!(
        collectives(&exe),
        [("all_reduce", vec!["model".to_string()])],
        "{}",
        exe.report()
    );
    let stats = exe.spmd().collectives();
    // Ring all-reduce of f32[4, 16] over 4 devices: 2 * 3/4 of 256 bytes.
    assert_eq!(stats.bytes(), 2 * (4 * 16 * 4) * 3 / 4);
    assert!(exe.spmd().warnings.is_empty(), "{:?}", exe.spmd().warnings);
}

#[test]
fn mlp_example_runs() {
    mlp_example::main().unwrap();
}

// ---- the 2-D Transformer: a helper model per layer, a loop over layers ---------------

const LAYERS: usize = 2;

fn transformer_program() -> Program {
    let dims = transformer::Dims {
        B: 4,
        S: 4,
        D: 16,
        L: LAYERS,
        H: 4,
        K: 4,
        F: 32,
    };
    transformer::trace(dims, 0.0).unwrap()
}

#[test]
fn transformer_runs_on_every_mesh() {
    check_on_meshes(&transformer_program(), &meshes_2d());
}

#[test]
fn one_transformer_block_alone_runs_on_every_mesh() {
    // The block's `#[shard] let`s and its weights' shardings from `transformer::Block`;
    // its residual dropout draws the same masks on every mesh (layer 1's sites).
    let dims = block::Dims {
        B: 4,
        S: 4,
        D: 8,
        H: 2,
        K: 4,
        F: 16,
    };
    check_on_meshes(&block::trace(dims, 0.25, 1).unwrap(), &meshes_2d());
}

#[test]
fn transformer_shardings_after_propagation_are_2d() {
    let exe = compile(&transformer_program(), &mesh24()).unwrap();
    let p = exe.propagated();
    let every_layer = |s: &str| vec![s.to_string(); LAYERS];
    // Batch over `data`, heads over `model`, for the attention's values.
    for name in ["q", "scores", "context"] {
        assert_eq!(
            shardings_of(p, name),
            every_layer("(data, model, _, _)"),
            "{name}"
        );
    }
    // The residual stream is split by batch only; the FFN's hidden dim over `model`.
    assert_eq!(shardings_of(p, "attended"), every_layer("(data, _, _)"));
    assert_eq!(shardings_of(p, "hidden"), every_layer("(data, _, model)"));
    assert_eq!(output_sharding(p, 0), "(data, _, _)");
    // The annotated weights keep their 2-D shardings.
    assert_eq!(shardings_of(p, "layers.attn.wq"), ["(_, data, model, _)"]);
    assert_eq!(shardings_of(p, "layers.ffn.w2"), ["(_, model, data)"]);
}

#[test]
fn transformer_on_2x4_gathers_weights_over_data_and_reduces_activations_over_model() {
    let exe = compile(&transformer_program(), &mesh24()).unwrap();
    let all = collectives(&exe);
    let data = vec!["data".to_string()];
    let model = vec!["model".to_string()];
    // Per layer: each of the 6 weights is split over `data` on its model dim and is
    // all-gathered over `data` once; those gathers depend on nothing but the weights, so
    // the combiner makes them one. The two matmuls contracting a `model`-split dim
    // (attention output, FFN output) give partial sums all-reduced over `model`, each
    // depending on the one before. Activations are never gathered.
    let gathers: Vec<_> = all.iter().filter(|c| c.0 == "all_gather").collect();
    let reduces: Vec<_> = all.iter().filter(|c| c.0 == "all_reduce").collect();
    assert_eq!(gathers.len(), 1, "{}", exe.spmd().report());
    assert_eq!(reduces.len(), 2 * LAYERS, "{}", exe.spmd().report());
    assert_eq!(all.len(), 1 + 2 * LAYERS, "{}", exe.spmd().report());
    assert!(gathers.iter().all(|c| c.1 == data), "{all:?}");
    assert!(reduces.iter().all(|c| c.1 == model), "{all:?}");
    // Every all-reduce is of the local residual block [B/2, S, D].
    for n in exe
        .spmd()
        .program
        .nodes
        .iter()
        .filter(|n| n.op.name() == "all_reduce")
    {
        assert_eq!(n.ty.shape, [2, 4, 16]);
    }
    assert!(exe.spmd().warnings.is_empty(), "{:?}", exe.spmd().warnings);
}

#[test]
fn transformer_example_runs() {
    transformer_example::main().unwrap();
}

// ---- an einsum model on a three-axis mesh -------------------------------------------

/// A mixture of experts without routing: every expert `e` transforms every token, the
/// experts' outputs are summed. Experts over `expert`, the hidden dim over `model`,
/// tokens over `data`.
#[gspmd::model(mesh = (data, expert, model), out = (data, _))]
fn experts(
    #[shard(data, _)] x: Tensor<B, D>,
    #[shard(expert, _, model)] w_in: Tensor<E, D, F>,
    #[shard(expert, model, _)] w_out: Tensor<E, F, D>,
) -> Tensor<B, D> {
    #[shard(expert, data, model)]
    let h = einsum("bd,edf->ebf", &x, &w_in).relu();
    einsum("ebf,efd->bd", &h, &w_out)
}

fn experts_program() -> Program {
    experts::trace(experts::Dims {
        B: 8,
        D: 8,
        E: 4,
        F: 16,
    })
    .unwrap()
}

#[test]
fn experts_run_on_every_mesh() {
    let meshes: Vec<Mesh> = [[1, 1, 1], [1, 1, 2], [2, 2, 1], [2, 2, 2], [1, 4, 2]]
        .into_iter()
        .map(|sizes| experts::mesh(sizes).unwrap())
        .chain([Mesh::with_device_order(
            [("data", 2), ("expert", 2), ("model", 2)],
            vec![3, 6, 0, 5, 2, 7, 4, 1],
        )
        .unwrap()])
        .collect();
    check_on_meshes(&experts_program(), &meshes);
}

#[test]
fn experts_on_2x2x2_all_reduce_once_over_expert_and_model() {
    let mesh = experts::mesh([2, 2, 2]).unwrap();
    let exe = compile(&experts_program(), &mesh).unwrap();
    let p = exe.propagated();
    assert_eq!(shardings_of(p, "h"), ["(expert, data, model)"]);
    assert_eq!(output_sharding(p, 0), "(data, _)");
    // The second einsum contracts e (split over `expert`) and f (over `model`): its
    // result is a partial sum over both, and one all-reduce over both axes is all the
    // communication.
    assert_eq!(
        collectives(&exe),
        [(
            "all_reduce",
            vec!["expert".to_string(), "model".to_string()]
        )],
        "{}",
        exe.spmd().report()
    );
}
