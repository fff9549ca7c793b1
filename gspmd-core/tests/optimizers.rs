//! Issue 26, item 4: optimizers as chains of gradient transformations (optax's design).
//! The re-expressed SGD, AdamW and Adafactor give bit for bit the parameters the closed
//! `Optimizer` enum gave before (fingerprints of its results, taken before it was
//! removed); Lion and a transform written here, outside the crate, match host
//! computations; state is sharded like its parameter; bad hyper-parameters are typed
//! errors; the defaults are optax's.

use gspmd_core::Error;
use gspmd_core::error::OptimizerProblem;
use gspmd_core::ir::{Builder, DType, Literal, Program, ValueId};
use gspmd_core::runtime::uniform_f32;
use gspmd_core::sharding::{Mesh, Sharding};
use gspmd_core::train::{
    Adafactor, AdamW, Emitter, Lion, Mask, Optimizer, Param, Schedule, Sgd, Slot, Trainer,
    Transform, add_decayed_weights, chain, check_hyper_parameters, clip_by_global_norm, scale,
    scale_by_adam, scale_by_learning_rate, scale_masked, step_program,
};
use ndarray::{Array1, Array2, Axis};
use rand::SeedableRng;
use rand::rngs::Xoshiro256PlusPlus;

fn s(text: &str) -> Sharding {
    text.parse().unwrap()
}

fn mesh() -> Mesh {
    Mesh::new([("data", 2), ("model", 4)]).unwrap()
}

/// `loss = mse(x w + b, target)`, `x: [8, 16]` over `data`, `w: [16, 8]` over both axes,
/// `b: [8]` over `model`; its initial parameters and four batches.
struct Dense {
    model: Program,
    initial: Vec<Literal>,
    batches: Vec<Vec<Literal>>,
}

fn dense() -> Dense {
    let rng = &mut Xoshiro256PlusPlus::seed_from_u64(26);
    let (batch, d, f) = (8, 16, 8);
    let b = Builder::new("dense");
    let x = b.parameter("x", [batch, d], DType::F32);
    let x = x.annotate(s("(data, _)"));
    let w = b.parameter("dense.w", [d, f], DType::F32);
    let w = w.annotate(s("(data, model)"));
    let bias = b.parameter("dense.bias", [f], DType::F32);
    let bias = bias.annotate(s("(model)"));
    let target = b.parameter("target", [batch, f], DType::F32);
    let target = target.annotate(s("(data, _)"));
    let y = &x.matmul(&w) + &bias.broadcast_in_dim([batch, f], &[1]);
    let loss = y.mse(&target);
    let model = b.finish(&[&loss]).unwrap();
    let initial = vec![
        uniform_f32(rng, &[d, f], -0.5, 0.5),
        uniform_f32(rng, &[f], -0.5, 0.5),
    ];
    let batches = (0..4)
        .map(|_| {
            vec![
                uniform_f32(rng, &[batch, d], -1.0, 1.0),
                uniform_f32(rng, &[batch, f], -1.0, 1.0),
            ]
        })
        .collect();
    Dense {
        model,
        initial,
        batches,
    }
}

const SCHEDULE: Schedule = Schedule::WarmupLinear {
    warmup: 2,
    total: 5,
    final_fraction: 0.1,
};

/// The trained parameters after all batches, on the interpreter and on a 2x4 mesh.
fn train(optimizer: &Optimizer) -> [Vec<(String, Literal)>; 2] {
    let p = dense();
    let step = step_program(&p.model, 0, &["dense.*"], optimizer).unwrap();
    let reference = Trainer::reference(step.clone(), p.initial.clone());
    let mesh = Trainer::on_mesh(step, mesh(), p.initial);
    [reference, mesh].map(|t| {
        let mut t = t.unwrap().with_schedule(SCHEDULE).unwrap();
        for batch in &p.batches {
            t.step(batch).unwrap();
        }
        t.params().unwrap()
    })
}

/// FNV-1a over the bits of every parameter.
fn fingerprint(params: &[(String, Literal)]) -> u64 {
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for (_, p) in params {
        for x in p.as_f32().unwrap() {
            for byte in x.to_bits().to_le_bytes() {
                h = (h ^ u64::from(byte)).wrapping_mul(0x100_0000_01b3);
            }
        }
    }
    h
}

/// Each optimizer as the chain of transforms gives the parameters the closed enum gave
/// (interpreter, 2x4 mesh), bit for bit: the fingerprints were printed by this test's
/// first version against the enum (`Sgd`, `AdamW { beta2: 0.99, weight_decay: 0 }`,
/// `StepOptions::clip_global_norm`, `Optimizer::adafactor`, which factored every
/// matrix and took the relative step). Re-recorded when small products moved to
/// `small_product.rs` (FMA, another summation order): with the previous product kernel
/// the first fingerprints still held, so the optimizers themselves did not change.
#[test]
fn re_expressed_optimizers_give_the_old_parameters_bit_for_bit() {
    let adamw = || -> Optimizer {
        AdamW {
            lr: 0.05,
            beta2: 0.99,
            weight_decay: 0.0,
            ..AdamW::new(0.05)
        }
        .into()
    };
    let adafactor = |relative_step, scale_parameter| -> Optimizer {
        Adafactor {
            relative_step,
            scale_parameter,
            min_dim_size_to_factor: 0,
            ..Adafactor::new(1e-2)
        }
        .into()
    };
    let cases = [
        (
            "sgd",
            Optimizer::sgd(0.1, 0.0),
            [0x44b3ea1f1e2218e4, 0x84b33aef36644d27],
        ),
        (
            "sgd momentum",
            Optimizer::sgd(0.1, 0.9),
            [0xfe0866527a07a50e, 0xc8f26786900a3944],
        ),
        ("adamw", adamw(), [0x0c8afe80912bae32, 0xc7511b964d96cf49]),
        (
            "clipped adamw",
            chain([clip_by_global_norm(0.5), adamw()]),
            [0x047906aba0330d58, 0xa56f76dfe8a6658f],
        ),
        (
            "adafactor",
            adafactor(true, true),
            [0x5841bd011e676f48, 0xa98a7bd5769a5549],
        ),
        (
            "adafactor, absolute step",
            adafactor(false, false),
            [0xbc26f656de106ded, 0x59e19cdecdc12b15],
        ),
    ];
    for (name, optimizer, want) in cases {
        let got = train(&optimizer).map(|p| fingerprint(&p));
        assert_eq!(got, want, "{name}: [interpreter, 2x4 mesh]");
    }
}

// ---- host computations --------------------------------------------------------------

fn matrix(l: &Literal) -> Array2<f64> {
    let a = l.as_f32().unwrap().mapv(f64::from);
    a.into_dimensionality().unwrap()
}

fn vector(l: &Literal) -> Array1<f64> {
    let a = l.as_f32().unwrap().mapv(f64::from);
    a.into_dimensionality().unwrap()
}

/// The gradients of the dense loss at `(w, b)` on `batch`, in f64.
fn gradients(w: &Array2<f64>, b: &Array1<f64>, batch: &[Literal]) -> (Array2<f64>, Array1<f64>) {
    let (x, target) = (matrix(&batch[0]), matrix(&batch[1]));
    let y = x.dot(w) + b;
    let dy = (y - target) * (2.0 / (x.nrows() * w.ncols()) as f64);
    (x.t().dot(&dy), dy.sum_axis(Axis(0)))
}

/// Host training of the dense problem: `update(t, g, w, state) -> new w`, for each
/// parameter (`w` then `b`, flattened) with its own state.
fn host_train<S: Default + Clone>(
    p: &Dense,
    mut update: impl FnMut(u64, &[f64], &mut [f64], &mut S),
) -> [Vec<f64>; 2] {
    let (mut w, mut b) = (matrix(&p.initial[0]), vector(&p.initial[1]));
    let mut state = [S::default(), S::default()];
    for (t, batch) in (1..).zip(&p.batches) {
        let (gw, gb) = gradients(&w, &b, batch);
        let [sw, sb] = &mut state;
        update(t, gw.as_slice().unwrap(), w.as_slice_mut().unwrap(), sw);
        update(t, gb.as_slice().unwrap(), b.as_slice_mut().unwrap(), sb);
    }
    [w.into_raw_vec_and_offset().0, b.into_raw_vec_and_offset().0]
}

fn assert_params_near(got: &[(String, Literal)], want: &[Vec<f64>], what: &str) {
    for ((name, got), want) in got.iter().zip(want) {
        let got = got.as_f32().unwrap();
        for (i, (g, w)) in got.iter().zip(want).enumerate() {
            assert!(
                (f64::from(*g) - w).abs() <= 1e-5,
                "{what}: {name}[{i}]: want {w}, got {g}"
            );
        }
    }
}

/// Lion (optax's defaults but the learning rate) equals optax's update rule on the
/// host over four steps, on the interpreter and a 2x4 mesh.
#[test]
fn lion_equals_a_host_computation() {
    let lr = 0.01;
    let got = train(&Optimizer::lion(lr));
    let want = host_train(&dense(), |t, g, w, m: &mut Vec<f64>| {
        let (b1, b2, wd) = (0.9, 0.99, 1e-3);
        let rate = f64::from(lr * SCHEDULE.factor(t));
        m.resize(g.len(), 0.0);
        for ((w, m), g) in w.iter_mut().zip(m.iter_mut()).zip(g) {
            let c = b1 * *m + (1.0 - b1) * g;
            *w -= rate * (c.signum() + wd * *w);
            *m = b2 * *m + (1.0 - b2) * g;
        }
    });
    assert_params_near(&got[0], &want, "interpreter");
    assert_params_near(&got[1], &want, "2x4 mesh");
}

/// A transform written outside the crate: the running mean of the updates,
/// `a = a + (u - a) / t` (state `mean`, host scalar `1 / t`).
#[derive(Debug)]
struct RunningMean;

impl Transform for RunningMean {
    fn name(&self) -> String {
        "running_mean".into()
    }

    fn slots(&self, _: &[usize]) -> Vec<Slot> {
        vec![Slot::like("mean")]
    }

    fn scalar_names(&self) -> Vec<String> {
        vec!["one_over_t".into()]
    }

    fn scalars(&self, t: u64, _: &Schedule) -> Vec<f32> {
        vec![1.0 / t as f32]
    }

    fn update(
        &self,
        e: &mut Emitter<'_, '_>,
        params: &mut [Param],
        scalars: &[ValueId],
    ) -> gspmd_core::Result<()> {
        e.each(params, |e, p| {
            let delta = e.sub(p.update, p.state[0])?;
            let step = e.mul_scalar(delta, scalars[0])?;
            p.update = e.add(p.state[0], step)?;
            p.state = vec![p.update];
            Ok(())
        })
    }
}

/// The user's transform chained before the crate's clipping and learning rate: SGD on
/// the running mean of the (clipped) gradients, equal to the host's.
#[test]
fn a_user_transform_works_in_a_chain() {
    let (lr, max) = (0.1, 0.3);
    let optimizer = chain([
        clip_by_global_norm(max),
        Optimizer::new(RunningMean),
        scale_by_learning_rate(lr),
    ]);
    let step = step_program(&dense().model, 0, &["dense.*"], &optimizer).unwrap();
    let inputs: Vec<&str> = (step.params.iter().flat_map(|p| &p.state))
        .map(|s| s.name.as_str())
        .collect();
    assert_eq!(inputs, ["mean(dense.w)", "mean(dense.bias)"]);
    let got = train(&optimizer);
    // The host: clip both gradients by their joint norm, then the running mean.
    let p = dense();
    let (mut w, mut b) = (matrix(&p.initial[0]), vector(&p.initial[1]));
    let (mut mw, mut mb) = (Array2::zeros(w.dim()), Array1::zeros(b.dim()));
    for (t, batch) in (1..).zip(&p.batches) {
        let (gw, gb) = gradients(&w, &b, batch);
        let norm = (gw.mapv(|x| x * x).sum() + gb.mapv(|x| x * x).sum()).sqrt();
        let clip = f64::from(max) / norm.max(f64::from(max));
        mw = &mw + (gw * clip - &mw) / t as f64;
        mb = &mb + (gb * clip - &mb) / t as f64;
        let rate = f64::from(lr * SCHEDULE.factor(t));
        w = w - &mw * rate;
        b = b - &mb * rate;
    }
    let want = [w.into_raw_vec_and_offset().0, b.into_raw_vec_and_offset().0];
    assert_params_near(&got[0], &want, "interpreter");
    assert_params_near(&got[1], &want, "2x4 mesh");
}

/// AdamW with decoupled weight decay (optax's order, `w - lr (u + wd w)`) and a mask
/// equals the host's over four steps; the masked bias does not decay.
#[test]
fn adamw_with_a_decay_mask_equals_a_host_computation() {
    let (lr, wd) = (0.05, 0.1);
    let adamw = AdamW {
        weight_decay: wd,
        mask: Mask::except(&["*.bias"]),
        ..AdamW::new(lr)
    };
    let got = train(&adamw.into());
    let mut which = 0;
    let want = host_train(&dense(), |t, g, w, s: &mut Vec<[f64; 2]>| {
        let (b1, b2, eps) = (0.9f64, 0.999f64, 1e-8);
        let decay = if which % 2 == 0 { f64::from(wd) } else { 0.0 };
        which += 1;
        let rate = f64::from(lr * SCHEDULE.factor(t));
        s.resize(g.len(), [0.0; 2]);
        for ((w, [m, v]), g) in w.iter_mut().zip(s.iter_mut()).zip(g) {
            *m = b1 * *m + (1.0 - b1) * g;
            *v = b2 * *v + (1.0 - b2) * g * g;
            let m_hat = *m / (1.0 - b1.powi(t as i32));
            let v_hat = *v / (1.0 - b2.powi(t as i32));
            *w -= rate * (m_hat / (v_hat.sqrt() + eps) + decay * *w);
        }
    });
    assert_params_near(&got[0], &want, "interpreter");
    assert_params_near(&got[1], &want, "2x4 mesh");
}

/// Per-parameter learning rates as μP's: `scale_masked` scales the SGD update of the
/// parameters its mask selects (`dense.w` by 1/16) and leaves the others; equals the
/// host's over four steps. A pattern that selects nothing is a typed error.
#[test]
fn scale_masked_scales_only_the_selected_parameters() {
    let lr = 0.1;
    let optimizer = chain([
        scale_masked(1.0 / 16.0, Mask::only(&["dense.w"])),
        scale_by_learning_rate(lr),
    ]);
    let got = train(&optimizer);
    let mut which = 0;
    let want = host_train(&dense(), |t, g, w, _: &mut ()| {
        let factor = if which % 2 == 0 { 1.0 / 16.0 } else { 1.0 };
        which += 1;
        let rate = f64::from(lr * SCHEDULE.factor(t));
        for (w, g) in w.iter_mut().zip(g) {
            *w -= rate * factor * g;
        }
    });
    assert_params_near(&got[0], &want, "interpreter");
    assert_params_near(&got[1], &want, "2x4 mesh");
    let misspelt = chain([
        scale_masked(0.5, Mask::only(&["dense.weight"])),
        scale_by_learning_rate(lr),
    ]);
    let err = step_program(&dense().model, 0, &["dense.*"], &misspelt).unwrap_err();
    assert!(
        matches!(&err, Error::Optimizer { problem: OptimizerProblem::UnusedMask { pattern }, .. } if pattern == "dense.weight"),
        "{err}"
    );
}

/// Every state tensor of the compiled step is sharded like its parameter: Lion's `m`
/// and AdamW's `m`, `v` take `dense.w`'s `(data, model)` and `dense.bias`'s `(model)`.
#[test]
fn state_is_sharded_like_its_parameter() {
    let p = dense();
    for optimizer in [Optimizer::lion(1e-3), Optimizer::adamw(1e-3)] {
        let step = step_program(&p.model, 0, &["dense.*"], &optimizer).unwrap();
        let exe = gspmd_core::compile(&step.program, &mesh()).unwrap();
        let inputs = &exe.spmd().inputs;
        for param in &step.params {
            let want = inputs[param.input].1.to_string();
            assert!(want.contains("model"), "{}: {want}", param.name);
            for slot in &param.state {
                assert_eq!(inputs[slot.input].1.to_string(), want, "{}", slot.name);
            }
        }
        let slots = step.params.iter().map(|p| p.state.len()).sum::<usize>();
        assert_eq!(slots, if optimizer.name() == "lion" { 2 } else { 4 });
    }
}

/// Out-of-range hyper-parameters, a mask pattern that matches nothing and two state
/// slots of one name are [`Error::Optimizer`]s naming the problem.
#[test]
fn bad_hyper_parameters_are_typed_errors() {
    let cases: Vec<(Optimizer, &str)> = vec![
        (
            Sgd {
                lr: f32::NAN,
                momentum: 0.0,
            }
            .into(),
            "lr = NaN",
        ),
        (Optimizer::sgd(0.1, 1.0), "momentum = 1"),
        (
            AdamW {
                beta2: 1.5,
                ..AdamW::new(0.1)
            }
            .into(),
            "beta2 = 1.5",
        ),
        (
            AdamW {
                eps: 0.0,
                ..AdamW::new(0.1)
            }
            .into(),
            "eps = 0",
        ),
        (
            Lion {
                beta1: -0.1,
                ..Lion::new(0.1)
            }
            .into(),
            "beta1 = -0.1",
        ),
        (
            Lion {
                weight_decay: -1.0,
                ..Lion::new(0.1)
            }
            .into(),
            "weight_decay = -1",
        ),
        (
            Adafactor {
                decay_rate: 0.0,
                ..Adafactor::new(0.1)
            }
            .into(),
            "decay_rate = 0",
        ),
        (
            Adafactor {
                clip_threshold: -1.0,
                ..Adafactor::new(0.1)
            }
            .into(),
            "threshold = -1",
        ),
        (
            chain([clip_by_global_norm(0.0), Optimizer::sgd(0.1, 0.0)]),
            "max = 0",
        ),
        (add_decayed_weights(-0.5, Mask::All), "weight_decay = -0.5"),
        (scale(f32::INFINITY), "factor = inf"),
        (scale_by_learning_rate(-1.0), "lr = -1"),
        (
            AdamW {
                mask: Mask::except(&["*.scale"]),
                ..AdamW::new(0.1)
            }
            .into(),
            "mask pattern `*.scale` matches no trained parameter",
        ),
        (
            chain([
                scale_by_adam(0.9, 0.999, 1e-8),
                scale_by_adam(0.9, 0.99, 1e-8),
            ]),
            "two state slots are named `m`",
        ),
    ];
    let model = dense().model;
    for (optimizer, want) in cases {
        match step_program(&model, 0, &["dense.*"], &optimizer) {
            Err(Error::Optimizer { problem, .. }) if problem.to_string().contains(want) => {}
            other => panic!("{optimizer:?}: want an optimizer error with `{want}`, got {other:?}"),
        }
    }
    // A user's transform checks its own with the crate's helper.
    let e = check_hyper_parameters(&RunningMean, &[("window", -2.0, false, "> 0")]);
    assert!(
        matches!(&e, Err(Error::Optimizer { problem: OptimizerProblem::HyperParameter { name, value, .. }, .. }) if (name.as_str(), *value) == ("window", -2.0)),
        "{e:?}"
    );
    assert!(
        e.unwrap_err()
            .to_string()
            .ends_with("window = -2 must be finite and > 0")
    );
}

/// The defaults are optax's (`adamw`, `lion`, `adafactor`); the remaining differences
/// are the documented ones.
#[test]
fn defaults_are_optaxs() {
    let adamw = AdamW::new(1e-3);
    assert_eq!(
        (
            adamw.beta1,
            adamw.beta2,
            adamw.eps,
            adamw.weight_decay,
            adamw.mask
        ),
        (0.9, 0.999, 1e-8, 1e-4, Mask::All)
    );
    let lion = Lion::new(1e-4);
    assert_eq!(
        (lion.beta1, lion.beta2, lion.weight_decay, lion.mask),
        (0.9, 0.99, 1e-3, Mask::All)
    );
    let a = Adafactor::new(1e-2);
    assert_eq!(
        (
            a.decay_rate,
            a.clip_threshold,
            a.eps1,
            a.eps2,
            a.weight_decay
        ),
        (0.8, 1.0, 1e-30, 1e-3, 0.0)
    );
    assert!(a.scale_parameter && !a.relative_step);
    assert_eq!(a.min_dim_size_to_factor, 128);
    // Factoring: the last two dims, both at least 128. optax factors the two largest
    // dims, so for [512, 64, 256] it would factor dims 0 and 2; this keeps one `v`.
    let slots = |shape: &[usize]| -> Vec<&str> {
        let o: Optimizer = Adafactor::new(1e-2).into();
        o.state_slots(shape)
            .unwrap()
            .iter()
            .map(|s| s.name)
            .collect()
    };
    assert_eq!(slots(&[256, 128]), ["v_row", "v_col"]);
    assert_eq!(slots(&[256, 64]), ["v"]);
    assert_eq!(slots(&[512, 64, 256]), ["v"]);
    assert_eq!(slots(&[1024]), ["v"]);
    // optax's Adafactor decays by `weight_decay w` not scaled by the step size: one
    // step of pure decay (zero gradient) moves w by exactly that.
    let b = Builder::new("decay");
    let w = b.parameter("w", [4], DType::F32);
    let zero = (&w - &w).sum(&[0]);
    let model = b.finish(&[&zero]).unwrap();
    let decayed: Optimizer = Adafactor {
        weight_decay: 0.25,
        ..Adafactor::new(1e-2)
    }
    .into();
    let step = step_program(&model, 0, &[0], &decayed).unwrap();
    let w0 = Literal::F32(ndarray::arr1(&[1.0f32, -2.0, 4.0, 8.0]).into_dyn());
    let mut t = Trainer::reference(step, vec![w0]).unwrap();
    t.step(&[]).unwrap();
    let w1: Vec<f32> = t.params().unwrap()[0]
        .1
        .as_f32()
        .unwrap()
        .iter()
        .copied()
        .collect();
    assert_eq!(w1, [0.75, -1.5, 3.0, 6.0]);
}
