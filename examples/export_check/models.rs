//! The four example models (LM, U-Net, MoE, pipeline) at the small sizes the XLA check
//! (`examples/export_check`) exports and `tests/compile_fingerprints.rs` pins: each
//! one's forward program, the parameters its step trains and its mesh.

use gspmd::ir::Program;
use gspmd::models::moe::moe_language_model;
use gspmd::models::pipeline::{Pipeline, mlp_loss};
use gspmd::models::transformer::language_model;
use gspmd::models::unet::denoise;
use gspmd::prelude::*;
use gspmd::train::{Optimizer, step_program};

/// A model's forward program (loss output 0), what its step trains and its mesh.
pub struct Model {
    /// The traced forward program.
    pub forward: Program,
    /// The trained parameters' indices.
    pub trained: Vec<usize>,
    /// The mesh it runs on.
    pub mesh: Mesh,
}

/// The language model's training step (AdamW, lr 3e-3) on its 2x4 mesh: B 16, S 16,
/// V 16, D 64, 2 layers of 4 heads of 16, F 256.
pub fn lm_step() -> gspmd::Result<(Program, Mesh)> {
    let dims = language_model::Dims {
        B: 16,
        S: 16,
        V: 16,
        D: 64,
        L: 2,
        H: 4,
        K: 16,
        F: 256,
    };
    let model = language_model::trace(dims, DType::F32, 0.0)?;
    let trained = ["embed", "position", "layers.*", "unembed"];
    let step = step_program(&model, 0, &trained, &Optimizer::adamw(3e-3))?;
    Ok((step.program, language_model::mesh([2, 4])?))
}

/// The U-Net's denoising loss (B 2, H 16, W 8) on a 2x4 data x space mesh.
pub fn unet() -> gspmd::Result<Model> {
    let forward = denoise::trace(denoise::Dims { B: 2, H: 16, W: 8 })?;
    Ok(Model {
        trained: (2..forward.params.len()).collect(),
        forward,
        mesh: denoise::mesh([2, 4])?,
    })
}

/// The mixture of experts' loss (8 groups of 6 tokens, 4 experts, capacity 2) on a
/// 2x4 data x expert mesh.
pub fn moe() -> gspmd::Result<Model> {
    let dims = moe_language_model::Dims {
        G: 8,
        S: 6,
        V: 8,
        M: 8,
        N: 2,
        K: 4,
        E: 4,
        H: 8,
    };
    let forward = moe_language_model::trace(dims, 2)?;
    Ok(Model {
        trained: (3..forward.params.len()).collect(),
        forward,
        mesh: moe_language_model::mesh([2, 4])?,
    })
}

/// The circular pipeline (4 stages of 2 repeats, 6 microbatches of 4 x 8, F 16) on a
/// 4x2 stage x model mesh.
pub fn pipeline() -> gspmd::Result<Model> {
    let p = Pipeline::circular(4, 2, 6);
    let dims = mlp_loss::Dims {
        M: p.microbatches,
        B: 4,
        D: 8,
        S: p.stages,
        R: p.repeats,
        F: 16,
    };
    Ok(Model {
        forward: mlp_loss::trace(dims, p, true)?,
        trained: vec![2, 3],
        mesh: mlp_loss::mesh([4, 2])?,
    })
}
