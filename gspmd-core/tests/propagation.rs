//! Golden tests of sharding propagation: the expected shardings are worked out by hand
//! from the ops' semantics (GSPMD section 3.5, Megatron-LM's MLP and attention
//! layouts), never taken from the code's output.

use gspmd_core::Error;
use gspmd_core::ir::random;
use gspmd_core::ir::{
    Builder, ConvDimensionNumbers, DType, Op, OpKind, Padding, Program, ReduceKind, ScatterDims,
    Tensor, ValueId, einsum,
};
use gspmd_core::propagation::{explain, propagate, sharding_rule};
use gspmd_core::sharding::{Mesh, Sharding};

mod op_coverage;

fn sh(text: &str) -> Sharding {
    text.parse().expect("test sharding parses")
}

/// The 2 x 4 mesh of the paper's examples.
fn mesh() -> Mesh {
    Mesh::new([("data", 2), ("model", 4)]).expect("valid mesh")
}

fn param(b: &Builder, name: &str, shape: &[usize], annotation: Option<&str>) -> Tensor {
    let t = b.parameter(name, shape.to_vec(), DType::F32);
    match annotation {
        Some(a) => t.annotate(sh(a)),
        None => t,
    }
}

fn id(t: &Tensor) -> ValueId {
    t.id().expect("traced without error")
}

fn finish(b: Builder, outputs: &[&Tensor]) -> Program {
    b.finish(outputs).expect("traced without error")
}

/// Propagates on the 2 x 4 mesh and checks the invariants every result must hold: each
/// value has a sharding of its rank, all dims closed, no priorities, no axis twice, and
/// annotations kept (closed dims exactly, open dims as a prefix).
fn run(program: &Program) -> Program {
    let p = propagate(program, &mesh()).expect("propagation succeeds");
    for v in p.values() {
        let node = p.node(v);
        let s = node.sharding.as_ref().expect("every value has a sharding");
        assert_eq!(s.dims.len(), node.ty.rank(), "{v}");
        assert!(
            s.dims.iter().all(|d| d.closed && d.priority.is_none()),
            "{v}: {s}"
        );
        assert_eq!(s.repeated_axis(), None, "{v}: {s}");
        assert!(
            node.origin
                .as_ref()
                .is_some_and(|o| o.dims.len() == node.ty.rank())
        );
        if let Some(a) = &node.annotation {
            for (want, got) in a.dims.iter().zip(&s.dims) {
                let kept = if want.closed {
                    got.axes == want.axes
                } else {
                    got.axes.starts_with(&want.axes)
                };
                assert!(kept, "{v}: annotation {a} became {s}");
            }
        }
    }
    op_coverage::record("propagated", &p);
    p
}

/// The final sharding of `t` as text.
fn of(p: &Program, t: &Tensor) -> String {
    match &p.node(id(t)).sharding {
        Some(s) => s.to_string(),
        None => "<none>".into(),
    }
}

/// The final sharding of every value, in program order.
fn all(p: &Program) -> Vec<String> {
    (p.values())
        .map(|v| {
            p.node(v)
                .sharding
                .as_ref()
                .map_or("<none>".into(), ToString::to_string)
        })
        .collect()
}

/// A manual region (`shard_map` over `model`): its operands and results have the specs'
/// manual axes, the automatic axis `data` propagates around it and into its body (as
/// minor axes at the boundary), and no value of the body is sharded over `model`.
#[test]
fn shard_map_keeps_its_manual_axes_and_propagates_the_automatic_ones() {
    let b = Builder::new("manual");
    let x = param(&b, "x", &[8, 16], Some("(data, ?)"));
    let w = param(&b, "w", &[16, 4], None);
    let other = param(&b, "other", &[8, 4], Some("(data, _)"));
    let h = x.exp();
    let ys = b.shard_map(
        &mesh(),
        &["model"],
        &[h.clone(), w],
        &[sh("(_, model)"), sh("(model, _)")],
        &[sh("(_, _)")],
        |_, blocks| vec![blocks[0].matmul(&blocks[1]).psum(&["model"])],
    );
    let z = ys[0].tanh().add(&other);
    let p = run(&finish(b, &[&z]));
    assert_eq!(of(&p, &h), "(data, model)");
    let flow = (p.values())
        .find(|&v| p.node(v).op.kind() == OpKind::ShardMap)
        .expect("the region");
    let boundary: Vec<String> = (p.node(flow).operands.iter())
        .map(|&o| p.node(o).sharding.as_ref().expect("a sharding").to_string())
        .collect();
    assert_eq!(boundary, ["(data, model)", "(model, _)"]);
    assert_eq!(
        p.node(flow)
            .sharding
            .as_ref()
            .expect("a sharding")
            .to_string(),
        "(data, _)"
    );
    assert_eq!(of(&p, &z), "(data, _)");
    let Op::Flow { flow, .. } = &p.node(flow).op else {
        panic!("a flow node")
    };
    let body = flow.regions()[0];
    let shardings: Vec<String> = (body.nodes.iter())
        .map(|n| n.sharding.as_ref().expect("a sharding").to_string())
        .collect();
    assert!(shardings.iter().all(|s| !s.contains("model")), "{body}");
    let param = body.node(body.params[0]).sharding.as_ref();
    assert_eq!(param.expect("a sharding").to_string(), "(data, _)");
}

// ---- rules -----------------------------------------------------------------------------

/// The rule of the op defining `t`, printed.
fn rule(p: &Program, t: &Tensor) -> String {
    op_coverage::record_kinds("propagated", [p.node(id(t)).op.kind()]);
    sharding_rule(p, id(t)).to_string()
}

#[test]
fn rules_of_contractions_and_reductions() {
    let b = Builder::new("rules");
    let x = param(&b, "x", &[8, 16], None);
    let w = param(&b, "w", &[16, 32], None);
    let a = param(&b, "a", &[4, 8, 16], None);
    let c = param(&b, "c", &[4, 16, 2], None);
    let t = param(&b, "t", &[8, 16, 32], None);
    let dot = x.matmul(&w);
    let batched = a.matmul(&c);
    let sum = t.sum(&[1]);
    let p = finish(b, &[&dot, &batched, &sum]);
    assert_eq!(
        rule(&p, &dot),
        "([i, k], [k, j])->([i, j]) {i=8, j=32, k=16} reduction={k}"
    );
    assert_eq!(
        rule(&p, &batched),
        "([i, j, l], [i, l, k])->([i, j, k]) {i=4, j=8, k=2, l=16} reduction={l}"
    );
    assert_eq!(
        rule(&p, &sum),
        "([i, j, k])->([i, k]) {i=8, j=16, k=32} reduction={j}"
    );
}

#[test]
fn rules_of_shape_ops() {
    let b = Builder::new("rules");
    let x = param(&b, "x", &[8, 16], None);
    let y = param(&b, "y", &[2, 4, 16], None);
    let z = param(&b, "z", &[2, 3], None);
    let u = param(&b, "u", &[8, 1, 4], None);
    let bias = param(&b, "bias", &[32], None);
    let col = param(&b, "col", &[8, 1], None);
    let t = param(&b, "t", &[8, 16, 32], None);
    let split = x.reshape([2, 4, 16]);
    let merge = y.reshape([8, 16]);
    let mismatch = z.reshape([3, 2]);
    let squeeze = u.reshape([32]);
    let bias_b = bias.broadcast_in_dim([8, 32], &[1]);
    let col_b = col.broadcast_in_dim([8, 32], &[0, 1]);
    let perm = t.transpose(&[2, 0, 1]);
    let p = finish(
        b,
        &[&split, &merge, &mismatch, &squeeze, &bias_b, &col_b, &perm],
    );
    assert_eq!(rule(&p, &split), "([ij, k])->([i, j, k]) {i=2, j=4, k=16}");
    assert_eq!(rule(&p, &merge), "([i, j, k])->([ij, k]) {i=2, j=4, k=16}");
    assert_eq!(
        rule(&p, &mismatch),
        "([i, j])->([k, l]) {i=2, j=3, k=3, l=2} need_replication={i, j, k, l}"
    );
    assert_eq!(rule(&p, &squeeze), "([i, 1, j])->([ij]) {i=8, j=4}");
    assert_eq!(rule(&p, &bias_b), "([j])->([i, j]) {i=8, j=32}");
    assert_eq!(rule(&p, &col_b), "([i, 1])->([i, j]) {i=8, j=32}");
    assert_eq!(
        rule(&p, &perm),
        "([i, j, k])->([k, i, j]) {i=8, j=16, k=32}"
    );
}

#[test]
fn rules_of_elementwise_and_windowed_ops() {
    let b = Builder::new("rules");
    let x = param(&b, "x", &[8, 16], None);
    let y = param(&b, "y", &[4, 16], None);
    let sum = &x + &x;
    let sliced = x.slice(&[0, 0], &[4, 16], &[1, 1]);
    let padded = x.pad(&b.scalar(0.0), &[1, 0], &[1, 0], &[0, 0]);
    let shifted = x.pad(&b.scalar(0.0), &[1, 0], &[-1, 0], &[0, 0]);
    let joined = b.concatenate(&[&y, &y], 0);
    let iota = b.iota([8, 16], 1, DType::I32);
    let p = finish(b, &[&sum, &sliced, &padded, &shifted, &joined, &iota]);
    assert_eq!(rule(&p, &sum), "([i, j], [i, j])->([i, j]) {i=8, j=16}");
    assert_eq!(
        rule(&p, &sliced),
        "([i, j])->([i, j]) {i=8, j=16} permutation={i}"
    );
    assert_eq!(
        rule(&p, &padded),
        "([i, j], [])->([i, j]) {i=10, j=16} permutation={i}"
    );
    // Same size, but every element moves one place along dim 0.
    assert_eq!(
        rule(&p, &shifted),
        "([i, j], [])->([i, j]) {i=8, j=16} permutation={i}"
    );
    assert_eq!(
        rule(&p, &joined),
        "([i, j], [i, j])->([i, j]) {i=8, j=16} permutation={i}"
    );
    assert_eq!(rule(&p, &iota), "()->([i, j]) {i=8, j=16}");
}

#[test]
fn rules_of_reduce_window() {
    let b = Builder::new("rules");
    let x = param(&b, "x", &[8, 16, 16, 4], None);
    let pooled = x.max_pool(&[1, 2, 2, 1], &[1, 2, 2, 1], Padding::Valid);
    // A size-1 window with stride 2 still moves elements; one with padding too.
    let strided = x.reduce_window(
        ReduceKind::Sum,
        &[1, 1, 1, 1],
        &[2, 1, 1, 1],
        &[(0, 0), (0, 0), (1, 0), (0, 0)],
    );
    let trivial = x.reduce_window(ReduceKind::Min, &[1; 4], &[1; 4], &[(0, 0); 4]);
    let p = finish(b, &[&pooled, &strided, &trivial]);
    assert_eq!(
        rule(&p, &pooled),
        "([i, j, k, l])->([i, j, k, l]) {i=8, j=16, k=16, l=4} permutation={j, k}"
    );
    assert_eq!(
        rule(&p, &strided),
        "([i, j, k, l])->([i, j, k, l]) {i=8, j=16, k=17, l=4} permutation={i, k}"
    );
    assert_eq!(
        rule(&p, &trivial),
        "([i, j, k, l])->([i, j, k, l]) {i=8, j=16, k=16, l=4}"
    );
}

#[test]
fn rules_of_convolution_and_reverse() {
    let b = Builder::new("rules");
    let x = param(&b, "x", &[8, 32, 32, 8], None);
    let k3 = param(&b, "k3", &[3, 3, 8, 16], None);
    let k1 = param(&b, "k1", &[1, 1, 8, 16], None);
    let kg = param(&b, "kg", &[3, 3, 2, 16], None);
    let same = x.conv2d(&k3, [1, 1], Padding::Same);
    let pointwise = x.conv2d(&k1, [1, 1], Padding::Valid);
    let dn = ConvDimensionNumbers::from_labels("NHWC", "HWIO", "NHWC").unwrap();
    let grouped = x.conv_general_dilated(&kg, &[1, 1], Padding::Same, &[], &[], &dn, 4);
    let batch_grouped =
        x.conv_general_dilated_grouped(&k3, &[1, 1], Padding::Same, &[], &[], &dn, 1, 4);
    let flipped = x.reverse(&[1, 3]);
    let p = finish(b, &[&same, &pointwise, &grouped, &batch_grouped, &flipped]);
    // Batch i and output features j pass through, input features k are a reduction,
    // H and W (l, n) are permutation factors, the kernel's window (m, o) is replicated.
    assert_eq!(
        rule(&p, &same),
        "([i, l, n, k], [m, o, k, j])->([i, l, n, j]) {i=8, j=16, k=8, l=32, m=3, n=32, o=3} \
         reduction={k} need_replication={m, o} permutation={l, n}"
    );
    // A 1x1 window moves nothing: H and W pass through like batch dims.
    assert_eq!(
        rule(&p, &pointwise),
        "([i, l, m, k], [1, 1, k, j])->([i, l, m, j]) {i=8, j=16, k=8, l=32, m=32} reduction={k}"
    );
    // Feature groups: the group factor i (4) passes through, major in the input's
    // features, the kernel's output features and the output's features; the features
    // within a group (k out, l in) are not split.
    assert_eq!(
        rule(&p, &grouped),
        "([j, m, o, il], [n, p, l, ik])->([j, m, o, ik]) {i=4, j=8, k=4, l=2, m=32, n=3, o=32, p=3} \
         need_replication={k, l, n, p} permutation={m, o}"
    );
    // Batch groups: the group factor i (4) is major in the input's batch instead; the
    // batch within a group (j) and the output features within a group (k) are not
    // split; the input features (l) are a reduction.
    assert_eq!(
        rule(&p, &batch_grouped),
        "([ij, m, o, l], [n, p, l, ik])->([j, m, o, ik]) {i=4, j=2, k=4, l=8, m=32, n=3, o=32, p=3} \
         reduction={l} need_replication={j, k, n, p} permutation={m, o}"
    );
    assert_eq!(
        rule(&p, &flipped),
        "([i, j, k, l])->([i, j, k, l]) {i=8, j=32, k=32, l=8} permutation={j, l}"
    );
}

#[test]
fn convolution_passes_batch_and_features_and_keeps_spatial_splits() {
    let b = Builder::new("conv");
    let x = param(&b, "x", &[8, 32, 32, 8], Some("(data, _, _, _)"));
    let k = param(&b, "k", &[3, 3, 8, 16], Some("(_, _, _, model)"));
    let y = x.conv2d(&k, [1, 1], Padding::Same);
    let rows = param(&b, "rows", &[8, 32, 32, 8], Some("(_, model, _, _)"));
    let z = rows.conv2d(&k, [1, 1], Padding::Same).reverse(&[1]);
    let p = run(&finish(b, &[&y, &z]));
    assert_eq!(of(&p, &y), "(data, _, _, model)");
    // The rows stay split through the convolution (a permutation factor: halo
    // exchange for the partitioner) and through the reverse.
    assert_eq!(of(&p, &z), "(_, model, _, _)");
}

#[test]
fn rules_of_gather_and_scatter() {
    let b = Builder::new("rules");
    let table = param(&b, "table", &[16, 8], None);
    let ids = b.parameter("ids", [4, 6], DType::I32);
    let index = b.parameter("index", [5], DType::I32);
    let rows = param(&b, "rows", &[5, 8], None);
    let x = param(&b, "x", &[4, 10], None);
    let picks = b.parameter("picks", [4, 3], DType::I32);
    let looked_up = table.embedding(&ids);
    let added = table.index_add(0, &index, &rows);
    let rows_at = ScatterDims::along(0, 2);
    let replaced = table.scatter(&index, &rows, &rows_at);
    let along = x.take_along_dim(&picks, 1);
    let p = finish(b, &[&looked_up, &added, &replaced, &along]);
    // The ids' dims (i, j) pass through to the result; the vocabulary k is indexed,
    // a reduction (split, each device looks up its own rows into a partial sum).
    assert_eq!(
        rule(&p, &looked_up),
        "([k, l], [i, j])->([i, j, l]) {i=4, j=6, k=16, l=8} reduction={k}"
    );
    // The updates' rows i add up (a reduction); the vocabulary j passes through from
    // the operand to the result, the features k through all three.
    assert_eq!(
        rule(&p, &added),
        "([j, k], [i], [i, k])->([j, k]) {i=5, j=16, k=8} reduction={i}"
    );
    // Replacing needs the updates whole, in order.
    assert_eq!(
        rule(&p, &replaced),
        "([j, k], [i], [i, k])->([j, k]) {i=5, j=16, k=8} need_replication={i}"
    );
    // Batching dims: operand dim 0, indices dim 0 and result dim 0 are one factor.
    assert_eq!(
        rule(&p, &along),
        "([i, k], [i, j])->([i, j]) {i=4, j=3, k=10} reduction={k}"
    );
}

#[test]
fn an_embedding_keeps_the_table_split_by_vocabulary_and_the_ids_by_batch() {
    let b = Builder::new("embedding");
    let table = param(&b, "table", &[16, 8], Some("(model, _)"));
    let ids = b
        .parameter("ids", [4, 6], DType::I32)
        .annotate(sh("(data, _)"));
    let x = param(&b, "x", &[4, 10], Some("(data, _)"));
    let picks = b.parameter("picks", [4, 3], DType::I32);
    let rows = table.embedding(&ids);
    let along = x.take_along_dim(&picks, 1);
    let p = run(&finish(b, &[&rows, &along]));
    assert_eq!(of(&p, &table), "(model, _)");
    assert_eq!(of(&p, &rows), "(data, _, _)");
    // The batching dim carries `data` to the indices and the result.
    assert_eq!(of(&p, &picks), "(data, _)");
    assert_eq!(of(&p, &along), "(data, _)");
}

#[test]
fn convolution_input_features_are_a_reduction() {
    let b = Builder::new("conv");
    let x = param(&b, "x", &[8, 16, 16, 8], Some("(data, _, _, model)"));
    let k = param(&b, "k", &[1, 1, 8, 4], None);
    let y = x.conv2d(&k, [1, 1], Padding::Valid);
    let p = run(&finish(b, &[&y]));
    // The kernel's input features follow the input's; the result has no feature split.
    assert_eq!(of(&p, &k), "(_, _, model, _)");
    assert_eq!(of(&p, &y), "(data, _, _, _)");
}

// ---- propagation -----------------------------------------------------------------------

#[test]
fn roll_and_slices_of_a_pad_keep_the_split_dim() {
    let b = Builder::new("windowed");
    let x = param(&b, "x", &[8, 32, 32, 8], Some("(_, model, data, _)"));
    let rolled = x.roll(1, 1);
    let padded = x.pad(&b.scalar(0.0), &[0, 1, 1, 0], &[0, 1, 1, 0], &[0; 4]);
    let tap = padded.slice(&[0, 2, 0, 0], &[8, 34, 32, 8], &[1; 4]);
    let p = run(&finish(b, &[&rolled, &tap]));
    assert_eq!(of(&p, &rolled), "(_, model, data, _)");
    assert_eq!(of(&p, &padded), "(_, model, data, _)");
    assert_eq!(of(&p, &tap), "(_, model, data, _)");
}

#[test]
fn paper_bd_df_to_bf() {
    let b = Builder::new("bd_df");
    let x = param(&b, "x", &[8, 16], Some("(data, _)"));
    let w = param(&b, "w", &[16, 32], Some("(_, model)"));
    let y = einsum("bd,df->bf", &x, &w);
    let p = run(&finish(b, &[&y]));
    assert_eq!(of(&p, &y), "(data, model)");
    assert_eq!(of(&p, &x), "(data, _)");
    assert_eq!(of(&p, &w), "(_, model)");
    let origin = p.node(id(&y)).origin.clone().expect("origin set");
    assert_eq!(origin.dims, vec![Some(id(&x)), Some(id(&w))]);
}

#[test]
fn megatron_mlp_from_three_annotations() {
    let b = Builder::new("mlp");
    let x = param(&b, "x", &[8, 16], Some("(data, _)"));
    let w1 = param(&b, "w1", &[16, 32], Some("(_, model)"));
    let w2 = param(&b, "w2", &[32, 16], Some("(model, _)"));
    let h = x.matmul(&w1);
    let r = h.relu();
    let y = r.matmul(&w2);
    let p = run(&finish(b, &[&y]));
    // %3 = dot, %4 = constant 0, %5 = broadcast of it, %6 = maximum, %7 = dot.
    assert_eq!(
        all(&p),
        [
            "(data, _)",
            "(_, model)",
            "(model, _)",
            "(data, model)",
            "()",
            "(data, model)",
            "(data, model)",
            "(data, _)",
        ]
    );
    assert_eq!(of(&p, &h), "(data, model)");
    assert_eq!(of(&p, &r), "(data, model)");
    assert_eq!(of(&p, &y), "(data, _)");
    let why = explain(&p, id(&r));
    assert!(
        why.contains("dim 0 (8): data, from the annotation of %0 \"x\"")
            && why.contains("dim 1 (32): model, from the annotation of %1 \"w1\""),
        "{why}"
    );
}

#[test]
fn elementwise_propagation_wins_over_the_dots_suggestion() {
    // GSPMD Fig. 4 style: the dot alone suggests h = (data, model), but the elementwise
    // chain from the constraint says (model, data); elementwise ops go first, so h follows
    // the chain and the dot's operands are the ones resharded.
    let b = Builder::new("linear_relu");
    let x = param(&b, "x", &[8, 16], Some("(data, _)"));
    let w = param(&b, "w", &[16, 32], Some("(_, model)"));
    let h = x.matmul(&w);
    let r = h.relu();
    let out = r.shard(sh("(model, data)"));
    let p = run(&finish(b, &[&out]));
    assert_eq!(of(&p, &h), "(model, data)");
    assert_eq!(of(&p, &r), "(model, data)");
    assert_eq!(of(&p, &x), "(data, _)");
}

#[test]
fn user_priority_overrides_operand_order() {
    let build = |a_spec: &str, b_spec: &str| {
        let b = Builder::new("priorities");
        let a = param(&b, "a", &[8, 16], Some(a_spec));
        let c = param(&b, "c", &[8, 16], Some(b_spec));
        let sum = &a + &c;
        let p = run(&finish(b, &[&sum]));
        of(&p, &sum)
    };
    // Equal sizes and equal priority: the first operand wins the conflict.
    assert_eq!(build("(data, ?)", "(model, ?)"), "(data, _)");
    // The second operand's annotation has the higher priority (0).
    assert_eq!(build("(data@1, ?)", "(model@0, ?)"), "(model, _)");
    // A priority beats no priority.
    assert_eq!(build("(data, ?)", "(model@3, ?)"), "(model, _)");
}

#[test]
fn reshape_splits_a_sharded_dim() {
    let b = Builder::new("split");
    let x = param(&b, "x", &[8, 16], Some("(data, _)"));
    let x2 = param(&b, "x2", &[8, 16], Some("((data, model), _)"));
    let x3 = param(&b, "x3", &[8, 16], Some("(model, _)"));
    let y = x.reshape([2, 4, 16]);
    let y2 = x2.reshape([2, 4, 16]);
    let y3 = x3.reshape([2, 4, 16]);
    let p = run(&finish(b, &[&y, &y2, &y3]));
    assert_eq!(of(&p, &y), "(data, _, _)");
    assert_eq!(of(&p, &y2), "(data, model, _)");
    // `model` (4) spans the major factor 2 of the dim: its major digit cuts the 2, its
    // minor digit the 4 (Shardy's sub-axes).
    assert_eq!(of(&p, &y3), "(model:(1)2, model:(2)2, _)");
}

#[test]
fn reshape_merges_sub_axes_back_into_their_axis() {
    let b = Builder::new("merge_sub_axes");
    let x = param(&b, "x", &[2, 4, 16], Some("(model:(1)2, model:(2)2, _)"));
    let y = x.reshape([8, 16]);
    // Backward: the operand of a reshape to a dim on `model` gets `model`'s digits.
    let u = param(&b, "u", &[2, 4, 16], None);
    let v = u.reshape([8, 16]).shard(sh("(model, _)"));
    // A split over `(data, model)` crosses the reshape as `data` and `model`'s digits
    // wherever they fit: [4, 2, 16] takes `data` and `model`'s major digit on dim 0.
    let w = param(&b, "w", &[8, 16], Some("((data, model), _)"));
    let z = w.reshape([4, 2, 16]);
    let p = run(&finish(b, &[&y, &v, &z]));
    assert_eq!(of(&p, &y), "(model, _)");
    assert_eq!(of(&p, &u), "(model:(1)2, model:(2)2, _)");
    assert_eq!(of(&p, &z), "((data, model:(1)2), model:(2)2, _)");
}

#[test]
fn sub_axes_never_overlap_an_axis_a_value_uses() {
    // Elementwise ops cross first: `u`'s `model` on dim 2 reaches the reshape's result,
    // which then cannot take `model`'s digits from the reshape on its dims 0 and 1.
    let b = Builder::new("overlap");
    let x = param(&b, "x", &[8, 16], Some("(model, _)"));
    let y = x.reshape([2, 4, 16]);
    let u = param(&b, "u", &[2, 4, 16], Some("(?, ?, model)"));
    let s = &y + &u;
    let p = run(&finish(b, &[&s]));
    assert_eq!(of(&p, &y), "(_, _, model)");
    assert_eq!(of(&p, &u), "(_, _, model)");
}

#[test]
fn reshape_merges_sharded_dims_both_ways() {
    let b = Builder::new("merge");
    let x = param(&b, "x", &[2, 4, 16], Some("(data, model, _)"));
    let y = x.reshape([8, 16]);
    // Backward: the operand gets the merged dim's axes back, split over its dims.
    let u = param(&b, "u", &[2, 4, 16], None);
    let v = u.reshape([8, 16]).shard(sh("((data, model), _)"));
    let p = run(&finish(b, &[&y, &v]));
    assert_eq!(of(&p, &y), "((data, model), _)");
    assert_eq!(of(&p, &u), "(data, model, _)");
}

#[test]
fn transpose_chains() {
    let b = Builder::new("transposes");
    let x = param(&b, "x", &[8, 16, 32], Some("(data, _, model)"));
    let t1 = x.transpose(&[2, 0, 1]);
    let t2 = t1.transpose(&[1, 2, 0]);
    let u = param(&b, "u", &[4, 8], None);
    let v = u.transpose(&[1, 0]).shard(sh("(model, data)"));
    let p = run(&finish(b, &[&t2, &v]));
    assert_eq!(of(&p, &t1), "(model, data, _)");
    assert_eq!(of(&p, &t2), "(data, _, model)");
    assert_eq!(of(&p, &u), "(data, model)");
}

#[test]
fn reduction_over_a_sharded_dim() {
    let b = Builder::new("reduce");
    let x = param(&b, "x", &[8, 16, 4], Some("(data, model, _)"));
    let over_model = x.sum(&[1]);
    let over_data = x.max_over(&[0]);
    let over_free = x.min_over(&[2]);
    let p = run(&finish(b, &[&over_model, &over_data, &over_free]));
    // The reduced dim's axis is not on the result.
    assert_eq!(of(&p, &over_model), "(data, _)");
    assert_eq!(of(&p, &over_data), "(model, _)");
    assert_eq!(of(&p, &over_free), "(data, model)");
}

#[test]
fn rules_of_dynamic_slices_scans_and_sorts() {
    let b = Builder::new("rules");
    let x = param(&b, "x", &[8, 16], None);
    let u = param(&b, "u", &[8, 4], None);
    let s = b.constant(gspmd_core::ir::Literal::full(&[], DType::I32, 3.0));
    let sliced = x.dynamic_slice(&[&s, &s], &[8, 4]);
    let updated = x.dynamic_update_slice(&u, &[&s, &s]);
    let scanned = x.cumsum(1);
    let sorted = x.argsort(0, false);
    let p = finish(b, &[&sliced, &updated, &scanned, &sorted]);
    // A dim sliced to fewer elements needs replication; a whole one passes through.
    assert_eq!(
        rule(&p, &sliced),
        "([i, j], [], [])->([i, j]) {i=8, j=16} need_replication={j}"
    );
    // The operand passes through; the update's smaller dim is its own factor.
    assert_eq!(
        rule(&p, &updated),
        "([i, j], [i, k], [], [])->([i, j]) {i=8, j=16, k=4} need_replication={k}"
    );
    assert_eq!(
        rule(&p, &scanned),
        "([i, j])->([i, j]) {i=8, j=16} permutation={j}"
    );
    assert_eq!(
        rule(&p, &sorted),
        "([i, j])->([i, j]) {i=8, j=16} need_replication={i}"
    );
}

#[test]
fn dynamic_slices_scans_and_sorts_keep_the_dims_they_leave_whole() {
    let b = Builder::new("along");
    let x = param(&b, "x", &[8, 16], Some("(data, model)"));
    let u = param(&b, "u", &[8, 4], None);
    let s = b.constant(gspmd_core::ir::Literal::full(&[], DType::I32, 3.0));
    let sliced = x.dynamic_slice(&[&s, &s], &[8, 4]);
    let updated = x.dynamic_update_slice(&u, &[&s, &s]);
    let scanned = x.cumsum(1);
    let product = x.cumprod(0);
    let sorted = x.argsort(1, true);
    let top = x.argmax(1);
    let p = run(&finish(
        b,
        &[&sliced, &updated, &scanned, &product, &sorted, &top],
    ));
    // The sliced dim of 16 does not pass `model` on; the whole dim keeps `data`. The
    // sorted dim's `model` moves to the other dim (XLA's sort along a split dim).
    assert_eq!(of(&p, &sliced), "(data, _)");
    assert_eq!(of(&p, &sorted), "((data, model), _)");
    // The update's whole dim follows the operand; its dim of 4 is its own.
    assert_eq!(of(&p, &u), "(data, _)");
    assert_eq!(of(&p, &updated), "(data, model)");
    // A scanned dim stays split.
    assert_eq!(of(&p, &scanned), "(data, model)");
    assert_eq!(of(&p, &product), "(data, model)");
    // argmax: reduce and compare, the reduced dim gone.
    assert_eq!(of(&p, &top), "(data)");
}

#[test]
fn pooling_keeps_batch_feature_and_split_spatial_dims() {
    let b = Builder::new("pool");
    let x = param(&b, "x", &[8, 16, 16, 4], Some("(data, model, _, _)"));
    let pooled = x.max_pool(&[1, 2, 2, 1], &[1, 2, 2, 1], Padding::Same);
    let averaged = pooled.avg_pool(&[1, 3, 3, 1], &[1, 1, 1, 1], Padding::Same, true);
    // Backward: the result's feature dim reaches the operand through the window.
    let y = param(&b, "y", &[8, 16, 16, 4], None);
    let summed = y
        .reduce_window(
            ReduceKind::Sum,
            &[1, 3, 1, 1],
            &[1, 1, 1, 1],
            &[(0, 0), (1, 1), (0, 0), (0, 0)],
        )
        .shard(sh("(_, _, _, model)"));
    let p = run(&finish(b, &[&averaged, &summed]));
    // Batch passes through; the split spatial dim is a permutation factor that stays
    // split (the partitioner exchanges halos or gathers it).
    assert_eq!(of(&p, &pooled), "(data, model, _, _)");
    assert_eq!(of(&p, &averaged), "(data, model, _, _)");
    assert_eq!(of(&p, &y), "(_, _, _, model)");
}

#[test]
fn every_elementwise_op_passes_the_sharding_through() {
    let b = Builder::new("elementwise");
    let x = param(&b, "x", &[8, 16], Some("(data, model)"));
    let y = param(&b, "y", &[8, 16], None);
    let unary = [
        x.neg(),
        x.abs(),
        x.exp(),
        x.log(),
        x.sqrt(),
        x.rsqrt(),
        x.tanh(),
        x.logistic(),
        x.sin(),
        x.cos(),
        x.erf(),
        x.floor(),
        x.ceil(),
        x.round(),
        x.sign(),
        // A bool result, split like its operand.
        x.is_finite(),
    ];
    let binary = [
        x.add(&y),
        x.sub(&y),
        x.mul(&y),
        x.div(&y),
        x.max(&y),
        x.min(&y),
        x.pow(&y),
        x.rem(&y),
    ];
    let compares = [x.eq(&y), x.ne(&y), x.lt(&y), x.le(&y), x.gt(&y), x.ge(&y)];
    let (p, q) = (&compares[0], &compares[1]);
    let rest = [
        p.not(),
        p.and(q),
        p.or(q),
        p.select(&x, &y),
        x.convert(DType::I32),
    ];
    let all: Vec<&Tensor> = unary
        .iter()
        .chain(&binary)
        .chain(&compares)
        .chain(&rest)
        .collect();
    let program = run(&finish(b, &all));
    assert_eq!(of(&program, &y), "(data, model)");
    for t in all {
        assert_eq!(
            of(&program, t),
            "(data, model)",
            "{}",
            program.node(id(t)).op.name()
        );
    }
}

/// The math ops are elementwise both ways: a constraint on a result after a chain of
/// them splits the operand they started from, and its rule maps dims one to one.
#[test]
fn math_ops_pass_a_result_sharding_back_to_their_operands() {
    let b = Builder::new("math");
    let x = param(&b, "x", &[8, 16], None);
    let y = param(&b, "y", &[8, 16], None);
    let chain = x.sin().cos().erf().floor().ceil().round().sign().rem(&y);
    let finite = chain.is_finite();
    let out = finite.shard(sh("(model, data)"));
    let p = finish(b, &[&out]);
    assert_eq!(rule(&p, &finite), "([i, j])->([i, j]) {i=8, j=16}");
    assert_eq!(rule(&p, &chain), "([i, j], [i, j])->([i, j]) {i=8, j=16}");
    let program = run(&p);
    for t in [&x, &y, &chain, &finite] {
        assert_eq!(of(&program, t), "(model, data)");
    }
}

#[test]
fn broadcast_of_a_bias() {
    let build = |w_spec: &str, bias_spec: Option<&str>| {
        let b = Builder::new("bias");
        let x = param(&b, "x", &[8, 16], Some("(data, _)"));
        let w = param(&b, "w", &[16, 32], Some(w_spec));
        let bias = param(&b, "bias", &[32], bias_spec);
        let y = &x.matmul(&w) + &bias;
        let p = run(&finish(b, &[&y]));
        let broadcast = (p.values())
            .find(|&v| matches!(p.node(v).op, Op::Broadcast { .. }))
            .expect("the add broadcasts the bias");
        let broadcast = p.node(broadcast).sharding.as_ref().map(ToString::to_string);
        (of(&p, &bias), broadcast.unwrap_or_default(), of(&p, &y))
    };
    // A replicated bias stays replicated; its broadcast follows the add.
    assert_eq!(
        build("(_, model)", Some("(_)")),
        ("(_)".into(), "(data, model)".into(), "(data, model)".into())
    );
    // The batch axis has no factor in the bias: it never reaches it.
    assert_eq!(
        build("(_, _)", None),
        ("(_)".into(), "(data, _)".into(), "(data, _)".into())
    );
    // The feature axis flows back through the broadcast to an unannotated bias.
    assert_eq!(
        build("(_, model)", None),
        (
            "(model)".into(),
            "(data, model)".into(),
            "(data, model)".into()
        )
    );
}

#[test]
fn attention_with_heads_on_the_model_axis() {
    let (bs, s, d, h, k) = (4, 8, 16, 4, 8);
    let b = Builder::new("attention");
    let x = param(&b, "x", &[bs, s, d], Some("(data, _, _)"));
    let wq = param(&b, "wq", &[d, h, k], Some("(_, model, _)"));
    let wk = param(&b, "wk", &[d, h, k], Some("(_, model, _)"));
    let wv = param(&b, "wv", &[d, h, k], Some("(_, model, _)"));
    let wo = param(&b, "wo", &[h, k, d], Some("(model, _, _)"));
    let q = einsum("bsd,dhk->bshk", &x, &wq);
    let kk = einsum("bsd,dhk->bshk", &x, &wk);
    let v = einsum("bsd,dhk->bshk", &x, &wv);
    let scores = einsum("bshk,bthk->bhst", &q, &kk);
    let probs = scores.softmax(-1);
    let o = einsum("bhst,bthk->bshk", &probs, &v);
    let y = einsum("bshk,hkd->bsd", &o, &wo);
    let p = run(&finish(b, &[&y]));
    for t in [&q, &kk, &v, &o] {
        assert_eq!(of(&p, t), "(data, _, model, _)");
    }
    assert_eq!(of(&p, &scores), "(data, model, _, _)");
    assert_eq!(of(&p, &probs), "(data, model, _, _)");
    assert_eq!(of(&p, &y), "(data, _, _)");
    // Softmax's max and sum keep batch and heads split.
    for v in p.values() {
        if matches!(p.node(v).op, Op::Reduce { .. }) {
            let s = p.node(v).sharding.as_ref().map(ToString::to_string);
            assert_eq!(s.as_deref(), Some("(data, model, _)"), "{v}");
        }
    }
}

#[test]
fn conflicts_reshard_the_smaller_tensor() {
    let build = |a_shape: &[usize], c_shape: &[usize]| {
        let b = Builder::new("conflict");
        let a = param(&b, "a", a_shape, Some("(data, _, _)"));
        let c = param(&b, "c", c_shape, Some("(model, _, _)"));
        let y = a.matmul(&c);
        let p = run(&finish(b, &[&y]));
        // Annotated values keep their annotations either way.
        assert_eq!(of(&p, &a), "(data, _, _)");
        assert_eq!(of(&p, &c), "(model, _, _)");
        of(&p, &y)
    };
    // Batch dim 4: lhs 4x8x16 = 512 elements against rhs 4x16x2 = 128: lhs wins.
    assert_eq!(build(&[4, 8, 16], &[4, 16, 2]), "(data, _, _)");
    // lhs 4x2x16 = 128 against rhs 4x16x8 = 512: rhs wins.
    assert_eq!(build(&[4, 2, 16], &[4, 16, 8]), "(model, _, _)");
}

#[test]
fn open_dims_are_filled_closed_ones_are_not() {
    let b = Builder::new("open");
    let x = param(&b, "x", &[8, 16], Some("(data, ?)"));
    let z = param(&b, "z", &[8, 16], Some("(?, model)"));
    let y = &x + &z;
    let x2 = param(&b, "x2", &[8, 16], Some("(data, _)"));
    let z2 = param(&b, "z2", &[8, 16], Some("(?, model)"));
    let y2 = &x2 + &z2;
    let before = finish(b, &[&y, &y2]);
    let p = run(&before);
    assert_eq!(of(&p, &x), "(data, model)");
    assert_eq!(of(&p, &z), "(data, model)");
    assert_eq!(of(&p, &y), "(data, model)");
    assert_eq!(of(&p, &x2), "(data, _)");
    assert_eq!(of(&p, &z2), "(data, model)");
    assert_eq!(of(&p, &y2), "(data, model)");
    // The annotations themselves are untouched.
    for v in p.values() {
        assert_eq!(p.node(v).annotation, before.node(v).annotation);
    }
}

#[test]
fn residual_mlp_layers_all_follow_megatron() {
    // x = x + relu(x @ w1 + b1) @ w2, three times: every hidden activation is split by
    // batch and feature, every residual by batch only, every bias by feature.
    let b = Builder::new("residual");
    let mut x = param(&b, "x", &[8, 16], Some("(data, _)"));
    let mut expected = vec![(x.clone(), "(data, _)")];
    for l in 0..3 {
        let w1 = param(&b, &format!("w1_{l}"), &[16, 32], Some("(_, model)"));
        let b1 = param(&b, &format!("b1_{l}"), &[32], None);
        let w2 = param(&b, &format!("w2_{l}"), &[32, 16], Some("(model, _)"));
        let pre = &x.matmul(&w1) + &b1;
        let h = pre.relu();
        let out = h.matmul(&w2);
        x = &x + &out;
        expected.extend([
            (b1, "(model)"),
            (pre, "(data, model)"),
            (h, "(data, model)"),
            (out, "(data, _)"),
            (x.clone(), "(data, _)"),
        ]);
    }
    let p = run(&finish(b, &[&x]));
    for (t, want) in &expected {
        assert_eq!(of(&p, t), *want, "{}", id(t));
    }
}

// ---- errors ----------------------------------------------------------------------------

/// A one-parameter program whose parameter carries `annotation` (set directly, past the
/// builder's own rank check), and the error context naming it.
fn annotated(annotation: &str) -> (Program, String) {
    let b = Builder::new("bad");
    let x = b.parameter("x", [8, 16], DType::F32);
    let line = line!() - 1;
    let mut p = finish(b, &[&x]);
    p.node_mut(id(&x)).annotation = Some(sh(annotation));
    (p, format!("{}:{line}: %0: ", file!()))
}

#[test]
fn unknown_axis_is_reported_with_its_location() {
    let (p, context) = annotated("(batch, _)");
    let err = propagate(&p, &mesh()).expect_err("unknown axis");
    assert!(
        matches!(&err, Error::UnknownAxis { axis, context: c, .. } if axis == "batch" && *c == context),
        "{err:?}"
    );
    assert!(err.to_string().starts_with(&context), "{err}");
}

#[test]
fn axis_used_twice_is_reported_with_its_location() {
    let (p, context) = annotated("(data, data)");
    let err = propagate(&p, &mesh()).expect_err("duplicate axis");
    assert!(
        matches!(&err, Error::DuplicateAxis { axis, context: c, .. } if axis == "data" && *c == context),
        "{err:?}"
    );
}

#[test]
fn spec_longer_than_rank_is_reported_with_its_location() {
    let (p, context) = annotated("(data, _, _)");
    let err = propagate(&p, &mesh()).expect_err("rank mismatch");
    assert!(
        matches!(&err, Error::ShardingRank { spec_rank: 3, rank: 2, context: c, .. } if *c == context),
        "{err:?}"
    );
}

#[test]
fn all_annotation_errors_are_reported_together() {
    let b = Builder::new("bad");
    let x = b.parameter("x", [8, 16], DType::F32);
    let y = b.parameter("y", [8, 16], DType::F32);
    let sum = &x + &y;
    let mut p = finish(b, &[&sum]);
    p.node_mut(id(&x)).annotation = Some(sh("(batch, _)"));
    p.node_mut(id(&y)).annotation = Some(sh("(model, model)"));
    let err = propagate(&p, &mesh()).expect_err("two bad annotations");
    match err {
        Error::Many(errors) => {
            assert_eq!(errors.len(), 2);
            assert!(matches!(errors[0], Error::UnknownAxis { .. }));
            assert!(matches!(errors[1], Error::DuplicateAxis { .. }));
        }
        other => panic!("expected two errors, got {other:?}"),
    }
}

// ---- properties ------------------------------------------------------------------------

mod properties {
    use super::*;
    use proptest::prelude::*;

    /// One step of a random program over a current value of shape [8, 16] or [16, 8].
    #[derive(Debug, Clone)]
    enum Step {
        Unary,
        AddParam(Option<&'static str>),
        Transpose,
        SplitAndMerge,
        MatmulSquare(Option<&'static str>),
        ReduceAndBroadcast,
        Constrain(&'static str),
    }

    const SPECS: [&str; 8] = [
        "(data, _)",
        "(_, model)",
        "(model, data)",
        "((data, model), ?)",
        "(?, data)",
        "(data@0, ?)",
        "(model@1, _)",
        "(?, ?)",
    ];

    fn spec() -> impl Strategy<Value = &'static str> {
        prop::sample::select(SPECS.to_vec())
    }

    fn step() -> impl Strategy<Value = Step> {
        prop_oneof![
            Just(Step::Unary),
            prop::option::of(spec()).prop_map(Step::AddParam),
            Just(Step::Transpose),
            Just(Step::SplitAndMerge),
            prop::option::of(spec()).prop_map(Step::MatmulSquare),
            Just(Step::ReduceAndBroadcast),
            spec().prop_map(Step::Constrain),
        ]
    }

    fn build(first: Option<&str>, steps: &[Step]) -> Program {
        let b = Builder::new("random");
        let mut x = param(&b, "x", &[8, 16], first);
        for (i, s) in steps.iter().enumerate() {
            let shape = x.shape().to_vec();
            x = match s {
                Step::Unary => x.exp(),
                Step::AddParam(a) => &x + &param(&b, &format!("p{i}"), &shape, *a),
                Step::Transpose => x.transpose(&[1, 0]),
                Step::SplitAndMerge => x.reshape([2, shape[0] / 2, shape[1]]).reshape(shape),
                Step::MatmulSquare(a) => {
                    x.matmul(&param(&b, &format!("w{i}"), &[shape[1], shape[1]], *a))
                }
                Step::ReduceAndBroadcast => x.sum(&[1]).broadcast_in_dim(shape, &[0]),
                Step::Constrain(a) => x.shard(sh(a)),
            };
        }
        finish(b, &[&x])
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(64))]
        /// Propagation succeeds on any well-formed program and keeps its invariants
        /// (checked by `run`).
        #[test]
        fn propagation_keeps_its_invariants(
            first in prop::option::of(spec()),
            steps in prop::collection::vec(step(), 1..12),
        ) {
            run(&build(first, &steps));
        }
    }
}

// ---- control flow (regions) -------------------------------------------------------------

/// The sharding of region value `v` of the flow op defining `result`.
fn region_sharding(p: &Program, result: &Tensor, region: usize, v: usize) -> String {
    let Op::Flow { flow, .. } = &p.node(id(result)).op else {
        panic!("{} is not a flow op", id(result));
    };
    let r = flow.regions()[region];
    r.node(ValueId(v as u32))
        .sharding
        .as_ref()
        .map_or("<none>".into(), ToString::to_string)
}

/// GSPMD 3.5: a `while`'s carried value, the condition's and body's parameters, the
/// body's result and the loop's result share one sharding; a captured value keeps its
/// own inside the body; the loop's result passes its sharding on to its users. The
/// body refines the state: `s + tanh(s @ w)` with `w` split on its output features
/// splits the state's features too, so the state is (data, model) while the initial
/// value keeps its closed annotation (it is resharded on entry, a local slice).
#[test]
fn while_loop_state_shares_one_sharding() {
    let b = Builder::new("while");
    let x = param(&b, "x", &[8, 16], Some("(data, _)"));
    let w = param(&b, "w", &[16, 16], Some("(_, model)"));
    let r = b.while_loop(
        |s| s[0].sum(&[0, 1]).lt(&s[0].builder().scalar(100.0)),
        |s| vec![s[0].matmul(&w).tanh().add(&s[0])],
        std::slice::from_ref(&x),
    );
    let after = r[0].exp();
    let p = run(&finish(b, &[&after]));
    assert_eq!(of(&p, &x), "(data, _)");
    assert_eq!(of(&p, &r[0]), "(data, model)");
    assert_eq!(of(&p, &after), "(data, model)");
    // cond: %0 the carried value; body: %0 carried, %1 the captured weight, and the
    // body's output pinned to the carried sharding at the back edge.
    assert_eq!(region_sharding(&p, &r[0], 0, 0), "(data, model)");
    assert_eq!(region_sharding(&p, &r[0], 1, 0), "(data, model)");
    assert_eq!(region_sharding(&p, &r[0], 1, 1), "(_, model)");
    let Op::Flow { flow, .. } = &p.node(id(&r[0])).op else {
        unreachable!()
    };
    let body = flow.regions()[1];
    let out = body.node(body.outputs[0]);
    assert_eq!(out.sharding.as_ref().unwrap().to_string(), "(data, model)");
    // Inside the body the matmul's result follows its operands: (data, model).
    let dot = (body.nodes.iter())
        .find(|n| matches!(n.op, Op::DotGeneral(_)))
        .unwrap();
    assert_eq!(dot.sharding.as_ref().unwrap().to_string(), "(data, model)");
}

/// The fixed point across the region boundary: a sharding decided inside the body (a
/// constraint on the new state) becomes the loop state's, so the initial value, the
/// body's parameter and result, and the loop's result and users all take it; nothing
/// is left to reshard at the back edge. The user's annotations are unchanged.
#[test]
fn a_sharding_inside_the_body_flows_out_to_the_loop_state() {
    let b = Builder::new("while");
    let x = param(&b, "x", &[8, 16], None);
    let y = x.tanh();
    let r = b.fori_loop(3, std::slice::from_ref(&y), |_, c| {
        vec![c[0].exp().shard(sh("(data, model)"))]
    });
    let after = r[0].neg();
    let p = run(&finish(b, &[&after]));
    for t in [&x, &y, &r[0], &after] {
        assert_eq!(of(&p, t), "(data, model)", "{p}");
    }
    // The scan's carried values: the counter, then the state.
    assert_eq!(region_sharding(&p, &r[0], 0, 1), "(data, model)");
    assert!(p.node(id(&r[0])).annotation.is_none());
}

/// A scan's carried value shares its initial value's sharding, refined by the body
/// (`c + x` adds the slice's `data`); a stacked operand's slice takes its sharding
/// without the leading dim, and the stacked dim is not split (phase 1) even where an
/// annotation would suggest it; the stacked outputs and a `cond`'s results take what
/// the regions give them; a `cond`'s branches take the captured values' shardings and
/// `on_false` returns what `on_true` does.
#[test]
fn scan_slices_and_cond_branches_take_the_operands_shardings() {
    let b = Builder::new("scan");
    let xs = param(&b, "xs", &[3, 8, 16], Some("(_, data, model)"));
    let init = param(&b, "init", &[8, 16], Some("(_, model)"));
    let (carry, ys) = b.scan(&[xs], &[init], |c, x| {
        (vec![c[0].add(&x[0])], vec![x[0].tanh()])
    });
    let pred = b.parameter("p", vec![], DType::Bool);
    let r = b.cond(
        &pred,
        |_| vec![carry[0].exp()],
        |inner| vec![carry[0].mul(&inner.scalar(2.0))],
    );
    let p = run(&finish(b, &[&ys[0], &r[0]]));
    assert_eq!(of(&p, &carry[0]), "(data, model)");
    assert_eq!(region_sharding(&p, &carry[0], 0, 0), "(data, model)");
    assert_eq!(region_sharding(&p, &carry[0], 0, 1), "(data, model)");
    // The stacked output takes the body's `y` sharding, the stacked dim whole; the
    // cond's result takes its branches'.
    assert_eq!(of(&p, &ys[0]), "(_, data, model)");
    assert_eq!(of(&p, &r[0]), "(data, model)");
    // on_true's parameter is the captured carry; its output, exp of it, keeps it.
    assert_eq!(region_sharding(&p, &r[0], 0, 0), "(data, model)");
    let Op::Flow { flow, .. } = &p.node(id(&r[0])).op else {
        unreachable!()
    };
    let on_false = flow.regions()[1];
    let out = on_false.node(on_false.outputs[0]);
    assert_eq!(out.sharding.as_ref().unwrap().to_string(), "(data, model)");
}

/// `random_bits`: every counter dim is free (each device counts its own block), the
/// key and a stacked key's word dim are whole; an annotated draw leaves its key
/// replicated, and a draw used with a split value takes that value's sharding.
#[test]
fn random_bits_counters_may_be_split_and_keys_stay_whole() {
    let b = Builder::new("random");
    let key = b.parameter("key", [2], DType::I32);
    let x = param(&b, "x", &[8, 12], Some("(data, model)"));
    let keys = random::split_stacked(&key, 4);
    let y = random::dropout(&x, 0.5, &key);
    let p = finish(b, &[&y, &keys]);
    assert_eq!(
        rule(&p, &keys),
        "([k], [])->([i, j]) {i=4, j=2, k=2} need_replication={j, k}"
    );
    let p = run(&p);
    assert_eq!(of(&p, &key), "(_)");
    let bits = (p.values())
        .find(|&v| {
            let bits = random::RandomOutput::Bits;
            matches!(p.node(v).op, Op::RandomBits { output, .. } if output == bits)
        })
        .unwrap();
    assert_eq!(
        p.node(bits).sharding.as_ref().unwrap().to_string(),
        "(data, model)"
    );
}

/// A propagation barrier lets shardings cross it only in its allowed direction: `x`'s
/// `data` reaches the barrier's result only through `Forward`, the constraint's `model`
/// reaches `x` only through `Backward`; `None` keeps both sides apart.
#[test]
fn a_propagation_barrier_blocks_the_disallowed_direction() {
    use gspmd_core::ir::PropagationDirection as D;
    for (allowed, x_want, y_want) in [
        (D::Forward, "(data, _)", "(data, model)"),
        (D::Backward, "(data, model)", "(_, model)"),
        (D::None, "(data, _)", "(_, model)"),
    ] {
        let b = Builder::new("barrier");
        let x = param(&b, "x", &[8, 16], Some("(data, ?)"));
        let y = x.propagation_barrier(allowed);
        let z = y.tanh().shard(sh("(?, model)"));
        let p = run(&finish(b, &[&z]));
        assert_eq!(
            (of(&p, &x), of(&p, &y)),
            (x_want.into(), y_want.into()),
            "{allowed:?}"
        );
    }
}

/// Every op kind of a global program has its sharding rule printed or is propagated
/// through and checked by a test above (through [`rule`] or [`run`]).
#[test]
fn covers_every_op_kind() {
    let kinds = op_coverage::kinds_checked("covers_every_op_kind");
    let global = |k: OpKind| !k.is_spmd_only();
    op_coverage::assert_kinds("propagated", kinds.get("propagated"), global, global);
}
