//! A Megatron MLP written with `#[gspmd::model]`, end to end: trace it, compile it for
//! a 2x4 mesh (`data` = 2, `model` = 4), run it on 8 threads and compare with the
//! single-device reference interpreter.
//!
//! ```text
//! cargo run --release --example mlp
//! ```
//!
//! Prints the sharding propagation chose for every named value, the per-device program
//! with its collectives, a picture of how `w1` is laid out over the devices, and the
//! largest difference from the reference.

use gspmd::prelude::*;
use gspmd::runtime::sample_inputs;
use gspmd::sharding::visualize;

/// Megatron MLP: `x` split by batch over `data`, `w1` by column and `w2` by row over
/// `model`, so the hidden activation `h` is split on both axes and the only
/// communication is one all-reduce of the output over `model`.
#[gspmd::model(mesh = (data, model))]
pub fn mlp(
    #[shard(data, _)] x: Tensor<B, D>,
    #[shard(_, model)] w1: Tensor<D, F>,
    #[shard(model, _)] w2: Tensor<F, D>,
) -> Tensor<B, D> {
    #[shard(data, model)]
    let h = x.matmul(&w1).relu();
    h.matmul(&w2)
}

/// The example's program (16 rows, 32 features, 64 hidden units) compiled for the 2x4
/// mesh; `tests/readme.rs` checks the README's quotes of its report against it.
pub fn compiled() -> gspmd::Result<(Program, Mesh, Executable)> {
    let program = mlp::trace(mlp::Dims {
        B: 16,
        D: 32,
        F: 64,
    })?;
    let mesh = mlp::mesh([2, 4])?;
    let exe = compile(&program, &mesh)?;
    Ok((program, mesh, exe))
}

pub fn main() -> gspmd::Result<()> {
    let (program, mesh, exe) = compiled()?;

    println!(
        "== {} on {mesh}: shardings after propagation\n",
        program.name
    );
    println!("{:<8} {:<12} sharding", "value", "type");
    let p = exe.propagated();
    for v in p.values() {
        let node = p.node(v);
        let is_output = p.outputs.contains(&v);
        let Some(name) = node
            .name
            .clone()
            .or_else(|| is_output.then(|| "result".into()))
        else {
            continue;
        };
        let sharding = node
            .sharding
            .as_ref()
            .map_or_else(|| "-".into(), ToString::to_string);
        println!("{name:<8} {:<12} {sharding}", node.ty.to_string());
    }

    println!("\n== the per-device program and its collectives\n");
    println!("{}", exe.spmd().report());

    let w1 = p.node(p.params[1]);
    if let Some(sharding) = &w1.sharding {
        println!("\n== w1 {} {sharding} over {mesh}\n", w1.ty);
        print!("{}", visualize(&mesh, &w1.ty.shape, sharding));
    }

    let inputs = sample_inputs(&program, 0);
    let threads = ThreadMesh::new(mesh)?;
    println!("\n== run on {} threads", threads.mesh().num_devices());
    for (k, c) in exe
        .compare_with_reference(&threads, &inputs)?
        .iter()
        .enumerate()
    {
        println!("output {k}: {c}");
    }
    Ok(())
}
