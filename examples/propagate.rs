//! Sharding propagation on a Megatron MLP: three annotations in, a sharding for every
//! value out.
//!
//! ```text
//! cargo run --example propagate
//! ```

use gspmd::error::Result;
use gspmd::ir::{Builder, DType};
use gspmd::propagation::{explain, propagate};
use gspmd::sharding::{Mesh, Sharding, visualize};

fn main() -> Result<()> {
    let mesh = Mesh::new([("data", 2), ("model", 4)])?;

    // y = relu(x @ w1) @ w2 with x split by batch, w1 by column, w2 by row.
    let b = Builder::new("mlp");
    let x = b.parameter("x", [8, 16], DType::F32);
    let w1 = b.parameter("w1", [16, 32], DType::F32);
    let w2 = b.parameter("w2", [32, 16], DType::F32);
    let x = x.annotate("(data, _)".parse::<Sharding>()?);
    let w1 = w1.annotate("(_, model)".parse::<Sharding>()?);
    let w2 = w2.annotate("(model, _)".parse::<Sharding>()?);
    let h = x.matmul(&w1).relu().named("h");
    let y = h.matmul(&w2).named("y");
    let program = b.finish(&[&y])?;

    println!("{mesh}\n\nbefore propagation:\n{program}\n");
    let propagated = propagate(&program, &mesh)?;
    println!("after propagation:\n{propagated}\n");

    for t in [&h, &y] {
        let Some(v) = t.id() else { continue };
        let node = propagated.node(v);
        if let Some(sharding) = &node.sharding {
            println!("{}\n", explain(&propagated, v));
            println!("{}", visualize(&mesh, &node.ty.shape, sharding));
        }
    }
    Ok(())
}
