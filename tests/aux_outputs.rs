//! Aux outputs (JAX's `has_aux`) of a training step and of an evaluation: a model
//! returning `(loss, accuracy, logits)` trained on a 2x4 [`ThreadMesh`], its aux
//! outputs compared with the [`Reference`] backend's and with a separate forward run of
//! the model by the reference interpreter; a sharded aux output returned with its
//! sharding, assembled or as blocks; the loss and the parameters bitwise the same with
//! and without aux outputs; and the typed errors of a name that does not exist.
//!
//! Tolerance between the mesh and the reference: |got - want| <= 1e-4 * max(1, max
//! |want|) (f32 sums in another order).

use gspmd::error::RequestProblem;
use gspmd::ndarray::{ArrayD, IxDyn};
use gspmd::prelude::*;
use gspmd::runtime::{Value, assemble};
use gspmd::train::{
    Batch, Fetch, Optimizer, StepOptions, StepOutput, TrainStep, Trainer, output_name,
    step_program, step_program_with,
};

/// A two-layer classifier returning its loss, its accuracy and its logits (sharded
/// over the batch).
#[gspmd::model(mesh = (data, model))]
fn classifier(
    #[shard(data, _)] x: Tensor<B, D>,
    #[shard(data)] labels: Tensor<B, i32>,
    #[shard(_, model)] w1: Tensor<D, H>,
    #[shard(model, _)] w2: Tensor<H, C>,
) -> (Tensor, Tensor, Tensor<B, C>) {
    #[shard(data, model)]
    let h = x.matmul(&w1).relu();
    #[shard(data, _)]
    let logits = h.matmul(&w2);
    let loss = logits.cross_entropy_with_logits(&labels);
    let hits = logits.argmax(-1).eq(&labels).convert(DType::F32);
    let accuracy = hits.mean(&[0]).named("accuracy");
    (loss, accuracy, logits)
}

const DIMS: classifier::Dims = classifier::Dims {
    B: 8,
    D: 16,
    H: 32,
    C: 4,
};

fn model() -> Program {
    classifier::trace(DIMS).unwrap()
}

fn mesh() -> Mesh {
    classifier::mesh([2, 4]).unwrap()
}

/// A deterministic f32 array of `shape`, values in [-1, 1), different for each `seed`.
fn values(shape: &[usize], seed: usize) -> Literal {
    let n: usize = shape.iter().product();
    let v: Vec<f32> = (0..n)
        .map(|i| ((i * 37 + seed * 101) % 61) as f32 / 30.5 - 1.0)
        .collect();
    Literal::F32(ArrayD::from_shape_vec(IxDyn(shape), v).unwrap())
}

/// The data of step `k`: inputs and labels.
fn batch(k: usize) -> Vec<Literal> {
    let labels: Vec<i32> = (0..DIMS.B).map(|i| ((i * 3 + k) % DIMS.C) as i32).collect();
    vec![
        values(&[DIMS.B, DIMS.D], k),
        Literal::I32(ArrayD::from_shape_vec(IxDyn(&[DIMS.B]), labels).unwrap()),
    ]
}

fn initial() -> Vec<Literal> {
    vec![values(&[DIMS.D, DIMS.H], 7), values(&[DIMS.H, DIMS.C], 8)]
}

fn step(aux: &[&str]) -> TrainStep {
    let options = StepOptions {
        aux: aux.iter().map(|s| s.to_string()).collect(),
        ..StepOptions::default()
    };
    step_program_with(
        &model(),
        0,
        &["w1", "w2"],
        &Optimizer::adamw(0.05),
        &options,
    )
    .unwrap()
}

fn f32s(literal: &Literal) -> Vec<f32> {
    literal.as_f32().unwrap().iter().copied().collect()
}

#[track_caller]
fn assert_close(got: &Literal, want: &Literal, what: &str) {
    assert_eq!(got.shape(), want.shape(), "{what}: shape");
    let (got, want) = (f32s(got), f32s(want));
    let scale = want.iter().fold(1.0f32, |m, x| m.max(x.abs()));
    for (i, (g, w)) in got.iter().zip(&want).enumerate() {
        assert!(
            (g - w).abs() <= 1e-4 * scale,
            "{what}[{i}]: {g} where the reference has {w}"
        );
    }
}

/// The outputs of `model` run forward by the interpreter on `data` and `trainer`'s
/// current parameters.
fn forward(model: &Program, trainer: &Trainer, data: &[Literal]) -> Vec<Literal> {
    let params = trainer.params().unwrap().into_iter().map(|p| p.1);
    let inputs: Vec<Literal> = data.iter().cloned().chain(params).collect();
    interpret(model, &inputs).unwrap()
}

fn global<'a>(out: &'a StepOutput, name: &str) -> &'a Literal {
    out.global(name)
        .unwrap_or_else(|| panic!("no global aux output `{name}` in {out:?}"))
}

#[test]
fn outputs_are_named_by_their_values() {
    let m = model();
    let names: Vec<String> = (0..3).map(|i| output_name(&m, i)).collect();
    assert_eq!(names[1..], ["accuracy", "logits"]);
    let s = step(&["*"]);
    let aux: Vec<(&str, usize)> = s.aux.iter().map(|a| (a.name.as_str(), a.output)).collect();
    let first = s.program.outputs.len() - 2;
    assert_eq!(aux, [("accuracy", first), ("logits", first + 1)]);
    assert!(step(&[]).aux.is_empty());
}

/// The aux outputs of each step on the mesh equal the reference backend's and the
/// model's own outputs run forward by the interpreter on the parameters before the
/// step; the parameters move, so three steps check aux outputs of changing weights.
#[test]
fn step_aux_outputs_match_the_reference_and_a_forward_run() {
    let s = step(&["accuracy", "logits"]);
    let mut mesh_trainer = Trainer::on_mesh(s.clone(), mesh(), initial()).unwrap();
    let mut reference = Trainer::reference(s, initial()).unwrap();
    let model = model();
    for k in 0..3 {
        let data = batch(k);
        let forward = forward(&model, &reference, &data);
        let got = mesh_trainer
            .step_with_aux(&Batch::Global(data.clone()))
            .unwrap();
        let want = reference.step_with_aux(&Batch::Global(data)).unwrap();
        assert_eq!(got.aux.len(), 2);
        assert_close(&Literal::scalar_f32(got.loss), &forward[0], "loss");
        for (i, name) in [(1, "accuracy"), (2, "logits")] {
            assert_close(global(&got, name), global(&want, name), name);
            assert_eq!(
                global(&want, name),
                &forward[i],
                "{name}: reference step vs forward"
            );
        }
        assert_eq!(global(&got, "accuracy").shape(), Vec::<usize>::new());
    }
}

/// The logits are sharded over the batch in the model; the compiled step returns them
/// so, and they come back assembled, or as each device's block when asked.
#[test]
fn sharded_aux_output_keeps_its_sharding() {
    let s = step(&["logits"]);
    let logits = s.aux[0].output;
    let mut trainer = Trainer::on_mesh(s.clone(), mesh(), initial()).unwrap();
    let (ty, sharding) = trainer.executable().spmd().outputs[logits].clone();
    assert_eq!(ty.shape, [DIMS.B, DIMS.C]);
    let want: Sharding = "(data, _)".parse().unwrap();
    assert_eq!(sharding.dims, want.dims, "{sharding}");
    let out = trainer
        .step_with(&Batch::Global(batch(0)), &[("logits", Fetch::Blocks)])
        .unwrap();
    let Some(Value::Shards(blocks)) = out.get("logits") else {
        panic!("logits as blocks: {out:?}");
    };
    assert_eq!(blocks.len(), 8);
    assert!(blocks.iter().all(|b| b.shape() == [DIMS.B / 2, DIMS.C]));
    let assembled = assemble(blocks, &sharding, &mesh(), &ty.shape).unwrap();
    let mut reference = Trainer::reference(s, initial()).unwrap();
    let want = reference.step_with_aux(&Batch::Global(batch(0))).unwrap();
    assert_close(&assembled, global(&want, "logits"), "assembled logits");
}

/// Adding aux outputs changes neither the loss nor the parameters, bit for bit.
#[test]
fn aux_outputs_leave_loss_and_parameters_bitwise_unchanged() {
    let plain = step_program(&model(), 0, &["w1", "w2"], &Optimizer::adamw(0.05)).unwrap();
    let mut without = Trainer::on_mesh(plain, mesh(), initial()).unwrap();
    let mut with = Trainer::on_mesh(step(&["*"]), mesh(), initial()).unwrap();
    for k in 0..3 {
        let a = without.step(&batch(k)).unwrap();
        let b = with.step_with_aux(&Batch::Global(batch(k))).unwrap();
        assert_eq!(a.to_bits(), b.loss.to_bits(), "loss of step {k}");
        assert_eq!(b.aux.len(), 2);
    }
    assert_eq!(without.params().unwrap(), with.params().unwrap());
    // A step that asks for no aux output returns none.
    let out = with.step_with(&Batch::Global(batch(3)), &[]).unwrap();
    assert!(out.aux.is_empty());
}

/// The evaluator returns the model's other outputs by name: on the mesh as on the
/// reference, equal to a forward run, and the loss as `evaluate` gives it.
#[test]
fn evaluator_returns_named_outputs() {
    let s = step(&[]);
    let model = model();
    let mut trainer = Trainer::on_mesh(s.clone(), mesh(), initial()).unwrap();
    let mut reference = Trainer::reference(s, initial()).unwrap();
    trainer.step(&batch(0)).unwrap();
    reference.step(&batch(0)).unwrap();
    let eval = trainer.evaluator(&model, 0).unwrap();
    let reference_eval = reference.evaluator(&model, 0).unwrap();
    let data = batch(5);
    let got = trainer.evaluate_with_aux(&eval, &data).unwrap();
    let want = reference.evaluate_with_aux(&reference_eval, &data).unwrap();
    let names: Vec<&str> = got.aux.iter().map(|(n, _)| n.as_str()).collect();
    assert_eq!(names, ["accuracy", "logits"]);
    assert_eq!(got.loss, trainer.evaluate(&eval, &data).unwrap());
    let forward = forward(&model, &reference, &data);
    assert_eq!(Literal::scalar_f32(want.loss), forward[0]);
    for (i, name) in [(1, "accuracy"), (2, "logits")] {
        assert_close(global(&got, name), global(&want, name), name);
        assert_eq!(global(&want, name), &forward[i], "{name}");
    }
    // One output, as blocks.
    let one = trainer
        .evaluate_with(&eval, &data, &[("logits", Fetch::Blocks)])
        .unwrap();
    assert!(matches!(one.get("logits"), Some(Value::Shards(b)) if b.len() == 8));
    assert!(one.get("accuracy").is_none());
}

#[test]
fn unknown_aux_names_are_typed_errors() {
    let e = step_program_with(
        &model(),
        0,
        &["w1", "w2"],
        &Optimizer::adamw(0.05),
        &StepOptions {
            aux: vec!["acuracy".into()],
            ..StepOptions::default()
        },
    );
    assert!(
        matches!(&e, Err(Error::TrainRequest { problem: RequestProblem::UnmatchedAux { pattern, .. }, .. }) if pattern == "acuracy"),
        "{e:?}"
    );
    // The loss is not an aux output of itself.
    let e = step_program_with(
        &model(),
        0,
        &["w1", "w2"],
        &Optimizer::adamw(0.05),
        &StepOptions {
            aux: vec![output_name(&model(), 0)],
            ..StepOptions::default()
        },
    );
    assert!(matches!(e, Err(Error::TrainRequest { .. })), "{e:?}");
    let e = step_program_with(
        &model(),
        0,
        &["w1", "w2"],
        &Optimizer::adamw(0.05),
        &StepOptions {
            aux: vec!["accuracy".into()],
            accumulate: Some(2),
        },
    );
    assert!(matches!(e, Err(Error::TrainRequest { .. })), "{e:?}");

    // Two outputs of one name cannot both be aux outputs.
    let b = Builder::new("twins");
    let x = b.parameter("x", vec![4], DType::F32);
    let loss = (&x * &x).sum(&[0]);
    let (y, z) = ((&x * 2.0).named("y"), (&x * 3.0).named("y"));
    let twins = b.finish(&[&loss, &y, &z]).unwrap();
    let e = step_program_with(
        &twins,
        0,
        &[0],
        &Optimizer::adamw(0.05),
        &StepOptions {
            aux: vec!["y".into()],
            ..StepOptions::default()
        },
    );
    assert!(
        matches!(&e, Err(Error::TrainRequest { problem: RequestProblem::RepeatedAux { first: 1, second: 2, name }, .. }) if name == "y"),
        "{e:?}"
    );

    let mut trainer = Trainer::on_mesh(step(&["accuracy"]), mesh(), initial()).unwrap();
    let e = trainer.step_with(&Batch::Global(batch(0)), &[("logits", Fetch::Global)]);
    assert!(
        matches!(&e, Err(Error::UnknownOutput { name, available, .. })
            if name == "logits" && available == &["accuracy"]),
        "{e:?}"
    );
    assert_eq!(trainer.steps_done(), 0, "no step ran");
    let eval = trainer.evaluator(&model(), 0).unwrap();
    let e = trainer.evaluate_with(&eval, &batch(0), &[("loss", Fetch::Global)]);
    assert!(matches!(e, Err(Error::UnknownOutput { .. })), "{e:?}");
}
