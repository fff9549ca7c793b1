//! Exports the example models and small DSL programs to StableHLO (per device and
//! global, see `gspmd::export`), with inputs and gspmd's thread-mesh outputs beside
//! them, then has XLA check them: `tools/xla_check.py` compiles each module with JAX's
//! XLA on as many CPU devices as the mesh, runs it on the same inputs and compares its
//! outputs with gspmd's (1e-5 relative), printing XLA's collectives beside gspmd's.
//!
//! ```text
//! cargo run --example export_check -- OUT_DIR                  # write only
//! cargo run --example export_check -- OUT_DIR --python PYTHON  # and check with XLA
//! cargo run --example export_check -- --import JAX_DIR           # JAX's modules imported
//! ```
//!
//! With `--import`, the modules `tools/jax_models.py` lowered with JAX are imported
//! (`gspmd::import`), partitioned and run on the thread mesh instead, and compared
//! with JAX's outputs.
//!
//! `PYTHON` is an interpreter with JAX 0.12 (`pip install jax==0.12.0.1` in a venv).
//! The run fails if a module does not export, or if the check fails.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::Command;

use gspmd::ir::{Program, distinct_flows, random};
use gspmd::models::transformer::language_model;
use gspmd::prelude::*;
use gspmd::runtime::sample_inputs;
use gspmd::train::{Optimizer, save_checkpoint, step_program};
use models::lm_step;

mod models;

#[gspmd::model(mesh = (data, model))]
pub fn mlp(
    #[shard(data, _)] x: Tensor<B, D>,
    #[shard(_, model)] w1: Tensor<D, F>,
    #[shard(model, _)] w2: Tensor<F, D>,
) -> Tensor<B, D> {
    #[shard(data, model)]
    let h = x.matmul(&w1).gelu();
    h.matmul(&w2)
}

/// A training step of `model` (loss output 0) updating its trained parameters with
/// AdamW, as the training examples run it.
fn step(model: gspmd::Result<models::Model>) -> gspmd::Result<(Program, Mesh)> {
    let model = model?;
    let step = step_program(&model.forward, 0, &model.trained, &Optimizer::adamw(3e-3))?;
    Ok((step.program, model.mesh))
}

fn mlp_program() -> gspmd::Result<(Program, Mesh)> {
    let program = mlp::trace(mlp::Dims {
        B: 16,
        D: 32,
        F: 64,
    })?;
    Ok((program, mlp::mesh([2, 4])?))
}

/// Ops the models use little or not at all: a scan, a loop, a cond, a sort, a scan
/// along a split dim, a gather and a scatter, a window, random bits.
fn ops_program() -> gspmd::Result<(Program, Mesh)> {
    let mesh = Mesh::new([("data", 2), ("model", 4)])?;
    let b = Builder::new("ops");
    let x = b
        .parameter("x", vec![8, 16], DType::F32)
        .annotate("(data, model)".parse()?);
    let w = b
        .parameter("w", vec![16, 16], DType::F32)
        .annotate("(_, model)".parse()?);
    let idx = b.parameter("idx", vec![8], DType::I32);
    let seq = b.parameter("seq", vec![4, 8, 16], DType::F32);
    let h = x.matmul(&w).tanh();
    let sorted = h.argsort(1, true).convert(DType::F32);
    let running = h.cumsum(1);
    let (carry, ys) = b.scan(&[seq], std::slice::from_ref(&h), |c, xs| {
        let next = c[0].add(&xs[0]).sin();
        (vec![next.clone()], vec![next.exp()])
    });
    let looped = b.fori_loop(3, &[carry[0].clone()], |_, c| vec![c[0].matmul(&w).cos()]);
    let total = looped[0].sum(&[0, 1]);
    let zero = total.scalar_like(0.0);
    let branch = b.cond(
        &total.gt(&zero),
        |_| vec![looped[0].abs()],
        |_| vec![looped[0].neg()],
    );
    let picked = branch[0].take(&idx, 0);
    let key = random::key(&b, 7);
    let noise = random::uniform(&key, vec![8, 16], -1.0, 1.0);
    let pooled = h.max_pool(&[1, 4], &[1, 2], Padding::Same);
    let p = b.finish(&[&sorted, &running, &ys[0], &picked.add(&noise), &pooled])?;
    Ok((p, mesh))
}

/// More ops: a strided grouped convolution, a scatter, pads, reversals, rolls, a
/// dynamic slice and update, a `while`, bf16 and i32 converts, the rounding and
/// predicate ops, a `shard_map` with its own collective.
fn more_ops_program() -> gspmd::Result<(Program, Mesh)> {
    let mesh = Mesh::new([("data", 2), ("model", 4)])?;
    let b = Builder::new("more_ops");
    let img = b
        .parameter("img", vec![4, 8, 8, 4], DType::F32)
        .annotate("(data, model, _, _)".parse()?);
    let kernel = b.parameter("kernel", vec![3, 3, 2, 8], DType::F32);
    let rows = b
        .parameter("rows", vec![16, 8], DType::F32)
        .annotate("(model, _)".parse()?);
    let at = b.parameter("at", vec![4], DType::I32);
    let dn = ConvDimensionNumbers::from_labels("NHWC", "HWIO", "NHWC")?;
    let conv = img.conv_general_dilated(&kernel, &[1, 2], Padding::Same, &[], &[2, 1], &dn, 2);
    let pooled = conv.avg_pool(&[1, 2, 2, 1], &[1, 2, 2, 1], Padding::Same, false);
    let added = rows.index_add(0, &at, &rows.slice_axis(0, 0, 4));
    let padded = added
        .pad(&added.scalar_like(0.5), &[1, -1], &[-1, 2], &[0, 1])
        .reverse(&[0, 1])
        .roll(3, 0);
    let start = at.slice_axis(0, 0, 1).reshape(vec![]);
    let zero = start.scalar_like(0.0);
    let window = padded.dynamic_slice(&[&start, &zero], &[4, 8]);
    let updated = padded.dynamic_update_slice(&window.erf().round(), &[&zero, &start]);
    let steps = b.while_loop(
        |s| s[0].sum(&[0, 1]).lt(&s[0].scalar_like(1e4)),
        |s| vec![s[0].mul(&s[0].scalar_like(2.0)).add(&s[0].scalar_like(1.0))],
        &[updated.abs()],
    );
    let halves = steps[0]
        .convert(DType::BF16)
        .mul(&steps[0].convert(DType::BF16))
        .convert(DType::F32);
    let signs = halves.sub(&halves.scalar_like(3.0)).sign().floor().ceil();
    let finite = halves.log().is_finite().convert(DType::F32);
    let ints = halves
        .convert(DType::I32)
        .remainder(&halves.convert(DType::I32).scalar_like(7.0));
    let spec: Sharding = "(model, _)".parse()?;
    let summed = b.shard_map(
        &mesh,
        &["model"],
        std::slice::from_ref(&rows),
        std::slice::from_ref(&spec),
        std::slice::from_ref(&spec),
        |_, blocks| vec![blocks[0].psum(&["model"]).pow(&blocks[0].scalar_like(2.0))],
    );
    let p = b.finish(&[&pooled, &signs, &finite, &ints, &summed[0]])?;
    Ok((p, mesh))
}

/// A case: its program and mesh.
type Case = fn() -> gspmd::Result<(Program, Mesh)>;

/// Each collective kind of a per-device program and its regions (each region once,
/// however often a loop runs it): how many, and the bytes of their results.
fn collectives(program: &Program, counts: &mut BTreeMap<String, (usize, usize)>) {
    for node in &program.nodes {
        if node.op.is_collective() {
            let entry = counts.entry(node.op.name().to_string()).or_default();
            *entry = (entry.0 + 1, entry.1 + node.ty.size_in_bytes());
        }
    }
    for (_, flow) in distinct_flows(program) {
        for region in flow.regions() {
            collectives(region, counts);
        }
    }
}

/// Writes one case's modules, inputs and gspmd's outputs under `dir/name`.
fn write_case(dir: &Path, name: &str, program: &Program, mesh: &Mesh) -> Result<(), Failure> {
    let exe = compile(program, mesh)?;
    let inputs = sample_inputs(program, 1);
    let threads = ThreadMesh::new(mesh.clone())?;
    let outputs = exe.run(&threads, &inputs)?;
    let case = dir.join(name);
    std::fs::create_dir_all(&case).map_err(|e| io_error(&case, e))?;
    let write = |file: &str, text: String| {
        let path = case.join(file);
        std::fs::write(&path, text).map_err(|e| io_error(&path, e))
    };
    write("per_device.mlir", exe.to_stablehlo()?)?;
    write("global.mlir", exe.to_stablehlo_global()?)?;
    write("traced.mlir", program.to_stablehlo(mesh)?)?;
    let named = |prefix: &str, values: &[Literal]| -> Vec<(String, Literal)> {
        (values.iter().enumerate())
            .map(|(i, v)| (format!("{prefix}{i:04}"), v.clone()))
            .collect()
    };
    save_checkpoint(case.join("inputs.safetensors"), &named("in", &inputs))?;
    save_checkpoint(case.join("outputs.safetensors"), &named("out", &outputs))?;
    let mut counts = BTreeMap::new();
    collectives(&exe.spmd().program, &mut counts);
    let counts: Vec<String> = (counts.iter())
        .map(|(k, (n, bytes))| format!("{k} {n} {bytes}"))
        .collect();
    write("gspmd_collectives.txt", counts.join("\n") + "\n")?;
    write("devices.txt", format!("{}\n", mesh.num_devices()))?;
    println!(
        "{name}: {} inputs, {} outputs on {mesh}",
        inputs.len(),
        outputs.len()
    );
    Ok(())
}

/// A failure of this check: what failed, as text.
type Failure = Box<dyn std::error::Error>;

fn io_error(path: &Path, e: std::io::Error) -> Failure {
    format!("{}: {e}", path.display()).into()
}

/// The round trip: each `DIR/NAME/jax.mlir` that `tools/jax_models.py` wrote is
/// imported, compiled for its mesh and run on the thread mesh with JAX's inputs; the
/// outputs must equal JAX's to 1e-5 of their largest magnitude. Prints gspmd's
/// collectives beside XLA's.
fn import_check(dir: &Path) -> Result<(), Failure> {
    let mut cases: Vec<PathBuf> = (std::fs::read_dir(dir).map_err(|e| io_error(dir, e))?)
        .filter_map(|entry| entry.ok().map(|e| e.path()))
        .filter(|p| p.join("jax.mlir").exists())
        .collect();
    cases.sort();
    let mut failures = Vec::new();
    for case in &cases {
        let read = |file: &str| {
            let path = case.join(file);
            std::fs::read_to_string(&path).map_err(|e| io_error(&path, e))
        };
        let imported = gspmd::import::from_stablehlo(&read("jax.mlir")?)?;
        let exe = compile(&imported.program, &imported.mesh)?;
        let values = |file: &str| -> Result<Vec<Literal>, Failure> {
            let loaded = gspmd::train::load_checkpoint(case.join(file))?;
            Ok(loaded.into_iter().map(|(_, v)| v).collect())
        };
        let (inputs, want) = (
            values("inputs.safetensors")?,
            values("outputs.safetensors")?,
        );
        let threads = ThreadMesh::new(imported.mesh.clone())?;
        let got = exe.run(&threads, &inputs)?;
        let reference = gspmd::runtime::interpret(&imported.program, &inputs)?;
        let (worst, worst_reference) = (differences(&want, &got), differences(&want, &reference));
        let mut counts = BTreeMap::new();
        collectives(&exe.spmd().program, &mut counts);
        let name = case
            .file_name()
            .map_or_else(String::new, |n| n.to_string_lossy().into_owned());
        let ok =
            (worst.iter().chain(&worst_reference)).all(|&d| d <= 1e-5) && got.len() == want.len();
        let largest = |d: &[f32]| d.iter().fold(0.0f32, |m, &x| m.max(x));
        println!(
            "{name}: imported {} nodes on {}; vs JAX's outputs, worst: thread mesh {:.2e}, \
             reference {:.2e} {}",
            imported.program.nodes.len(),
            imported.mesh,
            largest(&worst),
            largest(&worst_reference),
            if ok { "ok" } else { "DIFFERS" }
        );
        if !ok {
            println!("   per output: thread mesh {worst:?}, reference {worst_reference:?}");
        }
        let gspmd: Vec<String> = (counts.iter())
            .map(|(k, (n, bytes))| format!("{k} {n} ({bytes} B)"))
            .collect();
        let xla: Vec<String> = (read("xla_collectives.txt")?.lines())
            .filter_map(|l| match l.split_whitespace().collect::<Vec<_>>()[..] {
                [k, n, bytes] => Some(format!("{k} {n} ({bytes} B)")),
                _ => None,
            })
            .collect();
        println!("   gspmd collectives per device: {}", gspmd.join(", "));
        println!("   XLA collectives per device:   {}", xla.join(", "));
        if !ok {
            failures.push(name);
        }
    }
    if cases.is_empty() || !failures.is_empty() {
        let cases = cases.len();
        return Err(format!("{}: {cases} cases, differing: {failures:?}", dir.display()).into());
    }
    Ok(())
}

/// Each float output's largest difference from `want`'s, relative to `want`'s largest
/// magnitude (0 for the other dtypes).
fn differences(want: &[Literal], got: &[Literal]) -> Vec<f32> {
    (want.iter().zip(got))
        .map(|(w, g)| match (w.as_f32(), g.as_f32()) {
            (Some(w), Some(g)) => {
                let scale = w.iter().fold(f32::MIN_POSITIVE, |m, x| m.max(x.abs()));
                let diff = (w.iter().zip(g)).fold(0.0f32, |m, (a, b)| m.max((a - b).abs()));
                diff / scale
            }
            _ => 0.0,
        })
        .collect()
}

fn main() -> Result<(), Failure> {
    let args: Vec<String> = std::env::args().skip(1).collect();
    if args.first().map(String::as_str) == Some("--import") {
        let dir = args.get(1).map_or("target/jax_models", String::as_str);
        return import_check(Path::new(dir));
    }
    let dir = PathBuf::from(args.first().map_or("target/export_check", String::as_str));
    let python = (args.iter().position(|a| a == "--python")).and_then(|i| args.get(i + 1));
    let cases: [(&str, Case); 8] = [
        ("mlp", mlp_program),
        ("ops", ops_program),
        ("more_ops", more_ops_program),
        ("lm_step", lm_step),
        ("unet_step", || step(models::unet())),
        ("moe_step", || step(models::moe())),
        ("pipeline_step", || step(models::pipeline())),
        ("lm_step_mesh_4x2", || {
            Ok((lm_step()?.0, language_model::mesh([4, 2])?))
        }),
    ];
    for (name, make) in cases {
        let (program, mesh) = make()?;
        write_case(&dir, name, &program, &mesh)?;
    }
    let Some(python) = python else {
        println!(
            "wrote {}; pass --python PYTHON to check with XLA",
            dir.display()
        );
        return Ok(());
    };
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("tools/xla_check.py");
    let status = Command::new(python)
        .arg(&script)
        .arg(&dir)
        .env("JAX_PLATFORMS", "cpu")
        .status()
        .map_err(|e| io_error(&script, e))?;
    if !status.success() {
        return Err(format!("{}: the XLA check failed ({status})", script.display()).into());
    }
    Ok(())
}
