//! The `#[gspmd::model]` DSL end to end: models written as Rust functions are traced
//! into IR; the IR's ops, annotations and source lines are checked against what the
//! model text says, and trace-time errors are typed and located.

use gspmd::ir::{Node, Op, Program};
use gspmd::prelude::*;

/// This file's text, to find the line of a statement independently of the tracer.
const SOURCE: &str = include_str!("dsl.rs");

/// 1-based line of the first line of this file containing `needle`.
fn line_of(needle: &str) -> u32 {
    let index = SOURCE
        .lines()
        .position(|l| l.contains(needle))
        .unwrap_or_else(|| panic!("`{needle}` not in tests/dsl.rs"));
    index as u32 + 1
}

fn count(p: &Program, name: &str) -> usize {
    p.nodes.iter().filter(|n| n.op.name() == name).count()
}

fn named<'a>(p: &'a Program, name: &str) -> Vec<&'a Node> {
    p.nodes
        .iter()
        .filter(|n| n.name.as_deref() == Some(name))
        .collect()
}

fn annotation(node: &Node) -> String {
    node.annotation
        .as_ref()
        .map_or_else(|| "none".to_string(), ToString::to_string)
}

// ---- Megatron MLP ----------------------------------------------------------------

/// Megatron MLP.
#[gspmd::model(mesh = (data, model))]
pub fn mlp(
    #[shard(data, _)] x: Tensor<B, D>,
    #[shard(_, model)] w1: Tensor<D, F>,
    #[shard(model, _)] w2: Tensor<F, D>,
) -> Tensor<B, D> {
    #[shard(data, model)]
    let h = x.matmul(&w1).relu(); // mlp: hidden
    h.matmul(&w2)
}

#[test]
fn mlp_traces_to_two_dots_with_annotations_and_user_lines() {
    let p = mlp::trace(mlp::Dims { B: 8, D: 16, F: 64 }).unwrap();
    gspmd::ir::verify(&p).unwrap();
    assert_eq!(p.name, "mlp");
    assert_eq!(p.params.len(), 3);
    assert_eq!(count(&p, "dot_general"), 2);
    assert_eq!(count(&p, "sharding_constraint"), 1);
    let params: Vec<(String, Vec<usize>, String)> = p
        .params
        .iter()
        .map(|&v| {
            let n = p.node(v);
            (n.name.clone().unwrap(), n.ty.shape.clone(), annotation(n))
        })
        .collect();
    let expected = [
        ("x", vec![8, 16], "(data, _)"),
        ("w1", vec![16, 64], "(_, model)"),
        ("w2", vec![64, 16], "(model, _)"),
    ];
    for (got, want) in params.iter().zip(expected) {
        assert_eq!(
            (got.0.as_str(), &got.1, got.2.as_str()),
            (want.0, &want.1, want.2)
        );
    }
    // The constraint is named after its binding, pinned to (data, model) with closed
    // dims, sits on the relu's result and carries the line of its `#[shard]`.
    let h = named(&p, "h");
    assert_eq!(h.len(), 1);
    let h = h[0];
    assert!(matches!(h.op, Op::ShardingConstraint));
    assert_eq!(h.ty.shape, vec![8, 64]);
    let s = h.annotation.as_ref().unwrap();
    assert_eq!(s.dims.len(), 2);
    assert!(s.dims.iter().all(|d| d.closed && d.priority.is_none()));
    assert_eq!(s.dims[0].axes, ["data"]);
    assert_eq!(s.dims[1].axes, ["model"]);
    let relu_line = line_of("let h = x.matmul(&w1).relu(); // mlp: hidden");
    assert_eq!(h.location.line, relu_line - 1);
    assert_eq!(h.location.file, "tests/dsl.rs");
    assert_eq!(p.node(h.operands[0]).op.name(), "maximum");
    assert_eq!(p.node(h.operands[0]).location.line, relu_line);
    // Parameters carry the lines of their declarations.
    assert_eq!(
        p.node(p.params[1]).location.line,
        line_of("#[shard(_, model)] w1: Tensor<D, F>")
    );
    // The result is the second dot, consuming the constraint.
    let out = p.node(p.outputs[0]);
    assert_eq!(out.op.name(), "dot_general");
    assert_eq!(
        out.operands[0].index(),
        p.nodes.iter().position(|n| std::ptr::eq(n, h)).unwrap()
    );
    let text = p.to_string();
    assert!(text.contains(&format!(
        "sharding_constraint(%6) \"h\" : f32[8,64] annotation=(data, model)  // tests/dsl.rs:{}",
        relu_line - 1
    )), "{text}");
    assert!(
        text.contains("\"x\" : f32[8,16] annotation=(data, _)"),
        "{text}"
    );
}

#[test]
fn trace_shapes_binds_symbols_like_trace() {
    let from_dims = mlp::trace(mlp::Dims { B: 4, D: 6, F: 10 }).unwrap();
    let from_shapes = mlp::trace_shapes(&[&[4, 6], &[6, 10], &[10, 6]]).unwrap();
    assert_eq!(from_dims, from_shapes);
    assert_eq!(mlp::MESH_AXES, ["data", "model"]);
    assert_eq!(mlp::SIGNATURE.symbols, ["B", "D", "F"]);
    assert_eq!(mlp::mesh([2, 4]).unwrap().num_devices(), 8);
}

#[test]
fn symbol_bound_to_two_sizes_names_both_parameters() {
    let err = mlp::trace_shapes(&[&[8, 16], &[16, 64], &[64, 12]]).unwrap_err();
    assert_eq!(
        err,
        Error::SymbolConflict {
            model: "mlp".into(),
            symbol: "D".into(),
            first_param: "x".into(),
            first_size: 16,
            second_param: "w2".into(),
            second_size: 12,
        }
    );
    assert_eq!(
        err.to_string(),
        "model `mlp`: shape symbol `D` is 16 in parameter `x` but 12 in parameter `w2`"
    );
}

#[test]
fn wrong_shape_count_and_rank_are_typed_errors() {
    assert_eq!(
        mlp::trace_shapes(&[&[8, 16], &[16, 64]]).unwrap_err(),
        Error::ArgumentCount {
            model: "mlp".into(),
            expected: 3,
            given: 2
        }
    );
    assert_eq!(
        mlp::trace_shapes(&[&[8, 16], &[16, 64, 1], &[64, 16]]).unwrap_err(),
        Error::ArgumentShape {
            model: "mlp".into(),
            param: "w1".into(),
            declared: "[D, F]".into(),
            given: vec![16, 64, 1],
        }
    );
}

// ---- fixed sizes, dtypes, shape errors at the user's line --------------------------

#[gspmd::model(mesh = (data))]
fn embed(
    #[shard(data)] ids: Tensor<B, i32>,
    #[shard(_, data)] table: Tensor<16, E>,
    #[shard(data, _)] x: Tensor<B, E>,
) -> Tensor<B, E> {
    let _ = &ids;
    x.matmul(&table) // embed: bad matmul
}

#[test]
fn fixed_dims_are_checked_when_binding() {
    let err = embed::trace_shapes(&[&[4], &[15, 8], &[4, 8]]).unwrap_err();
    assert_eq!(
        err,
        Error::ArgumentShape {
            model: "embed".into(),
            param: "table".into(),
            declared: "[16, E]".into(),
            given: vec![15, 8],
        }
    );
}

#[test]
fn shape_error_starts_with_the_users_file_and_line() {
    // x: [B, E] x table: [16, E] only fits when E = 16.
    let err = embed::trace(embed::Dims { B: 4, E: 8 }).unwrap_err();
    let line = line_of("x.matmul(&table) // embed: bad matmul");
    let text = err.to_string();
    assert!(
        text.starts_with(&format!("tests/dsl.rs:{line}: matmul:")),
        "{text}"
    );
    let ok = embed::trace(embed::Dims { B: 4, E: 16 }).unwrap();
    assert_eq!(ok.node(ok.params[0]).ty.to_string(), "i32[4]");
}

#[gspmd::model(mesh = (data))]
fn widen(x: Tensor<B, D>, w: Tensor<D, F>) -> Tensor<B, D> {
    x.matmul(&w)
}

#[test]
fn result_of_another_shape_than_declared_is_an_error_at_the_declaration() {
    let err = widen::trace(widen::Dims { B: 2, D: 3, F: 5 }).unwrap_err();
    let Error::ResultType {
        model,
        result,
        declared,
        given,
        location,
    } = &err
    else {
        panic!("{err:?}")
    };
    assert_eq!((*model, *result), ("widen", "result"));
    assert_eq!(declared, "f32[B, D] = f32[2,3]");
    assert_eq!(given.shape, vec![2, 5]);
    assert_eq!(
        location.line,
        line_of("fn widen(x: Tensor<B, D>, w: Tensor<D, F>) -> Tensor<B, D> {")
    );
    // With F = D the declaration holds.
    assert!(widen::trace(widen::Dims { B: 2, D: 3, F: 3 }).is_ok());
}

#[gspmd::model(mesh = (data))]
fn bad_let_rank(x: Tensor<B, D>) -> Tensor<B, D> {
    #[shard(data)] // bad_let_rank: one entry for a rank-2 value
    let y = x.relu();
    y
}

#[test]
fn let_sharding_rank_is_checked_when_tracing() {
    let err = bad_let_rank::trace(bad_let_rank::Dims { B: 2, D: 2 }).unwrap_err();
    let Error::ShardingRank {
        spec_rank,
        rank,
        context,
        ..
    } = &err
    else {
        panic!("{err:?}")
    };
    assert_eq!((*spec_rank, *rank), (1, 2));
    let line = line_of("#[shard(data)] // bad_let_rank");
    assert!(
        context.starts_with(&format!("tests/dsl.rs:{line}:")),
        "{context}"
    );
}

// ---- a finalized 2-D Transformer: helpers, a loop over stacked layers ---------------

/// Layer `l` of a stacked weight `[L, ...]`.
fn layer(w: &Tensor, l: usize) -> Tensor {
    let rest = w.shape()[1..].to_vec();
    w.slice_axis(0, l, l + 1).reshape(rest)
}

/// Multi-head self-attention over `x: [B, S, D]` with `wq, wk, wv: [D, H, K]` and
/// `wo: [H, K, D]`.
fn attention(x: &Tensor, wq: &Tensor, wk: &Tensor, wv: &Tensor, wo: &Tensor) -> Tensor {
    let q = einsum("bsd,dhk->bshk", x, wq);
    let k = einsum("btd,dhk->bthk", x, wk);
    let v = einsum("btd,dhk->bthk", x, wv);
    let scale = 1.0 / (q.shape()[3] as f32).sqrt();
    let scores = einsum("bshk,bthk->bhst", &q, &k) * scale;
    let probs = scores.softmax(-1);
    let context = einsum("bhst,bthk->bshk", &probs, &v);
    einsum("bshk,hkd->bsd", &context, wo)
}

/// A stack of pre-norm Transformer layers, 2-D sharded: batch over `data`, heads and
/// the FFN's hidden dim over `model` (the paper's "finalized" Transformer pattern).
#[gspmd::model(mesh = (data, model), out = (data, _, _))]
fn transformer(
    #[shard(data, _, _)] x: Tensor<B, S, D>,
    #[shard(_, _, model, _)] wq: Tensor<L, D, H, K>,
    #[shard(_, _, model, _)] wk: Tensor<L, D, H, K>,
    #[shard(_, _, model, _)] wv: Tensor<L, D, H, K>,
    #[shard(_, model, _, _)] wo: Tensor<L, H, K, D>,
    #[shard(_, _, model)] w1: Tensor<L, D, F>,
    #[shard(_, model, _)] w2: Tensor<L, F, D>,
) -> Tensor<B, S, D> {
    let mut x = x;
    for l in 0..wq.shape()[0] {
        let a = attention(
            &x.layer_norm(-1, 1e-5),
            &layer(&wq, l),
            &layer(&wk, l),
            &layer(&wv, l),
            &layer(&wo, l),
        );
        #[shard(data, _, _, name = "residual")]
        let y = &x + &a;
        let ffn_in = |t: &Tensor| t.layer_norm(-1, 1e-5).matmul(&layer(&w1, l));
        #[shard(data, _, model)]
        let h = ffn_in(&y).gelu();
        x = &y + &h.matmul(&layer(&w2, l));
    }
    x
}

#[test]
fn transformer_stack_traces_every_layer() {
    let layers = 3;
    let dims = transformer::Dims {
        B: 4,
        S: 6,
        D: 8,
        L: layers,
        H: 2,
        K: 4,
        F: 16,
    };
    let p = transformer::trace(dims).unwrap();
    gspmd::ir::verify(&p).unwrap();
    // Per layer: q, k, v, scores, context, output projection, two FFN matmuls.
    assert_eq!(count(&p, "dot_general"), 8 * layers);
    // Per layer: the two `#[shard] let`s; plus the `out` constraint.
    assert_eq!(count(&p, "sharding_constraint"), 2 * layers + 1);
    let residuals = named(&p, "residual");
    assert_eq!(residuals.len(), layers);
    assert!(
        residuals
            .iter()
            .all(|n| annotation(n) == "(data, _, _)" && n.ty.shape == [4, 6, 8])
    );
    let hidden = named(&p, "h");
    assert_eq!(hidden.len(), layers);
    assert!(
        hidden
            .iter()
            .all(|n| annotation(n) == "(data, _, model)" && n.ty.shape == [4, 6, 16])
    );
    // The weights' annotations: heads and the FFN hidden dim over `model`.
    let wq = p.node(p.params[1]);
    assert_eq!(
        (wq.name.as_deref(), annotation(wq).as_str()),
        (Some("wq"), "(_, _, model, _)")
    );
    // The result is the `out` constraint.
    let out = p.node(p.outputs[0]);
    assert!(matches!(out.op, Op::ShardingConstraint));
    assert_eq!(annotation(out), "(data, _, _)");
    assert_eq!(out.ty.shape, vec![4, 6, 8]);
    // Ops inside the helper carry the helper's lines (no #[track_caller] there);
    // ops of the loop body carry the body's lines.
    let softmax_line = line_of("let probs = scores.softmax(-1);");
    let exps: Vec<u32> = p
        .nodes
        .iter()
        .filter(|n| n.op.name() == "exponential")
        .map(|n| n.location.line)
        .collect();
    assert_eq!(exps, vec![softmax_line; layers]);
    let residual_line = line_of("let y = &x + &a;");
    assert!(
        p.nodes
            .iter()
            .any(|n| n.op.name() == "add" && n.location.line == residual_line)
    );
}

// ---- einsum only, a static argument, two results ------------------------------------

#[gspmd::model(mesh = (data, model), out = [(data, model), (data)])]
fn einsum_model(
    #[shard(data, _)] x: Tensor<B, D>,
    #[shard(_, model?, priority = 0)] w: Tensor<D, F>,
    scale: f32,
) -> (Tensor<B, F>, Tensor<B>) {
    let y = einsum("bd,df->bf", &x, &w) * scale;
    let rows = y.transpose(&[1, 0]).einsum("fb->b");
    (y, rows)
}

#[test]
fn einsum_model_lowers_to_dot_and_reduce() {
    let p = einsum_model::trace_shapes(&[&[4, 8], &[8, 6]], 0.5).unwrap();
    gspmd::ir::verify(&p).unwrap();
    assert_eq!(count(&p, "dot_general"), 1);
    assert_eq!(count(&p, "reduce"), 1);
    assert_eq!(count(&p, "transpose"), 1);
    assert_eq!(p.outputs.len(), 2);
    let shapes: Vec<Vec<usize>> = p.outputs.iter().map(|&v| p.ty(v).shape.clone()).collect();
    assert_eq!(shapes, vec![vec![4, 6], vec![4]]);
    let dot = p
        .nodes
        .iter()
        .find(|n| n.op.name() == "dot_general")
        .unwrap();
    let Op::DotGeneral(dims) = &dot.op else {
        unreachable!()
    };
    assert_eq!(
        (
            dims.lhs_contracting.as_slice(),
            dims.rhs_contracting.as_slice()
        ),
        (&[1][..], &[0][..])
    );
    // `model?` is open with axes, `priority = 0` applies to every dim.
    let w = p.node(p.params[1]).annotation.as_ref().unwrap();
    assert!(w.dims[0].closed && !w.dims[1].closed);
    assert_eq!(w.dims[1].axes, ["model"]);
    assert!(w.dims.iter().all(|d| d.priority == Some(0)));
    assert_eq!(annotation(p.node(p.outputs[1])), "(data)");
    // The multiplication by the static `scale` is a constant 0.5.
    assert!(p.to_string().contains("value=0.5"));
}

// ---- a model calling a model; a mask built in the body ------------------------------

/// Scales `x` and pins the result; its parameter annotation only applies when `scaled`
/// itself is traced.
#[gspmd::model(mesh = (data, model))]
fn scaled(#[shard(_, model)] x: Tensor<B, D>) -> Tensor<B, D> {
    #[shard(data, _, name = "scaled")]
    let y = &x * 2.0;
    y
}

/// Lower-triangular part of `x` (zeros above the diagonal), through `scaled`.
#[gspmd::model(mesh = (data, model))]
fn lower(#[shard(data, _)] x: Tensor<N, N>) -> Tensor<N, N> {
    let b = x.builder();
    let n = x.shape()[0];
    let keep = b
        .iota([n, n], 0, DType::I32)
        .ge(&b.iota([n, n], 1, DType::I32));
    keep.select(&scaled(x.clone()), &x.scalar_like(0.0)) // lower: select
}

#[test]
fn a_called_model_contributes_its_lets_but_not_its_parameter_annotations() {
    let p = lower::trace(lower::Dims { N: 4 }).unwrap();
    gspmd::ir::verify(&p).unwrap();
    // The parameter is `lower`'s, with `lower`'s annotation.
    assert_eq!(annotation(p.node(p.params[0])), "(data, _)");
    // `scaled`'s `#[shard] let` is a constraint; its `(_, model)` is on no value.
    let pinned = named(&p, "scaled");
    assert_eq!(pinned.len(), 1);
    assert_eq!(annotation(pinned[0]), "(data, _)");
    assert_eq!(count(&p, "sharding_constraint"), 1);
    assert!(p.nodes.iter().all(|n| annotation(n) != "(_, model)"), "{p}");
    // The mask: two iotas, one comparison, one select at the user's line.
    assert_eq!(count(&p, "iota"), 2);
    assert_eq!(count(&p, "compare"), 1);
    let select = p.node(p.outputs[0]);
    assert_eq!(select.op.name(), "select");
    assert_eq!(select.location.line, line_of("// lower: select"));
    // Traced alone, `scaled` has its own parameter annotation.
    let alone = scaled::trace(scaled::Dims { B: 4, D: 4 }).unwrap();
    assert_eq!(annotation(alone.node(alone.params[0])), "(_, model)");
}

#[test]
fn the_lower_triangle_model_computes_a_lower_triangle() {
    let p = lower::trace(lower::Dims { N: 3 }).unwrap();
    let x = gspmd::ndarray::ArrayD::from_shape_fn(vec![3, 3], |i| (i[0] * 3 + i[1] + 1) as f32);
    let got = interpret(&p, &[Literal::from(x)]).unwrap();
    let expected = [2.0, 0.0, 0.0, 8.0, 10.0, 0.0, 14.0, 16.0, 18.0];
    assert_eq!(
        got[0].as_f32().unwrap().iter().copied().collect::<Vec<_>>(),
        expected
    );
}

// ---- models declared inside a function body, raw identifiers ------------------------

#[test]
fn a_model_declared_in_a_function_body_traces_and_runs_on_a_mesh() {
    // Declared here, the model and its module see this body's `use` and helper; the
    // generated module reaches the function without a `super::` path.
    use gspmd::ir::Op;
    fn double(t: &Tensor) -> Tensor {
        t + t
    }
    #[gspmd::model(mesh = (data))]
    fn local(#[shard(data, _)] x: Tensor<B, D>, w: Tensor<D, D>, scale: f32) -> Tensor<B, D> {
        #[shard(data, _)] // local: h
        let h = double(&x.matmul(&w));
        h * scale
    }
    let p = local::trace(local::Dims { B: 4, D: 3 }, 0.5).unwrap();
    assert_eq!(p, local::trace_shapes(&[&[4, 3], &[3, 3]], 0.5).unwrap());
    assert_eq!(annotation(p.node(p.params[0])), "(data, _)");
    let h = named(&p, "h");
    assert_eq!(h.len(), 1);
    assert!(matches!(h[0].op, Op::ShardingConstraint));
    assert_eq!(h[0].location.line, line_of("// local: h"));
    let inputs = [
        Literal::from(gspmd::ndarray::ArrayD::from_shape_fn(vec![4, 3], |i| {
            (i[0] * 3 + i[1]) as f32 - 5.0
        })),
        Literal::from(gspmd::ndarray::ArrayD::from_shape_fn(vec![3, 3], |i| {
            (i[0] + 2 * i[1]) as f32 / 4.0
        })),
    ];
    let want = interpret(&p, &inputs).unwrap();
    let mesh = local::mesh([2]).unwrap();
    let got = compile(&p, &mesh)
        .unwrap()
        .run(&ThreadMesh::new(mesh).unwrap(), &inputs)
        .unwrap();
    assert_eq!(got, want);
    // x w doubled and halved is x w.
    let x = inputs[0].as_f32().unwrap();
    let w = inputs[1].as_f32().unwrap();
    let got = got[0].as_f32().unwrap();
    for b in 0..4 {
        for d in 0..3 {
            let xw: f32 = (0..3).map(|k| x[[b, k]] * w[[k, d]]).sum();
            assert!((got[[b, d]] - xw).abs() < 1e-5, "({b}, {d})");
        }
    }
}

/// Raw identifiers name the axis, symbol or value without `r#`, as Rust itself does.
#[gspmd::model(mesh = (r#type, model))]
fn raw(#[shard(r#type, _)] r#in: Tensor<r#B, D>) -> Tensor<B, D> {
    #[shard(_, r#model)]
    let r#out = r#in.relu();
    r#out
}

#[test]
fn raw_identifiers_name_axes_symbols_and_values_without_r_hash() {
    assert_eq!(raw::MESH_AXES, ["type", "model"]);
    assert_eq!(raw::SIGNATURE.symbols, ["B", "D"]);
    let p = raw::trace(raw::Dims { B: 4, D: 2 }).unwrap();
    let param = p.node(p.params[0]);
    assert_eq!(param.name.as_deref(), Some("in"));
    assert_eq!(annotation(param), "(type, _)");
    assert_eq!(annotation(named(&p, "out")[0]), "(_, model)");
    // The mesh the module builds has the axes the shardings name: it compiles and runs.
    let mesh = raw::mesh([2, 2]).unwrap();
    let input = Literal::from(gspmd::ndarray::ArrayD::from_shape_fn(vec![4, 2], |i| {
        i[0] as f32 - 1.5 * i[1] as f32
    }));
    let want = interpret(&p, std::slice::from_ref(&input)).unwrap();
    let got = compile(&p, &mesh)
        .unwrap()
        .run(&ThreadMesh::new(mesh).unwrap(), &[input])
        .unwrap();
    assert_eq!(got, want);
}

// ---- control flow ----------------------------------------------------------------

/// A layer stack as one `scan`: `#[shard] let` inside the loop body's closure pins a
/// value of the body (the constraint is traced into the region).
#[gspmd::model(mesh = (data, model))]
pub fn scanned_layers(
    #[shard(data, _)] x: Tensor<B, D>,
    #[shard(_, _, model)] w: Tensor<L, D, D>,
) -> Tensor<B, D> {
    let b = x.builder();
    let (carry, _) = b.scan(&[w], &[x], |c, w| {
        #[shard(data, model)]
        let h = c[0].matmul(&w[0]).tanh(); // scanned: hidden
        (vec![h], vec![])
    });
    carry[0].clone()
}

#[test]
fn shard_let_inside_a_loop_body_constrains_the_body() {
    let p = scanned_layers::trace(scanned_layers::Dims { B: 8, D: 16, L: 3 }).unwrap();
    gspmd::ir::verify(&p).unwrap();
    assert_eq!(count(&p, "scan"), 1);
    assert_eq!(count(&p, "sharding_constraint"), 0);
    let scan = p.nodes.iter().find(|n| n.op.name() == "scan").unwrap();
    let Op::Flow { flow, .. } = &scan.op else {
        panic!("{}", scan.op.name())
    };
    let body = flow.regions()[0];
    let h = named(body, "h");
    assert_eq!(h.len(), 1);
    assert!(matches!(h[0].op, Op::ShardingConstraint));
    assert_eq!(annotation(h[0]), "(data, model)");
    assert_eq!(h[0].location.line, line_of("// scanned: hidden") - 1);
}

// ---- bf16 and f16 ----------------------------------------------------------------

/// A bf16 layer with an f16 bias, its result declared bf16.
#[gspmd::model(mesh = (data, model))]
pub fn narrow_mlp(
    #[shard(data, _)] x: Tensor<B, D, bf16>,
    #[shard(_, model)] w: Tensor<D, F, bf16>,
    bias: Tensor<F, f16>,
) -> Tensor<B, F, bf16> {
    &x.matmul(&w) + &bias.convert(DType::BF16)
}

#[test]
fn bf16_and_f16_tensors_trace_and_run() {
    let p = narrow_mlp::trace(narrow_mlp::Dims { B: 4, D: 8, F: 6 }).unwrap();
    let dtypes: Vec<DType> = p.params.iter().map(|&v| p.ty(v).dtype).collect();
    assert_eq!(dtypes, [DType::BF16, DType::BF16, DType::F16]);
    assert_eq!(p.ty(p.outputs[0]).dtype, DType::BF16);
    let inputs = [
        Literal::full(&[4, 8], DType::BF16, 0.5),
        Literal::full(&[8, 6], DType::BF16, 0.25),
        Literal::full(&[6], DType::F16, -1.0),
    ];
    let out = interpret(&p, &inputs).unwrap();
    // 8 * 0.5 * 0.25 - 1 = 0, exactly.
    assert_eq!(out[0], Literal::full(&[4, 6], DType::BF16, 0.0));
    // The prelude's types are the literals' element types.
    let one: bf16 = bf16::from_f32(1.0);
    assert_eq!(
        Literal::full(&[], DType::BF16, 1.0).as_bf16().unwrap()[[]],
        one
    );
    assert_eq!(f16::from_f32(1.0).to_f32(), 1.0);
}
