//! The per-device programs the compiler makes for the repository's models, pinned by
//! fingerprints recorded from the compiler before its post-partition passes (gather
//! reuse, combining) were made near-linear: a faster pass must make the same decisions.
//! Covers the language model's training step (gathers kept, regathered, and chosen
//! under a memory limit), the U-Net's and the mixture of experts' gradients, and the
//! pipelined stack's gradient.
//!
//! A change that alters partitioning on purpose changes these fingerprints: the failure
//! message prints every new one, to be recorded after checking the new programs.

use gspmd::autodiff::grad;
use gspmd::ir::Program;
use gspmd::prelude::*;
use gspmd::{CompileOptions, Executable, GatherReuse, compile_with};

#[path = "../examples/export_check/models.rs"]
mod models;

/// FNV-1a (64 bits) of the per-device program's text, its global inputs and outputs,
/// and the gather plan: stable across toolchains, unlike `DefaultHasher`.
fn fingerprint(exe: &Executable) -> u64 {
    let spmd = exe.spmd();
    let text = format!(
        "{}\n{:?}\n{:?}\n{}",
        spmd.program,
        spmd.inputs,
        spmd.outputs,
        exe.gathers()
    );
    text.bytes().fold(0xcbf2_9ce4_8422_2325, |h, b| {
        (h ^ u64::from(b)).wrapping_mul(0x0000_0100_0000_01b3)
    })
}

/// The gradient of `model`'s loss with respect to its trained parameters, and its mesh.
fn gradient(model: gspmd::Result<models::Model>) -> (Program, Mesh) {
    let model = model.unwrap();
    (grad(&model.forward, 0, &model.trained).unwrap(), model.mesh)
}

fn options(gathers: GatherReuse, memory_limit: Option<usize>) -> CompileOptions {
    CompileOptions {
        memory_limit,
        gathers,
        ..CompileOptions::default()
    }
}

#[test]
fn models_compile_to_the_recorded_programs() {
    let (lm, lm_mesh) = models::lm_step().unwrap();
    let keep = options(GatherReuse::Keep, None);
    let regather = options(GatherReuse::Regather, None);
    let peak = (compile_with(&lm, &lm_mesh, &regather).unwrap())
        .gathers()
        .peak_all_kept
        .unwrap();
    // Recorded again (h35t) when the per-device programs' weight gradients became
    // products of swapped operands instead of transposed products (`simplify`'s
    // `product_transposes`, after partitioning): the partitioner's input, the
    // collectives and the gather choices are unchanged; the u-net's gradient has no
    // such transpose. The LM's regather and auto cases recorded again when backward
    // loops began to recompute cheap forward values (`fusion::Group::copies`): the
    // programs and the gather choices are unchanged, the peak their reports print fell
    // from 1,092,892 to 896,284 bytes a device (all kept: 1,191,196 to 994,588). And
    // again when the plan began to fold iotas and what is computed from them (see
    // `runtime::folding`): the programs and the gather choices are unchanged, the peak
    // fell to 896,028 bytes (all kept: 994,332), a folded iota holding no buffer.
    let cases: Vec<(&str, (Program, Mesh), CompileOptions, u64)> = vec![
        (
            "lm step, keep",
            (lm.clone(), lm_mesh.clone()),
            keep.clone(),
            0xb03d2212bdfa08ce,
        ),
        (
            "lm step, regather",
            (lm.clone(), lm_mesh.clone()),
            regather,
            0xe675e8888b56aa3e,
        ),
        (
            "lm step, auto under 3/4 of the kept peak",
            (lm, lm_mesh),
            options(GatherReuse::Auto, Some(peak * 3 / 4)),
            0xb6aa17413f9eacd6,
        ),
        (
            "u-net gradient",
            gradient(models::unet()),
            keep.clone(),
            0x2567e714e1db38bf,
        ),
        (
            "moe gradient",
            gradient(models::moe()),
            keep.clone(),
            0xc113212b60b4c31d,
        ),
        (
            "pipeline gradient",
            gradient(models::pipeline()),
            keep,
            0xb1b5b6d3a51c80d9,
        ),
    ];
    let mut wrong = Vec::new();
    for (what, (program, mesh), options, want) in cases {
        let got = fingerprint(&compile_with(&program, &mesh, &options).unwrap());
        if got != want {
            wrong.push(format!("{what}: {got:#018x} (recorded {want:#018x})"));
        }
    }
    assert!(wrong.is_empty(), "programs changed:\n{}", wrong.join("\n"));
}
