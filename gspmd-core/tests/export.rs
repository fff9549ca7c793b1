//! The StableHLO export (`gspmd_core::export`) without XLA: every op kind exports (a
//! one-op program per [`OpKind`], chosen by an exhaustive match), the text of small
//! programs holds the expected ops, shardings and device lists (golden snippets), and
//! what `sdy` cannot say is a typed error. `tools/xla_check.py` runs the exported
//! models under XLA.

use gspmd_core::compile;
use gspmd_core::error::Error;
use gspmd_core::ir::random::RandomOutput;
use gspmd_core::ir::{
    AxisGroup, BinaryOp, Builder, CompareOp, ConvConfig, ConvDimensionNumbers, CumulativeKind,
    DType, DotDims, GatherDims, Literal, Location, Op, OpKind, Program, PropagationDirection,
    ReduceKind, ScatterDims, ScatterKind, TensorType, UnaryOp, WindowDim,
};
use gspmd_core::sharding::{DimSharding, Mesh, Sharding};

fn mesh() -> Mesh {
    Mesh::new([("data", 2), ("model", 4)]).unwrap()
}

fn t(shape: &[usize], dtype: DType) -> TensorType {
    TensorType::new(shape.to_vec(), dtype)
}

fn f(shape: &[usize]) -> TensorType {
    t(shape, DType::F32)
}

fn group(axes: &[&str], size: usize) -> AxisGroup {
    AxisGroup {
        axes: axes.iter().map(|a| a.to_string()).collect(),
        size,
    }
}

/// A program of parameters of `operands`' types and one op of them, returned.
fn one_op(op: Op, operands: &[TensorType]) -> Program {
    let mut p = Program::new("one_op");
    let location = Location::caller();
    for (index, ty) in operands.iter().enumerate() {
        let param = Op::Parameter {
            index,
            ty: ty.clone(),
        };
        let id = p.push_op(param, &[], location).unwrap();
        p.params.push(id);
    }
    let params = p.params.clone();
    let out =
        (p.push_op(op.clone(), &params, location)).unwrap_or_else(|e| panic!("{}: {e}", op.name()));
    p.outputs.push(out);
    p
}

/// A program holding an op of `kind`, and the StableHLO op it must export to.
fn program_of(kind: OpKind) -> (Program, &'static str) {
    use OpKind as K;
    let x = f(&[4, 8]);
    let b = t(&[4, 8], DType::Bool);
    let i = t(&[], DType::I32);
    let unary = |u: UnaryOp, name| {
        let ty = if u == UnaryOp::Not {
            b.clone()
        } else {
            x.clone()
        };
        (one_op(Op::Unary(u), &[ty]), name)
    };
    let binary = |o: BinaryOp, name| {
        let ty = if matches!(o, BinaryOp::And | BinaryOp::Or) {
            b.clone()
        } else {
            x.clone()
        };
        (one_op(Op::Binary(o), &[ty.clone(), ty]), name)
    };
    let compare = |c: CompareOp| {
        let p = one_op(Op::Compare(c), &[x.clone(), x.clone()]);
        (p, "stablehlo.compare")
    };
    let reduce = |kind: ReduceKind| {
        let p = one_op(
            Op::Reduce {
                kind,
                dims: vec![1],
            },
            std::slice::from_ref(&x),
        );
        (p, "stablehlo.reduce")
    };
    let window = |kind: ReduceKind| {
        let window = vec![WindowDim::new(1, 1, (0, 0)), WindowDim::new(3, 2, (1, 1))];
        let p = one_op(Op::ReduceWindow { kind, window }, std::slice::from_ref(&x));
        (p, "stablehlo.reduce_window")
    };
    let cumulative = |kind: CumulativeKind, reverse: bool| {
        let op = Op::Cumulative {
            kind,
            dim: 1,
            reverse,
        };
        (
            one_op(op, std::slice::from_ref(&x)),
            "stablehlo.reduce_window",
        )
    };
    let scatter = |kind: ScatterKind| {
        let op = Op::Scatter {
            dims: ScatterDims::along(0, 2),
            kind,
        };
        let operands = [x.clone(), t(&[3], DType::I32), f(&[3, 8])];
        (one_op(op, &operands), "stablehlo.scatter")
    };
    let model = group(&["model"], 4);
    match kind {
        K::Parameter => {
            let mut p = one_op(Op::Unary(UnaryOp::Neg), std::slice::from_ref(&x));
            p.outputs = vec![p.params[0]];
            (p, "func.return\"(%arg0)")
        }
        K::Constant => {
            let lit = Literal::full(&[4, 8], DType::F32, 1.5);
            (one_op(Op::Constant(lit), &[]), "stablehlo.constant")
        }
        K::Iota => {
            let op = Op::Iota {
                shape: vec![4, 8],
                dim: 1,
                dtype: DType::I32,
            };
            (one_op(op, &[]), "stablehlo.iota")
        }
        K::RandomBits => {
            let op = Op::RandomBits {
                shape: vec![4, 8],
                strides: vec![8, 1],
                output: RandomOutput::Bits,
            };
            let p = one_op(op, &[t(&[2], DType::I32), i.clone()]);
            (p, "stablehlo.shift_right_logical")
        }
        K::Neg => unary(UnaryOp::Neg, "stablehlo.negate"),
        K::Abs => unary(UnaryOp::Abs, "stablehlo.abs"),
        K::Exp => unary(UnaryOp::Exp, "stablehlo.exponential"),
        K::Log => unary(UnaryOp::Log, "stablehlo.log"),
        K::Sqrt => unary(UnaryOp::Sqrt, "stablehlo.sqrt"),
        K::Rsqrt => unary(UnaryOp::Rsqrt, "stablehlo.rsqrt"),
        K::Tanh => unary(UnaryOp::Tanh, "stablehlo.tanh"),
        K::Logistic => unary(UnaryOp::Logistic, "stablehlo.logistic"),
        K::Not => unary(UnaryOp::Not, "stablehlo.not"),
        K::Sin => unary(UnaryOp::Sin, "stablehlo.sine"),
        K::Cos => unary(UnaryOp::Cos, "stablehlo.cosine"),
        K::Erf => unary(UnaryOp::Erf, "chlo.erf"),
        K::Floor => unary(UnaryOp::Floor, "stablehlo.floor"),
        K::Ceil => unary(UnaryOp::Ceil, "stablehlo.ceil"),
        K::Round => unary(UnaryOp::Round, "stablehlo.round_nearest_even"),
        K::Sign => unary(UnaryOp::Sign, "stablehlo.sign"),
        K::IsFinite => unary(UnaryOp::IsFinite, "stablehlo.is_finite"),
        K::Add => binary(BinaryOp::Add, "stablehlo.add"),
        K::Sub => binary(BinaryOp::Sub, "stablehlo.subtract"),
        K::Mul => binary(BinaryOp::Mul, "stablehlo.multiply"),
        K::Div => binary(BinaryOp::Div, "stablehlo.divide"),
        K::Max => binary(BinaryOp::Max, "stablehlo.maximum"),
        K::Min => binary(BinaryOp::Min, "stablehlo.minimum"),
        K::Pow => binary(BinaryOp::Pow, "stablehlo.power"),
        K::And => binary(BinaryOp::And, "stablehlo.and"),
        K::Or => binary(BinaryOp::Or, "stablehlo.or"),
        K::Rem => binary(BinaryOp::Rem, "stablehlo.remainder"),
        K::Eq => compare(CompareOp::Eq),
        K::Ne => compare(CompareOp::Ne),
        K::Lt => compare(CompareOp::Lt),
        K::Le => compare(CompareOp::Le),
        K::Gt => compare(CompareOp::Gt),
        K::Ge => compare(CompareOp::Ge),
        K::Select => (
            one_op(Op::Select, &[b.clone(), x.clone(), x.clone()]),
            "stablehlo.select",
        ),
        K::Convert => (
            one_op(Op::Convert(DType::BF16), std::slice::from_ref(&x)),
            "stablehlo.convert",
        ),
        K::Broadcast => {
            let op = Op::Broadcast {
                shape: vec![2, 4, 8],
                dims: vec![1, 2],
            };
            (
                one_op(op, std::slice::from_ref(&x)),
                "stablehlo.broadcast_in_dim",
            )
        }
        K::Reshape => (
            one_op(Op::Reshape(vec![8, 4]), std::slice::from_ref(&x)),
            "stablehlo.reshape",
        ),
        K::Transpose => (
            one_op(Op::Transpose(vec![1, 0]), std::slice::from_ref(&x)),
            "stablehlo.transpose",
        ),
        K::ReduceSum => reduce(ReduceKind::Sum),
        K::ReduceMax => reduce(ReduceKind::Max),
        K::ReduceMin => reduce(ReduceKind::Min),
        K::DotGeneral => {
            let dims = DotDims {
                lhs_contracting: vec![1],
                rhs_contracting: vec![0],
                ..DotDims::default()
            };
            let p = one_op(Op::DotGeneral(dims), &[x.clone(), f(&[8, 2])]);
            (p, "stablehlo.dot_general")
        }
        K::Slice => {
            let op = Op::Slice {
                start: vec![0, 1],
                limit: vec![4, 8],
                stride: vec![2, 3],
            };
            (one_op(op, std::slice::from_ref(&x)), "stablehlo.slice")
        }
        K::Pad => {
            let op = Op::Pad {
                low: vec![1, 0],
                high: vec![0, -1],
                interior: vec![1, 0],
            };
            (one_op(op, &[x.clone(), f(&[])]), "stablehlo.pad")
        }
        K::Concatenate => (
            one_op(Op::Concatenate(0), &[x.clone(), x.clone()]),
            "stablehlo.concatenate",
        ),
        K::ReduceWindowSum => window(ReduceKind::Sum),
        K::ReduceWindowMax => window(ReduceKind::Max),
        K::ReduceWindowMin => window(ReduceKind::Min),
        K::Convolution => {
            let config = ConvConfig {
                dims: ConvDimensionNumbers::from_labels("NHWC", "HWIO", "NHWC").unwrap(),
                window: vec![WindowDim::new(3, 1, (1, 1)), WindowDim::new(3, 2, (1, 1))],
                feature_group_count: 1,
                batch_group_count: 1,
            };
            let operands = [f(&[1, 4, 4, 2]), f(&[3, 3, 2, 3])];
            (
                one_op(Op::Convolution(config), &operands),
                "[b, 0, 1, f]x[0, 1, i, o]->[b, 0, 1, f]",
            )
        }
        K::DynamicSlice => {
            let op = Op::DynamicSlice(vec![2, 4]);
            let p = one_op(op, &[x.clone(), i.clone(), i.clone()]);
            (p, "stablehlo.dynamic_slice")
        }
        K::DynamicUpdateSlice => {
            let operands = [x.clone(), f(&[2, 4]), i.clone(), i.clone()];
            let p = one_op(Op::DynamicUpdateSlice, &operands);
            (p, "stablehlo.dynamic_update_slice")
        }
        K::CumulativeSum => cumulative(CumulativeKind::Sum, false),
        K::CumulativeProd => cumulative(CumulativeKind::Prod, true),
        K::Argsort => {
            let op = Op::Argsort {
                dim: 1,
                descending: true,
            };
            (one_op(op, std::slice::from_ref(&x)), "is_stable = true")
        }
        K::Reverse => (
            one_op(Op::Reverse(vec![0]), std::slice::from_ref(&x)),
            "stablehlo.reverse",
        ),
        K::Gather => {
            let dims = GatherDims {
                offset_dims: vec![1],
                collapsed_slice_dims: vec![0],
                start_index_map: vec![0],
                index_vector_dim: 1,
                slice_sizes: vec![1, 8],
                ..GatherDims::default()
            };
            let p = one_op(Op::Gather(dims), &[x.clone(), t(&[3, 1], DType::I32)]);
            (p, "stablehlo.gather")
        }
        K::ScatterAdd => scatter(ScatterKind::Add),
        K::ScatterReplace => scatter(ScatterKind::Replace),
        K::AxisIndex => (
            one_op(Op::AxisIndex(model.clone()), &[]),
            "stablehlo.partition_id",
        ),
        K::AllReduce => {
            let op = Op::AllReduce {
                group: model.clone(),
                kind: ReduceKind::Sum,
            };
            (one_op(op, std::slice::from_ref(&x)), "stablehlo.all_reduce")
        }
        K::AllGather => {
            let op = Op::AllGather {
                group: model.clone(),
                dim: 1,
            };
            (one_op(op, std::slice::from_ref(&x)), "all_gather_dim = 1")
        }
        K::ReduceScatter => {
            let op = Op::ReduceScatter {
                group: model.clone(),
                kind: ReduceKind::Max,
                dim: 1,
            };
            (
                one_op(op, std::slice::from_ref(&x)),
                "stablehlo.reduce_scatter",
            )
        }
        K::AllToAll => {
            let op = Op::AllToAll {
                group: model.clone(),
                split_dim: 1,
                concat_dim: 0,
            };
            (one_op(op, std::slice::from_ref(&x)), "split_count = 4")
        }
        K::CollectivePermute => {
            let op = Op::CollectivePermute {
                group: group(&["data", "model"], 8),
                from: vec!["model".into(), "data".into()],
            };
            (
                one_op(op, std::slice::from_ref(&x)),
                "stablehlo.collective_permute",
            )
        }
        K::CollectiveShift => {
            let op = Op::CollectiveShift {
                group: model,
                offset: 1,
                wrap: false,
                mirror: false,
            };
            (
                one_op(op, std::slice::from_ref(&x)),
                "stablehlo.collective_permute",
            )
        }
        K::ShardingConstraint => {
            let mut p = one_op(Op::ShardingConstraint, std::slice::from_ref(&x));
            let out = p.outputs[0];
            p.node_mut(out).annotation = Some("(data, ?)".parse().unwrap());
            (p, "sdy.sharding_constraint")
        }
        K::PropagationBarrier => (
            one_op(
                Op::PropagationBarrier(PropagationDirection::Forward),
                std::slice::from_ref(&x),
            ),
            "sdy.propagation_barrier",
        ),
        K::While => {
            let b = Builder::new("while");
            let n = b.parameter("n", vec![], DType::F32);
            let limit = n.scalar_like(10.0);
            let out = b.while_loop(|s| s[0].lt(&limit), |s| vec![s[0].add(&s[0])], &[n]);
            (b.finish(&[&out[0]]).unwrap(), "stablehlo.while")
        }
        K::Scan => {
            let b = Builder::new("scan");
            let xs = b.parameter("xs", vec![3, 4], DType::F32);
            let init = b.parameter("init", vec![4], DType::F32);
            let (c, ys) = b.scan(&[xs], &[init], |c, x| {
                let next = c[0].mul(&x[0]);
                (vec![next.clone()], vec![next.exp()])
            });
            (b.finish(&[&c[0], &ys[0]]).unwrap(), "stablehlo.while")
        }
        K::Cond => {
            let b = Builder::new("cond");
            let p = b.parameter("p", vec![], DType::Bool);
            let y = b.parameter("y", vec![4], DType::F32);
            let out = b.cond(&p, |_| vec![y.exp()], |_| vec![y.neg()]);
            (b.finish(&[&out[0]]).unwrap(), "stablehlo.if")
        }
        K::ShardMap => {
            let b = Builder::new("shard_map");
            let y = b.parameter("y", vec![8, 4], DType::F32);
            let spec: Sharding = "(data, _)".parse().unwrap();
            let out = b.shard_map(
                &mesh(),
                &["data"],
                std::slice::from_ref(&y),
                std::slice::from_ref(&spec),
                std::slice::from_ref(&spec),
                |_, blocks| vec![blocks[0].exp()],
            );
            (b.finish(&[&out[0]]).unwrap(), "sdy.manual_computation")
        }
        // `OpKind` is `#[non_exhaustive]` outside its crate; the writer's own match
        // (`export/stablehlo.rs`) is exhaustive, so a new kind fails to compile there.
        other => panic!("no one-op program for {other:?}: add one here"),
    }
}

/// Every op kind exports in the global form, to the StableHLO op it stands for.
#[test]
fn every_op_kind_exports() {
    let mesh = mesh();
    for &kind in OpKind::ALL {
        let (program, expected) = program_of(kind);
        let text = program
            .to_stablehlo(&mesh)
            .unwrap_or_else(|e| panic!("{kind:?}: {e}"));
        assert!(
            text.contains(expected),
            "{kind:?}: no `{expected}` in\n{text}"
        );
        assert!(
            text.starts_with("module @") && text.contains("func.func public @main("),
            "{kind:?}: {text}"
        );
    }
}

/// The collectives' device lists come from the mesh: groups over `model` of a 2x4
/// mesh, the transposing permute, the shift without wrap, the axis-index table.
#[test]
fn collectives_carry_device_lists_from_the_mesh() {
    let mesh = mesh();
    let text = |kind| program_of(kind).0.to_stablehlo(&mesh).unwrap();
    let groups = "replica_groups = dense<[[0, 1, 2, 3], [4, 5, 6, 7]]> : tensor<2x4xi64>";
    let all_reduce = text(OpKind::AllReduce);
    assert!(all_reduce.contains(groups), "{all_reduce}");
    assert!(all_reduce.contains(
        "channel_handle = #stablehlo.channel_handle<handle = 1, type = 1>, use_global_device_ids"
    ));
    // Receiver c takes the operand of the device whose (model, data) index is c's
    // (data, model) index: device 1 = (0, 1) receives from (model 0, data 1) = 4.
    let permute = text(OpKind::CollectivePermute);
    assert!(
        permute.contains(
            "source_target_pairs = dense<[[0, 0], [1, 2], [2, 4], [3, 6], [4, 1], [5, 3], \
             [6, 5], [7, 7]]> : tensor<8x2xi64>"
        ),
        "{permute}"
    );
    let shift = text(OpKind::CollectiveShift);
    assert!(
        shift.contains(
            "source_target_pairs = dense<[[0, 1], [1, 2], [2, 3], [4, 5], [5, 6], [6, 7]]> : \
             tensor<6x2xi64>"
        ),
        "{shift}"
    );
    let index = text(OpKind::AxisIndex);
    assert!(
        index.contains("dense<[0, 1, 2, 3, 0, 1, 2, 3]> : tensor<8xi32>"),
        "{index}"
    );
}

/// The mesh and shardings as Shardy writes them: named axes, a device order, open
/// dims, priorities, sub-axes.
#[test]
fn shardings_are_written_as_sdy_attributes() {
    let mesh =
        Mesh::with_device_order([("data", 2), ("model", 4)], vec![1, 0, 2, 3, 4, 5, 6, 7]).unwrap();
    let b = Builder::new("annotated");
    let x = b
        .parameter("x", vec![8, 16], DType::F32)
        .annotate(Sharding::new([
            DimSharding::open(["data"]).with_priority(1),
            DimSharding::closed(["model:(1)2"]),
        ]));
    let y = x.exp().annotate("(_, model)".parse().unwrap());
    let text = b.finish(&[&y]).unwrap().to_stablehlo(&mesh).unwrap();
    assert!(
        text.contains(
            "sdy.mesh @mesh = <[\"data\"=2, \"model\"=4], device_ids=[1, 0, 2, 3, 4, 5, 6, 7]>"
        ),
        "{text}"
    );
    assert!(
        text.contains(
            "%arg0: tensor<8x16xf32> {sdy.sharding = #sdy.sharding<@mesh, [{\"data\", ?}p1, \
             {\"model\":(1)2}]>}"
        ),
        "{text}"
    );
    assert!(
        text.contains("{sharding = #sdy.sharding<@mesh, [{}, {\"model\"}]>}"),
        "{text}"
    );
    assert!(text.contains("mhlo.num_partitions = 8 : i32"), "{text}");
}

/// The per-device form of a compiled MLP: gspmd's program inside one manual
/// computation over every axis, its all-reduce over `model` spelled out.
#[test]
fn per_device_form_wraps_the_partitioned_program() {
    let mesh = mesh();
    let b = Builder::new("mlp");
    let x = b
        .parameter("x", vec![8, 16], DType::F32)
        .annotate("(data, _)".parse().unwrap());
    let w1 = b
        .parameter("w1", vec![16, 32], DType::F32)
        .annotate("(_, model)".parse().unwrap());
    let w2 = b
        .parameter("w2", vec![32, 16], DType::F32)
        .annotate("(model, _)".parse().unwrap());
    let y = x.matmul(&w1).tanh().matmul(&w2);
    let exe = compile(&b.finish(&[&y]).unwrap(), &mesh).unwrap();
    let text = exe.to_stablehlo().unwrap();
    for snippet in [
        "sdy.manual_computation(%arg0, %arg1, %arg2) in_shardings=[<@mesh, [{\"data\"}, {}]>, \
         <@mesh, [{}, {\"model\"}]>, <@mesh, [{\"model\"}, {}]>] out_shardings=[<@mesh, \
         [{\"data\"}, {}]>] manual_axes={\"data\", \"model\"}",
        ": tensor<4x16xf32>, ",
        "\"stablehlo.all_reduce\"",
        "replica_groups = dense<[[0, 1, 2, 3], [4, 5, 6, 7]]> : tensor<2x4xi64>",
        "\"sdy.return\"",
    ] {
        assert!(text.contains(snippet), "no `{snippet}` in\n{text}");
    }
    let global = exe.to_stablehlo_global().unwrap();
    assert!(!global.contains("all_reduce"), "{global}");
    assert!(global.contains("sdy.sharding_constraint"), "{global}");
}

/// What `sdy` cannot say is an `Error::Export` naming the value: a dim in reversed
/// device order, a per-device block padded at the boundary.
#[test]
fn inexpressible_shardings_are_typed_errors() {
    let mesh = mesh();
    let b = Builder::new("reversed");
    let x = b
        .parameter("x", vec![8, 4], DType::F32)
        .annotate(Sharding::new([
            DimSharding::closed(["data"]).with_reversed_order(),
            DimSharding::closed(Vec::<String>::new()),
        ]));
    let program = b.finish(&[&x.exp()]).unwrap();
    match program.to_stablehlo(&mesh) {
        Err(Error::Export { message, .. }) => {
            assert!(message.contains("reversed device order"), "{message}")
        }
        other => panic!("expected an export error, got {other:?}"),
    }

    let b = Builder::new("padded");
    let x = b
        .parameter("x", vec![6, 4], DType::F32)
        .annotate("(model, _)".parse().unwrap());
    let exe = compile(&b.finish(&[&x.exp()]).unwrap(), &mesh).unwrap();
    match exe.to_stablehlo() {
        Err(Error::Export { message, .. }) => {
            assert!(message.contains("padded"), "{message}")
        }
        other => panic!("expected an export error, got {other:?}"),
    }
}
