//! Fusion in the execution plan: chains of float elementwise ops (f32, and bf16 and
//! f16 in f32 lanes), compares and selects, with their broadcasts and a trailing
//! reduction, run as one loop. Fused results are bitwise those of the
//! unfused kernels (node by node through `kernels::eval`, a fresh array per op) — so
//! within the 1 ulp per op the issue allows — on random chains and on the library's
//! softmax, layer norm, GELU and cross-entropy; and the interpreter and a 1-device mesh
//! agree bitwise (the mesh's identity `dynamic_slice`s forwarded, fusion across them).

use gspmd_core::autodiff::grad;
use gspmd_core::compile;
use gspmd_core::ir::{Builder, DType, Literal, Program, ReduceKind, Tensor};
use gspmd_core::runtime::{Prepared, ThreadMesh, fusion_groups, fusion_passes, interpret};
use gspmd_core::sharding::{Mesh, Sharding};
use ndarray::{ArrayD, IxDyn};
use rand::rngs::Xoshiro256PlusPlus as StdRng;
use rand::{RngExt, SeedableRng};

mod node_by_node;
use node_by_node::node_by_node;

mod gating_chain;
use gating_chain::{gating_program, shapes};

/// The shape and the bits of each element of each output.
fn bits(outputs: &[Literal]) -> Vec<(Vec<usize>, Vec<u32>)> {
    outputs
        .iter()
        .map(|lit| (lit.shape().to_vec(), lit.bit_patterns()))
        .collect()
}

fn random(shape: &[usize], rng: &mut StdRng) -> Literal {
    let n = shape.iter().product();
    let v = (0..n).map(|_| rng.random_range(-3.0f32..3.0)).collect();
    Literal::F32(ArrayD::from_shape_vec(IxDyn(shape), v).expect("shape fits"))
}

/// The inputs of a random chain ([`random_arithmetic_chain`],
/// [`random_multi_result_chain`]): two `[rows, cols]` values and a row.
fn chain_inputs(rng: &mut StdRng, rows: usize, cols: usize) -> [Literal; 3] {
    [
        random(&[rows, cols], rng),
        random(&[rows, cols], rng),
        random(&[cols], rng),
    ]
}

/// `rows` class labels below `cols`.
fn labels(rows: usize, cols: usize, rng: &mut StdRng) -> Literal {
    let v = (0..rows)
        .map(|_| rng.random_range(0..cols as i32))
        .collect();
    Literal::I32(ArrayD::from_shape_vec(IxDyn(&[rows]), v).expect("shape fits"))
}

/// A random chain over `[rows, cols]`: unary ops, binary ops with earlier values of
/// the chain, with broadcast rows, columns (also reshaped with a unit dim first) and
/// scalars (on either side), compares and
/// selects (on a compare in the chain, with ties, or on a bool parameter), some
/// intermediates also outputs, and a trailing sum, max or min over the last dim, over
/// both dims, a mean, the log of a sum kept as a column, a scalar divided by a max kept
/// as a column (reductions finished by one op), or none; in `dtype`.
fn random_chain(rng: &mut StdRng, rows: usize, cols: usize, dtype: DType) -> Program {
    let b = Builder::new("chain");
    let x = b.parameter("x", [rows, cols], dtype);
    let row = b.parameter("row", [cols], dtype);
    let col = b.parameter("col", [rows], dtype);
    let mask = b.parameter("mask", [rows, cols], DType::Bool);
    let mut pool: Vec<Tensor> = vec![x.clone()];
    let mut outputs: Vec<Tensor> = Vec::new();
    let steps = rng.random_range(2..12);
    for _ in 0..steps {
        let a = pool[rng.random_range(0..pool.len())].clone();
        let other = match rng.random_range(0..6) {
            0 => row.broadcast_in_dim([rows, cols], &[1]),
            1 => col.broadcast_in_dim([rows, cols], &[0]),
            2 => a.scalar_like(rng.random_range(-2.0..2.0)),
            // Read through the reshape of unit dims (the plan does not compute it).
            3 => (row.reshape([1, cols])).broadcast_in_dim([rows, cols], &[0, 1]),
            4 => (col.reshape([rows, 1])).broadcast_in_dim([rows, cols], &[0, 1]),
            _ => pool[rng.random_range(0..pool.len())].clone(),
        };
        let (p, q) = if rng.random_bool(0.5) {
            (a.clone(), other)
        } else {
            (other, a.clone())
        };
        let y = match rng.random_range(0..18) {
            0 => a.exp(),
            1 => a.tanh(),
            2 => a.neg(),
            3 => a.abs().sqrt(),
            4 => a.logistic(),
            5 => a.erf(),
            6 => a.sin(),
            7 => p.add(&q),
            8 => p.sub(&q),
            9 => p.mul(&q),
            10 => p.div(&q),
            11 => p.max(&q),
            12 => p.min(&q),
            13 => p.gt(&q).select(&a, &q),
            14 => p.max(&q).eq(&a).select(&p, &a.scalar_like(0.0)),
            15 => mask.select(&p, &q),
            16 => p.le(&q).select(&a.exp(), &q.neg()),
            _ => a.abs().add(&a.scalar_like(0.5)).log(),
        };
        if rng.random_bool(0.1) {
            outputs.push(y.clone());
        }
        pool.push(y);
    }
    let last = pool.last().expect("a chain").clone();
    let end = match rng.random_range(0..10) {
        0 => last.sum(&[-1]),
        1 => last.max_over(&[-1]),
        2 => last.min_over(&[-1]),
        3 => last.sum(&[0, 1]),
        4 => last.mean(&[-1]),
        5 => last.reduce(ReduceKind::Sum, &[-1], true).abs().log(),
        6 => last
            .scalar_like(1.5)
            .div(&last.reduce(ReduceKind::Max, &[-1], true)),
        _ => last,
    };
    outputs.push(end);
    let refs: Vec<&Tensor> = outputs.iter().collect();
    b.finish(&refs).expect("traces")
}

/// A random chain of `add`, `sub`, `mul` and `div` over `[rows, cols]` on earlier
/// values, broadcast rows and scalars (on either side), some intermediates outputs, a
/// trailing sum over the last dim or none: chains whose ops the loop merges in pairs.
fn random_arithmetic_chain(rng: &mut StdRng, rows: usize, cols: usize) -> Program {
    let b = Builder::new("arithmetic");
    let x = b.parameter("x", [rows, cols], DType::F32);
    let y = b.parameter("y", [rows, cols], DType::F32);
    let row = b.parameter("row", [cols], DType::F32);
    let mut pool: Vec<Tensor> = vec![x, y];
    let mut outputs: Vec<Tensor> = Vec::new();
    for _ in 0..rng.random_range(2..14) {
        let a = pool[rng.random_range(pool.len().saturating_sub(3)..pool.len())].clone();
        let other = match rng.random_range(0..3) {
            0 => row.broadcast_in_dim([rows, cols], &[1]),
            1 => a.scalar_like(rng.random_range(-2.0..2.0)),
            _ => pool[rng.random_range(0..pool.len())].clone(),
        };
        let (p, q) = if rng.random_bool(0.5) {
            (a, other)
        } else {
            (other, a)
        };
        let z = match rng.random_range(0..4) {
            0 => p.add(&q),
            1 => p.sub(&q),
            2 => p.mul(&q),
            _ => p.div(&q),
        };
        if rng.random_bool(0.1) {
            outputs.push(z.clone());
        }
        pool.push(z);
    }
    let last = pool.last().expect("a chain").clone();
    finish_chain(b, outputs, last, rng)
}

/// `b`'s program of `outputs` and, last, a chain's `last` value summed over its last
/// dim (three chains in ten) or as it is.
fn finish_chain(b: Builder, mut outputs: Vec<Tensor>, last: Tensor, rng: &mut StdRng) -> Program {
    outputs.push(if rng.random_bool(0.3) {
        last.sum(&[-1])
    } else {
        last
    });
    let refs: Vec<&Tensor> = outputs.iter().collect();
    b.finish(&refs).expect("traces")
}

/// Arithmetic ops whose value only the next op reads run as one pass with it (a pair):
/// fused equals unfused bitwise, across chunks and tails, and most chains merge.
#[test]
fn arithmetic_pairs_fuse_into_one_pass_equal_unfused_bitwise() {
    let mut rng = StdRng::seed_from_u64(41);
    let (cases, mut merged) = (200, 0);
    for case in 0..cases {
        let rows = [1, 3, 40][rng.random_range(0..3)];
        let cols = [1, 8, 37, 600][rng.random_range(0..4)];
        let program = random_arithmetic_chain(&mut rng, rows, cols);
        let inputs = chain_inputs(&mut rng, rows, cols);
        let want = node_by_node(&program, &inputs);
        let got = interpret(&program, &inputs).expect("runs");
        assert_eq!(bits(&got), bits(&want), "case {case}: {program}");
        let ops = group_ops(&program);
        let passes = fusion_passes(&program);
        merged += usize::from(ops.iter().zip(&passes).any(|(g, &n)| {
            let arithmetic = g.iter().filter(|o| !matches!(**o, "broadcast" | "reduce"));
            n < arithmetic.count()
        }));
    }
    assert!(
        merged * 2 > cases,
        "{merged} of {cases} chains merged a pair"
    );
}

#[test]
fn random_chains_fused_equal_unfused_bitwise() {
    random_chains_in(DType::F32, 13, 300);
}

/// bf16 and f16 chains run in f32 lanes, each op rounded to the narrow type as the
/// unfused kernels round it.
#[test]
fn narrow_float_chains_fused_equal_unfused_bitwise() {
    random_chains_in(DType::BF16, 29, 120);
    random_chains_in(DType::F16, 31, 120);
}

/// `cases` random chains in `dtype` from `seed`: fused equals unfused bitwise, most
/// chains fuse and many fuse a select.
fn random_chains_in(dtype: DType, seed: u64, cases: usize) {
    let mut rng = StdRng::seed_from_u64(seed);
    let (mut fused, mut selects) = (0, 0);
    for case in 0..cases {
        // Rows across chunks (above 512) and with tails (not a multiple of 8); short
        // rows several to a chunk, over several chunks (40 rows).
        let rows = [1, 2, 3, 4, 40][rng.random_range(0..5)];
        let cols = [1, 3, 8, 37, 256, 300, 600][rng.random_range(0..7)];
        let program = random_chain(&mut rng, rows, cols, dtype);
        let inputs = [
            random(&[rows, cols], &mut rng).convert(dtype),
            random(&[cols], &mut rng).convert(dtype),
            random(&[rows], &mut rng).convert(dtype),
            bools(&[rows, cols], &mut rng),
        ];
        let want = node_by_node(&program, &inputs);
        let got = interpret(&program, &inputs).expect("runs");
        assert_eq!(bits(&got), bits(&want), "{dtype:?} case {case}: {program}");
        fused += usize::from(!fusion_groups(&program).is_empty());
        selects += usize::from(group_ops(&program).iter().any(|g| g.contains(&"select")));
    }
    assert!(
        fused * 2 > cases,
        "{dtype:?}: {fused} of {cases} chains fused"
    );
    assert!(
        selects * 5 > cases,
        "{dtype:?}: {selects} of {cases} fused a select"
    );
}

/// A random chain over `[rows, cols]` in `dtype` through converts and the ops giving
/// bools: comparisons of the chain's floats, of i32 values and of an iota with broadcast
/// labels (a one-hot), `is_finite`, floats converted to bool, `and`, `or` and `not` of
/// them, each converted to `dtype` or selecting; a parameter of another float dtype
/// converted to `dtype`, the chain rounded through that dtype and back, i32 values
/// converted to f32 (then to `dtype`); some intermediates outputs, a trailing sum over
/// the last dim or none.
fn random_converting_chain(rng: &mut StdRng, rows: usize, cols: usize, dtype: DType) -> Program {
    let other = if dtype == DType::F32 {
        [DType::BF16, DType::F16][rng.random_range(0..2)]
    } else {
        DType::F32
    };
    let shape = [rows, cols];
    let b = Builder::new("converts");
    let x = b.parameter("x", shape, dtype);
    let y = b.parameter("y", shape, other);
    let k = b.parameter("k", shape, DType::I32);
    let ids = b.parameter("ids", [rows], DType::I32);
    let mask = b.parameter("mask", shape, DType::Bool);
    let mut pool: Vec<Tensor> = vec![x];
    let mut outputs: Vec<Tensor> = Vec::new();
    for _ in 0..rng.random_range(2..10) {
        let a = pool[rng.random_range(0..pool.len())].clone();
        let q = pool[rng.random_range(0..pool.len())].clone();
        let zero = a.scalar_like(0.0);
        let pred = match rng.random_range(0..8) {
            0 => a.gt(&q),
            1 => k.ge(&k.scalar_like(f64::from(rng.random_range(-3..3)))),
            2 => b
                .iota(shape, 1, DType::I32)
                .eq(&ids.broadcast_in_dim(shape, &[0])),
            3 => a.log().is_finite(),
            4 => a.max(&zero).convert(DType::Bool),
            5 => a.lt(&q).or(&mask),
            6 => a.ge(&zero).and(&mask.not()),
            _ => a.eq(&q.max(&zero)).not(),
        };
        let z = match rng.random_range(0..6) {
            0 => pred.convert(dtype).mul(&a),
            1 => pred.select(&a, &q),
            2 => y.convert(dtype).add(&a),
            3 => a.convert(other).convert(dtype).sub(&q),
            4 => k.convert(DType::F32).convert(dtype).mul(&a),
            _ => pred.convert(dtype).add(&pred.not().convert(dtype).mul(&a)),
        };
        if rng.random_bool(0.1) {
            outputs.push(z.clone());
        }
        pool.push(z);
    }
    let last = pool.last().expect("a chain").clone();
    finish_chain(b, outputs, last, rng)
}

/// Converts (bool, i32 and floats of another dtype to the chain's float) and the ops
/// giving bools (comparisons of floats and of i32, `and`, `or`, `not`, `is_finite`, a
/// float converted to bool) fuse into the chains' loops: fused equals unfused bitwise,
/// in f32, bf16 and f16, across chunks and tails, on i32 values that f32 rounds; most
/// chains fuse a convert, and many an i32 comparison.
#[test]
fn converts_and_predicates_fused_equal_unfused_bitwise() {
    let mut rng = StdRng::seed_from_u64(61);
    for (dtype, cases) in [(DType::F32, 240), (DType::BF16, 80), (DType::F16, 80)] {
        let (mut converts, mut ints) = (0, 0);
        for case in 0..cases {
            let rows = [1, 3, 40][rng.random_range(0..3)];
            let cols = [1, 8, 37, 600][rng.random_range(0..4)];
            let program = random_converting_chain(&mut rng, rows, cols, dtype);
            let other = program.nodes[1].ty.dtype;
            let n = rows * cols;
            // Zeros (ties, `!= 0`), negatives (`log` is NaN), and i32 small (against
            // the thresholds) or beyond 2^24 (rounded to f32).
            let x = random(&[rows, cols], &mut rng)
                .as_f32()
                .expect("f32")
                .mapv(|v| if v.abs() < 0.5 { 0.0 } else { v });
            let k = (0..n)
                .map(|_| match rng.random_range(0..3) {
                    0 => rng.random_range(i32::MIN..i32::MAX),
                    1 => rng.random_range((1 << 24)..(1 << 26)),
                    _ => rng.random_range(-4..4),
                })
                .collect();
            let inputs = [
                Literal::F32(x).convert(dtype),
                random(&[rows, cols], &mut rng).convert(other),
                Literal::I32(ArrayD::from_shape_vec(IxDyn(&[rows, cols]), k).expect("shape fits")),
                labels(rows, cols, &mut rng),
                bools(&[rows, cols], &mut rng),
            ];
            let want = node_by_node(&program, &inputs);
            let got = interpret(&program, &inputs).expect("runs");
            assert_eq!(bits(&got), bits(&want), "{dtype:?} case {case}: {program}");
            if case % 8 == 0 {
                let mesh = on_one_device(&program, &inputs);
                assert_eq!(bits(&mesh), bits(&want), "mesh, {dtype:?} case {case}");
            }
            let groups = fusion_groups(&program);
            converts += usize::from(
                groups
                    .iter()
                    .flatten()
                    .any(|m| program.nodes[m.index()].op.name() == "convert"),
            );
            ints += usize::from(groups.iter().flatten().any(|m| {
                let node = &program.nodes[m.index()];
                let operand = node
                    .operands
                    .first()
                    .map(|o| program.nodes[o.index()].ty.dtype);
                node.op.name() == "compare" && operand == Some(DType::I32)
            }));
        }
        assert!(
            converts * 2 > cases,
            "{dtype:?}: {converts} of {cases} chains fused a convert"
        );
        assert!(
            ints * 5 > cases,
            "{dtype:?}: {ints} of {cases} chains fused an i32 comparison"
        );
    }
}

fn bools(shape: &[usize], rng: &mut StdRng) -> Literal {
    let n = shape.iter().product();
    let v = (0..n).map(|_| rng.random_bool(0.5)).collect();
    Literal::Bool(ArrayD::from_shape_vec(IxDyn(shape), v).expect("shape fits"))
}

/// The gradient, with respect to `x` and `w`, of `sum(activation(x w)^2)` for `x` of
/// `[rows, cols]` and `w` a row broadcast over it.
fn layer_gradient(rows: usize, cols: usize, activation: impl Fn(&Tensor) -> Tensor) -> Program {
    let b = Builder::new("layer");
    let x = b.parameter("x", [rows, cols], DType::F32);
    let w = b.parameter("w", [cols], DType::F32);
    let y = activation(&x.mul(&w.broadcast_in_dim([rows, cols], &[1])));
    let loss = y.mul(&y).sum(&[0, 1]);
    let forward = b.finish(&[&loss]).expect("traces");
    grad(&forward, 0, &[0, 1]).expect("differentiates")
}

/// The gradient of a ReLU layer (`max(x w, 0)`: the compares of the input and of zero
/// with the output, the selects of the cotangent and its half at ties) fuses its
/// compares and selects into the loop of the cotangent's product, with inputs at 0
/// (ties), on one chunk and many; equal to unfused bitwise, on a 1-device mesh too.
#[test]
fn the_relu_gradient_compares_and_selects_fuse_equal_unfused() {
    let mut rng = StdRng::seed_from_u64(23);
    for (rows, cols) in [(3, 8), (40, 300)] {
        let program = layer_gradient(rows, cols, Tensor::relu);
        let groups = group_ops(&program);
        assert!(
            groups
                .iter()
                .any(|g| g.contains(&"compare") && g.contains(&"select")),
            "compares and selects not fused: {groups:?}"
        );
        // A third of the inputs 0: ties of `max(x w, 0)`.
        let x = random(&[rows, cols], &mut rng);
        let x = Literal::F32(
            x.as_f32()
                .expect("f32")
                .mapv(|v| if v > 1.0 { 0.0 } else { v }),
        );
        let inputs = [x, random(&[cols], &mut rng)];
        let want = node_by_node(&program, &inputs);
        let got = interpret(&program, &inputs).expect("runs");
        assert_eq!(bits(&got), bits(&want), "{rows}x{cols}");
        let mesh = on_one_device(&program, &inputs);
        assert_eq!(bits(&mesh), bits(&want), "mesh, {rows}x{cols}");
    }
}

/// The gradient of a GELU layer: its backward loop recomputes the forward's cheap
/// values (`x * x`, `x / 2` as `0.5 * x`, `1 + tanh`) from the leaves it reads anyway
/// (`x`, `tanh`) instead of reading them stored, so they are members of two groups and
/// the forward loop stores fewer values; equal to unfused bitwise, on one chunk and
/// many, on a 1-device mesh too.
#[test]
fn the_gelu_gradient_recomputes_cheap_forward_values_equal_unfused() {
    let mut rng = StdRng::seed_from_u64(31);
    for (rows, cols) in [(3, 40), (16, 300)] {
        let program = layer_gradient(rows, cols, Tensor::gelu);
        let groups = fusion_groups(&program);
        let in_two: Vec<&'static str> = (0..program.nodes.len())
            .filter(|&i| {
                groups
                    .iter()
                    .filter(|g| g.iter().any(|m| m.index() == i))
                    .count()
                    > 1
            })
            .map(|i| program.nodes[i].op.name())
            .filter(|&name| name != "broadcast")
            .collect();
        assert!(in_two.len() >= 3, "recomputed: {in_two:?} of {groups:?}");
        let inputs = [random(&[rows, cols], &mut rng), random(&[cols], &mut rng)];
        let want = node_by_node(&program, &inputs);
        let got = interpret(&program, &inputs).expect("runs");
        assert_eq!(bits(&got), bits(&want), "{rows}x{cols}");
        let mesh = on_one_device(&program, &inputs);
        assert_eq!(bits(&mesh), bits(&want), "mesh, {rows}x{cols}");
    }
}

/// An op of two tensors.
type BinaryFn = dyn Fn(&Tensor, &Tensor) -> Tensor;

/// A lone elementwise op (with the broadcasts it reads) over at least
/// `LONE_ELEMENTS` (2048) elements is a group of one, run on the loop's vectors; over
/// fewer it stays its unfused kernel (a compare and a select are two ops: a group). Either way bitwise equal to unfused, in f32 and
/// in bf16 (rounded per op in f32 lanes), on the interpreter and a 1-device mesh.
#[test]
fn lone_ops_over_many_elements_run_as_loops_equal_unfused() {
    let mut rng = StdRng::seed_from_u64(37);
    for dtype in [DType::F32, DType::BF16] {
        for (rows, cols, grouped) in [(16, 128, true), (8, 255, false)] {
            let lone = |op: &BinaryFn| {
                let b = Builder::new("lone");
                let x = b.parameter("x", [rows, cols], dtype);
                let row = b.parameter("row", [cols], dtype);
                let y = op(&x, &row.broadcast_in_dim([rows, cols], &[1]));
                b.finish(&[&y]).expect("traces")
            };
            // Each op, and whether it is grouped however few its elements (a compare
            // and a select: two ops).
            let ops: [(&BinaryFn, bool); 3] = [
                (&|x, _| x.exp(), false),
                (&|x, row| x / row, false),
                (&|x, row| x.gt(row).select(x, row), true),
            ];
            for (op, always) in ops {
                let program = lone(op);
                let groups = group_ops(&program);
                assert_eq!(
                    groups.len(),
                    usize::from(grouped || always),
                    "{rows}x{cols}: {groups:?}"
                );
                let inputs = [random(&[rows, cols], &mut rng), random(&[cols], &mut rng)]
                    .map(|x| x.convert(dtype));
                let want = node_by_node(&program, &inputs);
                let got = interpret(&program, &inputs).expect("runs");
                assert_eq!(bits(&got), bits(&want), "{dtype:?} {rows}x{cols}");
                let mesh = on_one_device(&program, &inputs);
                assert_eq!(bits(&mesh), bits(&want), "mesh, {dtype:?} {rows}x{cols}");
            }
        }
    }
}

/// The library's composite ops on `[rows, cols]` logits (and `[rows]` labels).
fn composites(rows: usize, cols: usize) -> Program {
    let b = Builder::new("composites");
    let x = b.parameter("x", [rows, cols], DType::F32);
    let labels = b.parameter("labels", [rows], DType::I32);
    let softmax = x.softmax(-1);
    let norm = x.layer_norm(-1, 1e-5);
    let gelu = x.gelu();
    let loss = x.cross_entropy_with_logits(&labels);
    b.finish(&[&softmax, &norm, &gelu, &loss]).expect("traces")
}

/// Every group of `program`'s plan with its ops, by name.
fn group_ops(program: &Program) -> Vec<Vec<&'static str>> {
    fusion_groups(program)
        .iter()
        .map(|g| {
            g.iter()
                .map(|v| program.nodes[v.index()].op.name())
                .collect()
        })
        .collect()
}

#[test]
fn softmax_layer_norm_gelu_and_cross_entropy_fuse_and_equal_unfused() {
    let (rows, cols) = (6, 300);
    let program = composites(rows, cols);
    let groups = group_ops(&program);
    // GELU is one loop (its thirteen ops and four broadcast scalars); softmax's
    // `exp(x - max)` folds into its sum and is stored beside it (its division reads
    // it), and so does the cross-entropy's (its `x - max` stored, read after the sum),
    // its sum finished by the log (through the reshape keeping the dim); layer norm's
    // squared deviations fold into theirs, and its mean's sum is finished by the
    // division by the count.
    let has = |ops: &[&str]| groups.iter().any(|g| g.as_slice() == ops);
    assert!(
        groups.iter().any(|g| g.len() >= 13 && g.contains(&"tanh")),
        "GELU not fused: {groups:?}"
    );
    assert!(
        has(&["broadcast", "subtract", "exponential", "reduce"]),
        "{groups:?}"
    );
    assert!(
        has(&[
            "broadcast",
            "subtract",
            "exponential",
            "reduce",
            "reshape",
            "log"
        ]),
        "{groups:?}"
    );
    assert!(
        has(&["reduce", "reshape", "broadcast", "divide"]),
        "{groups:?}"
    );
    assert!(
        has(&["broadcast", "subtract", "multiply", "reduce"]),
        "{groups:?}"
    );
    let mut rng = StdRng::seed_from_u64(7);
    let inputs = [
        random(&[rows, cols], &mut rng),
        labels(rows, cols, &mut rng),
    ];
    let want = node_by_node(&program, &inputs);
    let got = interpret(&program, &inputs).expect("runs");
    assert_eq!(bits(&got), bits(&want));
}

/// A reduction finished by one op (see `fusion::Epilogue`): `mean`'s division by the
/// count (kept dims through a reshape, or not), a log of a sum, a scalar divided by a
/// max, of a parameter (a loop of no op) and of a chain, rows within a chunk and across
/// chunks; a sum read twice is not finished by either reader. Fused equals unfused
/// bitwise, on a 1-device mesh too.
#[test]
fn reductions_finished_by_one_op_fuse_equal_unfused_bitwise() {
    let mut rng = StdRng::seed_from_u64(47);
    for (rows, cols) in [(3, 8), (5, 37), (40, 300), (2, 1100)] {
        let b = Builder::new("finished");
        let x = b.parameter("x", [rows, cols], DType::F32);
        let y = b.parameter("y", [rows, cols], DType::F32);
        let mean = x.mean(&[-1]);
        let norm = y.layer_norm(-1, 1e-5);
        let log_sum = x.exp().reduce(ReduceKind::Sum, &[-1], true).log();
        let scaled = x.scalar_like(2.0).div(&y.mul(&x).max_over(&[-1]));
        let twice = y.sum(&[-1]);
        let read_twice = twice.div(&twice.scalar_like(3.0)).sub(&twice);
        let outputs = [&mean, &norm, &log_sum, &scaled, &read_twice];
        let program = b.finish(&outputs).expect("traces");
        // Each group's ops as a sorted list (the scalar's broadcast is traced with the
        // finishing op, after the reduction).
        let groups: Vec<Vec<&str>> = (group_ops(&program).into_iter())
            .map(|mut g| {
                g.sort_unstable();
                g
            })
            .collect();
        // x's mean (a loop of no op), y's mean in the layer norm (kept dims), the log
        // of the sum, the scalar over the max.
        let finished: [&[&str]; 4] = [
            &["broadcast", "divide", "reduce"],
            &["broadcast", "divide", "reduce", "reshape"],
            &["exponential", "log", "reduce", "reshape"],
            &["broadcast", "divide", "multiply", "reduce"],
        ];
        for ops in finished {
            assert!(
                groups.iter().any(|g| g.as_slice() == ops),
                "{ops:?}: {groups:?}"
            );
        }
        // The sum read twice ends no group it is in.
        for (i, node) in program.nodes.iter().enumerate() {
            let readers = (program.nodes.iter())
                .filter(|n| n.operands.iter().any(|o| o.index() == i))
                .count();
            if node.op.name() == "reduce" && readers > 1 {
                assert!(
                    (fusion_groups(&program).iter())
                        .all(|g| g.last().is_some_and(|l| l.index() == i)
                            || g.iter().all(|m| m.index() != i)),
                    "{groups:?}"
                );
            }
        }
        let inputs = [
            random(&[rows, cols], &mut rng),
            random(&[rows, cols], &mut rng),
        ];
        let want = node_by_node(&program, &inputs);
        let got = interpret(&program, &inputs).expect("runs");
        assert_eq!(bits(&got), bits(&want), "{rows}x{cols}");
        let mesh = on_one_device(&program, &inputs);
        assert_eq!(bits(&mesh), bits(&want), "mesh, {rows}x{cols}");
    }
}

#[test]
fn a_one_device_mesh_equals_the_interpreter_bitwise() {
    let (rows, cols) = (4, 40);
    let b = Builder::new("sharded");
    let sharding: Sharding = "(data, model)".parse().expect("a sharding");
    let x = b
        .parameter("x", [rows, cols], DType::F32)
        .annotate(sharding.clone());
    let y = x.gelu().add(&x.softmax(-1)).annotate(sharding);
    let program = b.finish(&[&y]).expect("traces");
    let mesh = Mesh::new([("data", 1), ("model", 1)]).expect("a mesh");
    let exe = compile(&program, &mesh).expect("compiles");
    // Axes of size 1 split nothing: the partitioner cuts no block, so the per-device
    // program is the global one and GELU fuses as in the interpreter.
    let local = &exe.spmd().program;
    assert!(!local.nodes.iter().any(|n| n.op.name() == "dynamic_slice"));
    let groups = group_ops(local);
    assert!(
        groups.iter().any(|g| g.len() >= 13 && g.contains(&"tanh")),
        "GELU not fused on one device: {groups:?}"
    );
    let mut rng = StdRng::seed_from_u64(3);
    let inputs = [random(&[rows, cols], &mut rng)];
    let want = interpret(&program, &inputs).expect("runs");
    let got = exe
        .run(&ThreadMesh::new(mesh).expect("a thread mesh"), &inputs)
        .expect("runs");
    assert_eq!(bits(&got), bits(&want));
}

/// A group's leaves read every way the loop reads them: a product handed over (the
/// result's buffer, read in place), parameters and a transpose (contiguous, read in
/// place), broadcast rows (loaded through their strides); fused equals unfused
/// bitwise, across chunks and a tail.
#[test]
fn leaves_read_in_place_and_loaded_equal_unfused() {
    let (rows, inner, cols) = (5, 7, 300);
    let b = Builder::new("leaves");
    let x = b.parameter("x", [rows, inner], DType::F32);
    let w = b.parameter("w", [inner, cols], DType::F32);
    let y = b.parameter("y", [rows, cols], DType::F32);
    let t = b.parameter("t", [cols, rows], DType::F32);
    let row = b.parameter("row", [cols], DType::F32);
    let product = x.matmul(&w);
    let z = product
        .mul(&y)
        .add(&t.transpose(&[1, 0]))
        .sub(&row.broadcast_in_dim([rows, cols], &[1]))
        .tanh();
    let program = b.finish(&[&z]).expect("traces");
    let groups = group_ops(&program);
    assert!(
        groups.iter().any(|g| g.contains(&"tanh") && g.len() >= 5),
        "not fused: {groups:?}"
    );
    let mut rng = StdRng::seed_from_u64(11);
    let inputs = [
        random(&[rows, inner], &mut rng),
        random(&[inner, cols], &mut rng),
        random(&[rows, cols], &mut rng),
        random(&[cols, rows], &mut rng),
        random(&[cols], &mut rng),
    ];
    let want = node_by_node(&program, &inputs);
    let got = interpret(&program, &inputs).expect("runs");
    assert_eq!(bits(&got), bits(&want));
}

/// A program planned once ([`Prepared`]) gives the interpreter's outputs bitwise, run
/// after run (registers and pooled buffers reused), and its errors on bad inputs.
#[test]
fn a_prepared_program_runs_as_the_interpreter() {
    let (rows, cols) = (40, 16);
    let program = composites(rows, cols);
    let prepared = Prepared::new(&program);
    let mut rng = StdRng::seed_from_u64(5);
    for _ in 0..3 {
        let inputs = [
            random(&[rows, cols], &mut rng),
            labels(rows, cols, &mut rng),
        ];
        let want = interpret(&program, &inputs).expect("runs");
        let got = prepared.run(&inputs).expect("runs");
        assert_eq!(bits(&got), bits(&want));
    }
    let wrong = [
        random(&[rows, cols + 1], &mut rng),
        labels(rows, cols, &mut rng),
    ];
    let want = interpret(&program, &wrong).expect_err("a wrong shape");
    let got = prepared.run(&wrong).expect_err("a wrong shape");
    assert_eq!(got.to_string(), want.to_string());
}

/// The outputs of `program` on `inputs` run on a 1-device mesh (one axis of size 1).
fn on_one_device(program: &Program, inputs: &[Literal]) -> Vec<Literal> {
    let mesh = Mesh::new([("data", 1)]).expect("a mesh");
    let exe = compile(program, &mesh).expect("compiles");
    exe.run(&ThreadMesh::new(mesh).expect("a thread mesh"), inputs)
        .expect("runs")
}

/// Whether a group of `program`'s plan stores a member besides its root: one that is
/// an output, or read by a node outside the group.
fn has_extra_result(program: &Program) -> bool {
    fusion_groups(program).iter().any(|g| {
        g[..g.len() - 1].iter().any(|m| {
            program.outputs.contains(m)
                || (program.nodes.iter().enumerate())
                    .any(|(i, n)| !g.iter().any(|x| x.index() == i) && n.operands.contains(m))
        })
    })
}

/// A random elementwise chain over `[rows, cols]` of which many intermediates are
/// outputs, and some are read after the chain by ops that do not fuse (a sum over the
/// major dim, a transpose) or by a second chain: groups with several results. With
/// `computed`, `x` and `y` are transposes of `[cols, rows]` parameters (values the loop
/// owns, handed over as results' buffers).
fn random_multi_result_chain(
    rng: &mut StdRng,
    rows: usize,
    cols: usize,
    computed: bool,
) -> Program {
    let b = Builder::new("multi");
    let leaf = |name: &str| {
        if computed {
            b.parameter(name, [cols, rows], DType::F32)
                .transpose(&[1, 0])
        } else {
            b.parameter(name, [rows, cols], DType::F32)
        }
    };
    let (x, y) = (leaf("x"), leaf("y"));
    let row = b.parameter("row", [cols], DType::F32);
    let mut pool: Vec<Tensor> = vec![x.clone(), y.clone()];
    let mut outputs: Vec<Tensor> = Vec::new();
    let mut later: Vec<Tensor> = Vec::new();
    let steps = rng.random_range(3..14);
    for _ in 0..steps {
        let a = pool[rng.random_range(0..pool.len())].clone();
        let other = match rng.random_range(0..3) {
            0 => row.broadcast_in_dim([rows, cols], &[1]),
            1 => a.scalar_like(rng.random_range(-2.0..2.0)),
            _ => pool[rng.random_range(0..pool.len())].clone(),
        };
        let t = match rng.random_range(0..8) {
            0 => a.exp().neg(),
            1 => a.tanh(),
            2 => a.abs().sqrt(),
            3 => a.add(&other),
            4 => a.sub(&other),
            5 => other.mul(&a),
            6 => a.div(&other.abs().add(&a.scalar_like(1.0))),
            _ => a.max(&other),
        };
        match rng.random_range(0..6) {
            0 | 1 => outputs.push(t.clone()),
            2 => later.push(t.clone()),
            _ => {}
        }
        pool.push(t);
    }
    // Read after the chain: a reduction over the major dim or a transpose (no fusion),
    // or a second elementwise chain (its own group, reading the first's result).
    for (k, t) in later.iter().enumerate() {
        outputs.push(match k % 3 {
            0 => t.sum(&[0]),
            1 => t.transpose(&[1, 0]),
            _ => t.mul(t).tanh(),
        });
    }
    outputs.push(pool.last().expect("a chain").clone());
    let refs: Vec<&Tensor> = outputs.iter().collect();
    b.finish(&refs).expect("traces")
}

#[test]
fn chains_with_several_results_fused_equal_unfused_bitwise() {
    let mut rng = StdRng::seed_from_u64(17);
    let mut several = 0;
    let cases = 200;
    for case in 0..cases {
        let rows = [1, 3, 4, 40][rng.random_range(0..4)];
        let cols = [1, 8, 37, 256, 300][rng.random_range(0..5)];
        let program = random_multi_result_chain(&mut rng, rows, cols, false);
        let inputs = chain_inputs(&mut rng, rows, cols);
        let want = node_by_node(&program, &inputs);
        let got = interpret(&program, &inputs).expect("runs");
        assert_eq!(bits(&got), bits(&want), "case {case}: {program}");
        if case % 4 == 0 {
            let mesh = on_one_device(&program, &inputs);
            assert_eq!(bits(&mesh), bits(&want), "case {case} on a mesh: {program}");
        }
        several += usize::from(has_extra_result(&program));
    }
    assert!(
        several * 2 > cases,
        "only {several} of {cases} chains had a group of several results"
    );
}

/// Broadcast rows whose length divides the chunk (a block repeated along the rows,
/// held in a register filled once per run) and results written by their op straight
/// into their buffers: fresh ones, and leaves handed over (transposes the loop owns)
/// that later ops of the chunk still read or do not. Fused equals unfused bitwise,
/// across chunks and tails.
#[test]
fn repeated_rows_and_results_written_into_their_buffers_equal_unfused_bitwise() {
    let mut rng = StdRng::seed_from_u64(53);
    for case in 0..160 {
        let rows = [1, 3, 40, 300][rng.random_range(0..4)];
        let cols = [1, 2, 16, 64, 512][rng.random_range(0..5)];
        let computed = rng.random_bool(0.5);
        let program = random_multi_result_chain(&mut rng, rows, cols, computed);
        let inputs = if computed {
            [
                random(&[cols, rows], &mut rng),
                random(&[cols, rows], &mut rng),
                random(&[cols], &mut rng),
            ]
        } else {
            chain_inputs(&mut rng, rows, cols)
        };
        let want = node_by_node(&program, &inputs);
        let got = interpret(&program, &inputs).expect("runs");
        assert_eq!(bits(&got), bits(&want), "case {case}: {program}");
        if case % 8 == 0 {
            let mesh = on_one_device(&program, &inputs);
            assert_eq!(bits(&mesh), bits(&want), "case {case} on a mesh: {program}");
        }
    }
}

/// The AdamW update of one weight `w` with gradient `g` and moments `m`, `v` (bias
/// corrections `c1`, `c2` and the learning rate as scalars): the new weight and
/// moments, all outputs. With `computed`, the gradient and the first moment are
/// transposes of parameters (values the loop owns and may hand over, so that two
/// results are written in place), else parameters.
fn adamw(n: usize, computed: bool) -> Program {
    let (beta1, beta2, eps) = (0.9, 0.99, 1e-8);
    let b = Builder::new("adamw");
    let shape = [n / 4, 4];
    let w = b.parameter("w", shape, DType::F32);
    let (g, m) = if computed {
        let g = b.parameter("g", [4, n / 4], DType::F32);
        let m = b.parameter("m", [4, n / 4], DType::F32);
        (g.transpose(&[1, 0]), m.transpose(&[1, 0]))
    } else {
        let g = b.parameter("g", shape, DType::F32);
        let m = b.parameter("m", shape, DType::F32);
        (g, m)
    };
    let v = b.parameter("v", shape, DType::F32);
    let lr = b.parameter("lr", [], DType::F32);
    let c1 = b.parameter("c1", [], DType::F32);
    let c2 = b.parameter("c2", [], DType::F32);
    let like = |t: &Tensor| t.broadcast_in_dim(shape, &[]);
    let m2 = m
        .mul(&m.scalar_like(beta1))
        .add(&g.mul(&g.scalar_like(1.0 - beta1)));
    let v2 = v
        .mul(&v.scalar_like(beta2))
        .add(&g.mul(&g).mul(&g.scalar_like(1.0 - beta2)));
    let direction = m2
        .div(&like(&c1))
        .div(&v2.div(&like(&c2)).sqrt().add(&v2.scalar_like(eps)));
    let w2 = w.sub(&direction.mul(&like(&lr)));
    b.finish(&[&w2, &m2, &v2]).expect("traces")
}

fn adamw_inputs(n: usize, computed: bool, rng: &mut StdRng) -> Vec<Literal> {
    let (shape, moved) = ([n / 4, 4], [4, n / 4]);
    let positive = |lit: Literal| Literal::F32(lit.as_f32().expect("f32").mapv(f32::abs));
    vec![
        random(&shape, rng),
        random(if computed { &moved } else { &shape }, rng),
        random(if computed { &moved } else { &shape }, rng),
        positive(random(&shape, rng)),
        Literal::scalar_f32(3e-3),
        Literal::scalar_f32(0.19),
        Literal::scalar_f32(0.0199),
    ]
}

#[test]
fn the_adamw_update_of_a_weight_is_one_loop_equal_to_unfused() {
    let mut rng = StdRng::seed_from_u64(19);
    for computed in [false, true] {
        // One chunk, a tail, many chunks.
        for n in [8, 300, 4096] {
            let program = adamw(n, computed);
            let groups = group_ops(&program);
            let ops = program.nodes.iter().filter(|x| {
                matches!(
                    x.op.name(),
                    "add" | "subtract" | "multiply" | "divide" | "sqrt"
                )
            });
            assert_eq!(groups.len(), 1, "{groups:?}");
            // Of its 14 ops, 5 merge into pairs (`m b1` into `.. + g (1 - b1)`,
            // `g g` into `.. (1 - b2)`, `v b2` into `.. + ..`, `m / c1` into
            // `.. / (sqrt + eps)`, `.. lr` into `w - ..`).
            assert_eq!(fusion_passes(&program), [9], "{groups:?}");
            assert_eq!(
                groups[0].iter().filter(|o| **o != "broadcast").count(),
                ops.count(),
                "every op of the update in the loop: {groups:?}"
            );
            let inputs = adamw_inputs(n, computed, &mut rng);
            let want = node_by_node(&program, &inputs);
            let got = interpret(&program, &inputs).expect("runs");
            assert_eq!(bits(&got), bits(&want), "n {n}, computed {computed}");
            let prepared = Prepared::new(&program);
            for _ in 0..2 {
                let again = prepared.run(&inputs).expect("runs");
                assert_eq!(bits(&again), bits(&want), "prepared, n {n}");
            }
            let mesh = on_one_device(&program, &inputs);
            assert_eq!(bits(&mesh), bits(&want), "mesh, n {n}, computed {computed}");
        }
    }
}

/// Short rows, several to a chunk (and rows of one, and rows past a chunk's
/// multiple), folded as the unfused `reduce` folds them: sums, maxima and minima over
/// the last dim of every row length 1..=40 and of odd row counts, of chains reading a
/// leaf broadcast along the minor dim (`[a, n, 1]` read as `[a, n, row]`: a value a
/// row) and one broadcast over a middle dim (`[a, row]` read as `[a, n, row]`), with
/// -0.0 and NaN among the values. Fused equals unfused bitwise.
#[test]
fn short_rows_and_broadcast_leaves_fold_equal_unfused_bitwise() {
    let mut rng = StdRng::seed_from_u64(28);
    let special = |lit: Literal, rng: &mut StdRng| match lit {
        Literal::F32(mut a) => {
            for v in a.iter_mut() {
                match rng.random_range(0..40) {
                    0 => *v = -0.0,
                    1 => *v = f32::NAN,
                    _ => {}
                }
            }
            Literal::F32(a)
        }
        other => other,
    };
    for row in 1..=40 {
        let (a, n) = ([1, 3, 7][row % 3], [5, 9, 33][row % 3]);
        let shape = [a, n, row];
        let b = Builder::new("short_rows");
        let x = b.parameter("x", shape, DType::F32);
        let column = b.parameter("column", [a, n, 1], DType::F32);
        let middle = b.parameter("middle", [a, row], DType::F32);
        let column = column.reshape([a, n]).broadcast_in_dim(shape, &[0, 1]);
        let middle = middle.broadcast_in_dim(shape, &[0, 2]);
        let sum = x.sub(&column).exp().sum(&[-1]);
        let max = x.mul(&middle).max_over(&[-1]);
        let min = (x.add(&middle).sub(&column)).reduce(ReduceKind::Min, &[-1], false);
        let program = b.finish(&[&sum, &max, &min]).expect("traces");
        let groups = group_ops(&program);
        assert!(
            groups.iter().filter(|g| g.contains(&"reduce")).count() >= 3,
            "row {row}: {groups:?}"
        );
        let inputs = [
            special(random(&shape, &mut rng), &mut rng),
            special(random(&[a, n, 1], &mut rng), &mut rng),
            random(&[a, row], &mut rng),
        ];
        let want = node_by_node(&program, &inputs);
        let got = interpret(&program, &inputs).expect("runs");
        assert_eq!(bits(&got), bits(&want), "row {row}, {a}x{n}");
    }
}

/// The MoE router's gating chain (`gspmd::models::moe::top2_gating`'s ops): the two
/// gates' normalisations `gate1 / norm` and `gate2 / norm` are siblings (neither reads
/// the other; both read `norm`), so one loop computes both beside `norm`, storing two
/// results, and no divide runs alone; the sums over the experts of `gates * first` and
/// `gates * second` each fold their rows. Fused equals unfused bitwise, on a 1-device
/// mesh too, for 1 and 16 groups of tokens.
#[test]
fn sibling_ops_reading_one_value_share_a_loop_equal_unfused_bitwise() {
    let mut rng = StdRng::seed_from_u64(61);
    for groups in [1, 16] {
        let (gse, full) = shapes(groups);
        let program = gating_program(groups);
        let groups_ops = group_ops(&program);
        let divides = |g: &Vec<&str>| g.iter().filter(|&&op| op == "divide").count();
        assert!(
            groups_ops
                .iter()
                .any(|g| divides(g) == 2 && g.contains(&"add")),
            "the two normalisations are not one loop: {groups_ops:?}"
        );
        let fused: usize = groups_ops
            .iter()
            .flatten()
            .filter(|&&op| op == "divide")
            .count();
        let all = (program.nodes.iter())
            .filter(|n| n.op.name() == "divide")
            .count();
        assert_eq!(fused, all, "a divide runs alone: {groups_ops:?}");
        let inputs = [
            random(&gse, &mut rng),
            random(&gse, &mut rng),
            random(&gse, &mut rng),
            random(&full, &mut rng),
            random(&full, &mut rng),
        ];
        let want = node_by_node(&program, &inputs);
        let got = interpret(&program, &inputs).expect("runs");
        assert_eq!(bits(&got), bits(&want), "{groups} groups");
        assert_eq!(bits(&on_one_device(&program, &inputs)), bits(&want));
    }
}
