//! The pipeline schedules of `gspmd::models::pipeline` (GSPMD section 3.3): the
//! pipelined forward of a residual MLP stack equals the same layers run one after the
//! other, on the reference interpreter and partitioned on thread meshes; the loop body
//! has one collective for the stage shift; the bubble fraction is what counting the
//! schedule's idle stage-iterations gives; bad configurations are typed errors.
//!
//! Tolerance: 1e-4 relative to the largest magnitude (at least 1): f32 sums in another
//! order.

use gspmd::autodiff::grad;
use gspmd::compile;
use gspmd::ir::{Flow, Location, Op, OpKind, distinct_flows};
use gspmd::models::pipeline::{Pipeline, Schedule, mlp_layer, mlp_loss, mlp_stack};
use gspmd::prelude::*;
use gspmd::runtime::ThreadMesh;
use ndarray::{ArrayD, IxDyn};

const TOLERANCE: f32 = 1e-4;

/// Deterministic inputs in `[-0.5, 0.5)`, weights scaled down so that the residual
/// stack stays of order one.
fn inputs(program: &Program) -> Vec<Literal> {
    (program.params.iter().enumerate())
        .map(|(k, &p)| {
            let shape = &program.ty(p).shape;
            let scale = if k == 0 { 1.0 } else { 0.3 };
            let n: usize = shape.iter().product();
            let v = (0..n)
                .map(|i| (((i * 2_654_435_761 + k * 97) % 1000) as f32 / 1000.0 - 0.5) * scale)
                .collect();
            Literal::F32(ArrayD::from_shape_vec(IxDyn(shape), v).unwrap())
        })
        .collect()
}

/// Rows per microbatch, features and hidden units of the test stacks.
const ROWS: usize = 4;
const FEATURES: usize = 8;
const HIDDEN: usize = 16;

fn dims(p: &Pipeline) -> mlp_stack::Dims {
    mlp_stack::Dims {
        M: p.microbatches,
        B: ROWS,
        D: FEATURES,
        S: p.stages,
        R: p.repeats,
        F: HIDDEN,
    }
}

fn max_diff(want: &Literal, got: &Literal) -> f32 {
    let (a, b) = (want.as_f32().unwrap(), got.as_f32().unwrap());
    let scale = a.iter().fold(1.0f32, |m, x| m.max(x.abs()));
    (a.iter().zip(b)).fold(0.0f32, |m, (x, y)| m.max((x - y).abs())) / scale
}

/// GPipe and circular schedules of several (stages, repeats, microbatches), including
/// one microbatch, `M = S` and `M > S` (the circular queue holds outputs for `M - S`
/// iterations).
fn configs() -> Vec<Pipeline> {
    vec![
        Pipeline::gpipe(4, 1, 1),
        Pipeline::gpipe(4, 1, 4),
        Pipeline::gpipe(4, 2, 6),
        Pipeline::gpipe(2, 3, 3),
        Pipeline::circular(4, 2, 4),
        Pipeline::circular(4, 2, 6),
        Pipeline::circular(4, 3, 5),
        Pipeline::circular(2, 2, 3),
    ]
}

/// The pipelined and the sequential [`mlp_stack`] of `p`, and inputs for both.
fn pipelined_and_sequential(p: &Pipeline) -> (Program, Program, Vec<Literal>) {
    let pipelined = mlp_stack::trace(dims(p), *p, true).unwrap();
    let sequential = mlp_stack::trace(dims(p), *p, false).unwrap();
    let inputs = inputs(&pipelined);
    (pipelined, sequential, inputs)
}

/// Asserts that `exe` run on its mesh with `inputs` gives `want` within the tolerance.
fn assert_runs_to(exe: &Executable, inputs: &[Literal], want: &Literal, what: &str) {
    let threads = ThreadMesh::new(exe.spmd().mesh.clone()).unwrap();
    let got = exe.run(&threads, inputs).unwrap();
    let d = max_diff(want, &got[0]);
    assert!(
        d <= TOLERANCE,
        "{what} on {}: differs by {d}",
        exe.spmd().mesh
    );
}

#[test]
fn pipelined_forward_equals_the_layers_run_one_after_the_other() {
    for p in configs() {
        let (pipelined, sequential, inputs) = pipelined_and_sequential(&p);
        let want = interpret(&sequential, &inputs).unwrap();
        let got = interpret(&pipelined, &inputs).unwrap();
        let d = max_diff(&want[0], &got[0]);
        assert!(d <= TOLERANCE, "{p:?}: differs by {d}");
    }
}

/// Partitioned with the stage dim over `stage` (one stage per device group, and two
/// per group) and Megatron's hidden-dim split over `model`.
#[test]
fn partitioned_pipeline_equals_the_sequential_reference_on_stage_model_meshes() {
    for p in configs() {
        let (pipelined, sequential, inputs) = pipelined_and_sequential(&p);
        let want = &interpret(&sequential, &inputs).unwrap()[0];
        let mut stage_sizes = vec![p.stages];
        if p.stages % 2 == 0 && p.stages > 2 {
            stage_sizes.push(p.stages / 2);
        }
        for stages in stage_sizes {
            let mesh = mlp_stack::mesh([stages, 2]).unwrap();
            let exe = compile(&pipelined, &mesh).unwrap();
            assert_runs_to(&exe, &inputs, want, &format!("{p:?}"));
        }
    }
}

/// The same stack with each microbatch split over `data` instead (mesh `(stage=4,
/// data=2)`), written with the builder.
#[test]
fn partitioned_pipeline_equals_the_sequential_reference_with_data_parallel_microbatches() {
    let sharding = |text: &str| -> Sharding { text.parse().unwrap() };
    let mesh = Mesh::new([("stage", 4), ("data", 2)]).unwrap();
    for p in [Pipeline::gpipe(4, 2, 5), Pipeline::circular(4, 2, 6)] {
        let trace = |pipelined: bool| {
            let b = Builder::new("data_parallel_stack");
            let (m, r) = (p.microbatches, p.repeats);
            let x = (b.parameter("x", [m, ROWS, FEATURES], DType::F32))
                .annotate(sharding("(_, data, _)"));
            let w1 = b.parameter("w1", [4, r, FEATURES, HIDDEN], DType::F32);
            let w2 = b.parameter("w2", [4, r, HIDDEN, FEATURES], DType::F32);
            let weights = [
                w1.annotate(sharding("(stage, _, _, _)")),
                w2.annotate(sharding("(stage, _, _, _)")),
            ];
            let y = match pipelined {
                true => p.run(&weights, &x, mlp_layer),
                false => p.sequential(&weights, &x, mlp_layer),
            };
            b.finish(&[&y]).unwrap()
        };
        let (pipelined, sequential) = (trace(true), trace(false));
        let inputs = inputs(&pipelined);
        let want = &interpret(&sequential, &inputs).unwrap()[0];
        let exe = compile(&pipelined, &mesh).unwrap();
        assert_runs_to(&exe, &inputs, want, &format!("{p:?}"));
    }
}

/// Reverse mode through the schedule's scan: the gradients of the pipelined loss with
/// respect to the stacked weights equal the sequential layers' gradients, on the
/// interpreter and partitioned on `(stage=4, model=2)`.
#[test]
fn pipelined_gradients_equal_the_sequential_ones() {
    let mesh = mlp_loss::mesh([4, 2]).unwrap();
    for p in [Pipeline::gpipe(4, 2, 5), Pipeline::circular(4, 2, 6)] {
        let loss_dims = mlp_loss::Dims {
            M: p.microbatches,
            B: ROWS,
            D: FEATURES,
            S: p.stages,
            R: p.repeats,
            F: HIDDEN,
        };
        let grads = |pipelined: bool| {
            let program = mlp_loss::trace(loss_dims, p, pipelined).unwrap();
            grad(&program, 0, &[2, 3]).unwrap()
        };
        let (pipelined, sequential) = (grads(true), grads(false));
        let inputs = inputs(&pipelined);
        let want = interpret(&sequential, &inputs).unwrap();
        let got = interpret(&pipelined, &inputs).unwrap();
        for (k, (w, g)) in want.iter().zip(&got).enumerate() {
            let d = max_diff(w, g);
            assert!(d <= TOLERANCE, "{p:?}: output {k} differs by {d}");
        }
        let exe = compile(&pipelined, &mesh).unwrap();
        let threads = ThreadMesh::new(mesh.clone()).unwrap();
        let got = exe.run(&threads, &inputs).unwrap();
        for (k, (w, g)) in want.iter().zip(&got).enumerate() {
            let d = max_diff(w, g);
            assert!(d <= TOLERANCE, "{p:?} on {mesh}: output {k} differs by {d}");
        }
    }
}

/// Names of the collectives of `program` (not of its regions).
fn collectives(program: &Program) -> Vec<&'static str> {
    (program.nodes.iter())
        .filter(|n| n.op.is_collective())
        .map(|n| n.op.name())
        .collect()
}

/// The per-device loop body: the only collective for the schedule is one
/// collective-shift of the buffer over `stage`; the rest is Megatron's all-reduce over
/// `model`, one per layer applied. Outside the loop, one all-reduce picks the last
/// stage's outputs. The per-device program does not grow with the microbatches (but
/// for constants).
#[test]
fn the_loop_body_has_one_shift_per_iteration() {
    let mesh = mlp_stack::mesh([4, 2]).unwrap();
    for (p, layers_per_iteration) in [
        (Pipeline::gpipe(4, 1, 4), 1),
        (Pipeline::gpipe(4, 3, 4), 3),
        (Pipeline::circular(4, 3, 4), 1),
        (Pipeline::circular(4, 3, 6), 1),
    ] {
        let sizes: Vec<usize> = [p.microbatches, 2 * p.microbatches]
            .into_iter()
            .map(|microbatches| {
                let p = Pipeline { microbatches, ..p };
                let exe = compile(&mlp_stack::trace(dims(&p), p, true).unwrap(), &mesh).unwrap();
                let local = &exe.spmd().program;
                assert_eq!(collectives(local), ["all_reduce"], "{p:?}\n{local}");
                let flows = distinct_flows(local);
                let [(_, flow)] = flows[..] else {
                    panic!("{p:?}: not one loop\n{local}");
                };
                let Flow::Scan { body, .. } = &**flow else {
                    panic!("{p:?}: not a scan\n{local}");
                };
                let mut got = collectives(body);
                got.sort();
                let mut want = vec!["all_reduce"; layers_per_iteration];
                want.push("collective_shift");
                assert_eq!(got, want, "{p:?}\n{body}");
                let shift = (body.nodes.iter())
                    .find(|n| n.op.name() == "collective_shift")
                    .unwrap();
                let Op::CollectiveShift { group, .. } = &shift.op else {
                    unreachable!()
                };
                assert_eq!(group.axes, ["stage"], "{p:?}");
                // Constants may merge when two of them coincide (`M = S`).
                (local.nodes.iter().chain(&body.nodes))
                    .filter(|n| n.op.kind() != OpKind::Constant)
                    .count()
            })
            .collect();
        assert_eq!(
            sizes[0], sizes[1],
            "{p:?}: the program grows with the microbatches"
        );
    }
}

/// The training step's loops, forward and backward: each iteration's only collective
/// over `stage` is one collective-shift (the backward of `roll` is the inverse
/// rotation; the backward loop state keeps the buffer's stage split), the others are
/// Megatron's all-reduces over `model`.
#[test]
fn the_backward_loop_body_has_one_shift_per_iteration() {
    let mesh = mlp_loss::mesh([4, 2]).unwrap();
    for p in [Pipeline::gpipe(4, 2, 5), Pipeline::circular(4, 2, 6)] {
        let loss_dims = mlp_loss::Dims {
            M: p.microbatches,
            B: ROWS,
            D: FEATURES,
            S: p.stages,
            R: p.repeats,
            F: HIDDEN,
        };
        let program = mlp_loss::trace(loss_dims, p, true).unwrap();
        let exe = compile(&grad(&program, 0, &[2, 3]).unwrap(), &mesh).unwrap();
        let local = &exe.spmd().program;
        let loops = distinct_flows(local);
        assert_eq!(loops.len(), 2, "{p:?}: forward and backward loops\n{local}");
        for (_, flow) in loops {
            let body = flow.regions()[0];
            let over = |axis: &str| -> Vec<&str> {
                (body.nodes.iter())
                    .filter(|n| n.op.collective_group().is_some_and(|g| g.axes == [axis]))
                    .map(|n| n.op.name())
                    .collect()
            };
            assert_eq!(over("stage"), ["collective_shift"], "{p:?}\n{body}");
            let others = collectives(body).len() - 1;
            assert!(
                over("model").len() == others && over("model").iter().all(|&c| c == "all_reduce"),
                "{p:?}\n{body}"
            );
        }
    }
}

/// Counts the schedule's idle stage-iterations ([`Pipeline::work`] is `None`) and checks
/// the schedule: every layer of every microbatch runs once, on the stage holding it,
/// after the layer before it, and a microbatch moves one stage per iteration. The
/// reported bubble fraction is the count's, the traced loop runs
/// [`Pipeline::iterations`] times, and at the same microbatch count the circular
/// schedule's fraction is below GPipe's.
#[test]
fn bubble_fraction_is_the_counted_idle_share() {
    for p in configs() {
        let (s, m) = (p.stages, p.microbatches);
        let per_iteration = match p.schedule {
            Schedule::GPipe => p.repeats,
            Schedule::Circular => 1,
            other => panic!("no iteration count for schedule {other:?}"),
        };
        let mut done = vec![vec![None; p.layers()]; m];
        let mut idle = 0;
        for t in 0..p.iterations() {
            for stage in 0..s {
                let Some((mb, first)) = p.work(t, stage) else {
                    idle += 1;
                    continue;
                };
                let layers = done[mb].iter_mut().enumerate();
                for (l, when) in layers.skip(first).take(per_iteration) {
                    assert_eq!(p.placement(l).0, stage, "{p:?}: layer {l} on stage {stage}");
                    assert!(when.is_none(), "{p:?}: layer {l} of {mb} twice");
                    *when = Some(t);
                }
            }
        }
        for (mb, times) in done.iter().enumerate() {
            let times: Vec<usize> = times.iter().map(|t| t.expect("every layer runs")).collect();
            for l in (per_iteration..p.layers()).step_by(per_iteration) {
                let (before, now) = (times[l - 1], times[l]);
                assert!(
                    now > before,
                    "{p:?}: microbatch {mb} layer {l} at {now} <= {before}"
                );
                if p.placement(l).0 != 0 {
                    assert_eq!(now, before + 1, "{p:?}: microbatch {mb} waits mid-pipeline");
                }
            }
        }
        let counted = idle as f64 / (s * p.iterations()) as f64;
        assert!(
            (p.bubble_fraction() - counted).abs() < 1e-12,
            "{p:?}: {counted}"
        );
        let program = mlp_stack::trace(dims(&p), p, true).unwrap();
        let lengths: Vec<usize> = (distinct_flows(&program).into_iter())
            .filter_map(|(_, flow)| match **flow {
                Flow::Scan { length, .. } => Some(length),
                _ => None,
            })
            .collect();
        assert_eq!(lengths, [p.iterations()], "{p:?}");
        let gpipe = Pipeline::gpipe(s, p.repeats, m).bubble_fraction();
        if p.schedule == Schedule::Circular && p.repeats > 1 {
            assert!(
                p.bubble_fraction() < gpipe,
                "{p:?}: {counted} vs GPipe {gpipe}"
            );
        }
    }
}

// ---- bad configurations ----------------------------------------------------------------

/// Traces `run` (given a builder, `x: [4, 2, 8]`, `w1: [4, 2, 8, 16]`, `w2: [4, 2, 16,
/// 8]`) and returns the message of the one `pipeline` error it records, checked to be
/// at the line `run` returns.
fn pipeline_error(run: impl FnOnce(&Builder, &Tensor, &[Tensor]) -> u32) -> String {
    let b = Builder::new("bad");
    let x = b.parameter("x", [4, 2, 8], DType::F32);
    let w = [
        b.parameter("w1", [4, 2, 8, 16], DType::F32),
        b.parameter("w2", [4, 2, 16, 8], DType::F32),
    ];
    let line = run(&b, &x, &w);
    match b.finish(&[]) {
        Err(Error::Shape {
            op: "pipeline",
            location: Location { file, line: at, .. },
            message,
        }) => {
            assert!(file.ends_with("tests/pipeline.rs"), "{file}");
            assert_eq!(at, line, "{message}");
            message
        }
        other => panic!("expected one pipeline error, got {other:?}"),
    }
}

#[test]
fn circular_schedule_with_fewer_microbatches_than_stages() {
    let message = pipeline_error(|_, x, w| {
        let x = x.slice_axis(0, 0, 3);
        let _ = Pipeline::circular(4, 2, 3).run(w, &x, mlp_layer);
        line!() - 1
    });
    assert!(message.contains("3 < 4"), "{message}");
}

#[test]
fn inputs_without_one_row_per_microbatch() {
    let message = pipeline_error(|_, x, w| {
        let _ = Pipeline::gpipe(4, 2, 5).run(w, x, mlp_layer);
        line!() - 1
    });
    assert!(message.contains("microbatches = 5"), "{message}");
}

#[test]
fn weights_not_stacked_by_stage_and_repeat() {
    let message = pipeline_error(|_, x, w| {
        let _ = Pipeline::gpipe(2, 4, 4).run(w, x, mlp_layer);
        line!() - 1
    });
    assert!(message.contains("[stages = 2, repeats = 4"), "{message}");
}

#[test]
fn a_pipeline_without_stages() {
    let message = pipeline_error(|_, x, _| {
        let _ = Pipeline::gpipe(0, 2, 4).sequential(&[], x, mlp_layer);
        line!() - 1
    });
    assert!(message.contains("at least one stage"), "{message}");
}

#[test]
fn a_layer_that_changes_the_activation_shape() {
    for p in [Pipeline::gpipe(4, 2, 4), Pipeline::circular(4, 2, 4)] {
        let message = pipeline_error(|_, x, w| {
            let _ = p.run(w, x, |w, x| einsum("sbd,sdf->sbf", x, &w[0]));
            line!() - 1
        });
        assert!(message.contains("the layer must return"), "{message}");
    }
}
