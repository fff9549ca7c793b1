//! The compiled chains (`gspmd-core/src/runtime/fusion/compiled.rs`, see
//! `runtime::fusion::chains`) are those of the model library's training steps: the
//! f32 fusion groups of the per-device programs of the language model (d_model 64 and
//! 128), the MoE language model and the U-Net, each with AdamW as the examples
//! configure it (also on gradients clipped to a global norm, and with AdamW's
//! defaults), on one device and on a 2x4 mesh. This test generates the module from
//! those programs and checks the file is what it generates;
//! `GSPMD_BLESS=1 cargo test --release --test compiled_chains` writes it instead.
//!
//! That a compiled chain computes bitwise what the interpreter's passes compute is
//! tested in `gspmd-core` (`runtime::fusion::chains`, every chain of the table on
//! random bits) and by `tests/fusion.rs` there (fused against unfused).

use std::path::Path;

use gspmd::ir::Program;
use gspmd::models::moe::moe_language_model;
use gspmd::models::transformer::language_model;
use gspmd::models::unet::denoise;
use gspmd::prelude::*;
use gspmd::runtime::compiled_chains_source;
use gspmd::train::{AdamW, Optimizer, Trainable, chain, clip_by_global_norm, step_program};

/// AdamW as the examples configure it.
fn examples_adamw() -> Optimizer {
    AdamW {
        beta2: 0.99,
        weight_decay: 0.0,
        ..AdamW::new(3e-3)
    }
    .into()
}

/// The optimizers each model's step is built with.
fn optimizers() -> Vec<Optimizer> {
    vec![
        examples_adamw(),
        chain([clip_by_global_norm(1.0), examples_adamw()]),
        AdamW::new(3e-3).into(),
    ]
}

/// The per-device program of `model`'s training step (loss output 0, `trained` the
/// trained parameters) with `optimizer` on `mesh`.
fn device_program(
    model: &Program,
    trained: impl Into<Trainable>,
    optimizer: &Optimizer,
    mesh: &Mesh,
) -> Program {
    let step = step_program(model, 0, trained, optimizer).expect("a step");
    let executable = compile(&step.program, mesh).expect("compiles");
    executable.spmd().program.clone()
}

fn library_programs() -> Vec<Program> {
    let mut programs = Vec::new();
    for (d, heads, ffn, seq) in [(64, 4, 256, 16), (128, 2, 512, 128)] {
        let dims = language_model::Dims {
            B: 16,
            S: seq,
            V: 16,
            D: d,
            L: 2,
            H: heads,
            K: d / heads,
            F: ffn,
        };
        let model = language_model::trace(dims, DType::F32, 0.0).expect("traces");
        let trained: &[&str] = &["embed", "position", "layers.*", "unembed"];
        for mesh in [[1, 1], [2, 4]] {
            let mesh = language_model::mesh(mesh).expect("a mesh");
            for optimizer in optimizers() {
                programs.push(device_program(&model, trained, &optimizer, &mesh));
            }
        }
    }
    let dims = moe_language_model::Dims {
        G: 16,
        S: 16,
        V: 32,
        M: 32,
        N: 4,
        K: 8,
        E: 4,
        H: 64,
    };
    let model = moe_language_model::trace(dims, 12).expect("traces");
    let trained: Vec<usize> = (3..model.params.len()).collect();
    for mesh in [[1, 1], [2, 4]] {
        let mesh = moe_language_model::mesh(mesh).expect("a mesh");
        for optimizer in optimizers() {
            programs.push(device_program(&model, &trained, &optimizer, &mesh));
        }
    }
    let model = denoise::trace(denoise::Dims { B: 8, H: 32, W: 32 }).expect("traces");
    let trained: Vec<usize> = (2..model.params.len()).collect();
    for mesh in [[1, 1], [2, 4]] {
        let mesh = denoise::mesh(mesh).expect("a mesh");
        programs.push(device_program(&model, &trained, &examples_adamw(), &mesh));
    }
    programs
}

#[test]
fn the_compiled_chains_are_the_model_librarys() {
    let programs = library_programs();
    let source = compiled_chains_source(&programs.iter().collect::<Vec<_>>());
    let path =
        Path::new(env!("CARGO_MANIFEST_DIR")).join("gspmd-core/src/runtime/fusion/compiled.rs");
    if std::env::var_os("GSPMD_BLESS").is_some() {
        std::fs::write(&path, &source).expect("writes the module");
        return;
    }
    let kept = std::fs::read_to_string(&path).expect("reads the module");
    assert!(
        kept == source,
        "{} is not what the model library's chains generate: run \
         `GSPMD_BLESS=1 cargo test --release --test compiled_chains` and commit it",
        path.display()
    );
}
