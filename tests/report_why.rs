//! Why each collective is there: every collective of the example models' training
//! steps carries a reason naming the op that needed it and the annotations behind both
//! shardings, and a conflicting annotation is flagged at the user's lines.

use gspmd::ir::{Node, Purpose, Why, distinct_flows};
use gspmd::models::moe::moe_language_model;
use gspmd::models::transformer::{WEIGHTS, language_model};
use gspmd::models::unet::denoise;
use gspmd::prelude::*;
use gspmd::train::{Optimizer, Trainable, step_program};

fn s(text: &str) -> Sharding {
    text.parse().unwrap()
}

/// The reasons of every collective of `program` and of its regions, with the
/// collective's op name; panics naming a collective without one.
fn reasons<'p>(program: &'p Program, out: &mut Vec<(&'static str, &'p Why)>) {
    for (_, flow) in distinct_flows(program) {
        for region in flow.regions() {
            reasons(region, out);
        }
    }
    for (index, node) in program.nodes.iter().enumerate() {
        if node.op.is_collective() {
            assert!(
                !node.why.is_empty(),
                "%{index} {} has no reason",
                node.op.name()
            );
            out.extend(node.why.iter().map(|w| (node.op.name(), w)));
        }
    }
}

/// Compiles the training step of `model` (parameters `trained` trained by AdamW) for
/// `mesh` and checks every collective's reasons: a resharding names both shardings,
/// and some reason traces a sharding to an annotation in the models' source.
fn check_step(model: &Program, trained: impl Into<Trainable>, mesh: &Mesh) -> Executable {
    let step = step_program(model, 0, trained, &Optimizer::adamw(1e-3)).unwrap();
    let exe = compile(&step.program, mesh).unwrap();
    let mut all = Vec::new();
    reasons(&exe.spmd().program, &mut all);
    assert!(!all.is_empty(), "{}: no collectives", model.name);
    for (op, why) in &all {
        if why.purpose != Purpose::Algorithm {
            assert!(why.from.is_some() && why.to.is_some(), "{op}: {why}");
        }
        assert!(!why.op.is_empty() && why.location.line > 0, "{op}: {why}");
    }
    let annotated = all.iter().any(|(_, w)| {
        (w.from_sources.iter().chain(&w.to_sources)).any(|s| s.location.file.contains("models"))
    });
    assert!(
        annotated,
        "{}: no reason names a model annotation",
        model.name
    );
    let report = exe.report();
    let lines = report
        .lines()
        .filter(|l| l.trim_start().starts_with("why (global %N): "))
        .count();
    assert_eq!(lines, all.len(), "{report}");
    println!("{} on {mesh}: {} collective reasons", model.name, all.len());
    exe
}

#[test]
fn every_collective_of_the_example_steps_has_a_reason() {
    let lm = language_model::trace(
        language_model::Dims {
            B: 4,
            S: 6,
            V: 8,
            D: 16,
            L: 2,
            H: 4,
            K: 4,
            F: 32,
        },
        DType::F32,
        0.0,
    )
    .unwrap();
    let exe = check_step(&lm, WEIGHTS, &language_model::mesh([2, 4]).unwrap());
    // explain: a parameter's sharding, its annotation line and the collectives on it.
    let w = (exe.propagated().values())
        .find(|&v| {
            let uses = |c: &Node| c.why.iter().any(|w| w.touches(v));
            exe.spmd().program.nodes.iter().any(uses)
        })
        .unwrap();
    let text = exe.explain(w);
    assert!(
        text.contains("collectives:\n") && text.contains("why (global %N): "),
        "{text}"
    );

    let unet = denoise::trace(denoise::Dims { B: 2, H: 16, W: 8 }).unwrap();
    let trained: Vec<usize> = (2..unet.params.len()).collect();
    check_step(&unet, &trained, &denoise::mesh([2, 4]).unwrap());

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
    let moe = moe_language_model::trace(dims, 2).unwrap();
    let trained: Vec<usize> = (3..moe.params.len()).collect();
    check_step(&moe, &trained, &moe_language_model::mesh([2, 4]).unwrap());
}

/// Two annotations that disagree on a `[10]` value, `(data)` then `(model)` on a 2x4
/// mesh: blocks of 5 and of 3 nest nowhere, so the value is gathered whole. The
/// warning names the second line, both shardings, and the first line as the origin of
/// `(data)`; `explain` lists the collectives with the same reason.
#[test]
fn a_conflicting_annotation_is_warned_with_both_lines_and_shardings() {
    let b = Builder::new("conflict");
    let x = b.parameter("x", [10], DType::F32);
    let first = line!() + 1;
    let split = x.exp().shard(s("(data)"));
    let second = line!() + 1;
    let resplit = split.shard(s("(model)"));
    let out = resplit.neg();
    let program = b.finish(&[&out]).unwrap();
    let mesh = Mesh::new([("data", 2), ("model", 4)]).unwrap();
    let exe = compile(&program, &mesh).unwrap();

    let file = file!();
    assert_eq!(exe.spmd().warnings.len(), 1, "{:?}", exe.spmd().warnings);
    let warning = &exe.spmd().warnings[0];
    for part in [
        format!("{file}:{second}: "),
        "full rematerialization".into(),
        "from (data) to (model)".into(),
        format!("has (data) [dim 0 data <- %2 at {file}:{first}]"),
        format!("needs (model) for %3 sharded (model) [dim 0 model <- %3 at {file}:{second}]"),
    ] {
        assert!(warning.contains(&part), "`{part}` not in {warning}");
    }
    assert!(
        warning.starts_with(&format!("{file}:{second}: ")),
        "{warning}"
    );

    let resplit_id = (exe.propagated().values())
        .find(|&v| exe.propagated().node(v).location.line == second)
        .unwrap();
    let text = exe.explain(resplit_id);
    assert!(
        text.contains("from its own annotation")
            && text.contains("all_gather")
            && text.contains(&format!("{file}:{first}]")),
        "{text}"
    );
}
