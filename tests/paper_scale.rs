//! The paper's scaling claims on small shapes of its dense Transformer (the checks
//! `examples/paper_scale.rs` makes at the paper's sizes): weight memory per device is
//! parameters x 4 bytes / devices, memory per device is O(1/XY) and bytes received per
//! device O(1/X) + O(1/Y) across meshes; and the checks catch what does not scale. And
//! the paper's mixed precision and optimizer run as the reference does.

use gspmd::analysis::DeviceModel;
use gspmd::models::dense::{self, Config, Point, scaling_failures};
use gspmd::prelude::*;

/// Many layers (a scan: as cheap to compile as one), so that what is stored for every
/// layer outweighs the one layer's weights gathered at a time.
fn small() -> Config {
    Config {
        layers: 256,
        model: 64,
        hidden: 256,
        heads: 8,
        head_dim: 8,
        batch: 16,
        seq: 16,
        dtype: DType::F32,
        remat: Remat::NothingSaveable,
    }
}

const MESHES: [(usize, usize); 4] = [(2, 2), (4, 2), (2, 4), (4, 4)];

#[test]
fn memory_and_communication_scale_as_the_paper_says() {
    let c = small();
    let step = dense::step(&c).expect("traces");
    let mut points = Vec::new();
    for (x, y) in MESHES {
        let exe = compile(&step.program, &dense::mesh(x, y).expect("mesh")).expect("compiles");
        let program = &exe.spmd().program;
        let weights: usize = (program.params[1..=6].iter())
            .map(|&p| program.ty(p).size_in_bytes())
            .sum();
        assert_eq!(weights, c.params() * 4 / (x * y), "({x}, {y})");
        let memory = exe.memory_analysis().peak_bytes;
        let bytes = exe
            .cost_analysis(&DeviceModel::tpu_v3_core())
            .bytes_received();
        println!("({x}, {y}): {memory} bytes per device, {bytes} received");
        points.push(Point {
            x,
            y,
            memory,
            bytes,
        });
    }
    let failures = scaling_failures(&points, 0.10);
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}

#[test]
fn the_checks_catch_memory_and_bytes_that_do_not_scale() {
    let point = |x, y, memory, bytes| Point {
        x,
        y,
        memory,
        bytes,
    };
    // Replicated memory; bytes growing with the mesh.
    let points = [
        point(2, 2, 100, 100),
        point(4, 2, 100, 200),
        point(2, 4, 100, 200),
    ];
    let failures = scaling_failures(&points, 0.10);
    assert!(
        failures.iter().any(|f| f.contains("O(1/XY)")),
        "{failures:?}"
    );
    assert!(
        failures.iter().any(|f| f.contains("a/X + b/Y")),
        "{failures:?}"
    );
    // Exactly 1/XY, and a (1 - 1/Y)/X + b (1 - 1/X)/Y with a = 40, b = 80.
    let points = [
        point(2, 2, 400, 30),
        point(4, 2, 200, 35),
        point(2, 4, 200, 25),
    ];
    assert_eq!(scaling_failures(&points, 0.01), Vec::<String>::new());
}

/// The paper's mixed precision and optimizer on small shapes: bf16 activations from f32
/// weights, Adafactor's factored state, run on a 2x2 thread mesh and compared with the
/// reference interpreter (every output: the loss, the new weights and state).
#[test]
fn the_bf16_adafactor_step_computes_what_the_reference_does() {
    use gspmd::runtime::sample_inputs;
    use gspmd::train::{Adafactor, Optimizer};
    let c = Config {
        layers: 2,
        model: 16,
        hidden: 32,
        heads: 2,
        head_dim: 8,
        batch: 4,
        seq: 4,
        dtype: DType::BF16,
        remat: Remat::NothingSaveable,
    };
    // Factored from dims of 2 up (the default, 128, would leave these small weights
    // second moments whole).
    let adafactor = Adafactor {
        min_dim_size_to_factor: 2,
        ..Adafactor::new(1e-2)
    };
    let step = dense::step_with(&c, &Optimizer::from(adafactor)).expect("traces");
    assert!(
        step.params.iter().all(|p| p.state.len() == 2),
        "every weight's second moment is factored: {:?}",
        step.params
    );
    let mut inputs = sample_inputs(&step.program, 7);
    // Second moments are non-negative; the decay is Adafactor's at step 2.
    for p in &step.params {
        for s in &p.state {
            let v = inputs[s.input].as_f32().expect("f32 state").mapv(f32::abs);
            inputs[s.input] = Literal::F32(v);
        }
    }
    let scalars = step.optimizer.scalars(2, &Default::default());
    for (&i, &v) in step.scalars.iter().zip(&scalars) {
        inputs[i] = Literal::scalar_f32(v);
    }
    let mesh = dense::mesh(2, 2).expect("mesh");
    let exe = compile(&step.program, &mesh).expect("compiles");
    let threads = gspmd::runtime::ThreadMesh::new(mesh).expect("thread mesh");
    let comparisons = exe.compare_with_reference(&threads, &inputs).expect("runs");
    for (k, cmp) in comparisons.iter().enumerate() {
        assert!(
            cmp.max_diff <= 2e-2 * cmp.max_abs.max(1.0),
            "output {k}: {cmp}"
        );
    }
}
