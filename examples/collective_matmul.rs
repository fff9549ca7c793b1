//! A collective matmul written by hand in a manual region (`shard_map`) inside an
//! auto-sharded model, against the same model with automatic sharding.
//!
//! ```text
//! cargo run --example collective_matmul
//! ```
//!
//! The model is a Megatron MLP block with its activations split by rows over `model`
//! (sequence parallel): `y = gelu(tanh(x) @ w1) @ w2`, `w1` split by columns, `w2` by
//! rows. Automatic sharding all-gathers the activation rows before the first matmul.
//! The collective matmul (Wang et al., "Overlap communication with dependent
//! computation via decomposition in large deep learning models", the decomposition the
//! GSPMD paper's section 4 builds on) never gathers them: each device multiplies the
//! row block it holds by its columns, then passes the block to the next device around
//! the ring (`ppermute`), `n` steps for `n` devices, so each step's transfer is
//! independent of that step's product and could overlap it (the thread mesh runs them
//! one after the other). The rest of the model stays automatic: `tanh` before, the
//! row-parallel second matmul and its reduce-scatter after (`data` is not used here,
//! so every value is replicated over it). Prints both per-device programs' collectives (with
//! the bytes each device receives) and each one's largest difference from the
//! single-device reference.

use gspmd::prelude::*;
use gspmd::runtime::sample_inputs;

/// Rows, model width and hidden width.
const ROWS: usize = 32;
const WIDTH: usize = 16;
const HIDDEN: usize = 64;

fn spec(text: &str) -> Result<Sharding> {
    text.parse()
}

/// `x @ w` for `x` split by rows and `w` by columns over `model`, the result split by
/// columns: on device `i`, step `s` multiplies the row block it holds (device
/// `i - s`'s) by its columns into rows `(i - s) mod n` of its result, then passes the
/// block on to device `i + 1`.
fn collective_matmul(x: &Tensor, w: &Tensor, mesh: &Mesh) -> Result<Tensor> {
    let n = mesh.axis_size("model").unwrap_or(1);
    let rows = x.shape()[0] / n;
    let specs = [spec("(model, _)")?, spec("(_, model)")?];
    let out = x.builder().shard_map(
        mesh,
        &["model"],
        &[x.clone(), w.clone()],
        &specs,
        &[spec("(_, model)")?],
        |b, blocks| {
            let (mut held, w) = (blocks[0].clone(), &blocks[1]);
            let index = b.axis_index(&["model"]);
            let int = |v: usize| index.scalar_like(v as f64);
            let zero = int(0);
            let mut y = b.full([rows * n, w.shape()[1]], DType::F32, 0.0);
            for step in 0..n {
                let source = (&index + &int(n - step)) % &int(n);
                let at = &source * &int(rows);
                y = y.dynamic_update_slice(&held.matmul(w), &[&at, &zero]);
                if step + 1 < n {
                    held = held.ppermute(&["model"], 1);
                }
            }
            vec![y]
        },
    );
    Ok(out[0].clone())
}

/// The MLP block, its first matmul by hand (`manual`) or automatic.
fn block(mesh: &Mesh, manual: bool) -> Result<Program> {
    let b = Builder::new(if manual {
        "collective_matmul"
    } else {
        "automatic"
    });
    let x = b
        .parameter("x", [ROWS, WIDTH], DType::F32)
        .shard(spec("(model, _)")?);
    let w1 = b
        .parameter("w1", [WIDTH, HIDDEN], DType::F32)
        .shard(spec("(_, model)")?);
    let w2 = b
        .parameter("w2", [HIDDEN, WIDTH], DType::F32)
        .shard(spec("(model, _)")?);
    let h = x.tanh();
    let y = if manual {
        collective_matmul(&h, &w1, mesh)?
    } else {
        h.matmul(&w1).shard(spec("(_, model)")?)
    };
    let out = y.gelu().matmul(&w2).shard(spec("(model, _)")?);
    b.finish(&[&out])
}

pub fn main() -> Result<()> {
    let mesh = Mesh::new([("data", 2), ("model", 4)])?;
    let threads = ThreadMesh::new(mesh.clone())?;
    let manual = block(&mesh, true)?;
    let automatic = block(&mesh, false)?;
    let inputs = sample_inputs(&manual, 0);
    let mut results = Vec::new();
    for program in [&manual, &automatic] {
        let exe = compile(program, &mesh)?;
        println!("== {} on {mesh}", program.name);
        println!("{}", exe.spmd().collectives());
        for c in exe.compare_with_reference(&threads, &inputs)? {
            println!("vs the reference: {c}");
        }
        results.push(exe.run(&threads, &inputs)?.remove(0));
        println!();
    }
    let (a, b) = (results[0].as_f32(), results[1].as_f32());
    let diff = match (a, b) {
        (Some(a), Some(b)) => a
            .iter()
            .zip(b)
            .fold(0.0f32, |m, (x, y)| m.max((x - y).abs())),
        _ => f32::NAN,
    };
    println!("largest difference, collective matmul vs automatic: {diff:e}");
    assert!(
        diff <= 1e-5,
        "the collective matmul differs from the automatic version"
    );
    Ok(())
}
