//! Bad models (issue 29, the runtime half): loop bodies returning another number of
//! carried values than the loop carries (every loop form, one check); a value traced in
//! a loop body used outside it; initializer rules with parameters that cannot draw;
//! trainable patterns selecting a parameter twice. Each is one typed error naming the
//! user's line or the parameter, none silently accepted.

use gspmd::error::{InputProblem, RequestProblem};
use gspmd::ir::{Builder, DType, Tensor};
use gspmd::prelude::*;
use gspmd::train::{Init, Initializer, Optimizer, step_program};

/// The one [`Error::Shape`] of `b`'s program: its op and message, at `line`.
#[track_caller]
fn one_shape_error(b: Builder, outputs: &[&Tensor], line: u32) -> (&'static str, String) {
    match b.finish(outputs) {
        Err(Error::Shape {
            op,
            location,
            message,
        }) => {
            assert_eq!(location.line, line, "{message}");
            assert!(location.file.ends_with("bad_models.rs"), "{location}");
            (op, message)
        }
        Err(other) => panic!("expected one shape error, got {other:?}"),
        Ok(_) => panic!("expected an error, got a program"),
    }
}

fn f32_param(b: &Builder, name: &str, shape: &[usize]) -> Tensor {
    b.parameter(name, shape.to_vec(), DType::F32)
}

// ---- carried arity: one check for every loop form ----------------------------------

#[test]
fn scan_body_returning_more_carried_values_than_it_carries() {
    let b = Builder::new("t");
    let (xs, init) = (f32_param(&b, "xs", &[3, 2]), f32_param(&b, "init", &[2]));
    let line = line!() + 1;
    let (carry, ys) = b.scan(&[xs], &[init], |c, x| {
        (vec![c[0].add(&x[0]), c[0].clone()], vec![x[0].exp()])
    });
    // The results are poisoned: using them adds no error.
    let out = carry[0].add(&ys[0].sum(&[0]));
    let (op, message) = one_shape_error(b, &[&out], line);
    assert_eq!(op, "scan");
    assert!(
        message.contains("the body returns 2 carried values but the loop carries 1"),
        "{message}"
    );
}

#[test]
fn scan_body_returning_fewer_carried_values_than_it_carries() {
    let b = Builder::new("t");
    let xs = f32_param(&b, "xs", &[3, 2]);
    let (a, c) = (f32_param(&b, "a", &[2]), f32_param(&b, "c", &[2]));
    // The y has the second carried value's type: without the check it would be taken
    // for it.
    let line = line!() + 1;
    let (carry, _) = b.scan(&[xs], &[a, c], |c, x| {
        (vec![c[0].add(&x[0])], vec![c[1].clone()])
    });
    let (op, message) = one_shape_error(b, &[&carry[0]], line);
    assert_eq!(op, "scan");
    assert!(
        message.contains("the body returns 1 carried values but the loop carries 2"),
        "{message}"
    );
}

#[test]
fn fori_loop_body_returning_more_carried_values_than_it_carries() {
    let b = Builder::new("t");
    let x = f32_param(&b, "x", &[2]);
    let line = line!() + 1;
    let out = b.fori_loop(3, &[x], |_, c| vec![c[0].exp(), c[0].neg()]);
    let (op, message) = one_shape_error(b, &[&out[0]], line);
    assert_eq!(op, "fori_loop");
    // The counter the loop carries itself is not counted.
    assert!(
        message.contains("the body returns 2 carried values but the loop carries 1"),
        "{message}"
    );
}

#[test]
fn fori_loop_body_returning_no_carried_value() {
    let b = Builder::new("t");
    let x = f32_param(&b, "x", &[2]);
    let line = line!() + 1;
    let out = b.fori_loop(3, std::slice::from_ref(&x), |_, _| vec![]);
    assert_eq!(out.len(), 1);
    let (op, message) = one_shape_error(b, &[&out[0]], line);
    assert_eq!(op, "fori_loop");
    assert!(
        message.contains("the body returns 0 carried values but the loop carries 1"),
        "{message}"
    );
}

#[test]
fn while_loop_body_returning_more_carried_values_than_it_carries() {
    let b = Builder::new("t");
    let x = f32_param(&b, "x", &[2]);
    let line = line!() + 1;
    let out = b.while_loop(
        |s| s[0].sum(&[0]).lt(&s[0].builder().scalar(1.0)),
        |s| vec![s[0].exp(), s[0].neg()],
        &[x],
    );
    let (op, message) = one_shape_error(b, &[&out[0]], line);
    assert_eq!(op, "while");
    assert!(
        message.contains("the body returns 2 carried values but the loop carries 1"),
        "{message}"
    );
}

// ---- values of a loop body used outside it -------------------------------------------

/// A `fori_loop` in `b` whose body also hands a value it traced to the caller: the
/// loop's result and that value.
fn loop_leaking_a_value(b: &Builder) -> (Tensor, Tensor) {
    let x = f32_param(b, "x", &[2]);
    let mut leaked = None;
    let out = b.fori_loop(3, &[x], |_, c| {
        let y = c[0].exp();
        leaked = Some(y.clone());
        vec![y]
    });
    (out[0].clone(), leaked.unwrap())
}

#[test]
fn loop_body_value_returned_as_a_program_output() {
    let b = Builder::new("t");
    let (out, leaked) = loop_leaking_a_value(&b);
    let line = line!() + 1;
    let (_, message) = one_shape_error(b, &[&out, &leaked], line);
    assert!(
        message.contains("traced inside a region (a loop body or branch) was used outside it"),
        "{message}"
    );
}

#[test]
fn loop_body_value_used_after_the_loop_is_one_error() {
    let b = Builder::new("t");
    let (out, leaked) = loop_leaking_a_value(&b);
    let line = line!() + 1;
    let sum = out.add(&leaked);
    // Used again, and returned: still the one error, at the first use.
    let more = sum.exp();
    let (_, message) = one_shape_error(b, &[&more, &sum], line);
    assert!(message.contains("was used outside it"), "{message}");
}

// ---- initializers and trainable patterns -----------------------------------------------

/// The [`Error::TrainerInput`] message for parameter `w` shaped `shape` under `init`.
#[track_caller]
fn init_error(init: Init, shape: &[usize]) -> String {
    match Initializer::new(7).rule("w", init).global("w", shape) {
        Err(Error::TrainerInput {
            name,
            problem: InputProblem::Invalid { reason },
        }) => {
            assert_eq!(name, "w");
            reason
        }
        other => panic!("expected TrainerInput, got {other:?}"),
    }
}

#[test]
fn initializer_with_a_nan_or_infinite_parameter() {
    let m = init_error(Init::Normal { std: f32::NAN }, &[2, 2]);
    assert!(m.contains("standard deviation is NaN"), "{m}");
    let m = init_error(
        Init::Uniform {
            bound: f32::INFINITY,
        },
        &[2, 2],
    );
    assert!(m.contains("bound is inf"), "{m}");
    let m = init_error(
        Init::FanIn {
            scale: f32::NEG_INFINITY,
            in_dims: vec![0],
        },
        &[2, 2],
    );
    assert!(m.contains("scale is -inf"), "{m}");
    let m = init_error(Init::Normal { std: -1.0 }, &[2, 2]);
    assert!(m.contains("not negative"), "{m}");
}

#[test]
fn fan_in_initializer_of_the_wrong_rank() {
    let m = init_error(Init::fan_in(&[2]), &[4, 3]);
    assert!(m.contains("input dim 2 is not a dim"), "{m}");
    let m = init_error(Init::NormalFanIn { in_dims: vec![1] }, &[4]);
    assert!(m.contains("input dim 1 is not a dim"), "{m}");
    let m = init_error(Init::fan_in(&[0, 0]), &[4, 3]);
    assert!(m.contains("names input dim 0 twice"), "{m}");
    // The rule fits a matrix.
    let w = Initializer::new(7)
        .rule("w", Init::fan_in(&[0]))
        .global("w", &[4, 3]);
    assert!(w.unwrap().as_f32().unwrap().iter().all(|v| v.abs() <= 0.5));
}

/// `loss = mean((x @ w + bias)^2)`.
fn regression() -> Program {
    let b = Builder::new("regression");
    let x = f32_param(&b, "x", &[4, 8]);
    let w = f32_param(&b, "w", &[8, 2]);
    let bias = f32_param(&b, "bias", &[2]);
    let y = &x.matmul(&w) + &bias.broadcast_to([4, 2]);
    let loss = (&y * &y).mean(&[0, 1]);
    b.finish(&[&loss]).unwrap()
}

/// The [`Error::TrainRequest`] problem of training `patterns` of the regression.
#[track_caller]
fn pattern_error(patterns: &[&str]) -> RequestProblem {
    let sgd = Optimizer::sgd(0.1, 0.0);
    match step_program(&regression(), 0, patterns, &sgd) {
        Err(Error::TrainRequest { problem, .. }) => problem,
        Err(other) => panic!("expected TrainRequest, got {other:?}"),
        Ok(_) => panic!("expected TrainRequest, got a step"),
    }
}

#[test]
fn trainable_pattern_given_twice() {
    let p = pattern_error(&["w", "w"]);
    assert!(
        p.to_string()
            .contains("patterns `w` and `w` both select parameter `w`"),
        "{p}"
    );
    let overlap = RequestProblem::OverlappingPatterns {
        first: "w".into(),
        second: "w".into(),
        name: "w".into(),
    };
    assert_eq!(p, overlap);
}

#[test]
fn trainable_patterns_that_overlap() {
    let p = pattern_error(&["w", "*"]);
    let overlap = RequestProblem::OverlappingPatterns {
        first: "w".into(),
        second: "*".into(),
        name: "w".into(),
    };
    assert_eq!(p, overlap, "{p}");
    // Disjoint patterns are fine.
    let sgd = Optimizer::sgd(0.1, 0.0);
    assert!(step_program(&regression(), 0, &["w", "b*"], &sgd).is_ok());
}
