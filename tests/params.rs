//! Parameter structs (`#[gspmd::params]`): leaf names, shapes, shardings and
//! initialisers from field paths through nested structs, `Vec` and `Stacked` layers;
//! `trace` against `trace_shapes`; typed errors for shape symbols; `scan` over a stack
//! against the unrolled loop; a struct model trained on a 2x4 thread mesh against the
//! reference backend, its trainable globs, weight-decay mask and checkpoint by name.

use gspmd::params::Size;
use gspmd::prelude::*;
use gspmd::train::{AdamW, Init, Mask, Trainable, Trainer, param_names, step_program};

#[gspmd::params(mesh = (data, model))]
pub struct Ffn {
    #[shard(data, model)]
    #[init(fan_in(0))]
    pub w1: Tensor<D, F>,
    #[shard(model, data)]
    #[init(normal(0.5))]
    pub w2: Tensor<F, D>,
}

#[gspmd::params(mesh = (data, model))]
pub struct Block {
    #[shard(model)]
    #[init(ones)]
    pub scale: Tensor<D>,
    pub ffn: Ffn,
}

#[gspmd::params(mesh = (data, model))]
pub struct Net {
    #[shard(model, _, name = "embedding")]
    #[init(uniform(0.1))]
    pub embed: Tensor<V, D>,
    pub layers: Stacked<Block, L>,
    pub heads: Vec<Ffn, 2>,
    #[init(zeros)]
    pub bias: Tensor<D>,
}

/// One residual layer: `h + scale * ffn(h)`.
fn residual(h: &Tensor, layer: &Block) -> Tensor {
    let ffn = h.matmul(&layer.ffn.w1).relu().matmul(&layer.ffn.w2);
    let scale = layer.scale.broadcast_in_dim(h.shape().to_vec(), &[1]);
    h + &(&ffn * &scale)
}

/// The sum of squares of the heads' output (plus the bias) for `h` out of the layers.
fn heads_loss(h: Tensor, p: &Net) -> Tensor {
    let shape = h.shape().to_vec();
    let h = (p.heads.iter()).fold(h, |h, head| h.matmul(&head.w1).tanh().matmul(&head.w2));
    let y = &h + &p.bias.broadcast_in_dim(shape, &[1]);
    (&y * &y).sum(&[0, 1]) * 0.01
}

/// [`heads_loss`] after the layers as a Python-style loop.
#[gspmd::model(mesh = (data, model))]
pub fn net(#[shard(data, _)] x: Tensor<B, D>, #[params(V, D, L, F)] p: &Net) -> Tensor {
    let shape = x.shape().to_vec();
    let mut h = &x + &p.embed.sum(&[0]).broadcast_in_dim(shape, &[1]);
    for l in 0..p.layers.len() {
        h = residual(&h, &p.layers.layer(l));
    }
    heads_loss(h, p)
}

/// [`net`] with the layers as one `scan` op.
#[gspmd::model(mesh = (data, model))]
pub fn scanned(#[shard(data, _)] x: Tensor<B, D>, #[params(V, D, L, F)] p: &Net) -> Tensor {
    let shape = x.shape().to_vec();
    let h = &x + &p.embed.sum(&[0]).broadcast_in_dim(shape, &[1]);
    let carry = p
        .layers
        .scan(&[h], |layer, carry| vec![residual(&carry[0], layer)]);
    heads_loss(carry[0].clone(), p)
}

/// [`scanned`] with the layers' scan saving their products for the backward pass.
#[gspmd::model(mesh = (data, model))]
pub fn scanned_dots(#[shard(data, _)] x: Tensor<B, D>, #[params(V, D, L, F)] p: &Net) -> Tensor {
    let shape = x.shape().to_vec();
    let h = &x + &p.embed.sum(&[0]).broadcast_in_dim(shape, &[1]);
    let options = ScanOptions::new().remat(Remat::DotsSaveable);
    let carry = (p.layers).scan_with(&[h], options, |layer, carry| {
        vec![residual(&carry[0], layer)]
    });
    heads_loss(carry[0].clone(), p)
}

fn dims() -> net::Dims {
    net::Dims {
        B: 4,
        V: 8,
        D: 8,
        L: 3,
        F: 16,
    }
}

const NAMES: [&str; 10] = [
    "x",
    "embedding",
    "layers.scale",
    "layers.ffn.w1",
    "layers.ffn.w2",
    "heads.0.w1",
    "heads.0.w2",
    "heads.1.w1",
    "heads.1.w2",
    "bias",
];

/// Deterministic values for every parameter of `program`.
fn inputs(program: &Program) -> Vec<Literal> {
    (program.params.iter().enumerate())
        .map(|(k, &p)| {
            let shape = program.ty(p).shape.clone();
            let shape_len = shape.len();
            Literal::from(gspmd::ndarray::ArrayD::from_shape_fn(shape, |i| {
                let n: usize = (0..shape_len).map(|d| i[d] * (d + 1)).sum();
                ((n * 7 + k * 3) % 11) as f32 / 11.0 - 0.5
            }))
        })
        .collect()
}

#[test]
fn leaves_are_parameters_named_by_field_path_in_field_order() {
    let program = net::trace(dims()).unwrap();
    assert_eq!(param_names(&program), NAMES);
    let shapes: Vec<Vec<usize>> = (program.params.iter())
        .map(|&p| program.ty(p).shape.clone())
        .collect();
    let want: [&[usize]; 10] = [
        &[4, 8],
        &[8, 8],
        &[3, 8],
        &[3, 8, 16],
        &[3, 16, 8],
        &[8, 16],
        &[16, 8],
        &[8, 16],
        &[16, 8],
        &[8],
    ];
    assert_eq!(shapes, want);
    // The struct alone: its symbols, and its declarations for given sizes.
    assert_eq!(Net::symbols(), ["V", "D", "L", "F"]);
    let leaves = Net::declarations(&[("V", 8), ("D", 8), ("L", 3), ("F", 16)]).unwrap();
    let names: Vec<&str> = leaves.iter().map(|l| l.name.as_str()).collect();
    assert_eq!(names, NAMES[1..]);
    assert_eq!(
        leaves[2].dims,
        [Size::Symbol("L"), Size::Symbol("D"), Size::Symbol("F")]
    );
}

#[test]
fn shardings_come_from_the_fields_with_a_replicated_dim_per_stack() {
    let program = net::trace(dims()).unwrap();
    let shardings: Vec<String> = (program.params.iter())
        .map(|&p| {
            let sharding = program.node(p).annotation.as_ref();
            sharding.map_or("none".into(), ToString::to_string)
        })
        .collect();
    assert_eq!(
        shardings,
        [
            "(data, _)",
            "(model, _)",
            "(_, model)",
            "(_, data, model)",
            "(_, model, data)",
            "(data, model)",
            "(model, data)",
            "(data, model)",
            "(model, data)",
            "none",
        ]
    );
}

#[test]
fn initializer_has_a_rule_per_initialised_leaf_with_stacked_fan_in_shifted() {
    let init = Net::initializer(5);
    assert_eq!(init.seed, 5);
    let rule = |name: &str| init.init_of(name).unwrap().clone();
    assert_eq!(rule("embedding"), Init::Uniform { bound: 0.1 });
    assert_eq!(rule("layers.scale"), Init::Ones);
    assert_eq!(rule("layers.ffn.w1"), Init::fan_in(&[1]));
    assert_eq!(rule("layers.ffn.w2"), Init::Normal { std: 0.5 });
    // `Vec` leaves get one glob rule for every copy.
    assert_eq!(rule("heads.0.w1"), Init::fan_in(&[0]));
    assert_eq!(rule("heads.1.w2"), Init::Normal { std: 0.5 });
    assert_eq!(rule("bias"), Init::Zeros);
    // The data parameter has no rule.
    assert!(init.init_of("x").is_err());
    // The values: ones and zeros where declared, fan-in bounds on the stacked weight.
    let w1 = init.global("layers.ffn.w1", &[3, 8, 16]).unwrap();
    let bound = 1.0 / 8f32.sqrt();
    let w1 = w1.as_f32().unwrap();
    assert!(w1.iter().all(|v| v.abs() <= bound) && w1.iter().any(|v| v.abs() > bound / 2.0));
    let scale = init.global("layers.scale", &[3, 8]).unwrap();
    assert!(scale.as_f32().unwrap().iter().all(|&v| v == 1.0));
}

#[test]
fn trace_and_trace_shapes_make_the_same_program() {
    let program = net::trace(dims()).unwrap();
    let shapes: Vec<Vec<usize>> = (program.params.iter())
        .map(|&p| program.ty(p).shape.clone())
        .collect();
    let shapes: Vec<&[usize]> = shapes.iter().map(Vec::as_slice).collect();
    assert_eq!(net::trace_shapes(&shapes).unwrap(), program);
    // A leaf's shape that disagrees with an earlier parameter about a symbol.
    let mut bad = shapes.clone();
    bad[3] = &[3, 8, 12];
    let err = net::trace_shapes(&bad).unwrap_err();
    assert!(
        matches!(&err, Error::SymbolConflict { symbol, second_param, .. }
            if symbol == "F" && second_param == "layers.ffn.w2"),
        "{err}"
    );
    let err = net::trace_shapes(&shapes[..9]).unwrap_err();
    assert!(
        matches!(
            err,
            Error::ArgumentCount {
                expected: 10,
                given: 9,
                ..
            }
        ),
        "{err}"
    );
}

/// `#[params(..)]` missing `F`.
#[gspmd::model(mesh = (data, model))]
pub fn missing(x: Tensor<B, D>, #[params(V, D, L)] p: &Net) -> Tensor<B, D> {
    &x + &p.bias.broadcast_in_dim(x.shape().to_vec(), &[1])
}

/// `#[params(..)]` with `E`, which `Net` does not use.
#[gspmd::model(mesh = (data, model))]
pub fn extra(x: Tensor<B, D>, #[params(V, D, L, F, E)] p: &Net) -> Tensor<B, D> {
    &x + &p.bias.broadcast_in_dim(x.shape().to_vec(), &[1])
}

#[gspmd::params(mesh = (data, model))]
pub struct Deep {
    pub blocks: Vec<Ffn, N>,
}

#[gspmd::model(mesh = (data, model))]
pub fn deep(x: Tensor<B, D>, #[params(N, D, F)] p: &Deep) -> Tensor<B, D> {
    p.blocks
        .iter()
        .fold(x, |h, b| h.matmul(&b.w1).matmul(&b.w2))
}

#[test]
fn symbols_a_model_lists_wrongly_are_typed_errors_naming_the_symbol() {
    let dims = missing::Dims {
        B: 2,
        D: 4,
        V: 4,
        L: 1,
    };
    let err = missing::trace(dims).unwrap_err();
    assert!(
        matches!(&err, Error::ParamsSymbol { model, param, symbol, .. }
            if model == "missing" && param == "p" && symbol == "F"),
        "{err}"
    );
    assert!(err.to_string().contains("#[params(V, D, L, F)]"), "{err}");
    let dims = extra::Dims {
        B: 2,
        D: 4,
        V: 4,
        L: 1,
        F: 4,
        E: 3,
    };
    let err = extra::trace(dims).unwrap_err();
    assert!(
        matches!(&err, Error::ParamsSymbol { symbol, .. } if symbol == "E"),
        "{err}"
    );
    // A `Vec` length: sized by `trace`, unknown to `trace_shapes` (no earlier tensor
    // binds it).
    let program = deep::trace(deep::Dims {
        B: 2,
        D: 4,
        N: 3,
        F: 8,
    })
    .unwrap();
    assert_eq!(param_names(&program)[1..3], ["blocks.0.w1", "blocks.0.w2"]);
    assert_eq!(program.params.len(), 7);
    let err = deep::trace_shapes(&[&[2, 4], &[4, 8], &[8, 4]]).unwrap_err();
    assert!(
        matches!(&err, Error::ParamsSymbol { symbol, .. } if symbol == "N"),
        "{err}"
    );
}

#[test]
fn scan_over_a_stack_equals_the_unrolled_layers_on_a_2x4_mesh() {
    let unrolled = net::trace(dims()).unwrap();
    let scan = scanned::trace(scanned::Dims {
        B: 4,
        V: 8,
        D: 8,
        L: 3,
        F: 16,
    })
    .unwrap();
    assert!(scan.nodes.len() < unrolled.nodes.len());
    let inputs = inputs(&unrolled);
    let want = interpret(&unrolled, &inputs).unwrap();
    let mesh = scanned::mesh([2, 4]).unwrap();
    let got = compile(&scan, &mesh)
        .unwrap()
        .run(&ThreadMesh::new(mesh).unwrap(), &inputs)
        .unwrap();
    let (w, g) = (want[0].as_f32().unwrap(), got[0].as_f32().unwrap());
    let (w, g) = (w.iter().next().unwrap(), g.iter().next().unwrap());
    assert!((w - g).abs() <= 1e-4 * w.abs().max(1.0), "{w} vs {g}");
}

/// A model's scan with a remat policy (`Stacked::scan_with`): its scan op carries the
/// policy, and the gradients of every parameter are those of [`scanned`]'s, bitwise on
/// the reference.
#[test]
fn a_stack_scanned_under_dots_saveable_has_the_same_gradients() {
    use gspmd::autodiff::grad;
    use gspmd::ir::{Flow, Op};
    let sizes = |d: net::Dims| (d.B, d.V, d.D, d.L, d.F);
    let (b, v, d, l, f) = sizes(dims());
    let plain = scanned::trace(scanned::Dims {
        B: b,
        V: v,
        D: d,
        L: l,
        F: f,
    })
    .unwrap();
    let dots = scanned_dots::trace(scanned_dots::Dims {
        B: b,
        V: v,
        D: d,
        L: l,
        F: f,
    })
    .unwrap();
    let remat = (dots.nodes.iter()).find_map(|n| match &n.op {
        Op::Flow { flow, .. } => match flow.as_ref() {
            Flow::Scan { remat, .. } => Some(*remat),
            _ => None,
        },
        _ => None,
    });
    assert_eq!(remat, Some(Remat::DotsSaveable));
    let wrt: Vec<usize> = (1..plain.params.len()).collect();
    let inputs = inputs(&plain);
    let want = interpret(&grad(&plain, 0, &wrt).unwrap(), &inputs).unwrap();
    let got = interpret(&grad(&dots, 0, &wrt).unwrap(), &inputs).unwrap();
    assert_eq!(got, want);
}

#[test]
fn a_struct_model_trains_on_a_2x4_thread_mesh_as_on_the_reference() {
    let model = net::trace(dims()).unwrap();
    let trainable = Trainable::patterns(&["embedding", "layers.*", "heads.*", "bias"]);
    let no_decay = Mask::except(&["bias", "layers.scale"]);
    let adamw = AdamW {
        mask: no_decay.clone(),
        ..AdamW::new(1e-2)
    };
    let step = step_program(&model, 0, trainable, &adamw.into()).unwrap();
    let trained: Vec<(&str, bool)> = (step.params.iter())
        .map(|p| (p.name.as_str(), no_decay.selects(&p.name)))
        .collect();
    assert_eq!(
        trained,
        [
            ("embedding", true),
            ("layers.scale", false),
            ("layers.ffn.w1", true),
            ("layers.ffn.w2", true),
            ("heads.0.w1", true),
            ("heads.0.w2", true),
            ("heads.1.w1", true),
            ("heads.1.w2", true),
            ("bias", false),
        ]
    );
    let init = Net::initializer(3);
    let mesh = net::mesh([2, 4]).unwrap();
    let mut on_mesh = Trainer::on_mesh(step.clone(), mesh, &init).unwrap();
    let mut reference = Trainer::reference(step, &init).unwrap();
    let data = [inputs(&model)[0].clone()];
    let mut losses = Vec::new();
    for _ in 0..5 {
        let (got, want) = (on_mesh.step(&data).unwrap(), reference.step(&data).unwrap());
        assert!(
            (got - want).abs() <= 1e-4 * want.abs().max(1.0),
            "{got} vs {want}"
        );
        losses.push(want);
    }
    assert!(losses[4] < losses[0], "{losses:?} did not fall");
    let (got, want) = (
        on_mesh.checkpoint().unwrap(),
        reference.checkpoint().unwrap(),
    );
    assert!(got.iter().any(|(name, _)| name == "m(layers.ffn.w1)"));
    for ((name, g), (other, w)) in got.iter().zip(&want) {
        assert_eq!(name, other);
        if let (Some(g), Some(w)) = (g.as_f32(), w.as_f32()) {
            let diff = (g - w).fold(0.0f32, |m, d| m.max(d.abs()));
            assert!(diff <= 1e-4, "{name} differs by {diff}");
        }
    }
}

/// The language model's `#[init]`s make exactly the initial weights of the rules
/// `examples/train_transformer.rs` wrote by hand before, so its measured losses hold.
#[test]
fn language_model_initializer_equals_the_hand_written_rules() {
    use gspmd::models::transformer::LanguageModel;
    use gspmd::train::Initializer;
    let by_hand = Initializer::new(7)
        .rule("embed", Init::Uniform { bound: 1.0 })
        .rule("position", Init::Uniform { bound: 1.0 })
        .rule("layers.attn.wo", Init::fan_in(&[1, 2]))
        .rule("layers.*", Init::fan_in(&[1]))
        .rule("unembed", Init::fan_in(&[0]));
    let from_struct = LanguageModel::initializer(7);
    let sizes = [
        ("V", 16),
        ("D", 8),
        ("S", 4),
        ("L", 2),
        ("H", 2),
        ("K", 4),
        ("F", 16),
    ];
    let leaves = LanguageModel::declarations(&sizes).unwrap();
    assert_eq!(leaves.len(), 9);
    for leaf in leaves {
        let want = by_hand.global(&leaf.name, &leaf.shape).unwrap();
        let got = from_struct.global(&leaf.name, &leaf.shape).unwrap();
        assert_eq!(got, want, "{}", leaf.name);
    }
}
