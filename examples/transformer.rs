//! A stack of Transformer layers with GSPMD's 2-D "finalized" sharding (paper section
//! 5.1), written with `#[gspmd::model]`: batch over `data`; attention heads and the
//! FFN's hidden dim over `model`; weights split over both axes (their model dim over
//! `data`, so each device stores 1/8 of every weight and gathers it just in time).
//! Compiled for a 2x4 mesh, run on 8 threads, compared with the reference interpreter.
//!
//! ```text
//! cargo run --release --example transformer
//! ```

use gspmd::ndarray::{ArrayD, Dimension, IxDyn};
use gspmd::prelude::*;

/// Layer `l` of a weight stacked over layers (`[L, ...]` → `[...]`).
fn layer(w: &Tensor, l: usize) -> Tensor {
    let rest = w.shape()[1..].to_vec();
    w.slice_axis(0, l, l + 1).reshape(rest)
}

/// `scores: [B, H, S, T]` with every key after its query (`t > s`) masked to -1e9.
/// The mask is built in the program: two iotas, a comparison, a select.
fn causal(scores: &Tensor) -> Tensor {
    let b = scores.builder();
    let (s, t) = (scores.shape()[2], scores.shape()[3]);
    let query = b.iota([s, t], 0, DType::I32);
    let key = b.iota([s, t], 1, DType::I32);
    query.ge(&key).select(scores, &scores.scalar_like(-1e9))
}

/// Causal multi-head self-attention over `x: [B, S, D]` with `wq, wk, wv: [D, H, K]`
/// and `wo: [H, K, D]`.
fn attention(x: &Tensor, wq: &Tensor, wk: &Tensor, wv: &Tensor, wo: &Tensor) -> Tensor {
    let q = einsum("bsd,dhk->bhsk", x, wq).named("q");
    let k = einsum("btd,dhk->bhtk", x, wk);
    let v = einsum("btd,dhk->bhtk", x, wv);
    let scale = 1.0 / (q.shape()[3] as f32).sqrt();
    let scores = causal(&(einsum("bhsk,bhtk->bhst", &q, &k) * scale)).named("scores");
    let context = einsum("bhst,bhtk->bhsk", &scores.softmax(-1), &v).named("context");
    einsum("bhsk,hkd->bsd", &context, wo)
}

/// One pre-norm Transformer layer: `x + attention(ln(x))`, then `y + ffn(ln(y))` with a
/// GELU FFN. A model itself, so its `#[shard]`s pin the activations of every layer
/// the stack calls it for (and it can be traced and compiled alone).
#[gspmd::model(mesh = (data, model))]
pub fn block(
    x: Tensor<B, S, D>,
    wq: Tensor<D, H, K>,
    wk: Tensor<D, H, K>,
    wv: Tensor<D, H, K>,
    wo: Tensor<H, K, D>,
    w1: Tensor<D, F>,
    w2: Tensor<F, D>,
) -> Tensor<B, S, D> {
    let a = attention(&x.layer_norm(-1, 1e-5), &wq, &wk, &wv, &wo);
    #[shard(data, _, _)]
    let attended = &x + &a;
    #[shard(data, _, model)]
    let hidden = einsum("bsd,df->bsf", &attended.layer_norm(-1, 1e-5), &w1).gelu();
    &attended + &einsum("bsf,fd->bsd", &hidden, &w2)
}

/// `L` layers of [`block`], weights stacked over layers. The annotations are the
/// paper's 2-D finalized sharding of the weights.
#[gspmd::model(mesh = (data, model), out = (data, _, _))]
pub fn transformer(
    #[shard(data, _, _)] x: Tensor<B, S, D>,
    #[shard(_, data, model, _)] wq: Tensor<L, D, H, K>,
    #[shard(_, data, model, _)] wk: Tensor<L, D, H, K>,
    #[shard(_, data, model, _)] wv: Tensor<L, D, H, K>,
    #[shard(_, model, _, data)] wo: Tensor<L, H, K, D>,
    #[shard(_, data, model)] w1: Tensor<L, D, F>,
    #[shard(_, model, data)] w2: Tensor<L, F, D>,
) -> Tensor<B, S, D> {
    let mut x = x;
    for l in 0..wq.shape()[0] {
        let w = |stacked: &Tensor| layer(stacked, l);
        x = block(x, w(&wq), w(&wk), w(&wv), w(&wo), w(&w1), w(&w2));
    }
    x
}

pub fn main() -> gspmd::Result<()> {
    let dims = transformer::Dims {
        B: 8,
        S: 8,
        D: 32,
        L: 2,
        H: 4,
        K: 8,
        F: 64,
    };
    let program = transformer::trace(dims)?;
    let mesh = transformer::mesh([2, 4])?;
    let exe = compile(&program, &mesh)?;
    let p = &exe.propagated;

    println!(
        "== {} layers on {mesh}: key values after propagation\n",
        dims.L
    );
    println!("{:<6} {:<9} {:<15} sharding", "layer", "value", "type");
    // Named values: parameters first, then those of the layer loop, where the n-th
    // value of a name belongs to layer n.
    let mut rows: Vec<(Option<usize>, &str, String, String)> = Vec::new();
    for node in &p.nodes {
        let Some(name) = node.name.as_deref() else {
            continue;
        };
        let layer =
            (node.op.name() != "parameter").then(|| rows.iter().filter(|r| r.1 == name).count());
        let sharding = node
            .sharding
            .as_ref()
            .map_or_else(|| "-".into(), ToString::to_string);
        rows.push((layer, name, node.ty.to_string(), sharding));
    }
    rows.sort_by_key(|r| r.0);
    for (layer, name, ty, sharding) in rows {
        let layer = layer.map_or_else(|| "-".into(), |l| l.to_string());
        println!("{layer:<6} {name:<9} {ty:<15} {sharding}");
    }

    // The report's tail: one line per collective (axes, shapes, the model's source
    // line), totals and warnings. `exe.spmd.report()` also prints the whole program.
    let report = exe.spmd.report();
    let collectives = report.split_once("\ncollectives:\n").map_or("", |r| r.1);
    println!("\n== collectives of the per-device program\n\n{collectives}");

    let inputs: Vec<Literal> = program
        .params
        .iter()
        .enumerate()
        .map(|(k, &v)| sample(&program.ty(v).shape, k))
        .collect();
    let threads = ThreadMesh::new(mesh)?;
    let got = exe.run(&threads, &inputs)?;
    let want = interpret(&program, &inputs)?;
    println!("\n== run on {} threads", threads.mesh().num_devices());
    for (k, (w, g)) in want.iter().zip(&got).enumerate() {
        let (Some(w), Some(g)) = (w.as_f32(), g.as_f32()) else {
            continue;
        };
        let diff = w
            .iter()
            .zip(g.iter())
            .fold(0.0f32, |m, (a, b)| m.max((a - b).abs()));
        let scale = w.iter().fold(0.0f32, |m, a| m.max(a.abs()));
        println!(
            "output {k} {:?}: max |value| {scale:.3}, max |threads - reference| {diff:.2e}",
            w.shape()
        );
    }
    Ok(())
}

/// A deterministic input of `shape` with values in [-0.5, 0.5), different per `seed`.
fn sample(shape: &[usize], seed: usize) -> Literal {
    ArrayD::from_shape_fn(IxDyn(shape), |ix| {
        let i = ix.as_array_view().iter().fold(seed, |h, &d| h * 31 + d);
        (i.wrapping_mul(2_654_435_761) % 1000) as f32 / 1000.0 - 0.5
    })
    .into()
}
