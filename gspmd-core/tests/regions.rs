//! Control flow with regions (`while`, `scan`, `fori_loop`, `cond`) through the whole
//! pipeline: printing, simplification, propagation across the region boundary, and
//! partitioned runs on thread meshes against the reference interpreter.
//!
//! Tolerance: |got - want| <= 1e-4 * max(1, max |want|) (f32 sums in another order).

mod differential;

use differential::compile_and_check;
use gspmd_core::autodiff::grad;
use gspmd_core::ir::{Builder, DType, Literal, Op, OpKind, Program, ReduceKind, Tensor, verify};
use gspmd_core::runtime::{interpret, interpret_with_memory_limit};
use gspmd_core::sharding::{Mesh, Sharding};
use gspmd_core::{Error, compile};
use ndarray::{ArrayD, IxDyn};

fn s(text: &str) -> Sharding {
    text.parse().unwrap()
}

fn f32_input(shape: &[usize], seed: usize) -> Literal {
    let n: usize = shape.iter().product();
    let v: Vec<f32> = (0..n)
        .map(|i| (((i * 7 + seed * 13) % 29) as f32 / 9.0 - 1.5) * 0.5)
        .collect();
    Literal::F32(ArrayD::from_shape_vec(IxDyn(shape), v).unwrap())
}

/// Deterministic inputs: f32 by [`f32_input`], i32 scalars `int`.
fn inputs(program: &Program, int: i32) -> Vec<Literal> {
    (program.params.iter().enumerate())
        .map(|(i, &p)| match program.ty(p).dtype {
            DType::I32 => Literal::full(&program.ty(p).shape, DType::I32, f64::from(int)),
            _ => f32_input(&program.ty(p).shape, i),
        })
        .collect()
}

fn build(name: &str, f: impl FnOnce(&Builder) -> Vec<Tensor>) -> Program {
    let b = Builder::new(name);
    let outs = f(&b);
    let refs: Vec<&Tensor> = outs.iter().collect();
    b.finish(&refs).unwrap()
}

fn meshes() -> Vec<Mesh> {
    vec![
        Mesh::new([("data", 1), ("model", 2)]).unwrap(),
        Mesh::new([("data", 4), ("model", 1)]).unwrap(),
        Mesh::new([("data", 2), ("model", 2)]).unwrap(),
        Mesh::new([("data", 2), ("model", 4)]).unwrap(),
        Mesh::with_device_order([("data", 4), ("model", 2)], vec![5, 2, 7, 0, 3, 6, 1, 4]).unwrap(),
    ]
}

/// Every output of `program` compiled for each mesh and run on threads is within the
/// tolerance of the interpreter's.
fn check_on_meshes(program: &Program, inputs: &[Literal]) {
    for mesh in meshes() {
        compile_and_check(program, &mesh, inputs, 1e-4);
    }
}

/// `x <- tanh(x @ w[l])` for each layer `l` of the stacked weights, as one scan; the
/// weights' output features split over `model`, the activations over `data`.
fn scanned_mlp(b: &Builder, layers: usize, batch: usize, d: usize) -> Tensor {
    let x = b
        .parameter("x", [batch, d], DType::F32)
        .annotate(s("(data, _)"));
    let w = b
        .parameter("w", [layers, d, d], DType::F32)
        .annotate(s("(_, _, model)"));
    let (carry, _) = b.scan(&[w], &[x], |c, w| (vec![c[0].matmul(&w[0]).tanh()], vec![]));
    carry[0].clone()
}

/// The same layers unrolled by a Rust `for` loop over slices of the stacked weights.
fn unrolled_mlp(b: &Builder, layers: usize, batch: usize, d: usize) -> Tensor {
    let mut x = b
        .parameter("x", [batch, d], DType::F32)
        .annotate(s("(data, _)"));
    let w = b
        .parameter("w", [layers, d, d], DType::F32)
        .annotate(s("(_, _, model)"));
    for l in 0..layers {
        let wl = w.slice_axis(0, l, l + 1).reshape([d, d]);
        x = x.matmul(&wl).tanh();
    }
    x
}

/// A scan over stacked layer weights `[L, D, D]` computes what the unrolled model
/// does, on one device and on every mesh.
#[test]
fn scan_over_stacked_layers_equals_the_unrolled_model() {
    let scanned = build("scan_mlp", |b| vec![scanned_mlp(b, 3, 8, 16)]);
    let unrolled = build("unrolled_mlp", |b| vec![unrolled_mlp(b, 3, 8, 16)]);
    let inputs = inputs(&scanned, 0);
    let (a, b) = (
        interpret(&scanned, &inputs).unwrap(),
        interpret(&unrolled, &inputs).unwrap(),
    );
    let (a, b) = (a[0].as_f32().unwrap(), b[0].as_f32().unwrap());
    let d = a
        .iter()
        .zip(b.iter())
        .map(|(x, y)| (x - y).abs())
        .fold(0.0, f32::max);
    assert!(d <= 1e-5, "scan vs unrolled: {d}");
    check_on_meshes(&scanned, &inputs);
}

/// Reverse mode through the scan: the gradients of a loss of the scanned MLP with
/// respect to the input and the stacked weights equal those of the unrolled model, on
/// one device and partitioned on every mesh (the backward pass is a reverse scan whose
/// body is partitioned once, like the forward one).
#[test]
fn scan_gradients_equal_the_unrolled_model_on_meshes() {
    let loss = |model: fn(&Builder, usize, usize, usize) -> Tensor| {
        move |b: &Builder| {
            let y = model(b, 3, 8, 16);
            vec![y.mul(&y).sum(&[0, 1])]
        }
    };
    let scanned = grad(&build("scan_loss", loss(scanned_mlp)), 0, &[0, 1]).unwrap();
    let unrolled = grad(&build("unrolled_loss", loss(unrolled_mlp)), 0, &[0, 1]).unwrap();
    let inputs = inputs(&scanned, 0);
    let (a, b) = (
        interpret(&scanned, &inputs).unwrap(),
        interpret(&unrolled, &inputs).unwrap(),
    );
    for (k, (a, b)) in a.iter().zip(&b).enumerate() {
        let (a, b) = (a.as_f32().unwrap(), b.as_f32().unwrap());
        let d = (a.iter().zip(b.iter())).fold(0.0f32, |m, (x, y)| m.max((x - y).abs()));
        assert!(d <= 1e-4, "output {k}: scan vs unrolled gradient {d}");
    }
    check_on_meshes(&scanned, &inputs);
}

/// Reverse mode through a `cond` inside a `fori_loop`, partitioned on every mesh.
#[test]
fn fori_loop_and_cond_gradients_on_meshes() {
    let p = build("fori_cond", |b| {
        let x = b
            .parameter("x", [8, 12], DType::F32)
            .annotate(s("(data, model)"));
        let w = b.parameter("w", [12, 12], DType::F32);
        let out = b.fori_loop(3, &[x], |i, c| {
            let even = i.rem(&i.scalar_like(2.0)).eq(&i.scalar_like(0.0));
            let ib = i.builder();
            let r = ib.cond(
                &even,
                |_| vec![c[0].matmul(&w).tanh()],
                |_| vec![c[0].sin()],
            );
            vec![r[0].clone()]
        });
        vec![out[0].mul(&out[0]).sum(&[0, 1])]
    });
    let g = grad(&p, 0, &[0, 1]).unwrap();
    check_on_meshes(&g, &inputs(&g, 0));
}

/// The body is partitioned once: its collective (the all-gather that brings the
/// activations back to the carried sharding) is inside the loop, the per-device
/// program has one scan and no collective outside it, and its size does not depend on
/// the number of layers.
#[test]
fn loop_body_is_partitioned_once_with_its_collectives_inside() {
    let mesh = Mesh::new([("data", 2), ("model", 2)]).unwrap();
    let sizes: Vec<(usize, usize)> = [2, 12, 48]
        .iter()
        .map(|&layers| {
            let p = build("scan_mlp", |b| vec![scanned_mlp(b, layers, 8, 16)]);
            let exe = compile(&p, &mesh).unwrap();
            let local = &exe.spmd().program;
            assert!(local.nodes.iter().all(|n| !n.op.is_collective()), "{local}");
            let scans: Vec<&Op> = (local.nodes.iter().map(|n| &n.op))
                .filter(|op| op.kind() == OpKind::Scan)
                .collect();
            assert_eq!(scans.len(), 1, "{local}");
            let Op::Flow { flow, .. } = scans[0] else {
                unreachable!()
            };
            let body = flow.regions()[0];
            let gathers: Vec<_> = (body.nodes.iter())
                .filter(|n| n.op.is_collective())
                .collect();
            assert_eq!(gathers.len(), 1, "{local}");
            assert_eq!(gathers[0].op.name(), "all_gather", "{local}");
            // The report lists it under its loop, once.
            let report = exe.report();
            let listed = report
                .lines()
                .filter(|l| l.contains(" scan body: "))
                .count();
            assert_eq!(listed, 1, "{report}");
            (local.nodes.len(), body.nodes.len())
        })
        .collect();
    assert!(sizes.windows(2).all(|w| w[0] == w[1]), "{sizes:?}");
}

/// A `while` whose trip count is a run-time input, with a matmul needing a collective
/// in the body and the condition reading the sharded state through a reduction: every
/// device runs the same iterations.
#[test]
fn while_with_run_time_trip_count_on_meshes() {
    let p = build("while", |b| {
        let x = b
            .parameter("x", [8, 12], DType::F32)
            .annotate(s("(data, model)"));
        let w = b
            .parameter("w", [12, 12], DType::F32)
            .annotate(s("(model, _)"));
        let n = b.parameter("n", [], DType::I32);
        let zero = b.constant(Literal::full(&[], DType::I32, 0.0));

        b.while_loop(
            |st| {
                let small = st[1].abs().sum(&[0, 1]).lt(&st[1].builder().scalar(1e6));
                st[0].lt(&n).and(&small)
            },
            |st| {
                let one = st[0]
                    .builder()
                    .constant(Literal::full(&[], DType::I32, 1.0));
                vec![st[0].add(&one), st[1].matmul(&w).tanh().add(&st[1])]
            },
            &[zero, x],
        )
    });
    for n in [0, 1, 4] {
        check_on_meshes(&p, &inputs(&p, n));
    }
}

/// Nested loops and a `cond` on a run-time predicate on meshes: the inner loop's body
/// captures a sharded weight through both regions.
#[test]
fn nested_loops_and_cond_on_meshes() {
    let p = build("nested", |b| {
        let x = b
            .parameter("x", [8, 6], DType::F32)
            .annotate(s("(data, _)"));
        let w = b
            .parameter("w", [6, 6], DType::F32)
            .annotate(s("(_, model)"));
        let k = b.parameter("k", [], DType::I32);
        let outer = b.fori_loop(2, &[x], |_, c| {
            b.fori_loop(3, c, |j, c| {
                let fj = j.convert(DType::F32).mul(&j.builder().scalar(0.1));
                vec![c[0].matmul(&w).tanh().add(&fj)]
            })
        });
        let pred = k.gt(&b.constant(Literal::full(&[], DType::I32, 2.0)));
        let r = b.cond(
            &pred,
            |_| vec![outer[0].matmul(&w)],
            |inner| vec![outer[0].mul(&inner.scalar(-1.0))],
        );
        vec![outer[0].clone(), r[0].clone()]
    });
    for k in [1, 3] {
        check_on_meshes(&p, &inputs(&p, k));
    }
}

/// The printer nests each region under the first result node of its op, one level
/// deeper per region level; the op's other result nodes name that node.
#[test]
fn regions_print_nested() {
    let p = build("printed", |b| {
        let x = b.parameter("x", [2], DType::F32);
        b.fori_loop(2, &[x], |_, c| b.fori_loop(1, c, |_, c| vec![c[0].exp()]))
    });
    let text = p.to_string();
    let lines: Vec<&str> = text.lines().collect();
    let at = |needle: &str| {
        lines
            .iter()
            .position(|l| l.contains(needle))
            .unwrap_or_else(|| panic!("no {needle:?} in\n{text}"))
    };
    let indent = |i: usize| lines[i].len() - lines[i].trim_start().len();
    let outer = at("= scan(%1, %0), result=0");
    assert_eq!(indent(outer), 2, "{text}");
    assert_eq!(indent(outer + 1), 4, "{text}");
    assert!(lines[outer + 1].trim() == "body {", "{text}");
    let inner = at("exponential");
    assert_eq!(indent(inner), 10, "{text}");
    assert!(text.contains("// regions of %2"), "{text}");
    // The counter's constants and increment are located at the user's `fori_loop`.
    assert!(!text.contains("control_flow.rs"), "{text}");
}

/// A sharding chosen inside a loop body (a constraint on the new state) becomes the
/// loop state's: the unannotated initial value is split alike, and the per-device
/// program has no reshard of the state at the back edge or before the loop.
#[test]
fn a_constraint_in_the_body_shards_the_whole_loop_state() {
    let p = build("body_sharded", |b| {
        let x = b.parameter("x", [8, 12], DType::F32);

        b.fori_loop(3, &[x], |_, c| {
            vec![c[0].tanh().add(&c[0]).shard(s("(data, model)"))]
        })
    });
    let exe = compile(&p, &Mesh::new([("data", 2), ("model", 2)]).unwrap()).unwrap();
    assert_eq!(
        exe.spmd().inputs[0].1.to_string(),
        "(data, model)",
        "{}",
        exe.report()
    );
    assert_eq!(exe.spmd().collectives().total(), 0, "{}", exe.report());
    check_on_meshes(&p, &inputs(&p, 0));
}

/// A scan's stacked dim may be split outside the loop: the stacked operand split over
/// `data` on its leading dim is gathered once at the loop's entry (one all-gather over
/// `data`, outside the body), and the stacked output, wanted split the same way, is
/// cut locally after the loop (no collective over `data` there).
#[test]
fn a_stacked_dim_split_outside_the_loop_is_gathered_once_at_entry() {
    let p = build("split_stacked", |b| {
        let xs = b
            .parameter("xs", [8, 4, 12], DType::F32)
            .annotate(s("(data, _, model)"));
        let w = b.parameter("w", [12, 12], DType::F32);
        let init = b.parameter("init", [4, 12], DType::F32);
        let (c, ys) = b.scan(&[xs], &[init], |c, x| {
            let h = x[0].matmul(&w).tanh().add(&c[0]);
            (vec![h.clone()], vec![h.mul(&x[0])])
        });
        vec![c[0].clone(), ys[0].annotate(s("(data, _, _)"))]
    });
    let mesh = Mesh::new([("data", 2), ("model", 2)]).unwrap();
    let exe = compile_and_check(&p, &mesh, &inputs(&p, 0), 1e-4);
    let outside: Vec<(&str, Vec<String>)> = (exe.spmd().program.nodes.iter())
        .filter(|n| n.op.is_collective())
        .map(|n| (n.op.name(), n.op.collective_group().unwrap().axes.clone()))
        .collect();
    let gather = |axis: &str| ("all_gather", vec![axis.to_string()]);
    assert_eq!(
        outside,
        [gather("data"), gather("model")],
        "{}",
        exe.report()
    );
    check_on_meshes(&p, &inputs(&p, 0));
}

/// Results of a flow instance waiting for their node count as live values: here the
/// stacked output `ys` of a scan is read only after a large temporary, and the memory
/// limit sees it (as it sees a scan's residuals kept for the backward pass).
#[test]
fn results_waiting_for_their_node_count_against_the_memory_limit() {
    let n = 256;
    let b = Builder::new("pending");
    let x = b.parameter("x", [n], DType::F32);
    let xs = b.parameter("xs", [4, n], DType::F32);
    let (c, ys) = b.scan(
        std::slice::from_ref(&xs),
        std::slice::from_ref(&x),
        |c, x| (vec![c[0].add(&x[0])], vec![c[0].mul(&c[0])]),
    );
    let traced = b.finish(&[&c[0], &ys[0]]).unwrap();
    // The same program with a large temporary between the two result nodes.
    let (r0, r1) = (c[0].id().unwrap(), ys[0].id().unwrap());
    let mut program = Program::new("pending");
    for node in &traced.nodes[..=r0.index()] {
        program.push(node.clone());
    }
    let at = traced.node(r0).location;
    let broadcast = Op::Broadcast {
        shape: vec![16, n],
        dims: vec![1],
    };
    let big = program.push_op(broadcast, &[r0], at).unwrap();
    let sum = Op::Reduce {
        kind: ReduceKind::Sum,
        dims: vec![0, 1],
    };
    let total = program.push_op(sum, &[big], at).unwrap();
    let late = program.push(traced.node(r1).clone());
    program.params = traced.params.clone();
    program.outputs = vec![total, late];
    verify(&program).unwrap();

    let inputs = inputs(&program, 0);
    // At the broadcast: x, xs (read again by the late node), the carried result, the
    // waiting ys and the temporary.
    let (x_bytes, xs_bytes, big_bytes) = (4 * n, 16 * n, 64 * n);
    let live_before = x_bytes + xs_bytes + x_bytes + xs_bytes;
    let peak = live_before + big_bytes;
    let want = interpret(&program, &inputs).unwrap();
    // The reduce then runs beside the temporary with its kernel's scratch (a copy of
    // its operand and of its result), which the limit counts too.
    let reduce_scratch = big_bytes + 4;
    assert_eq!(
        interpret_with_memory_limit(&program, &inputs, peak + 4 + reduce_scratch).unwrap(),
        want
    );
    match interpret_with_memory_limit(&program, &inputs, peak - 1) {
        Err(Error::OutOfMemory {
            op, bytes, live, ..
        }) => assert_eq!((op, bytes, live), ("broadcast", big_bytes, live_before)),
        other => panic!("{other:?}"),
    }
}

/// Random differential test of reverse mode through control flow: random shardings of
/// the input, the weights and the loop state (a constraint inside the body), a random
/// loop (`scan` over stacked weights, forward or reversed; `fori_loop` with a `cond`
/// inside; a `cond` holding a scan), the gradient of `sum(out^2)` with respect to
/// every parameter, partitioned on a random mesh and run on threads against the
/// interpreter.
#[test]
fn random_gradients_through_control_flow_on_meshes() {
    use rand::rngs::Xoshiro256PlusPlus;
    use rand::seq::IndexedRandom;
    use rand::{RngExt, SeedableRng};
    let rank2 = [
        "(_, _)",
        "(data, _)",
        "(_, model)",
        "(data, model)",
        "(model, data)",
        "((data, model), _)",
    ];
    let rank3 = [
        "(_, _, _)",
        "(_, data, model)",
        "(_, _, model)",
        "(_, model, _)",
        "(data, _, _)",
    ];
    let mut rng = Xoshiro256PlusPlus::seed_from_u64(11);
    for case in 0..24 {
        let mesh = meshes().choose(&mut rng).unwrap().clone();
        let pick2 = |rng: &mut Xoshiro256PlusPlus| s(rank2.choose(rng).unwrap());
        let (xs, ws, cs) = (pick2(&mut rng), pick2(&mut rng), pick2(&mut rng));
        let stack = s(rank3.choose(&mut rng).unwrap());
        let (kind, reverse) = (rng.random_range(0..3), rng.random_ratio(1, 2));
        let (batch, d, layers) = (4 * rng.random_range(1..3), 4 * rng.random_range(1..3), 3);
        let name = format!("case {case}: kind {kind}, x {xs}, w {ws}, carry {cs}, stack {stack}");
        let p = build("random_grad", |b| {
            let x = b.parameter("x", [batch, d], DType::F32).annotate(xs);
            let w = b.parameter("w", [d, d], DType::F32).annotate(ws);
            let stacked = b
                .parameter("stack", [layers, d, d], DType::F32)
                .annotate(stack);
            let layer = |c: &Tensor, w: &Tensor| c.matmul(w).tanh().shard(cs.clone());
            let out = match kind {
                0 => {
                    let body = |c: &[Tensor], wl: &[Tensor]| {
                        let h = layer(&c[0], &wl[0]);
                        (vec![h.clone()], vec![h.mul(&x)])
                    };
                    let (c, ys) = if reverse {
                        b.scan_reverse(
                            std::slice::from_ref(&stacked),
                            std::slice::from_ref(&x),
                            body,
                        )
                    } else {
                        b.scan(
                            std::slice::from_ref(&stacked),
                            std::slice::from_ref(&x),
                            body,
                        )
                    };
                    c[0].add(&ys[0].sum(&[0]))
                }
                1 => b.fori_loop(layers, std::slice::from_ref(&x), |i, c| {
                    let odd = i.rem(&i.scalar_like(2.0)).eq(&i.scalar_like(1.0));
                    let r =
                        i.builder()
                            .cond(&odd, |_| vec![layer(&c[0], &w)], |_| vec![c[0].sin()]);
                    vec![r[0].clone()]
                })[0]
                    .clone(),
                _ => {
                    let positive = w.sum(&[0, 1]).gt(&b.scalar(0.0));
                    b.cond(
                        &positive,
                        |_| {
                            let (c, _) = b.scan(
                                std::slice::from_ref(&stacked),
                                std::slice::from_ref(&x),
                                |c, wl| (vec![layer(&c[0], &wl[0])], vec![]),
                            );
                            vec![c[0].clone()]
                        },
                        |_| vec![layer(&x, &w)],
                    )[0]
                    .clone()
                }
            };
            vec![out.mul(&out).sum(&[0, 1])]
        });
        let g = grad(&p, 0, &[0, 1, 2]).unwrap_or_else(|e| panic!("{name}: {e}"));
        let mut inputs = inputs(&g, 0);
        if rng.random_ratio(1, 2) {
            // The other branch of the `cond` on `sum(w) > 0`.
            inputs[1] = Literal::F32(-inputs[1].as_f32().unwrap());
        }
        compile_and_check(&g, &mesh, &inputs, 1e-3);
    }
}
