//! Bad input to the tracer and the shape rules ends in exactly one typed error, located
//! at the user's line: sizes whose arithmetic would overflow (in debug and release
//! alike), ops on poisoned handles, repeated parameter names, shardings of the wrong
//! rank (printed in their text form).

use gspmd_core::Error;
use gspmd_core::ir::{
    AxisGroup, Builder, ConvDimensionNumbers, DType, DotDims, GatherDims, Location, Op, Padding,
    ReduceKind, ScatterDims, Tensor, TensorType, WindowDim, einsum, infer_type, verify,
};
use gspmd_core::sharding::Sharding;

const BIG: usize = 1 << 40;

/// The one error `builder` recorded, checked to be a `Shape` error of `op` at `line` of
/// this file; returns its message.
fn one_shape_error(builder: Builder, op: &str, line: u32) -> String {
    match builder.finish(&[]) {
        Err(Error::Shape {
            op: got,
            location,
            message,
        }) => {
            assert_eq!(got, op, "{message}");
            assert_at(location, line);
            message
        }
        other => panic!("expected one Error::Shape of `{op}`, got {other:?}"),
    }
}

fn assert_at(location: Location, line: u32) {
    assert!(
        location.file.ends_with("trace_errors.rs"),
        "location {location} is not in this test file"
    );
    assert_eq!(location.line, line, "location {location}");
}

#[track_caller]
fn f32_param(b: &Builder, name: &str, shape: &[usize]) -> Tensor {
    b.parameter(name, shape.to_vec(), DType::F32)
}

// ---- size arithmetic ---------------------------------------------------------------

#[test]
fn reshape_to_a_shape_whose_element_count_overflows() {
    let b = Builder::new("t");
    let x = f32_param(&b, "x", &[4]);
    let (_y, line) = (x.reshape(vec![BIG, BIG]), line!());
    let message = one_shape_error(b, "reshape", line);
    assert!(message.contains("more than usize::MAX"), "{message}");
}

#[test]
fn reshape_between_two_overflowing_shapes_is_not_equal_by_wrapping() {
    // 2^64 + 2^64 wraps to 0 elements, the same as a shape with a zero dim.
    let b = Builder::new("t");
    let x = f32_param(&b, "x", &[0, 4]);
    let (_y, line) = (x.reshape(vec![1 << 32, 1 << 32, 0]), line!());
    let (_z, line2) = (x.reshape(vec![1 << 63, 2]), line!());
    match b.finish(&[]) {
        Err(Error::Many(errors)) => {
            assert_eq!(errors.len(), 2, "{errors:?}");
            // The first has zero elements too, but its non-zero dims are too large to
            // hold; the second wraps to zero elements without checked arithmetic.
            for (e, l) in errors.iter().zip([line, line2]) {
                let Error::Shape { op, location, .. } = e else {
                    panic!("expected Error::Shape, got {e:?}");
                };
                assert_eq!(*op, "reshape");
                assert_at(*location, l);
            }
        }
        other => panic!("expected two errors, got {other:?}"),
    }
}

#[test]
fn parameter_too_large_to_hold() {
    let b = Builder::new("t");
    let (x, line) = (f32_param(&b, "x", &[BIG, BIG, BIG]), line!());
    assert!(x.id().is_none());
    let message = one_shape_error(b, "parameter", line);
    assert!(message.contains("too large"), "{message}");
}

#[test]
fn parameter_with_a_zero_dim_is_still_bounded_by_its_other_dims() {
    let b = Builder::new("t");
    let (_x, line) = (f32_param(&b, "x", &[0, BIG, BIG]), line!());
    one_shape_error(b, "parameter", line);
}

#[test]
fn parameter_byte_size_must_fit_even_when_the_element_count_does() {
    // 2^62 f32 elements: the count fits in usize, the 2^64 bytes do not.
    let b = Builder::new("t");
    let (_x, line) = (f32_param(&b, "x", &[1 << 31, 1 << 31]), line!());
    one_shape_error(b, "parameter", line);
    // The same count of bools is 2^62 bytes: fine.
    let b = Builder::new("t");
    let x = b.parameter("x", vec![1 << 31, 1 << 31], DType::Bool);
    assert!(x.id().is_some());
    assert!(b.finish(&[&x]).is_ok());
}

#[test]
fn mean_over_huge_dims_gives_one_error_at_the_parameter() {
    let b = Builder::new("t");
    let (x, line) = (f32_param(&b, "x", &[1 << 33, 1 << 33]), line!());
    let _m = x.mean(&[0, 1]);
    one_shape_error(b, "parameter", line);
}

#[test]
fn mean_over_a_repeated_dim_is_an_error_not_an_overflow() {
    // The count of the mean would be (2^33)^2 if the repeated dim were multiplied twice.
    let b = Builder::new("t");
    let x = f32_param(&b, "x", &[1 << 33, 2]);
    let (_m, line) = (x.mean(&[0, -2]), line!());
    let message = one_shape_error(b, "reduce", line);
    assert!(message.contains("distinct"), "{message}");
}

#[test]
fn mean_of_a_large_valid_tensor_divides_by_its_count() {
    let b = Builder::new("t");
    let x = f32_param(&b, "x", &[1 << 30, 1 << 30]);
    let m = x.mean(&[0, 1]);
    let p = b
        .finish(&[&m])
        .expect("a 2^60-element f32 tensor is a valid type");
    let count = p.nodes.iter().find_map(|n| match &n.op {
        Op::Constant(lit) => lit.as_f32().and_then(|a| a.first().copied()),
        _ => None,
    });
    assert_eq!(count, Some((1u64 << 60) as f32));
}

/// Pads an `f32[4]` by `low`, `high`, `interior` in a new builder; checks that this
/// gives one `pad` error at the caller's line and returns its message.
#[track_caller]
fn pad_error(low: i64, high: i64, interior: usize) -> String {
    let line = std::panic::Location::caller().line();
    let b = Builder::new("t");
    let x = f32_param(&b, "x", &[4]);
    let zero = b.scalar(0.0);
    let _y = x.pad(&zero, &[low], &[high], &[interior]);
    one_shape_error(b, "pad", line)
}

#[test]
fn pad_sizes_that_overflow_or_do_not_fit() {
    let message = pad_error(0, i64::MAX, 0);
    assert!(message.contains("overflows"), "{message}");
    let message = pad_error(-5, i64::MIN, 0);
    assert!(message.contains("overflows"), "{message}");
    let message = pad_error(i64::MIN, 0, 0);
    assert!(message.contains("negative size"), "{message}");
    let message = pad_error(0, 0, usize::MAX);
    assert!(message.contains("overflows"), "{message}");
    // The i64 arithmetic fits; the f32 result of 2^62 elements is 2^64 bytes.
    let message = pad_error(0, 1 << 62, 0);
    assert!(message.contains("too large"), "{message}");
    let message = pad_error(-3, -3, 0);
    assert!(message.contains("negative size -2"), "{message}");
}

/// Applies `op` to an `f32[4, 6]` in a new builder; checks that this gives one error of
/// `name` at the caller's line and returns its message.
#[track_caller]
fn window_error(name: &str, op: impl FnOnce(&Tensor) -> Tensor) -> String {
    let line = std::panic::Location::caller().line();
    let b = Builder::new("t");
    let x = f32_param(&b, "x", &[4, 6]);
    let _y = op(&x);
    one_shape_error(b, name, line)
}

#[test]
fn bad_windows_are_one_error_at_the_user_line() {
    use ReduceKind::{Max, Sum};
    let rw = "reduce_window";
    let none = [(0, 0), (0, 0)];
    let m = window_error(rw, |x| x.reduce_window(Max, &[2], &[1, 1], &none));
    assert!(m.contains("need one entry per dim of f32[4,6]"), "{m}");
    let one = [WindowDim::new(1, 1, (0, 0))];
    let m = window_error(rw, |x| x.reduce_window_with(Max, &one));
    assert!(m.contains("window of rank 1 for f32[4,6]"), "{m}");
    let m = window_error(rw, |x| x.reduce_window(Sum, &[2, 2], &[1, 0], &none));
    assert!(m.contains("window dim 1 has size 2, stride 0"), "{m}");
    let m = window_error(rw, |x| x.reduce_window(Sum, &[0, 2], &[1, 1], &none));
    assert!(m.contains("window dim 0 has size 0"), "{m}");
    let pads = [(0, 1), (0, 0)];
    let m = window_error(rw, |x| x.reduce_window(Max, &[6, 1], &[1, 1], &pads));
    assert!(
        m.contains("spans 6 elements, more than the 5 of dim 0"),
        "{m}"
    );
    let dilated = WindowDim::new(3, 1, (0, 0)).with_window_dilation(3);
    let [one] = one;
    let window = [one, dilated];
    let m = window_error(rw, |x| x.reduce_window_with(Max, &window));
    assert!(
        m.contains("window dim 1 spans 7 elements, more than the 6"),
        "{m}"
    );
    let m = window_error(rw, |x| x.ne(x).reduce_window(Max, &[1, 1], &[1, 1], &none));
    assert!(m.contains("cannot reduce pred[4,6]"), "{m}");
    // The window type is shared with convolution; reduce_window takes no negative
    // padding, and a base dilation of at least 1.
    let cropped = [(-1, 0), (0, 0)];
    let m = window_error(rw, |x| x.reduce_window(Max, &[1, 1], &[1, 1], &cropped));
    assert!(
        m.contains("padding -1_0: reduce_window takes no negative padding"),
        "{m}"
    );
    let undilated = [WindowDim::new(1, 1, (0, 0)).with_base_dilation(0), one];
    let m = window_error(rw, |x| x.reduce_window_with(Max, &undilated));
    assert!(
        m.contains("base dilation 0: each must be at least 1"),
        "{m}"
    );
}

#[test]
fn window_sizes_that_overflow_are_errors() {
    use ReduceKind::Max;
    let rw = "reduce_window";
    let pads = [(i64::MAX, 1), (0, 0)];
    let m = window_error(rw, |x| x.reduce_window(Max, &[1, 1], &[1, 1], &pads));
    assert!(m.contains("window dim 0 of f32[4,6] overflows"), "{m}");
    let huge = WindowDim::new(3, 1, (0, 0)).with_window_dilation(usize::MAX);
    let window = [huge, WindowDim::new(1, 1, (0, 0))];
    let m = window_error(rw, |x| x.reduce_window_with(Max, &window));
    assert!(m.contains("window dim 0 of f32[4,6] overflows"), "{m}");
    // Each padded dim fits; the result of 2^80 elements does not.
    let pads = [(1 << 40, 0), (1 << 40, 0)];
    let m = window_error(rw, |x| x.reduce_window(Max, &[1, 1], &[1, 1], &pads));
    assert!(m.contains("too large"), "{m}");
}

#[test]
fn pooling_and_upsampling_errors_name_the_user_line() {
    let rw = "reduce_window";
    let m = window_error(rw, |x| x.max_pool(&[2, 2, 1], &[1, 1], Padding::Same));
    assert!(m.contains("need one entry per dim"), "{m}");
    let m = window_error(rw, |x| x.avg_pool(&[5, 1], &[1, 1], Padding::Valid, false));
    assert!(m.contains("spans 5 elements, more than the 4"), "{m}");
    // A poisoned operand: the first error only.
    let same = Padding::Same;
    let m = window_error("reshape", |x| x.reshape([5]).max_pool(&[2], &[2], same));
    assert!(m.contains("cannot reshape"), "{m}");
    let m = window_error("upsample_nearest", |x| x.upsample_nearest(&[2]));
    assert!(
        m.contains("factors [2] need one entry of at least 1 per dim"),
        "{m}"
    );
    let m = window_error("upsample_nearest", |x| x.upsample_nearest(&[2, 0]));
    assert!(m.contains("factors [2, 0]"), "{m}");
    let m = window_error("broadcast", |x| x.upsample_nearest(&[BIG, BIG]));
    assert!(m.contains("too large"), "{m}");
}

#[test]
fn broadcast_and_full_to_huge_shapes() {
    let b = Builder::new("t");
    let x = f32_param(&b, "x", &[1]);
    let (_y, line) = (x.broadcast_in_dim(vec![BIG, BIG], &[1]), line!());
    one_shape_error(b, "broadcast", line);

    let b = Builder::new("t");
    let (_y, line) = (b.full(vec![BIG, BIG], DType::I32, 1.0), line!());
    one_shape_error(b, "broadcast", line);
}

#[test]
fn iota_of_a_huge_shape() {
    let b = Builder::new("t");
    let (_y, line) = (b.iota(vec![BIG, BIG], 1, DType::I32), line!());
    one_shape_error(b, "iota", line);
}

#[test]
fn concatenate_whose_size_overflows() {
    // Each operand is a valid bool type of isize::MAX bytes; three of them overflow usize.
    let b = Builder::new("t");
    let n = isize::MAX as usize;
    let xs: Vec<Tensor> = (0..3)
        .map(|i| b.parameter(&format!("x{i}"), vec![n], DType::Bool))
        .collect();
    let refs: Vec<&Tensor> = xs.iter().collect();
    let (_y, line) = (b.concatenate(&refs, 0), line!());
    let message = one_shape_error(b, "concatenate", line);
    assert!(message.contains("overflows"), "{message}");
}

#[test]
fn outer_product_too_large_by_dot_general_and_einsum() {
    let b = Builder::new("t");
    let u = f32_param(&b, "u", &[1 << 32]);
    let v = f32_param(&b, "v", &[1 << 32]);
    let (_y, line) = (u.dot_general(&v, DotDims::default()), line!());
    one_shape_error(b, "dot_general", line);

    let b = Builder::new("t");
    let u = f32_param(&b, "u", &[1 << 32]);
    let v = f32_param(&b, "v", &[1 << 32]);
    let (_y, line) = (einsum("i,j->ij", &u, &v), line!());
    one_shape_error(b, "dot_general", line);
}

#[test]
fn collective_shape_rules_reject_overflow_and_empty_groups() {
    let t = TensorType::new(vec![1 << 40], DType::F32);
    let group = |size| AxisGroup {
        axes: vec!["x".into()],
        size,
    };
    let gather = Op::AllGather {
        group: group(1 << 40),
        dim: 0,
    };
    let message = infer_type(&gather, &[&t]).expect_err("2^80 elements");
    assert!(message.contains("overflows"), "{message}");
    let empty = TensorType::new(vec![0], DType::F32);
    let scatter = Op::ReduceScatter {
        kind: ReduceKind::Sum,
        group: group(0),
        dim: 0,
    };
    let message = infer_type(&scatter, &[&empty]).expect_err("a group of no devices");
    assert!(message.contains("group size 0"), "{message}");
    let all_to_all = Op::AllToAll {
        group: group(0),
        split_dim: 0,
        concat_dim: 0,
    };
    assert!(infer_type(&all_to_all, &[&empty]).is_err());
}

#[test]
fn verify_rejects_a_hand_built_parameter_too_large_to_hold() {
    let b = Builder::new("t");
    let x = f32_param(&b, "x", &[4]);
    let mut p = b.finish(&[&x]).expect("traced");
    let huge = TensorType::new(vec![BIG, BIG], DType::F32);
    p.nodes[0].op = Op::Parameter {
        index: 0,
        ty: huge.clone(),
    };
    p.nodes[0].ty = huge;
    match verify(&p) {
        Err(Error::Verify { message, .. }) => assert!(message.contains("too large"), "{message}"),
        other => panic!("expected Error::Verify, got {other:?}"),
    }
}

// ---- poisoned handles --------------------------------------------------------------

#[test]
fn one_bad_reshape_followed_by_more_ops_is_one_error() {
    let b = Builder::new("t");
    let x = f32_param(&b, "x", &[2, 4]);
    let w = f32_param(&b, "w", &[4, 3]);
    let labels = b.parameter("labels", vec![2], DType::I32);
    let (y, line) = (x.reshape(vec![3, 5]), line!());
    // Every op below would report its own error on a handle of the poisoned type (a
    // scalar): axes out of range, ranks, broadcasting, einsum letters.
    let s = y.sum(&[1]).softmax(-1);
    let m = y.matmul(&w).relu().gelu() + &x;
    let e = einsum("ij,jk->ik", &y, &w).layer_norm(-1, 1e-5);
    let l = y.cross_entropy_with_logits(&labels) + y.mse(&x);
    let z = y.slice_axis(1, 0, 2).mean(&[0, 1]).log_softmax(1);
    let c = b.concatenate(&[&y, &x], 1).transpose(&[1, 0]);
    let k = y.shard("(data, model)".parse().expect("sharding"));
    let _ = (s, m, e, l, z, c, k);
    one_shape_error(b, "reshape", line);
}

#[test]
fn two_independent_mistakes_are_two_errors() {
    let b = Builder::new("t");
    let x = f32_param(&b, "x", &[2, 4]);
    let (y, line1) = (x.reshape(vec![3]), line!());
    let (z, line2) = (x.sum(&[2]), line!());
    let _ = (y.exp(), z.exp());
    match b.finish(&[]) {
        Err(Error::Many(errors)) => {
            let lines: Vec<(&str, u32)> = errors
                .iter()
                .map(|e| match e {
                    Error::Shape { op, location, .. } => (*op, location.line),
                    other => panic!("expected Error::Shape, got {other:?}"),
                })
                .collect();
            assert_eq!(lines, [("reshape", line1), ("reduce", line2)]);
        }
        other => panic!("expected two errors, got {other:?}"),
    }
}

#[test]
fn a_tensor_from_another_builder_is_one_error_at_the_user_line() {
    let b = Builder::new("t");
    let other = Builder::new("other");
    let x = f32_param(&b, "x", &[4]);
    let y = f32_param(&other, "y", &[4]);
    let (z, line) = (x.mul(&y), line!());
    let _ = z.exp();
    match b.finish(&[]) {
        Err(Error::Shape {
            op: "trace",
            location,
            message,
        }) => {
            assert_at(location, line);
            assert!(message.contains("another builder"), "{message}");
        }
        other => panic!("expected one Error::Shape of `trace`, got {other:?}"),
    }
}

// ---- parameter names ---------------------------------------------------------------

#[test]
fn two_parameters_of_one_name_are_a_trace_error() {
    let b = Builder::new("t");
    let (x, first) = (f32_param(&b, "w", &[4]), line!());
    let (y, second) = (f32_param(&b, "w", &[4]), line!());
    assert!(y.id().is_none());
    let _ = x.add(&y).exp();
    match b.finish(&[]) {
        Err(Error::DuplicateName {
            name,
            first: f,
            second: s,
        }) => {
            assert_eq!(name, "w");
            assert_at(f, first);
            assert_at(s, second);
        }
        other => panic!("expected Error::DuplicateName, got {other:?}"),
    }
}

#[test]
fn verify_rejects_two_parameters_of_one_name() {
    let b = Builder::new("t");
    let x = f32_param(&b, "x", &[4]);
    let (y, line) = (f32_param(&b, "y", &[4]), line!());
    let s = x.add(&y);
    let mut p = b.finish(&[&s]).expect("traced");
    let y = y.id().expect("traced");
    p.node_mut(y).name = Some("x".into());
    match verify(&p) {
        Err(Error::DuplicateName { name, second, .. }) => {
            assert_eq!(name, "x");
            assert_at(second, line);
        }
        other => panic!("expected Error::DuplicateName, got {other:?}"),
    }
}

// ---- shardings in errors -----------------------------------------------------------

#[test]
fn sharding_rank_mismatch_prints_the_sharding_in_text_form() {
    let b = Builder::new("t");
    let x = f32_param(&b, "x", &[2, 4]);
    let text = "((data, model), ?, _@1)";
    let sharding: Sharding = text.parse().expect("sharding");
    let (_y, line) = (x.shard(sharding.clone()), line!());
    let error = b
        .finish(&[])
        .expect_err("rank 3 sharding of a rank 2 value");
    let Error::ShardingRank {
        sharding: printed,
        spec_rank: 3,
        rank: 2,
        context,
    } = &error
    else {
        panic!("expected Error::ShardingRank, got {error:?}");
    };
    assert_eq!(printed, text);
    assert_eq!(printed.parse::<Sharding>().expect("reparses"), sharding);
    assert!(
        context.contains(&format!("trace_errors.rs:{line}")),
        "{context}"
    );
    assert!(error.to_string().contains(text), "{error}");
}

#[test]
fn annotate_rank_mismatch_is_one_error_at_the_user_line() {
    let b = Builder::new("t");
    let x = f32_param(&b, "x", &[2, 4]);
    let (y, line) = (x.annotate("(data)".parse().expect("sharding")), line!());
    let _ = y.exp().sum(&[0]);
    match b.finish(&[]) {
        Err(Error::ShardingRank {
            sharding, context, ..
        }) => {
            assert_eq!(sharding, "(data)");
            assert!(
                context.contains(&format!("trace_errors.rs:{line}")),
                "{context}"
            );
        }
        other => panic!("expected Error::ShardingRank, got {other:?}"),
    }
}

#[test]
fn roll_along_a_missing_axis_is_one_error_at_the_call() {
    let b = Builder::new("roll");
    let x = f32_param(&b, "x", &[4, 3]);
    let line = line!() + 1;
    let y = x.roll(1, 2);
    let _ = y.roll(1, 0);
    let message = one_shape_error(b, "roll", line);
    assert!(message.contains("axis 2 out of range"), "{message}");
}

// ---- convolution and reverse -----------------------------------------------------------

fn nhwc() -> ConvDimensionNumbers {
    ConvDimensionNumbers::from_labels("NHWC", "HWIO", "NHWC").unwrap()
}

/// One bad convolution of an `[2, 6, 6, 4]` NHWC input with `kernel`: the message of
/// the one error, at the line of the call.
fn conv_error(
    kernel: &[usize],
    strides: &[usize],
    padding: Padding,
    rhs_dilation: &[usize],
    dn: &ConvDimensionNumbers,
    groups: usize,
) -> String {
    let b = Builder::new("t");
    let x = f32_param(&b, "x", &[2, 6, 6, 4]);
    let k = f32_param(&b, "k", kernel);
    let line = line!() + 1;
    let _y = x.conv_general_dilated(&k, strides, padding, &[], rhs_dilation, dn, groups);
    one_shape_error(b, "convolution", line)
}

/// The error of a SAME convolution of an f32[2,6,6,4] NHWC input with a `kernel` of
/// that shape, in `feature_groups` and `batch_groups`.
fn grouped_conv_error(kernel: &[usize], feature_groups: usize, batch_groups: usize) -> String {
    let b = Builder::new("t");
    let x = f32_param(&b, "x", &[2, 6, 6, 4]);
    let k = f32_param(&b, "k", kernel);
    let (line, same) = (line!() + 1, Padding::Same);
    let _y = x.conv_general_dilated_grouped(
        &k,
        &[1, 1],
        same,
        &[],
        &[],
        &nhwc(),
        feature_groups,
        batch_groups,
    );
    one_shape_error(b, "convolution", line)
}

#[test]
fn every_bad_batch_group_count_is_one_error_at_the_user_line() {
    for (message, needle) in [
        (
            grouped_conv_error(&[3, 3, 4, 8], 1, 0),
            "batch_group_count 0",
        ),
        (
            grouped_conv_error(&[3, 3, 2, 8], 2, 2),
            "batch_group_count 2 with feature_group_count 2: the batch group count must be at least 1, and at most one of the two may exceed 1",
        ),
        (
            grouped_conv_error(&[3, 3, 4, 8], 1, 4),
            "batch_group_count 4 must divide the input batch 2",
        ),
        (
            grouped_conv_error(&[3, 3, 4, 7], 1, 2),
            "must divide the input batch 2 and the output features 7",
        ),
    ] {
        assert!(message.contains(needle), "{needle:?} not in {message:?}");
    }
}

#[test]
fn every_bad_convolution_is_one_error_at_the_user_line() {
    let ok_kernel: &[usize] = &[3, 3, 4, 8];
    let same = || Padding::Same;
    let mut repeated = nhwc();
    repeated.input_feature = repeated.input_batch;
    let mut out_of_range = nhwc();
    out_of_range.kernel_spatial[1] = 7;
    let mut too_few = nhwc();
    too_few.output_spatial.pop();
    let cases: Vec<(String, &str)> = vec![
        (
            conv_error(ok_kernel, &[1, 1], same(), &[], &repeated, 1),
            "input dimension numbers",
        ),
        (
            conv_error(ok_kernel, &[1, 1], same(), &[], &out_of_range, 1),
            "kernel dimension numbers",
        ),
        (
            conv_error(ok_kernel, &[1, 1], same(), &[], &too_few, 1),
            "the same number for input, kernel and output",
        ),
        (
            conv_error(ok_kernel, &[1, 0], same(), &[], &nhwc(), 1),
            "stride 0",
        ),
        (
            conv_error(ok_kernel, &[1, 1], same(), &[0, 1], &nhwc(), 1),
            "window dilation 0",
        ),
        (
            conv_error(ok_kernel, &[1], same(), &[], &nhwc(), 1),
            "window_strides has 1 entries for 2 spatial dims",
        ),
        (
            conv_error(&[7, 3, 4, 8], &[1, 1], Padding::Valid, &[], &nhwc(), 1),
            "window dim 0 spans 7 elements, more than the 6 of dim 1",
        ),
        (
            conv_error(ok_kernel, &[1, 1], Padding::Valid, &[3, 1], &nhwc(), 1),
            "window dim 0 spans 7 elements",
        ),
        (
            conv_error(
                &[3, 3, 4, 8],
                &[1, 1],
                Padding::Explicit(vec![(-4, 0), (0, 0)]),
                &[],
                &nhwc(),
                1,
            ),
            "more than the 2 of dim 1",
        ),
        (
            conv_error(&[3, 3, 1, 8], &[1, 1], same(), &[], &nhwc(), 3),
            "feature_group_count 3 must divide the input features 4",
        ),
        (
            conv_error(&[3, 3, 2, 7], &[1, 1], same(), &[], &nhwc(), 2),
            "must divide the input features 4 and the output features 7",
        ),
        (
            conv_error(ok_kernel, &[1, 1], same(), &[], &nhwc(), 0),
            "feature_group_count 0",
        ),
        (
            conv_error(ok_kernel, &[1, 1], same(), &[], &nhwc(), 2),
            "has 4 input features (dim 2), but input f32[2,6,6,4] has 4 features in 2 group(s) of 2",
        ),
        (
            conv_error(&[3, 3, 8], &[1, 1], same(), &[], &nhwc(), 1),
            "must have rank 4",
        ),
    ];
    for (message, needle) in cases {
        assert!(message.contains(needle), "{needle:?} not in {message:?}");
    }
}

#[test]
fn bad_convolution_labels_and_dtypes_are_errors_at_the_user_line() {
    for (labels, needle) in [
        (
            ["NHWCD", "HWIO", "NHWC"],
            "input labels \"NHWCD\" must have",
        ),
        (
            ["NHWC", "HWIO", "NHWD"],
            "output labels \"NHWD\" have no 'C'",
        ),
        (["NHHC", "HWIO", "NHWC"], "input labels \"NHHC\" repeat 'H'"),
    ] {
        let [i, k, o] = labels;
        let (got, line) = (ConvDimensionNumbers::from_labels(i, k, o), line!());
        match got {
            Err(Error::Shape {
                op: "convolution",
                location,
                message,
            }) => {
                assert_at(location, line);
                assert!(message.contains(needle), "{needle:?} not in {message:?}");
            }
            other => panic!("expected a shape error, got {other:?}"),
        }
    }
    let b = Builder::new("t");
    let x = b.parameter("x", [1, 4, 4, 2], DType::I32);
    let k = f32_param(&b, "k", &[3, 3, 2, 2]);
    let (_y, line) = (x.conv2d(&k, [1, 1], Padding::Same), line!());
    let message = one_shape_error(b, "convolution", line);
    assert!(message.contains("must share a numeric dtype"), "{message}");
}

#[test]
fn reverse_of_bad_dims_is_one_error_at_the_user_line() {
    for dims in [&[2][..], &[1, 0], &[0, 0]] {
        let b = Builder::new("t");
        let x = f32_param(&b, "x", &[2, 3]);
        let (_y, line) = (x.reverse(dims), line!());
        let message = one_shape_error(b, "reverse", line);
        assert!(message.contains("reverse dims"), "{message}");
    }
}

// ---- math ops ------------------------------------------------------------------------

/// Traces `build` (which returns the line of its one bad call) and checks the one
/// `Error::Shape` of `op` there, whose message contains `want`.
fn math_error(op: &str, want: &str, build: impl FnOnce(&Builder) -> u32) {
    let b = Builder::new("t");
    let line = build(&b);
    let message = one_shape_error(b, op, line);
    assert!(message.contains(want), "{op}: {message}");
}

fn i32_param(b: &Builder) -> Tensor {
    b.parameter("i", [3], DType::I32)
}

/// Each dtype misuse of a math op is one `Error::Shape` of that op at the user's line,
/// also inside a composite (the failing primitive is named; the later ops on its
/// poisoned result record nothing).
#[test]
fn math_ops_of_the_wrong_dtype_are_one_error_at_the_user_line() {
    let not_f32 = "needs a float operand, got i32[3]";
    let mixed = "operands f32[3] and i32[3] differ";
    math_error("is_finite", not_f32, |b| {
        let (_y, line) = (i32_param(b).is_finite(), line!());
        line
    });
    math_error("floor", not_f32, |b| {
        let (_y, line) = (i32_param(b).floor(), line!());
        line
    });
    math_error("erf", not_f32, |b| {
        let (_y, line) = (i32_param(b).gelu_exact(), line!());
        line
    });
    math_error("sign", "needs numeric operands, got pred[3]", |b| {
        let p = b.parameter("p", [3], DType::Bool);
        let (_y, line) = (p.sign(), line!());
        line
    });
    math_error("remainder", mixed, |b| {
        let (x, i) = (f32_param(b, "x", &[3]), i32_param(b));
        let (_y, line) = (x.rem(&i), line!());
        line
    });
    math_error("remainder", mixed, |b| {
        let (x, i) = (f32_param(b, "x", &[3]), i32_param(b));
        let (_y, line) = (&x % &i, line!());
        line
    });
    math_error("remainder", mixed, |b| {
        let (x, i) = (f32_param(b, "x", &[3]), i32_param(b));
        let (_y, line) = (x.remainder(&i), line!());
        line
    });
    math_error("divide", mixed, |b| {
        let (x, i) = (f32_param(b, "x", &[3]), i32_param(b));
        let (_y, line) = (x.floor_divide(&i), line!());
        line
    });
    math_error("maximum", mixed, |b| {
        let (x, i) = (f32_param(b, "x", &[3]), i32_param(b));
        let (_y, line) = (x.clamp(&i, &x), line!());
        line
    });
}

// ---- dynamic slices, scans and sorting ---------------------------------------------------

/// Each bad use, traced on `x: f32[4, 6]`, is one error of `op` at the call's line whose
/// message contains `needle`.
#[test]
fn bad_dynamic_slices_scans_and_sorts_are_one_error_at_the_user_line() {
    type Case = fn(&Builder, &Tensor) -> (Tensor, u32);
    let cases: Vec<(&str, &str, Case)> = vec![
        ("dynamic_slice", "i32 scalars, got f32[]", |b, x| {
            let f = b.scalar(1.0);
            let s = b.full(Vec::<usize>::new(), DType::I32, 0.0);
            (x.dynamic_slice(&[&s, &f], &[2, 2]), line!())
        }),
        ("dynamic_slice", "i32 scalars, got i32[1]", |b, x| {
            let s = b.full(Vec::<usize>::new(), DType::I32, 0.0);
            let v = b.full(vec![1], DType::I32, 0.0);
            (x.dynamic_slice(&[&s, &v], &[2, 2]), line!())
        }),
        ("dynamic_slice", "one of each per dim", |b, x| {
            let s = b.full(Vec::<usize>::new(), DType::I32, 0.0);
            (x.dynamic_slice(&[&s], &[2, 2]), line!())
        }),
        ("dynamic_slice", "do not fit f32[4,6]", |b, x| {
            let s = b.full(Vec::<usize>::new(), DType::I32, 0.0);
            (x.dynamic_slice(&[&s, &s], &[5, 2]), line!())
        }),
        ("dynamic_update_slice", "does not fit f32[4,6]", |b, x| {
            let s = b.full(Vec::<usize>::new(), DType::I32, 0.0);
            let u = b.parameter("u", [2, 7], DType::F32);
            (x.dynamic_update_slice(&u, &[&s, &s]), line!())
        }),
        ("dynamic_update_slice", "does not fit f32[4,6]", |b, x| {
            let s = b.full(Vec::<usize>::new(), DType::I32, 0.0);
            let u = b.parameter("u", [2, 2], DType::I32);
            (x.dynamic_update_slice(&u, &[&s, &s]), line!())
        }),
        (
            "dynamic_update_slice",
            "1 start indices for f32[4,6]",
            |b, x| {
                let s = b.full(Vec::<usize>::new(), DType::I32, 0.0);
                let u = b.parameter("u", [2, 2], DType::F32);
                (x.dynamic_update_slice(&u, &[&s]), line!())
            },
        ),
        ("dynamic_update_slice", "i32 scalars, got f32[]", |b, x| {
            let (s, f) = (b.full(Vec::<usize>::new(), DType::I32, 0.0), b.scalar(0.0));
            let u = b.parameter("u", [2, 2], DType::F32);
            (x.dynamic_update_slice(&u, &[&f, &s]), line!())
        }),
        ("top_k", "k = 0 must be in 1..=4", |_, x| {
            (x.top_k(0, 0).0, line!())
        }),
        ("top_k", "k = 7 must be in 1..=6", |_, x| {
            (x.top_k(7, -1).0, line!())
        }),
        ("top_k", "axis 2 out of range", |_, x| {
            (x.top_k(1, 2).1, line!())
        }),
        ("cumsum", "axis 2 out of range", |_, x| {
            (x.cumsum(2), line!())
        }),
        ("cumprod", "axis -3 out of range", |_, x| {
            (x.cumprod(-3), line!())
        }),
        ("cumsum", "cannot scan dim 0 of pred[3]", |b, _| {
            let p = b.parameter("p", [3], DType::Bool);
            (p.cumsum(0), line!())
        }),
        ("argsort", "axis 5 out of range", |_, x| {
            (x.argsort(5, false), line!())
        }),
        ("argmax", "axis -3 out of range", |_, x| {
            (x.argmax(-3), line!())
        }),
        (
            "argmin",
            "numeric tensor with elements along dim 0, got f32[0,6]",
            |b, _| {
                let e = b.parameter("e", [0, 6], DType::F32);
                (e.argmin(0), line!())
            },
        ),
        (
            "argmax",
            "numeric tensor with elements along dim 0, got pred[3]",
            |b, _| {
                let p = b.parameter("p", [3], DType::Bool);
                (p.argmax(0), line!())
            },
        ),
    ];
    for (op, needle, case) in cases {
        let b = Builder::new("t");
        let x = f32_param(&b, "x", &[4, 6]);
        let (y, line) = case(&b, &x);
        // Later ops on the poisoned result record nothing more.
        let _ = y.exp();
        let message = one_shape_error(b, op, line);
        assert!(message.contains(needle), "{op}: {message}");
    }
}

/// The message of the one error of `op` that `build` records at the line it returns.
fn indexing_error(op: &str, build: impl FnOnce(&Builder) -> u32) -> String {
    let b = Builder::new("t");
    let line = build(&b);
    one_shape_error(b, op, line)
}

#[test]
fn every_bad_gather_and_scatter_is_one_error_at_the_user_line() {
    let window = |offset: Vec<usize>, collapsed: Vec<usize>, sizes: Vec<usize>| GatherDims {
        offset_dims: offset,
        collapsed_slice_dims: collapsed,
        start_index_map: vec![0],
        index_vector_dim: 1,
        slice_sizes: sizes,
        ..GatherDims::default()
    };
    let rows = ScatterDims::along(0, 2);
    let table = |b: &Builder| f32_param(b, "table", &[4, 3]);
    let ids = |b: &Builder, shape: &[usize]| b.parameter("ids", shape.to_vec(), DType::I32);
    let cases: Vec<(String, &str)> = vec![
        (
            indexing_error("gather", |b| {
                let f = f32_param(b, "f", &[2]);
                (table(b).take(&f, 0), line!()).1
            }),
            "indices must be i32, got f32[2]",
        ),
        (
            indexing_error("take", |b| (table(b).take(&ids(b, &[2]), 2), line!()).1),
            "axis 2 out of range for f32[4,3]",
        ),
        (
            indexing_error("take_along_dim", |b| {
                (table(b).take_along_dim(&ids(b, &[2, 2]), 1), line!()).1
            }),
            "must have the rank of f32[4,3] and its sizes except along dim 1",
        ),
        (
            indexing_error("embedding", |b| {
                let t = f32_param(b, "t", &[4, 3, 2]);
                (t.embedding(&ids(b, &[5])), line!()).1
            }),
            "the table f32[4,3,2] must be [vocabulary, features]",
        ),
        (
            indexing_error("index_add", |b| {
                let source = f32_param(b, "source", &[2, 4]);
                (table(b).index_add(0, &ids(b, &[2]), &source), line!()).1
            }),
            "a source of shape [2, 3] (got f32[2,4])",
        ),
        (
            indexing_error("gather", |b| {
                let dims = window(vec![1, 2], vec![], vec![5, 3]);
                (table(b).gather(&ids(b, &[2, 1]), &dims), line!()).1
            }),
            "slice size 5 does not fit dim 0 of f32[4,3]",
        ),
        (
            indexing_error("gather", |b| {
                let dims = window(vec![1], vec![0], vec![2, 3]);
                (table(b).gather(&ids(b, &[2, 1]), &dims), line!()).1
            }),
            "collapsed and batching dims must have slice size 1, dim 0 has 2",
        ),
        (
            indexing_error("gather", |b| {
                let dims = window(vec![1], vec![0], vec![1, 3]);
                (table(b).gather(&ids(b, &[2, 2]), &dims), line!()).1
            }),
            "index vectors of 2 components (dim 1 of i32[2,2]) for an index map of 1 entries",
        ),
        (
            indexing_error("gather", |b| {
                let dims = window(vec![1, 2], vec![0], vec![1, 3]);
                (table(b).gather(&ids(b, &[2, 1]), &dims), line!()).1
            }),
            "2 window dims [1, 2] for the 1 operand dims",
        ),
        (
            indexing_error("gather", |b| {
                let dims = GatherDims {
                    index_vector_dim: 3,
                    ..window(vec![1], vec![0], vec![1, 3])
                };
                (table(b).gather(&ids(b, &[2, 1]), &dims), line!()).1
            }),
            "index_vector_dim 3 out of range for indices i32[2,1]",
        ),
        (
            indexing_error("gather", |b| {
                let dims = GatherDims {
                    operand_batching_dims: vec![1],
                    start_indices_batching_dims: vec![0],
                    ..window(vec![], vec![0], vec![1, 1])
                };
                (table(b).gather(&ids(b, &[2, 1]), &dims), line!()).1
            }),
            "batching dims differ: operand dim 1 of f32[4,3] is 3 but indices dim 0 of i32[2,1] is 2",
        ),
        (
            indexing_error("scatter_add", |b| {
                let updates = f32_param(b, "updates", &[3, 3]);
                let (t, i) = (table(b), ids(b, &[2]));
                let (_y, line) = (t.scatter_add(&i, &updates, &rows), line!());
                line
            }),
            "updates dim 0 of f32[3,3] is 3 but the indices' batch dim is 2",
        ),
        (
            indexing_error("scatter", |b| {
                let dims = ScatterDims {
                    inserted_window_dims: vec![],
                    update_window_dims: vec![1, 2],
                    ..rows.clone()
                };
                let updates = f32_param(b, "updates", &[2, 5, 3]);
                (table(b).scatter(&ids(b, &[2]), &updates, &dims), line!()).1
            }),
            "the updates' window of 5 along operand dim 0 does not fit f32[4,3]",
        ),
        (
            indexing_error("scatter_add", |b| {
                let flags = b.parameter("flags", [4, 3], DType::Bool);
                let updates = b.parameter("updates", [2, 3], DType::Bool);
                (flags.scatter_add(&ids(b, &[2]), &updates, &rows), line!()).1
            }),
            "cannot add into pred[4,3]",
        ),
        (
            indexing_error("scatter", |b| {
                let updates = b.parameter("updates", [2, 3], DType::I32);
                (table(b).scatter(&ids(b, &[2]), &updates, &rows), line!()).1
            }),
            "updates i32[2,3] and operand f32[4,3] differ in dtype",
        ),
    ];
    for (message, needle) in cases {
        assert!(message.contains(needle), "{needle:?} not in {message:?}");
    }
}

// ---- control flow (regions) ----------------------------------------------------------

/// `b.scalar(v)` in the region builder of `t`.
fn scalar_beside(t: &Tensor, v: f32) -> Tensor {
    t.builder().scalar(v)
}

#[test]
fn while_body_returning_another_type_is_one_error_at_the_loop() {
    let b = Builder::new("t");
    let x = f32_param(&b, "x", &[4]);
    let line = line!() + 1;
    let r = b.while_loop(
        |s| s[0].sum(&[0]).lt(&scalar_beside(&s[0], 1.0)),
        |s| vec![s[0].sum(&[0])],
        &[x],
    );
    let _after = r[0].exp();
    let message = one_shape_error(b, "while", line);
    assert!(
        message.contains("the body region returns (f32[]) but the carried values are (f32[4])"),
        "{message}"
    );
}

#[test]
fn while_condition_must_be_a_bool_scalar() {
    let b = Builder::new("t");
    let x = f32_param(&b, "x", &[4]);
    let line = line!() + 1;
    let _r = b.while_loop(|s| s[0].sum(&[0]), |s| vec![s[0].exp()], &[x]);
    let message = one_shape_error(b, "while", line);
    assert!(
        message.contains("the condition must return one pred[] but returns (f32[])"),
        "{message}"
    );
}

#[test]
fn scan_stacked_operands_need_one_leading_dim() {
    let b = Builder::new("t");
    let (xs, ys) = (f32_param(&b, "xs", &[3, 2]), f32_param(&b, "ys", &[4, 2]));
    let init = f32_param(&b, "init", &[2]);
    let line = line!() + 1;
    let (carry, stacked) = b.scan(&[xs, ys], &[init], |c, x| {
        (vec![c[0].add(&x[0])], vec![x[1].clone()])
    });
    // The results are poisoned: using them records nothing more.
    let _more = carry[0].add(&stacked[0].sum(&[0]));
    let message = one_shape_error(b, "scan", line);
    assert!(
        message.contains("one leading dim: f32[3,2] and f32[4,2]"),
        "{message}"
    );
}

#[test]
fn scan_without_a_stacked_operand_points_to_fori_loop() {
    let b = Builder::new("t");
    let init = f32_param(&b, "init", &[2]);
    let line = line!() + 1;
    let (_carry, _) = b.scan(&[], &[init], |c, _| (vec![c[0].exp()], vec![]));
    let message = one_shape_error(b, "scan", line);
    assert!(message.contains("fori_loop"), "{message}");
}

#[test]
fn scan_body_changing_the_carried_type_is_an_error() {
    let b = Builder::new("t");
    let xs = f32_param(&b, "xs", &[3, 2]);
    let init = f32_param(&b, "init", &[2]);
    let line = line!() + 1;
    let (_carry, _ys) = b.scan(&[xs], &[init], |c, x| {
        (vec![c[0].convert(DType::I32)], vec![x[0].clone()])
    });
    let message = one_shape_error(b, "scan", line);
    assert!(
        message.contains("returns (i32[2], f32[2]) but the carried values are (f32[2])"),
        "{message}"
    );
}

#[test]
fn cond_predicate_must_be_a_bool_scalar() {
    let b = Builder::new("t");
    let x = f32_param(&b, "x", &[2]);
    let p = f32_param(&b, "p", &[]);
    let line = line!() + 1;
    let _r = b.cond(&p, |_| vec![x.exp()], |_| vec![x.neg()]);
    let message = one_shape_error(b, "cond", line);
    assert!(
        message.contains("the predicate must be pred[], got f32[]"),
        "{message}"
    );
}

#[test]
fn cond_branches_must_return_the_same_types() {
    let b = Builder::new("t");
    let x = f32_param(&b, "x", &[2]);
    let p = b.parameter("p", vec![], DType::Bool);
    let line = line!() + 1;
    let _r = b.cond(&p, |_| vec![x.exp()], |_| vec![x.sum(&[0])]);
    let message = one_shape_error(b, "cond", line);
    assert!(
        message.contains("the on_false region returns (f32[]) but on_true's results are (f32[2])"),
        "{message}"
    );
}

#[test]
fn a_bad_op_inside_a_body_is_one_error_at_its_line() {
    let b = Builder::new("t");
    let xs = f32_param(&b, "xs", &[3, 2]);
    let init = f32_param(&b, "init", &[2]);
    let line = line!() + 2;
    let (carry, _) = b.scan(&[xs], &[init], |c, x| {
        let bad = c[0].matmul(&x[0].reshape([1, 2]));
        (vec![bad], vec![])
    });
    let _after = carry[0].exp();
    let message = one_shape_error(b, "matmul", line);
    assert!(message.contains("inner dims 2 and 1 differ"), "{message}");
}

#[test]
fn a_value_of_a_body_used_after_it_is_an_error() {
    let b = Builder::new("t");
    let x = f32_param(&b, "x", &[2]);
    let mut leaked = None;
    let _r = b.fori_loop(2, std::slice::from_ref(&x), |_, c| {
        let y = c[0].exp();
        leaked = Some(y.clone());
        vec![y]
    });
    let leaked = leaked.unwrap();
    let line = line!() + 1;
    let _bad = x.add(&leaked);
    let message = one_shape_error(b, "trace", line);
    assert!(message.contains("traced inside a region"), "{message}");
}

#[test]
fn finishing_a_region_builder_is_an_error_not_a_broken_loop() {
    let b = Builder::new("t");
    let x = f32_param(&b, "x", &[2]);
    let mut finished = None;
    let line = line!() + 2;
    let r = b.fori_loop(2, &[x], |_, c| {
        finished = Some(c[0].builder().finish(&[&c[0]]));
        vec![c[0].exp()]
    });
    match finished.unwrap() {
        Err(Error::Shape { op, location, .. }) => {
            assert_eq!(op, "trace");
            assert_at(location, line);
        }
        other => panic!("expected an error, got {other:?}"),
    }
    // The loop itself is intact.
    let program = b.finish(&[&r[0]]).unwrap();
    verify(&program).unwrap();
}

/// A `fori_loop` counts in an i32 (as JAX's): a trip count past `i32::MAX` is an error
/// at the call, not a counter that wraps.
#[test]
fn fori_loop_trip_count_past_the_i32_counter() {
    let b = Builder::new("t");
    let x = f32_param(&b, "x", &[2]);
    let n = i32::MAX as usize + 1;
    let line = line!() + 1;
    let _r = b.fori_loop(n, std::slice::from_ref(&x), |_, c| vec![c[0].clone()]);
    let message = one_shape_error(b, "fori_loop", line);
    assert!(message.contains("2147483648"), "{message}");
    // The largest count that fits traces.
    let b = Builder::new("t");
    let x = f32_param(&b, "x", &[2]);
    let r = b.fori_loop(i32::MAX as usize, &[x], |_, c| vec![c[0].clone()]);
    b.finish(&[&r[0]]).unwrap();
}
