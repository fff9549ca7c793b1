//! Per-value device order (issue 27): a `reverse` of a split dim moves no data and
//! leaves the dim's shards in reversed device order (`(-h, _)`, XLA's
//! `devices=[4,1]3,2,1,0`); elementwise ops keep a common order, other ops get their
//! operands mirrored into mesh order, outputs are assembled in their order. Goldens
//! of the collectives and bytes, each checked on the thread mesh against the reference
//! interpreter, on 1-D and 2-D meshes and meshes with a device order of their own.

use gspmd_core::compile;
use gspmd_core::ir::{Builder, DType, Literal, Program, Tensor};
use gspmd_core::runtime::{ThreadMesh, interpret};
use gspmd_core::sharding::{Mesh, Sharding};
use ndarray::{ArrayD, IxDyn};

fn s(text: &str) -> Sharding {
    text.parse().unwrap()
}

fn build(name: &str, f: impl FnOnce(&Builder) -> Vec<Tensor>) -> Program {
    let b = Builder::new(name);
    let outs = f(&b);
    let refs: Vec<&Tensor> = outs.iter().collect();
    b.finish(&refs).unwrap()
}

/// Distinct values (exact in f32), so a block in the wrong place shows.
fn input(shape: &[usize], seed: usize) -> Literal {
    let n: usize = shape.iter().product();
    let v: Vec<f32> = (0..n).map(|i| (i + 1000 * seed) as f32).collect();
    Literal::F32(ArrayD::from_shape_vec(IxDyn(shape), v).unwrap())
}

fn h4() -> Mesh {
    Mesh::new([("h", 4)]).unwrap()
}

/// 2x4 meshes: in row-major device order, and with devices permuted.
fn meshes_2x4() -> [Mesh; 2] {
    [
        Mesh::new([("data", 2), ("model", 4)]).unwrap(),
        Mesh::with_device_order([("data", 2), ("model", 4)], vec![2, 5, 0, 7, 4, 1, 6, 3]).unwrap(),
    ]
}

/// The 1-D mesh, and one with its devices in reverse.
fn meshes_4() -> [Mesh; 2] {
    [
        h4(),
        Mesh::with_device_order([("h", 4)], vec![3, 1, 2, 0]).unwrap(),
    ]
}

/// Compiles `p` for `mesh`, checks it on the thread mesh against the interpreter, and
/// returns (collectives, bytes received per device, output shardings).
fn run(p: &Program, mesh: &Mesh) -> (usize, usize, Vec<Sharding>) {
    let exe = compile(p, mesh).unwrap();
    let inputs: Vec<Literal> = (p.params.iter().enumerate())
        .map(|(i, &x)| input(&p.ty(x).shape, i))
        .collect();
    let want = interpret(p, &inputs).unwrap();
    let got = exe
        .run(&ThreadMesh::new(mesh.clone()).unwrap(), &inputs)
        .unwrap();
    assert_eq!(want, got, "{}", exe.report());
    let stats = exe.spmd().collectives();
    let outputs = exe.spmd().outputs.iter().map(|(_, s)| s.clone()).collect();
    (stats.total(), stats.bytes(), outputs)
}

#[test]
fn flip_of_a_split_dim_moves_nothing() {
    let p = build("flip", |b| {
        let x = b.parameter("x", [16, 8], DType::F32).annotate(s("(h, _)"));
        vec![x.reverse(&[0])]
    });
    for mesh in meshes_4() {
        assert_eq!(run(&p, &mesh), (0, 0, vec![s("(-h, _)")]), "{mesh}");
    }
    let p = build("flip2d", |b| {
        let x = b
            .parameter("x", [8, 16, 3], DType::F32)
            .annotate(s("(data, model, _)"));
        vec![x.reverse(&[0, 1, 2]), x.reverse(&[1]).reverse(&[1])]
    });
    for mesh in meshes_2x4() {
        let want = vec![s("(-data, -model, _)"), s("(data, model, _)")];
        assert_eq!(run(&p, &mesh), (0, 0, want), "{mesh}");
    }
}

#[test]
fn elementwise_ops_keep_a_common_order() {
    // Both operands flipped alike: the product is in their order, nothing moves.
    let p = build("flips", |b| {
        let x = b.parameter("x", [16, 8], DType::F32).annotate(s("(h, _)"));
        let y = b.parameter("y", [16, 8], DType::F32).annotate(s("(h, _)"));
        vec![(x.reverse(&[0]) * y.reverse(&[0])).tanh()]
    });
    for mesh in meshes_4() {
        assert_eq!(run(&p, &mesh), (0, 0, vec![s("(-h, _)")]), "{mesh}");
    }
}

#[test]
fn flip_then_add_with_an_unflipped_value_moves_one_shard() {
    // x[16, 8] in 4 shards of [4, 8] f32: the flipped operand is mirrored into mesh
    // order, one shard (128 bytes) received per device.
    let p = build("flip_add", |b| {
        let x = b.parameter("x", [16, 8], DType::F32).annotate(s("(h, _)"));
        let y = b.parameter("y", [16, 8], DType::F32).annotate(s("(h, _)"));
        vec![x.reverse(&[0]) + y]
    });
    for mesh in meshes_4() {
        assert_eq!(run(&p, &mesh), (1, 4 * 8 * 4, vec![s("(h, _)")]), "{mesh}");
    }
    // On 2x4 both dims flipped: one mirrored shift over (data, model) moves the [4, 4]
    // shard (64 bytes).
    let p = build("flip_add_2d", |b| {
        let x = b
            .parameter("x", [8, 16], DType::F32)
            .annotate(s("(data, model)"));
        let y = b
            .parameter("y", [8, 16], DType::F32)
            .annotate(s("(data, model)"));
        vec![x.reverse(&[0, 1]) - y]
    });
    for mesh in meshes_2x4() {
        let want = (1, 4 * 4 * 4, vec![s("(data, model)")]);
        assert_eq!(run(&p, &mesh), want, "{mesh}");
    }
}

#[test]
fn roll_then_flip_moves_no_more_than_xla() {
    // x[16, 8] f32 split 4 ways on dim 0 (shards of [4, 8] = 128 bytes), rolled by one
    // shard, flipped, then an elementwise op.
    //
    // XLA: the roll (concatenate of two slices) is a rotation by one shard: one
    // collective-permute, each device receiving its neighbour's whole shard = 4 * 8 *
    // 4 = 128 bytes; the reverse is free (the result's tile assignment is the reversed
    // `devices=[4,1]3,2,1,0`), the elementwise op too: 128 bytes per device in all.
    // gspmd before per-value orders: the same 128 bytes, plus a mirrored shift of the
    // reversed shard (128 bytes) = 256 bytes.
    let xla_bytes = 4 * 8 * 4;
    let p = build("roll_flip", |b| {
        let x = b.parameter("x", [16, 8], DType::F32).annotate(s("(h, _)"));
        let y = x.roll(4, 0).reverse(&[0]);
        vec![y.exp() * y]
    });
    for mesh in meshes_4() {
        let (collectives, bytes, outputs) = run(&p, &mesh);
        assert!(bytes <= xla_bytes, "{mesh}: {bytes} bytes");
        assert_eq!(
            (collectives, bytes, outputs),
            (1, xla_bytes, vec![s("(-h, _)")])
        );
    }
}

#[test]
fn other_ops_read_a_flipped_value_in_mesh_order() {
    // A reduction, a dot and a slice of a flipped value: each gets it mirrored into mesh
    // order (one shard each way), with the flip's results right.
    let p = build("users", |b| {
        let x = b.parameter("x", [16, 8], DType::F32).annotate(s("(h, _)"));
        let w = b.parameter("w", [8, 4], DType::F32);
        let f = x.reverse(&[0]);
        vec![
            f.sum(&[1]),
            f.matmul(&w),
            f.slice(&[2, 0], &[14, 8], &[1, 1]),
        ]
    });
    for mesh in meshes_4() {
        run(&p, &mesh);
    }
}

#[test]
fn uneven_flips_are_mirrored_shifts_and_resplit_ones_in_place() {
    // 14 rows in 4 shards of 4 (the last has 2): the blocks do not line up reversed, so
    // each device receives its mirrored rows, in two pieces (as before per-value
    // orders).
    let p = build("uneven", |b| {
        let x = b.parameter("x", [14, 8], DType::F32).annotate(s("(h, _)"));
        vec![x.reverse(&[0])]
    });
    for mesh in meshes_4() {
        let (collectives, _, outputs) = run(&p, &mesh);
        assert_eq!((collectives, outputs), (2, vec![s("(h, _)")]), "{mesh}");
    }
    // Operand split on `data`, result on `model`: resharded to `model` (one permute of
    // the blocks that fit), then flipped in place.
    let p = build("moved", |b| {
        let x = b
            .parameter("x", [8, 8], DType::F32)
            .annotate(s("(data, _)"));
        vec![x.reverse(&[0]).annotate(s("(model, _)"))]
    });
    for mesh in meshes_2x4() {
        assert_eq!(run(&p, &mesh).2, vec![s("(-model, _)")], "{mesh}");
    }
}

#[test]
fn an_annotated_order_is_honoured() {
    // `-h` written by the user: `x` arrives in reversed order, `y` is mirrored into
    // it (one shard per device) and the sum is returned in it.
    let p = build("annotated", |b| {
        let x = b.parameter("x", [16, 8], DType::F32).annotate(s("(-h, _)"));
        let y = b.parameter("y", [16, 8], DType::F32).annotate(s("(h, _)"));
        vec![(x + y).annotate(s("(-h, _)"))]
    });
    for mesh in meshes_4() {
        assert_eq!(run(&p, &mesh), (1, 4 * 8 * 4, vec![s("(-h, _)")]), "{mesh}");
    }
}

#[test]
fn a_loop_carry_comes_back_in_mesh_order() {
    // The carry is flipped each iteration: the body's output is mirrored back into the
    // carry's (mesh) order, so the loop's boundary is one sharding.
    let p = build("loop", |b| {
        let x = b.parameter("x", [16, 8], DType::F32).annotate(s("(h, _)"));
        b.fori_loop(3, &[x], |_, c| {
            vec![c[0].reverse(&[0]) * c[0].scalar_like(0.5)]
        })
    });
    for mesh in meshes_4() {
        let (_, _, outputs) = run(&p, &mesh);
        assert_eq!(outputs, vec![s("(h, _)")]);
    }
}

#[test]
fn shards_and_resident_values_keep_their_order() {
    use gspmd_core::runtime::{Backend, Input, Output, Value, shard_literal};
    let mesh = Mesh::with_device_order([("h", 4)], vec![3, 1, 2, 0]).unwrap();
    let threads = ThreadMesh::new(mesh.clone()).unwrap();
    let p = build("flip", |b| {
        let x = b.parameter("x", [16, 8], DType::F32).annotate(s("(h, _)"));
        vec![x.reverse(&[0]), x.reverse(&[0])]
    });
    let exe = compile(&p, &mesh).unwrap();
    let x = input(&[16, 8], 0);
    let want = interpret(&p, std::slice::from_ref(&x)).unwrap();
    let out = exe
        .execute(
            &threads,
            &[Input::Global(&x)],
            &[Output::Shards, Output::Resident("y".into())],
        )
        .unwrap();
    // Device d's shard is its block of the reversed order: the first device of the
    // mesh holds the last rows.
    let Value::Shards(blocks) = &out[0] else {
        panic!("{out:?}")
    };
    for (d, block) in blocks.iter().enumerate() {
        assert_eq!(
            *block,
            shard_literal(&want[0], &s("(-h, _)"), &mesh, d),
            "device {d}"
        );
    }
    assert_eq!(threads.fetch("y").unwrap(), want[1]);
    // A resident value in reversed order feeds a parameter in that order, and is
    // refused, by name, by one in mesh order.
    let consumer = |order: &str| {
        let q = build("consumer", |b| {
            let y = b.parameter("y", [16, 8], DType::F32).annotate(s(order));
            vec![y.exp()]
        });
        compile(&q, &mesh).unwrap()
    };
    let out = consumer("(-h, _)").execute(&threads, &[Input::Resident("y")], &[Output::Global]);
    let Value::Global(got) = &out.unwrap()[0] else {
        panic!()
    };
    let exp = build("exp", |b| vec![b.parameter("y", [16, 8], DType::F32).exp()]);
    assert_eq!(
        *got,
        interpret(&exp, std::slice::from_ref(&want[1])).unwrap()[0]
    );
    let err = consumer("(h, _)")
        .execute(&threads, &[Input::Resident("y")], &[Output::Global])
        .unwrap_err();
    assert!(
        err.to_string()
            .contains("sharded (-h, _), but the parameter is f32[16,8] sharded (h, _)"),
        "{err}"
    );
}

#[test]
fn a_reversed_unsplit_dim_is_an_error_at_the_users_line() {
    let mut bad = s("(h, _)");
    bad.dims[1].reversed = true;
    let line = line!() + 3;
    let b = Builder::new("bad");
    let x = b.parameter("x", [16, 8], DType::F32);
    let y = x.exp().annotate(bad);
    let p = b.finish(&[&y]).unwrap();
    let err = compile(&p, &h4()).unwrap_err();
    assert!(
        matches!(&err, gspmd_core::Error::ReversedUnsplitDim { dim: 1, .. }),
        "{err:?}"
    );
    let text = err.to_string();
    assert!(
        text.contains(&format!("device_order.rs:{line}"))
            && text.contains("dim 1 of sharding (h, -_) is in reversed device order"),
        "{text}"
    );
    assert!(
        "(h, -_)"
            .parse::<Sharding>()
            .unwrap_err()
            .to_string()
            .contains("`-` (reversed device order) before an unsplit dim")
    );
}
