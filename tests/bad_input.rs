//! Bad input, as a new user or an attacker would give it, at every stage: meshes,
//! shardings, tracing, the DSL's trace-time checks, compiling, gradients, training,
//! checkpoints, running, and misuse of the thread mesh. Each case asserts the exact
//! [`Error`] variant; none may panic, abort or hang. Cases that would abort the whole
//! process if the library regressed (allocations that cannot succeed) run in a child
//! process, so a regression fails one test instead of killing the suite.
//!
//! The DSL's compile-time misuses are trybuild cases in `tests/ui/fail`.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::Arc;

use gspmd::autodiff::grad;
use gspmd::error::{
    AssembleProblem, CheckpointProblem, CollectiveProblem, DeviceOrderProblem, GroupProblem,
    InputProblem, MeshProblem, OptimizerProblem, ParseProblem, RequestProblem, SubAxisProblem,
    ThreadMeshProblem,
};
use gspmd::ir::{
    AxisGroup, Builder, CollectiveKind, DType, Literal, Op, Program, ReduceKind, verify,
};
use gspmd::prelude::*;
use gspmd::runtime::{Input, Output, assemble};
use gspmd::train::{
    InputRole, Optimizer, TrainStep, Trainer, load_checkpoint, save_checkpoint, step_program,
};

/// The error of `r`, or a failed test naming what succeeded.
#[track_caller]
fn err<T>(r: Result<T>) -> Error {
    match r {
        Ok(_) => panic!("expected an error, got Ok"),
        Err(e) => e,
    }
}

/// Asserts `$e` is `Err` of the variant matched by `$pat`.
macro_rules! assert_err {
    ($e:expr, $pat:pat $(if $guard:expr)?) => {{
        let e = err($e);
        assert!(matches!(&e, $pat $(if $guard)?), "wrong variant: {e:?}");
        assert!(!e.to_string().is_empty());
        e
    }};
}

/// Runs `body` in a child process (this test binary, running only test `name`), so that
/// an abort (e.g. a failed allocation) fails this test rather than the whole suite.
fn isolated(name: &str, body: impl FnOnce()) {
    const CHILD: &str = "GSPMD_BAD_INPUT_CHILD";
    if std::env::var_os(CHILD).is_some() {
        body();
        return;
    }
    let out = Command::new(std::env::current_exe().unwrap())
        .args([name, "--exact", "--test-threads=1", "--nocapture"])
        .env(CHILD, "1")
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success() && stdout.contains("1 passed"),
        "child running `{name}` ended with {}:\n{stdout}\n{}",
        out.status,
        String::from_utf8_lossy(&out.stderr)
    );
}

fn f32s(shape: &[usize], fill: f32) -> Literal {
    Literal::full(shape, DType::F32, f64::from(fill))
}

fn sharding(text: &str) -> Sharding {
    text.parse().unwrap()
}

fn mesh_2x2() -> Mesh {
    Mesh::new([("data", 2), ("model", 2)]).unwrap()
}

/// `y = x @ w` with `x` annotated `annotation`.
fn matmul_program(annotation: &str) -> Program {
    let b = Builder::new("matmul");
    let x = b.parameter("x", [4, 8], DType::F32);
    let w = b.parameter("w", [8, 2], DType::F32);
    let y = x.shard(sharding(annotation)).matmul(&w);
    b.finish(&[&y]).unwrap()
}

/// `loss = mean((x @ w)^2)`: a model with one trainable weight.
fn regression() -> Program {
    let b = Builder::new("regression");
    let x = b.parameter("x", [4, 8], DType::F32);
    let w = b.parameter("w", [8, 2], DType::F32);
    let y = x.matmul(&w);
    let loss = (&y * &y).mean(&[0, 1]);
    b.finish(&[&loss]).unwrap()
}

fn scratch(name: &str) -> PathBuf {
    std::env::temp_dir().join(format!("gspmd-bad-input-{}-{name}", std::process::id()))
}

// ---- meshes and shardings --------------------------------------------------------------

#[test]
fn mesh_axis_of_size_zero() {
    let e = assert_err!(
        Mesh::new([("data", 0)]),
        Error::InvalidMesh {
            problem: MeshProblem::ZeroSize { .. }
        }
    );
    assert_eq!(e.to_string(), "invalid mesh: axis `data` has size 0");
}

#[test]
fn mesh_axis_named_twice() {
    assert_err!(
        Mesh::new([("x", 2), ("x", 2)]),
        Error::InvalidMesh {
            problem: MeshProblem::RepeatedAxis { axis }
        } if axis == "x"
    );
}

#[test]
fn mesh_axis_with_empty_name() {
    assert_err!(
        Mesh::new([("", 2)]),
        Error::InvalidMesh {
            problem: MeshProblem::NotAnIdentifier { axis }
        } if axis.is_empty()
    );
}

#[test]
fn mesh_device_count_overflows() {
    assert_err!(
        Mesh::new([("a", usize::MAX), ("b", 2)]),
        Error::InvalidMesh {
            problem: MeshProblem::TooManyDevices
        }
    );
}

#[test]
fn mesh_device_order_is_not_a_permutation() {
    assert_err!(
        Mesh::with_device_order([("data", 2)], vec![0, 0]),
        Error::DeviceOrder {
            num_devices: 2,
            problem: DeviceOrderProblem::Repeated { id: 0 }
        }
    );
    assert_err!(
        Mesh::with_device_order([("data", 2)], vec![0, 2]),
        Error::DeviceOrder {
            num_devices: 2,
            problem: DeviceOrderProblem::OutOfRange { id: 2 }
        }
    );
    assert_err!(
        Mesh::with_device_order([("data", 2)], vec![0]),
        Error::DeviceOrder {
            num_devices: 2,
            problem: DeviceOrderProblem::Count { given: 1 }
        }
    );
}

#[test]
fn sharding_text_does_not_parse() {
    for (text, at) in [
        ("(data", 5),
        ("(data,, model)", 6),
        ("(data) unreduced=", 17),
        ("((a, b)", 7),
    ] {
        assert_err!(
            text.parse::<Sharding>(),
            Error::ParseSharding { offset, problem: ParseProblem::Expected { .. }, .. } if *offset == at
        );
    }
    assert_err!(
        "(-_)".parse::<Sharding>(),
        Error::ParseSharding {
            offset: 1,
            problem: ParseProblem::ReversedUnsplit,
            ..
        }
    );
    assert_err!(
        "(data) replicated={x} replicated={y}".parse::<Sharding>(),
        Error::ParseSharding { problem: ParseProblem::GivenTwice { clause }, .. } if clause == "replicated"
    );
}

#[test]
fn annotation_names_an_unknown_axis() {
    let e = assert_err!(
        compile(&matmul_program("(rows, _)"), &mesh_2x2()),
        Error::UnknownAxis { .. }
    );
    assert!(e.to_string().contains("(rows, _)"), "{e}");
}

#[test]
fn annotation_uses_an_axis_twice() {
    assert_err!(
        compile(&matmul_program("(data, data)"), &mesh_2x2()),
        Error::DuplicateAxis { .. }
    );
}

#[test]
fn annotation_names_an_invalid_sub_axis() {
    // model=2: a sub-axis of 4 does not divide it; size 1 is not a sub-axis.
    let not_dividing = SubAxisProblem::NotDividing {
        pre: 1,
        size: 4,
        axis_size: 2,
    };
    for (text, why) in [
        ("(model:(1)4, _)", not_dividing),
        ("(model:(1)1, _)", SubAxisProblem::SizeBelowTwo { size: 1 }),
        ("(_, _) unreduced={model:(1)2}", SubAxisProblem::Unreduced),
    ] {
        let e = assert_err!(
            compile(&matmul_program(text), &mesh_2x2()),
            Error::InvalidSubAxis { problem, .. } if *problem == why
        );
        assert!(e.to_string().contains("tests/bad_input.rs:"), "{e}");
    }
}

#[test]
fn annotation_uses_overlapping_parts_of_an_axis() {
    let on_4 = Mesh::new([("data", 2), ("model", 4)]).unwrap();
    for text in ["(model, model:(2)2)", "((model:(1)4, model:(2)2), _)"] {
        assert_err!(
            compile(&matmul_program(text), &on_4),
            Error::OverlappingAxes { .. }
        );
    }
}

#[test]
fn annotation_has_the_wrong_rank() {
    let b = Builder::new("rank");
    let x = b.parameter("x", [4, 8], DType::F32);
    let y = x.shard(sharding("(data, _, _)"));
    assert_err!(
        b.finish(&[&y]),
        Error::ShardingRank { .. } | Error::Shape { .. }
    );
}

#[test]
fn shards_do_not_assemble() {
    let shards = vec![f32s(&[2, 8], 0.0); 3];
    assert_err!(
        assemble(&shards, &sharding("(data, _)"), &mesh_2x2(), &[4, 8]),
        Error::Assemble {
            problem: AssembleProblem::ShardCount {
                given: 3,
                devices: 4
            },
            ..
        }
    );
    let mut shards = vec![f32s(&[2, 8], 0.0); 4];
    shards[3] = f32s(&[2, 7], 0.0);
    assert_err!(
        assemble(&shards, &sharding("(data, _)"), &mesh_2x2(), &[4, 8]),
        Error::Assemble {
            problem: AssembleProblem::Shard { device: 3, given, expected },
            ..
        } if given.shape[..] == [2, 7] && expected.shape[..] == [2, 8]
    );
}

// ---- tracing ---------------------------------------------------------------------------

/// Traces `f` on a fresh builder with an f32[4, 8] parameter `x` and returns the error.
fn trace_error(f: impl FnOnce(&Builder, &Tensor) -> Tensor) -> Error {
    let b = Builder::new("bad");
    let x = b.parameter("x", [4, 8], DType::F32);
    let y = f(&b, &x);
    err(b.finish(&[&y]))
}

/// Asserts a trace error is one `Error::Shape` for `op` located in this file.
#[track_caller]
fn assert_shape_error(e: Error, op: &str) {
    match &e {
        Error::Shape {
            op: got, location, ..
        } => {
            assert_eq!(*got, op, "{e}");
            assert!(location.file.ends_with("bad_input.rs"), "{e}");
        }
        other => panic!("expected one Error::Shape for {op}, got {other:?}"),
    }
}

#[test]
fn matmul_of_mismatched_inner_dims() {
    let e = trace_error(|b, x| x.matmul(&b.parameter("w", [7, 2], DType::F32)));
    assert_shape_error(e, "matmul");
}

#[test]
fn add_of_different_dtypes() {
    let e = trace_error(|b, x| x + &b.parameter("i", [4, 8], DType::I32));
    assert_shape_error(e, "add");
}

#[test]
fn reshape_to_another_element_count() {
    assert_shape_error(trace_error(|_, x| x.reshape([5, 7])), "reshape");
}

#[test]
fn transpose_by_a_non_permutation() {
    assert_shape_error(trace_error(|_, x| x.transpose(&[0, 0])), "transpose");
}

#[test]
fn reduce_over_a_missing_dim() {
    assert_shape_error(trace_error(|_, x| x.sum(&[2])), "reduce");
}

#[test]
fn slice_beyond_the_end() {
    assert_shape_error(
        trace_error(|_, x| x.slice(&[0, 0], &[5, 8], &[1, 1])),
        "slice",
    );
}

#[test]
fn slice_with_zero_stride() {
    assert_shape_error(
        trace_error(|_, x| x.slice(&[0, 0], &[4, 8], &[0, 1])),
        "slice",
    );
}

#[test]
fn concatenate_of_mismatched_dims() {
    let e = trace_error(|b, x| {
        let y = b.parameter("y", [4, 3], DType::F32);
        b.concatenate(&[x, &y], 0)
    });
    assert_shape_error(e, "concatenate");
}

#[test]
fn broadcast_to_an_incompatible_shape() {
    assert_shape_error(
        trace_error(|_, x| x.broadcast_in_dim([4, 9], &[0, 1])),
        "broadcast",
    );
}

#[test]
fn einsum_with_a_letter_of_two_sizes() {
    let e = trace_error(|b, x| {
        let w = b.parameter("w", [4, 2], DType::F32);
        einsum("ij,jk->ik", x, &w)
    });
    assert!(matches!(e, Error::Shape { .. }), "{e:?}");
}

#[test]
fn select_with_a_non_bool_predicate() {
    assert_shape_error(trace_error(|_, x| x.select(x, x)), "select");
}

#[test]
fn verifier_reports_a_forward_reference() {
    let mut p = regression();
    let last = p.nodes.len() - 1;
    p.nodes[0].operands = vec![gspmd::ir::ValueId(last as u32)];
    assert_err!(verify(&p), Error::Verify { .. } | Error::Many(_));
}

// ---- the DSL's trace-time checks -------------------------------------------------------

#[gspmd::model(mesh = (data, model))]
fn two_layer(
    #[shard(data, _)] x: Tensor<B, D>,
    #[shard(_, model)] w1: Tensor<D, F>,
    w2: Tensor<F, D>,
) -> Tensor<B, D> {
    x.matmul(&w1).relu().matmul(&w2)
}

#[test]
fn dsl_given_too_few_shapes() {
    assert_err!(
        two_layer::trace_shapes(&[&[8, 16], &[16, 32]]),
        Error::ArgumentCount { .. }
    );
}

#[test]
fn dsl_given_a_shape_of_the_wrong_rank() {
    assert_err!(
        two_layer::trace_shapes(&[&[8, 16, 1], &[16, 32], &[32, 16]]),
        Error::ArgumentShape { .. }
    );
}

#[test]
fn dsl_symbol_bound_to_two_sizes() {
    assert_err!(
        two_layer::trace_shapes(&[&[8, 16], &[17, 32], &[32, 16]]),
        Error::SymbolConflict { .. }
    );
}

#[test]
fn dsl_mesh_with_an_empty_axis() {
    assert_err!(
        two_layer::mesh([2, 0]),
        Error::InvalidMesh {
            problem: MeshProblem::ZeroSize { .. }
        }
    );
}

// ---- compiling -------------------------------------------------------------------------

#[test]
fn partitioning_an_unpropagated_program() {
    let p = regression();
    assert_err!(
        gspmd::partition::partition(&p, &mesh_2x2()),
        Error::Partition { .. }
    );
}

// ---- gradients and training ------------------------------------------------------------

#[test]
fn grad_of_a_missing_output() {
    assert_err!(
        grad(&regression(), 3, &[1]),
        Error::GradRequest {
            problem: RequestProblem::NoSuchOutput {
                index: 3,
                outputs: 1
            },
            ..
        }
    );
}

#[test]
fn grad_of_a_non_scalar_loss() {
    assert_err!(
        grad(&matmul_program("(_, _)"), 0, &[1]),
        Error::GradRequest {
            problem: RequestProblem::LossNotScalar { index: 0, ty, .. },
            ..
        } if ty.rank() == 2
    );
}

#[test]
fn grad_with_respect_to_a_missing_parameter() {
    assert_err!(
        grad(&regression(), 0, &[9]),
        Error::GradRequest {
            problem: RequestProblem::NoSuchParameter { index: 9, .. },
            ..
        }
    );
}

#[test]
fn grad_through_an_spmd_op() {
    let mut p = regression();
    let x = p.params[0];
    let location = p.node(x).location;
    let group = AxisGroup {
        axes: vec!["data".into()],
        size: 2,
    };
    let op = Op::AllReduce {
        group,
        kind: ReduceKind::Sum,
    };
    let reduced = p.push_op(op, &[x], location).unwrap();
    let square = p
        .push_op(
            Op::Reduce {
                kind: ReduceKind::Sum,
                dims: vec![0, 1],
            },
            &[reduced],
            location,
        )
        .unwrap();
    p.outputs = vec![square];
    assert_err!(grad(&p, 0, &[0]), Error::NotDifferentiable { .. });
}

#[test]
fn optimizer_with_a_negative_learning_rate() {
    let sgd = Optimizer::sgd(-0.1, 0.0);
    assert_err!(
        step_program(&regression(), 0, &[1], &sgd),
        Error::Optimizer {
            problem: OptimizerProblem::HyperParameter { value, .. },
            ..
        } if *value == -0.1
    );
}

#[test]
fn optimizer_with_a_nan_hyper_parameter() {
    let sgd = Optimizer::sgd(0.1, f32::NAN);
    assert_err!(
        step_program(&regression(), 0, &[1], &sgd),
        Error::Optimizer {
            problem: OptimizerProblem::HyperParameter { value, .. },
            ..
        } if value.is_nan()
    );
}

/// A training step's inputs have a typed description (order, name, type, role) and are
/// fed by name: leaving out one the step adds (the learning rate) is a typed error
/// naming it, not a made-up value; so is a misspelt name, a wrong type, or feeding the
/// program positionally one input short.
#[test]
fn train_step_fed_without_its_learning_rate() {
    let step = step_program(&regression(), 0, &[1], &Optimizer::adamw(0.1)).unwrap();
    let inputs = step.inputs();
    assert_eq!(inputs.len(), step.program.params.len());
    let described: Vec<(&str, InputRole)> =
        (inputs.iter()).map(|i| (i.name.as_str(), i.role)).collect();
    assert_eq!(
        described[..2],
        [
            ("x", InputRole::Data),
            ("w", InputRole::Trained { param: 0 })
        ]
    );
    assert!(described.contains(&("m(w)", InputRole::State { param: 0, slot: 0 })));
    let lr = (inputs.iter()).find(|i| i.name == "learning_rate").unwrap();
    assert_eq!((lr.role, lr.ty.shape.len()), (InputRole::Scalar, 0));
    // Every input but the learning rate, by name.
    let given = || {
        (inputs.iter())
            .filter(|i| i.name != "learning_rate")
            .map(|i| (i.name.as_str(), Literal::full(&i.ty.shape, i.ty.dtype, 0.5)))
            .collect::<Vec<_>>()
    };
    let e = assert_err!(
        step.feed(given()),
        Error::Input {
            problem: InputProblem::Missing,
            ..
        }
    );
    let Error::Input { index, name, .. } = &e else {
        unreachable!()
    };
    assert_eq!((*index, name.as_str()), (lr.index, "learning_rate"), "{e}");
    let mut all = given();
    all.push(("learning_rate", Literal::scalar_f32(0.1)));
    let fed = step.feed(all.clone()).unwrap();
    assert_eq!(fed.len(), inputs.len());
    assert_eq!(
        interpret(&step.program, &fed).unwrap().len(),
        step.program.outputs.len()
    );
    // Positionally, one input short: a count error at the run, not a fallback.
    assert_err!(
        interpret(&step.program, &fed[..fed.len() - 1]),
        Error::Input {
            problem: InputProblem::Count { .. },
            ..
        }
    );
    let mut misspelt = given();
    misspelt.push(("learning_rat", Literal::scalar_f32(0.1)));
    assert_err!(
        step.feed(misspelt),
        Error::Input {
            problem: InputProblem::Unknown { available },
            ..
        } if available.iter().any(|n| n == "learning_rate")
    );
    let mut twice = all.clone();
    twice.push(("learning_rate", Literal::scalar_f32(0.2)));
    assert_err!(
        step.feed(twice),
        Error::Input {
            problem: InputProblem::Repeated,
            ..
        }
    );
    let mut wrong = given();
    wrong.push(("learning_rate", f32s(&[1], 0.1)));
    assert_err!(
        step.feed(wrong),
        Error::Input {
            problem: InputProblem::Type { .. },
            ..
        }
    );
}

/// Collective kinds are a type: a misspelt kind parsed from text is an error naming it,
/// never a count of 0.
#[test]
fn collective_kind_misspelt() {
    assert_eq!(
        "all_gather".parse::<CollectiveKind>().unwrap(),
        CollectiveKind::AllGather
    );
    for kind in CollectiveKind::ALL {
        assert_eq!(kind.to_string().parse::<CollectiveKind>().unwrap(), kind);
    }
    assert_err!(
        "all_gahter".parse::<CollectiveKind>(),
        Error::UnknownCollective { name } if name == "all_gahter"
    );
}

#[test]
fn train_step_of_nothing() {
    let sgd = Optimizer::sgd(0.1, 0.0);
    assert_err!(
        step_program(&regression(), 0, &[] as &[usize], &sgd),
        Error::TrainRequest {
            problem: RequestProblem::NothingTrained,
            ..
        }
    );
    assert_err!(
        step_program(&regression(), 0, &[1, 1], &sgd),
        Error::TrainRequest {
            problem: RequestProblem::RepeatedParameter { index: 1, at: 1 },
            ..
        }
    );
    assert_err!(
        step_program(&regression(), 0, &["v*"], &sgd),
        Error::TrainRequest {
            problem: RequestProblem::UnmatchedPattern { pattern, .. },
            ..
        } if pattern == "v*"
    );
}

#[test]
fn trainer_given_a_wrong_initial_value() {
    let sgd = Optimizer::sgd(0.1, 0.0);
    let step = step_program(&regression(), 0, &[1], &sgd).unwrap();
    assert_err!(
        Trainer::reference(step.clone(), vec![f32s(&[2, 8], 0.0)]),
        Error::TrainerInput { .. }
    );
    assert_err!(Trainer::reference(step, vec![]), Error::TrainerInput { .. });
}

#[test]
fn trainer_restored_from_tensors_of_another_model() {
    let sgd = Optimizer::sgd(0.1, 0.0);
    let step = step_program(&regression(), 0, &[1], &sgd).unwrap();
    let mut trainer = Trainer::reference(step, vec![f32s(&[8, 2], 0.5)]).unwrap();
    let foreign = vec![("v".to_string(), f32s(&[8, 2], 0.0))];
    assert_err!(trainer.restore(&foreign), Error::TrainerInput { .. });
}

// ---- checkpoints -----------------------------------------------------------------------

#[test]
fn checkpoint_that_does_not_exist() {
    assert_err!(
        load_checkpoint(scratch("missing.safetensors")),
        Error::Checkpoint {
            problem: CheckpointProblem::Io { .. },
            ..
        }
    );
}

#[test]
fn checkpoint_that_is_not_safetensors() {
    let path = scratch("garbage.safetensors");
    std::fs::write(&path, b"\xff\xff\xff\xff\xff\xff\xff\x7fnot a header").unwrap();
    assert_err!(
        load_checkpoint(&path),
        Error::Checkpoint {
            problem: CheckpointProblem::Format { .. },
            ..
        }
    );
    std::fs::remove_file(path).unwrap();
}

#[test]
fn checkpoint_saved_with_a_name_twice() {
    let tensors = vec![
        ("w".to_string(), f32s(&[2], 1.0)),
        ("w".to_string(), f32s(&[2], 2.0)),
    ];
    assert_err!(
        save_checkpoint(scratch("twice.safetensors"), &tensors),
        Error::Checkpoint {
            tensor: Some(name),
            problem: CheckpointProblem::RepeatedName,
            ..
        } if name == "w"
    );
}

/// Writes a safetensors file of f32 tensors `names` with `order` as its metadata.
fn write_with_metadata(path: &std::path::Path, names: &[&str], order: &[(&str, &str)]) {
    let data = [0u8; 8];
    let views: Vec<(&str, safetensors::tensor::TensorView<'_>)> = names
        .iter()
        .map(|n| {
            let view =
                safetensors::tensor::TensorView::new(safetensors::Dtype::F32, vec![2], &data)
                    .unwrap();
            (*n, view)
        })
        .collect();
    let metadata = order
        .iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect();
    safetensors::serialize_to_file(views, Some(metadata), path).unwrap();
}

#[test]
fn checkpoint_order_metadata_names_a_tensor_twice() {
    let path = scratch("order-twice.safetensors");
    write_with_metadata(
        &path,
        &["a", "b"],
        &[("gspmd.order.0", "a"), ("gspmd.order.1", "a")],
    );
    let e = assert_err!(load_checkpoint(&path), Error::Checkpoint { .. });
    assert!(e.to_string().contains("second time"), "{e}");
    std::fs::remove_file(path).unwrap();
}

#[test]
fn checkpoint_order_metadata_names_a_missing_tensor() {
    let path = scratch("order-missing.safetensors");
    write_with_metadata(
        &path,
        &["a", "b"],
        &[("gspmd.order.0", "a"), ("gspmd.order.1", "c")],
    );
    assert_err!(load_checkpoint(&path), Error::Checkpoint { .. });
    std::fs::remove_file(path).unwrap();
}

#[test]
fn checkpoint_order_metadata_is_incomplete() {
    let path = scratch("order-gap.safetensors");
    write_with_metadata(&path, &["a", "b"], &[("gspmd.order.1", "a")]);
    assert_err!(load_checkpoint(&path), Error::Checkpoint { .. });
    std::fs::remove_file(path).unwrap();
}

#[test]
fn checkpoint_of_an_unsupported_dtype() {
    let path = scratch("f64.safetensors");
    let data = [0u8; 16];
    let view =
        safetensors::tensor::TensorView::new(safetensors::Dtype::F64, vec![2], &data).unwrap();
    safetensors::serialize_to_file(vec![("w", view)], None, &path).unwrap();
    assert_err!(load_checkpoint(&path), Error::Checkpoint { .. });
    std::fs::remove_file(path).unwrap();
}

// ---- sharded checkpoints ---------------------------------------------------------------

/// `loss = mean((x @ w)^2)` with `x` `[4, 8]` and `w` `[8, cols]` split over `model`,
/// its parameters `trained` by `optimizer`.
fn split_regression(cols: usize, trained: &[usize], optimizer: &Optimizer) -> TrainStep {
    let b = Builder::new("split_regression");
    let x = b.parameter("x", [4, 8], DType::F32);
    let w = b
        .parameter("w", [8, cols], DType::F32)
        .annotate(sharding("(model, _)"));
    let y = x.matmul(&w);
    let loss = (&y * &y).mean(&[0, 1]);
    step_program(&b.finish(&[&loss]).unwrap(), 0, trained, optimizer).unwrap()
}

/// A trainer of `step` on a mesh of two devices along `model`.
fn split_trainer(step: TrainStep) -> Trainer {
    let mesh = Mesh::new([("model", 2)]).unwrap();
    let initial = (step.params.iter())
        .map(|p| {
            let ty = step.program.ty(step.program.params[p.input]);
            Literal::full(&ty.shape, ty.dtype, 0.5)
        })
        .collect::<Vec<_>>();
    Trainer::on_mesh(step, mesh, initial).unwrap()
}

/// A sharded checkpoint at `scratch(name)` of the split regression's AdamW step (`w`
/// trained) after one step; its index and its file.
fn sharded_checkpoint(name: &str) -> (PathBuf, PathBuf) {
    let dir = scratch(name);
    let _ = std::fs::remove_dir_all(&dir);
    let mut trainer = split_trainer(split_regression(2, &[1], &Optimizer::adamw(0.1)));
    trainer.step(&[f32s(&[4, 8], 1.0)]).unwrap();
    trainer.save(&dir).unwrap();
    (dir.join("index.json"), shard_file(&dir))
}

/// The one shard file of the checkpoint at `dir` (saved by one process).
fn shard_file(dir: &Path) -> PathBuf {
    let save = (std::fs::read_dir(dir).unwrap())
        .map(|e| e.unwrap().path())
        .find(|p| p.is_dir())
        .unwrap();
    std::fs::read_dir(save)
        .unwrap()
        .next()
        .unwrap()
        .unwrap()
        .path()
}

/// Loads the checkpoint whose index is `index` into a trainer of `step`: the error,
/// which must be an [`Error::Checkpoint`] naming `path` and `tensor`.
#[track_caller]
fn load_error(index: &Path, step: TrainStep, path: &Path, tensor: Option<&str>) -> Error {
    let dir = index.parent().unwrap();
    let e = assert_err!(split_trainer(step).load(dir), Error::Checkpoint { .. });
    let Error::Checkpoint {
        path: named,
        tensor: which,
        ..
    } = &e
    else {
        unreachable!()
    };
    assert_eq!(Path::new(named), path, "{e}");
    assert_eq!(which.as_deref(), tensor, "{e}");
    std::fs::remove_dir_all(dir).unwrap();
    e
}

/// The split regression's AdamW step training `w`, as saved by [`sharded_checkpoint`].
fn adamw_step() -> TrainStep {
    split_regression(2, &[1], &Optimizer::adamw(0.1))
}

#[test]
fn sharded_checkpoint_with_a_truncated_file() {
    let (index, file) = sharded_checkpoint("truncated");
    let len = std::fs::metadata(&file).unwrap().len();
    let handle = std::fs::OpenOptions::new().write(true).open(&file).unwrap();
    handle.set_len(len - 4).unwrap();
    let e = load_error(&index, adamw_step(), &file, Some("w"));
    assert!(e.to_string().contains("truncated"), "{e}");
}

#[test]
fn sharded_checkpoint_with_an_index_that_is_not_json() {
    let (index, _) = sharded_checkpoint("bad-json");
    std::fs::write(&index, "{\"format\": ").unwrap();
    load_error(&index, adamw_step(), &index, None);
}

#[test]
fn sharded_checkpoint_whose_index_names_a_missing_file() {
    let (index, file) = sharded_checkpoint("missing-file");
    std::fs::remove_file(&file).unwrap();
    load_error(&index, adamw_step(), &file, Some("w"));
}

#[test]
fn sharded_checkpoint_that_never_committed() {
    let (index, _) = sharded_checkpoint("uncommitted");
    std::fs::remove_file(&index).unwrap();
    let e = load_error(&index, adamw_step(), &index, None);
    assert!(e.to_string().contains("committed"), "{e}");
    assert!(matches!(
        e,
        Error::Checkpoint {
            problem: CheckpointProblem::NoIndex,
            ..
        }
    ));
}

#[test]
fn sharded_checkpoint_of_another_shape() {
    let (index, _) = sharded_checkpoint("shape");
    let wider = split_regression(3, &[1], &Optimizer::adamw(0.1));
    let e = load_error(&index, wider, &index, Some("w"));
    assert!(
        matches!(&e, Error::Checkpoint { problem: CheckpointProblem::Type { saved, expected }, .. }
            if saved.shape != expected.shape),
        "{e}"
    );
}

#[test]
fn sharded_checkpoint_of_another_dtype() {
    let (index, _) = sharded_checkpoint("dtype");
    let text = std::fs::read_to_string(&index).unwrap();
    std::fs::write(
        &index,
        text.replacen("\"dtype\":\"f32\"", "\"dtype\":\"i32\"", 1),
    )
    .unwrap();
    load_error(&index, adamw_step(), &index, Some("w"));
}

#[test]
fn sharded_checkpoint_missing_a_tensor() {
    let (index, _) = sharded_checkpoint("missing-tensor");
    let both = split_regression(2, &[0, 1], &Optimizer::adamw(0.1));
    let e = load_error(&index, both, &index, Some("x"));
    assert!(
        matches!(
            e,
            Error::Checkpoint {
                problem: CheckpointProblem::Missing,
                ..
            }
        ),
        "{e}"
    );
}

#[test]
fn sharded_checkpoint_whose_blocks_are_not_its_shardings() {
    let (index, _) = sharded_checkpoint("blocks");
    let text = std::fs::read_to_string(&index).unwrap();
    let edited = text.replacen("\"sharding\":\"(model, _)\"", "\"sharding\":\"(_, _)\"", 1);
    assert_ne!(edited, text);
    std::fs::write(&index, edited).unwrap();
    load_error(&index, adamw_step(), &index, Some("w"));
}

#[test]
fn sharded_checkpoint_of_another_optimizer() {
    let (index, _) = sharded_checkpoint("optimizer");
    let sgd = Optimizer::sgd(0.1, 0.9);
    let e = load_error(&index, split_regression(2, &[1], &sgd), &index, None);
    assert!(e.to_string().contains("adamw"), "{e}");
    assert!(
        matches!(&e, Error::Checkpoint { problem: CheckpointProblem::Optimizer { saved, .. }, .. }
            if saved == "adamw"),
        "{e}"
    );
}

#[test]
fn sharded_checkpoint_with_a_file_of_another_save() {
    let (index, file) = sharded_checkpoint("mixed");
    let (other_index, other_file) = sharded_checkpoint("mixed-other");
    std::fs::copy(&other_file, &file).unwrap();
    std::fs::remove_dir_all(other_index.parent().unwrap()).unwrap();
    let e = load_error(&index, adamw_step(), &file, Some("w"));
    assert!(e.to_string().contains("belongs to save"), "{e}");
    assert!(
        matches!(&e, Error::Checkpoint { problem: CheckpointProblem::OtherSave { file: Some(a), index }, .. }
            if a != index),
        "{e}"
    );
}

// ---- running ---------------------------------------------------------------------------

#[test]
fn interpreter_given_too_few_inputs() {
    assert_err!(
        interpret(&regression(), &[f32s(&[4, 8], 1.0)]),
        Error::Input {
            index: 1,
            problem: InputProblem::Count {
                expected: 2,
                given: 1
            },
            ..
        }
    );
}

#[test]
fn interpreter_given_an_input_of_the_wrong_dtype() {
    let i32s = Literal::full(&[4, 8], DType::I32, 1.0);
    assert_err!(
        interpret(&regression(), &[i32s, f32s(&[8, 2], 1.0)]),
        Error::Input {
            index: 0,
            problem: InputProblem::Type { expected, given },
            ..
        } if (expected.dtype, given.dtype) == (DType::F32, DType::I32)
    );
}

#[test]
fn interpreter_given_an_input_of_the_wrong_shape() {
    assert_err!(
        interpret(&regression(), &[f32s(&[4, 9], 1.0), f32s(&[8, 2], 1.0)]),
        Error::Input {
            index: 0,
            problem: InputProblem::Type { expected, given },
            ..
        } if (expected.shape.as_slice(), given.shape.as_slice()) == (&[4, 8][..], &[4, 9][..])
    );
}

#[test]
fn interpreter_given_an_spmd_program() {
    let mut p = regression();
    let x = p.params[0];
    let location = p.node(x).location;
    let op = Op::AxisIndex(AxisGroup {
        axes: vec!["data".into()],
        size: 2,
    });
    let index = p.push_op(op, &[], location).unwrap();
    p.outputs.push(index);
    assert_err!(
        interpret(&p, &[f32s(&[4, 8], 1.0), f32s(&[8, 2], 1.0)]),
        Error::Runtime { .. }
    );
}

#[test]
fn mesh_run_given_the_wrong_inputs() {
    let mesh = mesh_2x2();
    let exe = compile(&matmul_program("(data, _)"), &mesh).unwrap();
    let threads = ThreadMesh::new(mesh).unwrap();
    assert_err!(
        exe.run(&threads, &[f32s(&[4, 8], 1.0)]),
        Error::Input {
            index: 1,
            problem: InputProblem::Count {
                expected: 2,
                given: 1
            },
            ..
        }
    );
    assert_err!(
        exe.run(&threads, &[f32s(&[4, 8], 1.0), f32s(&[3, 2], 1.0)]),
        Error::Input {
            index: 1,
            problem: InputProblem::Type { .. },
            ..
        }
    );
}

#[test]
fn program_run_on_another_mesh() {
    let exe = compile(&matmul_program("(data, _)"), &mesh_2x2()).unwrap();
    let other = ThreadMesh::new(Mesh::new([("data", 4)]).unwrap()).unwrap();
    let inputs = [f32s(&[4, 8], 1.0), f32s(&[8, 2], 1.0)];
    assert_err!(exe.run(&other, &inputs), Error::WrongMesh { .. });
}

#[test]
fn run_with_the_wrong_number_of_output_modes() {
    let mesh = mesh_2x2();
    let exe = compile(&matmul_program("(data, _)"), &mesh).unwrap();
    let threads = ThreadMesh::new(mesh).unwrap();
    let (x, w) = (f32s(&[4, 8], 1.0), f32s(&[8, 2], 1.0));
    let inputs = [Input::Global(&x), Input::Global(&w)];
    assert_err!(
        exe.execute(&threads, &inputs, &[Output::Global, Output::Global]),
        Error::OutputCount { .. }
    );
}

#[test]
fn run_binding_a_resident_value_that_does_not_exist() {
    let mesh = mesh_2x2();
    let exe = compile(&matmul_program("(data, _)"), &mesh).unwrap();
    let threads = ThreadMesh::new(mesh).unwrap();
    let x = f32s(&[4, 8], 1.0);
    let inputs = [Input::Global(&x), Input::Resident("never-stored")];
    assert_err!(
        exe.execute(&threads, &inputs, &[Output::Global]),
        Error::Input { .. }
    );
}

#[test]
fn collective_over_an_unknown_axis() {
    let threads = ThreadMesh::new(mesh_2x2()).unwrap();
    let e = assert_err!(
        threads.run(|ctx| {
            ctx.communicator()
                .all_reduce(&["rows".into()], ReduceKind::Sum, f32s(&[2], 1.0))
        }),
        Error::Collective {
            problem: CollectiveProblem::Group {
                problem: GroupProblem::UnknownAxis { axis, available },
            },
            ..
        } if axis == "rows" && available[..] == ["data", "model"]
    );
    assert!(e.to_string().contains("rows"), "{e}");
}

#[test]
fn device_program_that_fails_on_one_device() {
    let threads = ThreadMesh::new(mesh_2x2()).unwrap();
    let e = assert_err!(
        threads.run(|ctx| {
            if ctx.device() == 2 {
                return Err(Error::MissingResident {
                    device: 2,
                    key: "injected".into(),
                });
            }
            ctx.communicator()
                .all_reduce(&["data".into()], ReduceKind::Sum, f32s(&[2], 1.0))
        }),
        Error::DeviceFailed { device: 2, .. }
    );
    assert!(e.to_string().contains("injected"), "{e}");
}

#[test]
fn device_program_that_panics() {
    let threads = Arc::new(ThreadMesh::new(mesh_2x2()).unwrap());
    assert_err!(
        threads.run(|ctx| {
            assert_ne!(ctx.device(), 1, "device 1 panics on purpose");
            Ok(())
        }),
        Error::DevicePanicked { device: 1, message, .. } if message.contains("on purpose")
    );
    // The mesh is usable afterwards.
    assert_eq!(threads.run(|ctx| Ok(ctx.device())).unwrap(), [0, 1, 2, 3]);
}

#[test]
fn blocks_of_a_resident_value_the_mesh_does_not_hold() {
    let threads = ThreadMesh::new(mesh_2x2()).unwrap();
    assert_err!(
        threads.local_blocks("nothing"),
        Error::ThreadMesh {
            problem: ThreadMeshProblem::NoResident { key }
        } if key == "nothing"
    );
}

#[test]
fn value_too_large_for_memory_is_an_error_not_an_abort() {
    isolated(
        "value_too_large_for_memory_is_an_error_not_an_abort",
        || {
            let b = Builder::new("huge");
            let x = b.parameter("x", [2], DType::F32);
            let big = b.full([1_000_000, 1_000_000], DType::F32, 1.0);
            let y = &big.sum(&[0, 1]).broadcast_to([2]) + &x;
            let p = b.finish(&[&y]).unwrap();
            let e = err(interpret(&p, &[f32s(&[2], 1.0)]));
            assert!(!matches!(e, Error::Shape { .. }), "{e:?}");
        },
    );
}

#[test]
fn run_called_from_a_device_thread() {
    let threads = Arc::new(ThreadMesh::new(mesh_2x2()).unwrap());
    let inner = Arc::clone(&threads);
    let refused = threads
        .run(move |_| {
            Ok(matches!(
                inner.run(|_| Ok(())),
                Err(Error::ReentrantRun { .. })
            ))
        })
        .unwrap();
    assert_eq!(refused, [true; 4]);
}

#[test]
fn device_that_never_reaches_a_collective() {
    let threads = ThreadMesh::new(mesh_2x2())
        .unwrap()
        .with_timeout(std::time::Duration::from_millis(100))
        .unwrap();
    let e = assert_err!(
        threads.run(|ctx| {
            if ctx.device() == 3 {
                std::thread::sleep(std::time::Duration::from_millis(600));
            }
            ctx.communicator()
                .all_reduce(&["data".into()], ReduceKind::Sum, f32s(&[2], 1.0))
        }),
        Error::CollectiveTimeout { .. }
    );
    let Error::CollectiveTimeout { missing, .. } = e else {
        unreachable!()
    };
    assert_eq!(missing, [3]);
}

/// A `fn main() -> gspmd::Result<()>` that fails prints the error's message (Rust's
/// `Termination` prints the error's `Debug` form, which is its message), not the
/// enum's fields: the child process returns an error from a stand-in `main` through
/// `Termination::report`, as a real `main` does.
#[test]
fn main_returning_an_error_prints_its_message() {
    const CHILD: &str = "GSPMD_MAIN_ERROR_CHILD";
    fn main() -> Result<()> {
        Mesh::new([("data", 2), ("data", 4)])?;
        Ok(())
    }
    if std::env::var_os(CHILD).is_some() {
        let failed = main().is_err();
        let _ = std::process::Termination::report(main());
        std::process::exit(i32::from(failed));
    }
    let message = err(main()).to_string();
    let out = Command::new(std::env::current_exe().unwrap())
        .args([
            "main_returning_an_error_prints_its_message",
            "--exact",
            "--nocapture",
        ])
        .env(CHILD, "1")
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success());
    assert!(message.contains("data"), "{message}");
    assert_eq!(stderr.trim_end(), format!("Error: {message}"));
}
