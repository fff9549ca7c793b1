//! `simplify` (common-subexpression and dead-code elimination) and its place in
//! `compile`: node counts of the global and per-device programs, and differential runs
//! (thread mesh vs. the reference interpreter on the original, unsimplified program).

use gspmd_core::ir::{
    Builder, CollectiveKind, DType, Literal, Node, Op, Program, Tensor, UnaryOp, einsum,
};
use gspmd_core::partition::partition;
use gspmd_core::propagation::propagate;
use gspmd_core::runtime::{ThreadMesh, interpret, sample_inputs};
use gspmd_core::sharding::{Mesh, Sharding};
use gspmd_core::simplify::{Stage, simplify};
use gspmd_core::{Error, Executable, compile};

fn s(text: &str) -> Sharding {
    text.parse().unwrap()
}

fn mesh(axes: &[(&str, usize)]) -> Mesh {
    Mesh::new(axes.iter().copied()).unwrap()
}

/// Number of nodes of `program` whose op is named `name`.
fn count(program: &Program, name: &str) -> usize {
    program.nodes.iter().filter(|n| n.op.name() == name).count()
}

/// Bitwise equality of two runs' outputs (simplification must not change one bit).
fn assert_same_bits(want: &[Literal], got: &[Literal], context: &str) {
    assert_eq!(want.len(), got.len(), "{context}");
    for (k, (w, g)) in want.iter().zip(got).enumerate() {
        let same = match (w, g) {
            (Literal::F32(a), Literal::F32(b)) => {
                a.shape() == b.shape() && a.iter().zip(b).all(|(x, y)| x.to_bits() == y.to_bits())
            }
            _ => w == g,
        };
        assert!(same, "{context}: output {k} differs\nwant {w:?}\ngot {g:?}");
    }
}

/// Compiles `program` for `mesh`, runs it on threads and compares every output with
/// the interpreter's on the ORIGINAL program; returns the executable.
fn check_on_mesh(program: &Program, mesh: &Mesh) -> Executable {
    let inputs = sample_inputs(program, 7);
    let want = interpret(program, &inputs).unwrap();
    let exe = compile(program, mesh).unwrap_or_else(|e| panic!("{mesh}: {e}"));
    let threads = ThreadMesh::new(mesh.clone()).unwrap();
    let got = exe
        .run(&threads, &inputs)
        .unwrap_or_else(|e| panic!("{mesh}: {e}"));
    assert_eq!(want.len(), got.len());
    for (k, (w, g)) in want.iter().zip(&got).enumerate() {
        let (a, b) = (w.as_f32().unwrap(), g.as_f32().unwrap());
        assert_eq!(a.shape(), b.shape());
        let scale = a.iter().fold(1.0f32, |m, x| m.max(x.abs()));
        let diff = a
            .iter()
            .zip(b)
            .fold(0.0f32, |m, (x, y)| m.max((x - y).abs()));
        assert!(
            diff <= 1e-4 * scale,
            "{mesh}, output {k}: diff {diff}\n{}",
            exe.report()
        );
    }
    // The per-device program is simplified: simplifying it again changes nothing.
    let again = simplify(&exe.spmd().program, Stage::Sharded).unwrap();
    assert_eq!(again.nodes.len(), exe.spmd().program.nodes.len(), "{mesh}");
    exe
}

// ---- dead code ------------------------------------------------------------------------

/// x, y -> exp(x) + 1, with a dead chain on x and an unused parameter y.
fn with_dead_code() -> Program {
    let b = Builder::new("dead");
    let x = b.parameter("x", [4, 6], DType::F32);
    let _y = b.parameter("y", [3], DType::F32);
    let dead = x.tanh().sum(&[1]);
    let _deader = dead.exp();
    let out = x.exp().add(&b.full([4, 6], DType::F32, 1.0));
    b.finish(&[&out]).unwrap()
}

#[test]
fn dce_removes_what_no_output_uses_and_keeps_every_parameter() {
    let program = with_dead_code();
    let simple = simplify(&program, Stage::Sharded).unwrap();
    // x, y, exp, constant, broadcast, add: the tanh, reduce and exp of the dead chain go.
    let ops: Vec<&str> = simple.nodes.iter().map(|n| n.op.name()).collect();
    assert_eq!(count(&program, "tanh"), 1);
    assert_eq!(
        count(&simple, "tanh") + count(&simple, "reduce"),
        0,
        "{simple}"
    );
    assert_eq!(count(&simple, "parameter"), 2, "{simple}");
    assert_eq!(simple.nodes.len(), program.nodes.len() - 3, "{ops:?}");
    // Parameter i is still params[i], with its name; outputs are renumbered.
    for (i, &p) in simple.params.iter().enumerate() {
        assert!(matches!(simple.node(p).op, Op::Parameter { index, .. } if index == i));
    }
    assert_eq!(simple.node(simple.params[1]).name.as_deref(), Some("y"));
    gspmd_core::ir::verify(&simple).unwrap();
    let inputs = sample_inputs(&program, 1);
    assert_same_bits(
        &interpret(&program, &inputs).unwrap(),
        &interpret(&simple, &inputs).unwrap(),
        "dead code",
    );
    check_on_mesh(&program, &mesh(&[("data", 2), ("model", 2)]));
}

// ---- common subexpressions --------------------------------------------------------------

/// Two copies of `tanh(x @ w) * 2` (the second one traced separately), added; plus
/// the constant 2 traced several times.
fn with_duplicates() -> Program {
    let b = Builder::new("dup");
    let x = b
        .parameter("x", [8, 6], DType::F32)
        .annotate(s("(data, _)"));
    let w = b
        .parameter("w", [6, 4], DType::F32)
        .annotate(s("(_, model)"));
    let branch = || x.matmul(&w).tanh().mul(&b.full([8, 4], DType::F32, 2.0));
    let out = branch().add(&branch());
    b.finish(&[&out]).unwrap()
}

#[test]
fn cse_merges_equal_chains_and_the_result_still_runs_right() {
    let program = with_duplicates();
    let simple = simplify(&program, Stage::Sharded).unwrap();
    // Each branch is dot, tanh, constant, broadcast, multiply: one branch remains.
    assert_eq!(count(&program, "dot_general"), 2);
    assert_eq!(count(&simple, "dot_general"), 1, "{simple}");
    assert_eq!(count(&simple, "constant"), 1, "{simple}");
    assert_eq!(simple.nodes.len(), program.nodes.len() - 5, "{simple}");
    let inputs = sample_inputs(&program, 3);
    assert_same_bits(
        &interpret(&program, &inputs).unwrap(),
        &interpret(&simple, &inputs).unwrap(),
        "duplicates",
    );
    // Before propagation the constant 2 and its broadcast are not merged, but they
    // compare equal, so the multiplies merge and the second copy is dead.
    let global = simplify(&program, Stage::BeforePropagation).unwrap();
    assert_eq!(global, simple);
    for m in [
        mesh(&[("data", 2), ("model", 2)]),
        mesh(&[("data", 2), ("model", 4)]),
    ] {
        let exe = check_on_mesh(&program, &m);
        // compile's global program is the one simplified before propagation.
        assert_eq!(exe.propagated().nodes.len(), global.nodes.len(), "{m}");
        assert_eq!(count(&exe.spmd().program, "dot_general"), 1, "{m}");
    }
}

#[test]
fn constants_merge_by_bit_pattern() {
    let b = Builder::new("constants");
    let x = b.parameter("x", [5], DType::F32);
    let full = |v: f32| {
        b.constant(Literal::F32(ndarray::ArrayD::from_elem(
            ndarray::IxDyn(&[5]),
            v,
        )))
    };
    // 1/0 and 1/-0 differ (+inf, -inf): merging the zeros would change the result.
    let pos = full(1.0).div(&full(0.0));
    let neg = full(1.0).div(&full(-0.0));
    let nan = x.add(&full(f32::NAN)).add(&full(f32::NAN));
    let out = pos.add(&x).mul(&neg.max(&x)).add(&nan.mul(&full(0.0)));
    let program = b.finish(&[&out, &pos, &neg]).unwrap();
    let simple = simplify(&program, Stage::Sharded).unwrap();
    // Constants 1.0 (x2 -> 1), 0.0 (x2 -> 1), -0.0, NaN (x2 -> 1): four remain.
    assert_eq!(count(&program, "constant"), 7);
    assert_eq!(count(&simple, "constant"), 4, "{simple}");
    assert_eq!(count(&simple, "divide"), 2, "{simple}");
    let inputs = sample_inputs(&program, 5);
    let want = interpret(&program, &inputs).unwrap();
    assert_same_bits(&want, &interpret(&simple, &inputs).unwrap(), "constants");
    assert!(
        want[1]
            .as_f32()
            .unwrap()
            .iter()
            .all(|&v| v == f32::INFINITY)
    );
    assert!(
        want[2]
            .as_f32()
            .unwrap()
            .iter()
            .all(|&v| v == f32::NEG_INFINITY)
    );
}

#[test]
fn constraints_merge_only_with_the_same_annotation() {
    let b = Builder::new("constraints");
    let x = b.parameter("x", [8, 8], DType::F32);
    let e = x.exp();
    let by_data = e.shard(s("(data, _)"));
    let by_data_again = e.shard(s("(data, _)"));
    let by_model = e.shard(s("(_, model)"));
    let out = by_data.add(&by_data_again).add(&by_model.mul(&by_model));
    let program = b.finish(&[&out]).unwrap();
    let simple = simplify(&program, Stage::Sharded).unwrap();
    assert_eq!(count(&program, "sharding_constraint"), 3);
    assert_eq!(count(&simple, "sharding_constraint"), 2, "{simple}");
    let annotations: Vec<String> = (simple.nodes.iter())
        .filter(|n| n.op == Op::ShardingConstraint)
        .map(|n| n.annotation.as_ref().unwrap().to_string())
        .collect();
    assert_eq!(annotations, ["(data, _)", "(_, model)"]);
    let exe = check_on_mesh(&program, &mesh(&[("data", 2), ("model", 2)]));
    assert_eq!(count(exe.propagated(), "sharding_constraint"), 2);
}

/// Two equal `exp(x)` nodes, sharded as given (as after propagation).
fn two_exps(first: &str, second: &str) -> Program {
    let b = Builder::new("sharded");
    let x = b.parameter("x", [4, 4], DType::F32);
    let (p, q) = (x.exp(), x.exp());
    let mut program = b.finish(&[&p.add(&q)]).unwrap();
    for (v, sharding) in [(p.id(), first), (q.id(), second)] {
        program.node_mut(v.unwrap()).sharding = Some(s(sharding));
    }
    program
}

#[test]
fn values_sharded_differently_do_not_merge() {
    let exps = |p: &Program| count(p, "exponential");
    let simplify_sharded = |p: &Program| simplify(p, Stage::Sharded);
    assert_eq!(
        exps(&simplify_sharded(&two_exps("(data, _)", "(_, data)")).unwrap()),
        2
    );
    assert_eq!(
        exps(&simplify_sharded(&two_exps("(data, _)", "(data, _)")).unwrap()),
        1
    );
}

#[test]
fn a_merged_value_keeps_the_first_location_and_a_name() {
    let b = Builder::new("names");
    let x = b.parameter("x", [4], DType::F32);
    let first = x.neg();
    let second = x.neg().named("negated");
    let program = b.finish(&[&first, &second]).unwrap();
    let simple = simplify(&program, Stage::Sharded).unwrap();
    assert_eq!(simple.outputs[0], simple.outputs[1]);
    let node = simple.node(simple.outputs[0]);
    assert_eq!(node.name.as_deref(), Some("negated"));
    assert_eq!(node.location, program.node(first.id().unwrap()).location);
    // Two outputs that are one value still come back as two outputs on the mesh.
    check_on_mesh(&program, &mesh(&[("data", 2)]));
}

#[test]
fn simplify_rejects_a_malformed_program_with_a_typed_error() {
    let mut program = with_dead_code();
    let last = program.nodes.len() as u32 - 1;
    program.nodes[1].operands = vec![gspmd_core::ir::ValueId(last)];
    program.nodes[1].op = Op::Unary(UnaryOp::Neg);
    let err = simplify(&program, Stage::Sharded).unwrap_err();
    assert!(
        matches!(&err, Error::Verify { .. } | Error::Many(_)),
        "{err:?}"
    );
}

/// The input layer and the loss of a language model: one-hot encodings of tokens and
/// of targets, each comparing its own copy of one iota.
fn one_hots() -> Program {
    let (batch, seq, vocab, width) = (8, 6, 8, 16);
    let b = Builder::new("one_hots");
    let ids = |name: &str| {
        b.parameter(name, [batch, seq], DType::I32)
            .annotate(s("(data, _)"))
    };
    let (tokens, targets) = (ids("tokens"), ids("targets"));
    let embed = b
        .parameter("embed", [vocab, width], DType::F32)
        .annotate(s("(_, model)"));
    let unembed = b
        .parameter("unembed", [width, vocab], DType::F32)
        .annotate(s("(data, model)"));
    let one_hot = |ids: &Tensor| {
        let shape = [batch, seq, vocab];
        b.iota(shape, 2, DType::I32)
            .eq(&ids.broadcast_in_dim(shape, &[0, 1]))
            .convert(DType::F32)
    };
    let x = einsum("bsv,vd->bsd", &one_hot(&tokens), &embed).shard(s("(data, _, _)"));
    let logits = einsum("bsd,dv->bsv", &x, &unembed);
    let loss = logits
        .log_softmax(-1)
        .mul(&one_hot(&targets))
        .sum(&[0, 1, 2]);
    b.finish(&[&loss]).unwrap()
}

#[test]
fn copies_of_an_iota_stay_apart_until_shardings_are_decided() {
    let program = one_hots();
    let before = simplify(&program, Stage::BeforePropagation).unwrap();
    assert_eq!(count(&before, "iota"), 2, "{before}");
    assert_eq!(
        count(&simplify(&program, Stage::Sharded).unwrap(), "iota"),
        1
    );
    // Merged before propagation, the one iota would serve both encodings at one
    // sharding and cost a gather; kept apart, compile communicates no more than the
    // unsimplified program.
    let m = mesh(&[("data", 2), ("model", 4)]);
    let exe = check_on_mesh(&program, &m);
    let unsimplified = partition(&propagate(&program, &m).unwrap(), &m).unwrap();
    let merged = simplify(&program, Stage::Sharded).unwrap();
    let merged = partition(&propagate(&merged, &m).unwrap(), &m).unwrap();
    let (got, plain) = (exe.spmd().collectives(), unsimplified.collectives());
    assert!(got.bytes() <= plain.bytes(), "{got}\nvs\n{plain}");
    assert!(
        got.bytes() < merged.collectives().bytes(),
        "{got}\nvs\n{}",
        merged.collectives()
    );
}

// ---- the example: a spatial convolution as nine slices ---------------------

const N: usize = 2;
const H: usize = 8;
const W: usize = 5;
const C: usize = 3;

/// x: f32[N,H,W,C] split along H, padded once by 1 along H and W, then the nine 3x3
/// shifted windows of the padded value, summed.
fn nine_slices() -> Program {
    let b = Builder::new("conv3x3");
    let x = b
        .parameter("x", [N, H, W, C], DType::F32)
        .annotate(s("(_, h, _, _)"));
    let zero = b.scalar(0.0);
    let padded = x.pad(&zero, &[0, 1, 1, 0], &[0, 1, 1, 0], &[0; 4]);
    let mut sum: Option<Tensor> = None;
    for dh in 0..3 {
        for dw in 0..3 {
            let window = padded.slice(&[0, dh, dw, 0], &[N, dh + H, dw + W, C], &[1; 4]);
            sum = Some(match sum {
                None => window,
                Some(acc) => acc.add(&window),
            });
        }
    }
    let out = sum.unwrap().shard(s("(_, h, _, _)"));
    b.finish(&[&out]).unwrap()
}

/// (all-gathers of a parameter, all-gathers of any other value) in `program`.
fn all_gathers(program: &Program) -> (usize, usize) {
    let gathers = program.nodes.iter().filter(|n| n.op.name() == "all_gather");
    let of_param = |n: &&Node| matches!(program.node(n.operands[0]).op, Op::Parameter { .. });
    let (params, others): (Vec<&Node>, Vec<&Node>) = gathers.partition(of_param);
    (params.len(), others.len())
}

#[test]
fn nine_windows_of_one_padded_input_exchange_each_halo_once() {
    let program = nine_slices();
    let m = mesh(&[("h", 4)]);
    // Without simplification: each slice of the pad reads x's neighbours itself; the
    // three windows starting one row up (down) each shift x's last (first) row.
    let propagated = propagate(&program, &m).unwrap();
    let unsimplified = partition(&propagated, &m).unwrap();
    let stats = unsimplified.collectives();
    assert_eq!(
        (stats.count(CollectiveKind::CollectiveShift), stats.total()),
        (6, 6),
        "{}",
        unsimplified.report()
    );
    // compile merges the equal shifts: one each way, no gather.
    let exe = check_on_mesh(&program, &m);
    assert_eq!(all_gathers(&exe.spmd().program), (0, 0), "{}", exe.report());
    assert_eq!(
        exe.spmd()
            .collectives()
            .count(CollectiveKind::CollectiveShift),
        2
    );
    assert_eq!(exe.spmd().collectives().total(), 2);
    assert!(exe.spmd().program.nodes.len() < unsimplified.program.nodes.len());
}

// ---- simplify preserves results (spmd.rs-style programs) ---------------------------

/// Annotated programs in the style of `tests/spmd.rs`, each with some duplicated and
/// some dead work, as tracing composite ops produces.
fn cases() -> Vec<Program> {
    let mut programs = vec![
        with_dead_code(),
        with_duplicates(),
        nine_slices(),
        one_hots(),
    ];
    // Megatron MLP with a duplicated bias broadcast and an unused softmax.
    let b = Builder::new("mlp");
    let x = b
        .parameter("x", [8, 16], DType::F32)
        .annotate(s("(data, _)"));
    let w1 = b
        .parameter("w1", [16, 32], DType::F32)
        .annotate(s("(_, model)"));
    let w2 = b
        .parameter("w2", [32, 16], DType::F32)
        .annotate(s("(model, _)"));
    let h = x.matmul(&w1).relu();
    let _unused = h.softmax(-1);
    let y = h.matmul(&w2);
    let out = y.add(&y.mean(&[1]).broadcast_in_dim([8, 16], &[0]));
    let again = h.matmul(&w2).relu();
    programs.push(b.finish(&[&out, &again]).unwrap());
    // Attention scores twice through einsum, a layer norm and a log-softmax.
    let b = Builder::new("attention");
    let q = b
        .parameter("q", [2, 4, 6], DType::F32)
        .annotate(s("(data, _, model)"));
    let k = b.parameter("k", [2, 5, 6], DType::F32);
    let scores = einsum("bqd,bkd->bqk", &q, &k);
    let again = einsum("bqd,bkd->bqk", &q, &k);
    let out = scores
        .log_softmax(-1)
        .add(&again.softmax(-1))
        .layer_norm(-1, 1e-5);
    programs.push(b.finish(&[&out]).unwrap());
    programs
}

#[test]
fn simplify_preserves_interpreted_results_and_is_idempotent() {
    for program in cases() {
        for stage in [Stage::BeforePropagation, Stage::Sharded] {
            let context = format!("{} {stage:?}", program.name);
            let simple = simplify(&program, stage).unwrap();
            // The nine windows are all distinct in the global program.
            if !["conv3x3", "one_hots"].contains(&program.name.as_str()) {
                assert!(simple.nodes.len() < program.nodes.len(), "{context}");
            }
            for seed in 0..3 {
                let inputs = sample_inputs(&program, seed);
                assert_same_bits(
                    &interpret(&program, &inputs).unwrap(),
                    &interpret(&simple, &inputs).unwrap(),
                    &context,
                );
            }
            let twice = simplify(&simple, stage).unwrap();
            assert_eq!(twice, simple, "{context}");
        }
    }
}

#[test]
fn simplified_programs_run_right_on_meshes() {
    let meshes = [
        mesh(&[("data", 2), ("model", 2)]),
        Mesh::with_device_order([("data", 4), ("model", 2)], vec![5, 2, 7, 0, 3, 6, 1, 4]).unwrap(),
    ];
    for program in cases().into_iter().filter(|p| p.name != "conv3x3") {
        for m in &meshes {
            let exe = check_on_mesh(&program, m);
            // Simplifying never adds communication to these programs.
            let plain = partition(&propagate(&program, m).unwrap(), m).unwrap();
            let (got, plain) = (exe.spmd().collectives(), plain.collectives());
            assert!(
                got.bytes() <= plain.bytes(),
                "{} on {m}: {got}\nvs\n{plain}",
                program.name
            );
            // No node of the per-device program is unused.
            let users = exe.spmd().program.users();
            for v in exe.spmd().program.values() {
                let node: &Node = exe.spmd().program.node(v);
                let used = !users[v.index()].is_empty()
                    || exe.spmd().program.outputs.contains(&v)
                    || matches!(node.op, Op::Parameter { .. });
                assert!(used, "{} on {m}: {v} unused", program.name);
            }
        }
    }
}

// ---- sums of zero-padded slabs ------------------------------------------------------

/// The gradient of a stacked weight read in slices, as autodiff writes it: each slice
/// (rows 0..2 and 2..6 of `w`) scaled, padded back to the stack with zeros and the pads
/// added; a second sum tiles dim 1 with three slabs through nested adds; a third
/// leaves a gap (rows 2..4 are zero), and a fourth adds an inner sum that another node
/// reads too: neither of those two is a tiling.
fn padded_sums() -> Program {
    let b = Builder::new("padded_sums");
    let w = b
        .parameter("w", [6, 8], DType::F32)
        .annotate(s("(_, model)"));
    let zero = b.scalar(0.0);
    let rows = |lo: usize, hi: usize| w.slice(&[lo, 0], &[hi, 8], &[1, 1]).exp();
    let (top, bottom) = (rows(0, 2), rows(2, 6));
    let stacked = top.pad(&zero, &[0, 0], &[4, 0], &[0, 0]).add(&bottom.pad(
        &zero,
        &[2, 0],
        &[0, 0],
        &[0, 0],
    ));
    let cols = |lo: usize, hi: usize| w.slice(&[0, lo], &[6, hi], &[1, 1]).tanh();
    let (left, mid, right) = (cols(0, 3), cols(3, 4), cols(4, 8));
    let three = right
        .pad(&zero, &[0, 4], &[0, 0], &[0, 0])
        .add(&left.pad(&zero, &[0, 0], &[0, 5], &[0, 0]))
        .add(&mid.pad(&zero, &[0, 3], &[0, 4], &[0, 0]));
    let gap = top
        .pad(&zero, &[0, 0], &[4, 0], &[0, 0])
        .add(&rows(4, 6).pad(&zero, &[4, 0], &[0, 0], &[0, 0]));
    let shared = top.pad(&zero, &[0, 0], &[4, 0], &[0, 0]).add(&w);
    let reread = shared
        .add(&bottom.pad(&zero, &[2, 0], &[0, 0], &[0, 0]))
        .add(&shared.exp());
    b.finish(&[&stacked, &three, &gap, &reread]).unwrap()
}

#[test]
fn sums_of_padded_slabs_that_tile_a_dim_become_concatenations() {
    let program = padded_sums();
    let before = simplify(&program, Stage::BeforePropagation).unwrap();
    assert_eq!(
        count(&before, "concatenate"),
        0,
        "shardings not decided yet"
    );
    let simple = simplify(&program, Stage::Sharded).unwrap();
    // `stacked` and `three`; `gap` and `reread` keep their pads (2 + 1).
    assert_eq!(count(&simple, "concatenate"), 2, "{simple}");
    assert_eq!(count(&simple, "pad"), 3, "{simple}");
    for seed in 0..3 {
        let inputs = sample_inputs(&program, seed);
        assert_same_bits(
            &interpret(&program, &inputs).unwrap(),
            &interpret(&simple, &inputs).unwrap(),
            "padded sums",
        );
    }
    assert_eq!(simplify(&simple, Stage::Sharded).unwrap(), simple);
    // A slab element -0.0 stays -0.0 (adding the +0.0 padding made it +0.0).
    let b = Builder::new("negative_zero");
    let x = b.parameter("x", [2], DType::F32);
    let zero = b.scalar(0.0);
    let (head, tail) = (x.slice(&[0], &[1], &[1]), x.slice(&[1], &[2], &[1]));
    let sum = head
        .pad(&zero, &[0], &[1], &[0])
        .add(&tail.pad(&zero, &[1], &[0], &[0]));
    let program = b.finish(&[&sum]).unwrap();
    let simple = simplify(&program, Stage::Sharded).unwrap();
    let input = [Literal::F32(ndarray::arr1(&[-0.0f32, 2.0]).into_dyn())];
    let bits = |p: &Program| -> Vec<u32> {
        let out = interpret(p, &input).unwrap();
        out[0]
            .as_f32()
            .unwrap()
            .iter()
            .map(|x| x.to_bits())
            .collect()
    };
    assert_eq!(bits(&program), [0.0f32.to_bits(), 2.0f32.to_bits()]);
    assert_eq!(bits(&simple), [(-0.0f32).to_bits(), 2.0f32.to_bits()]);
}

#[test]
fn joined_padded_sums_run_right_on_meshes() {
    let program = padded_sums();
    for m in [
        mesh(&[("model", 1)]),
        mesh(&[("model", 2)]),
        mesh(&[("data", 2), ("model", 2)]),
    ] {
        let exe = check_on_mesh(&program, &m);
        let per_device = &exe.spmd().program;
        // On one device the per-device program is the global one: both sums joined.
        if m.num_devices() == 1 {
            assert_eq!(count(per_device, "concatenate"), 2, "{per_device}");
        }
    }
}

// ---- control flow (regions) --------------------------------------------------------

/// A loop is kept while one of its results is used and its unused result nodes go;
/// two equal loops on the same operands merge result by result; dead code inside a
/// region goes, its parameters stay. The simplified program computes the same bits.
#[test]
fn loops_are_pure_ops_to_cse_and_dce() {
    let b = Builder::new("loops");
    let x = b.parameter("x", [4], DType::F32);
    let w = b.parameter("w", [4], DType::F32);
    let trace_loop = || {
        b.fori_loop(3, &[x.clone(), w.clone()], |_, c| {
            let _dead = c[1].exp();
            vec![c[0].mul(&c[1]).tanh(), c[1].clone()]
        })
    };
    let (first, second) = (trace_loop(), trace_loop());
    // Only result 0 of each loop is used; both loops compute the same.
    let program = b.finish(&[&first[0].add(&second[0])]).unwrap();
    assert_eq!(count(&program, "scan"), 6);
    let simplified = simplify(&program, Stage::Sharded).unwrap();
    // One loop, one result node left (the counter and `w` results are unused).
    assert_eq!(count(&simplified, "scan"), 1, "{simplified}");
    let Some(Op::Flow { flow, .. }) = simplified
        .nodes
        .iter()
        .map(|n| &n.op)
        .find(|op| op.name() == "scan")
    else {
        panic!("{simplified}")
    };
    let body = flow.regions()[0];
    assert_eq!(count(body, "exponential"), 0, "{simplified}");
    assert_eq!(body.params.len(), 3, "{simplified}");
    let inputs = sample_inputs(&program, 7);
    let (want, got) = (
        interpret(&program, &inputs).unwrap(),
        interpret(&simplified, &inputs).unwrap(),
    );
    assert_same_bits(&want, &got, "simplified loops");
}

// ---- transposes of products ----------------------------------------------------------

/// Transposes of products, as einsum and autodiff write them: weight gradients
/// `tn,tk->kn` (a product `[n, k]` transposed to `[k, n]`) on the 6x16 tile and on
/// matrixmultiply, with `t` below and above one block of 256; a batched product
/// `bqd,bkd->bkq`; two that are not swaps (the batch dim moved, a product read twice).
fn product_transposes() -> Program {
    let b = Builder::new("product_transposes");
    let ct = b.parameter("ct", [256, 256], DType::F32);
    let x = b.parameter("x", [256, 64], DType::F32);
    let ct2 = b.parameter("ct2", [300, 72], DType::F32);
    let x2 = b.parameter("x2", [300, 40], DType::F32);
    let q = b.parameter("q", [4, 24, 32], DType::F32);
    let k = b.parameter("k", [4, 40, 32], DType::F32);
    let small = einsum("tn,tk->kn", &ct, &x);
    let wide = einsum("tn,tk->kn", &x, &ct);
    let long = einsum("tn,tk->kn", &ct2, &x2);
    let scores = einsum("bqd,bkd->bkq", &q, &k);
    let moved = einsum("bqd,bkd->kbq", &q, &k);
    let (y, z) = (
        b.parameter("y", [50, 24], DType::F32),
        b.parameter("z", [50, 16], DType::F32),
    );
    let twice = einsum("tn,tk->nk", &y, &z);
    let read_twice = twice
        .transpose(&[1, 0])
        .add(&twice.exp().transpose(&[1, 0]));
    b.finish(&[&small, &wide, &long, &scores, &moved, &read_twice])
        .unwrap()
}

/// `loss = sum(tanh(x · w))` and its gradients with respect to `x` and `w`: the
/// gradient of `w` is `dot(ct, x)` transposed.
fn matmul_gradient() -> Program {
    let b = Builder::new("matmul_gradient");
    let x = b.parameter("x", [48, 300], DType::F32);
    let w = b.parameter("w", [300, 40], DType::F32);
    let loss = x.matmul(&w).tanh().sum(&[0, 1]);
    let program = b.finish(&[&loss]).unwrap();
    gspmd_core::autodiff::grad(&program, 0, &[0, 1]).unwrap()
}

#[test]
fn transposes_that_swap_a_products_operands_become_the_swapped_product() {
    for (program, transposes) in [(product_transposes(), 3), (matmul_gradient(), 0)] {
        let name = program.name.clone();
        assert!(count(&program, "transpose") > transposes, "{program}");
        // Before propagation the partitioner sees the products as written.
        let before = simplify(&program, Stage::BeforePropagation).unwrap();
        assert_eq!(
            count(&before, "transpose"),
            count(&program, "transpose"),
            "{name}"
        );
        let simple = simplify(&program, Stage::Sharded).unwrap();
        // Left: `moved`'s and both of `read_twice`'s (its product is read twice).
        assert_eq!(count(&simple, "transpose"), transposes, "{name}: {simple}");
        assert_eq!(
            count(&simple, "dot_general"),
            count(&program, "dot_general"),
            "{name}"
        );
        for seed in 0..2 {
            let inputs = sample_inputs(&program, seed);
            assert_same_bits(
                &interpret(&program, &inputs).unwrap(),
                &interpret(&simple, &inputs).unwrap(),
                &name,
            );
        }
        assert_eq!(simplify(&simple, Stage::Sharded).unwrap(), simple, "{name}");
    }
}

/// Compiled (the transposes swapped after partitioning) and run
/// on threads, the outputs are the interpreter's on the original program, bit for bit:
/// on one device, and on two with the products' free dims split (nothing contracted
/// is split, so no partial sums).
#[test]
fn swapped_products_run_bitwise_on_meshes() {
    let split = {
        let b = Builder::new("split_gradient");
        let ct = b
            .parameter("ct", [256, 96], DType::F32)
            .annotate(s("(_, model)"));
        let x = b.parameter("x", [256, 300], DType::F32);
        let ct2 = b
            .parameter("ct2", [300, 64], DType::F32)
            .annotate(s("(_, model)"));
        let x2 = b.parameter("x2", [300, 16], DType::F32);
        let w = einsum("tn,tk->kn", &ct, &x).annotate(s("(_, model)"));
        let w2 = einsum("tn,tk->kn", &ct2, &x2).annotate(s("(_, model)"));
        b.finish(&[&w, &w2]).unwrap()
    };
    let one = mesh(&[("model", 1)]);
    for (program, meshes) in [
        (product_transposes(), vec![one.clone()]),
        (matmul_gradient(), vec![one.clone()]),
        (split, vec![one.clone(), mesh(&[("model", 2)])]),
    ] {
        let inputs = sample_inputs(&program, 3);
        let want = interpret(&program, &inputs).unwrap();
        for m in meshes {
            let exe = compile(&program, &m).unwrap();
            if program.name != "product_transposes" {
                assert_eq!(count(&exe.spmd().program, "transpose"), 0, "{m}");
            }
            let threads = ThreadMesh::new(m.clone()).unwrap();
            let got = exe.run(&threads, &inputs).unwrap();
            assert_same_bits(&want, &got, &format!("{} on {m}", program.name));
        }
    }
}
