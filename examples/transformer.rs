//! A stack of Transformer layers with GSPMD's 2-D "finalized" sharding (paper section
//! 5.1): batch over `data`; attention heads and the FFN's hidden dim over `model`;
//! weights split over both axes (their model dim over `data`, so each device stores 1/8
//! of every weight and gathers it just in time). The model is
//! `gspmd::models::transformer::stack`, written with `#[gspmd::model]` and shared with
//! the training example. Compiled for a 2x4 mesh, run on 8 threads, compared with the
//! reference interpreter.
//!
//! ```text
//! cargo run --release --example transformer
//! ```

use gspmd::models::transformer::stack as transformer;
use gspmd::prelude::*;
use gspmd::runtime::sample_inputs;

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
    let program = transformer::trace(dims, 0.0)?; // no dropout
    let mesh = transformer::mesh([2, 4])?;
    let exe = compile(&program, &mesh)?;
    let p = exe.propagated();

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
    // line), totals and warnings. `exe.spmd().report()` also prints the whole program.
    let report = exe.spmd().report();
    let collectives = report.split_once("\ncollectives:\n").map_or("", |r| r.1);
    println!("\n== collectives of the per-device program\n\n{collectives}");

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
