//! Differential test of the partitioner alone: every value of a program gets a random
//! (valid) sharding, the program is partitioned and run on a thread mesh, and the result
//! must equal the reference interpreter's. The partitioner must be right for ANY
//! assignment of shardings, not only the ones propagation picks, so this explores
//! reshards between arbitrary tilings, uneven dims and device orders.

use std::collections::HashMap;
use std::sync::Arc;

use gspmd_core::ir::random;
use gspmd_core::ir::{
    Builder, DType, Flow, GatherDims, Literal, Op, OpKind, Padding, Program, ReduceKind,
    ScatterDims, Tensor, WindowDim,
};
use gspmd_core::partition::partition;
use gspmd_core::runtime::{Loaded, ThreadMesh, interpret};
use gspmd_core::sharding::{DimSharding, Mesh, Sharding};
use ndarray::{ArrayD, IxDyn};
use rand::rngs::Xoshiro256PlusPlus;
use rand::{RngExt, SeedableRng};

mod conv_cases;
mod op_coverage;
mod random_axes;

use random_axes::random_axes;

/// A random valid sharding: each mesh axis, or sub-axis ([`random_axes`]), unused
/// (1/3) or on a random dim; a split dim's device order reversed 1 time in 4.
fn random_sharding(rng: &mut Xoshiro256PlusPlus, mesh: &Mesh, rank: usize) -> Sharding {
    let mut axes = random_axes(rng, mesh);
    let mut dims = vec![Vec::new(); rank];
    if rank > 0 {
        while !axes.is_empty() {
            let a = axes.remove(rng.random_range(0..axes.len()));
            // Each (sub-)axis: unused (1/3) or on a random dim.
            if rng.random_range(0..3) > 0 {
                dims[rng.random_range(0..rank)].push(a);
            }
        }
    }
    // A split dim is in reversed device order (as a `reverse` leaves it) 1 time in 4.
    Sharding::new(dims.into_iter().map(|axes| {
        let reversed = !axes.is_empty() && rng.random_ratio(1, 4);
        let dim = DimSharding::closed(axes);
        if reversed {
            dim.with_reversed_order()
        } else {
            dim
        }
    }))
}

fn input(shape: &[usize], dtype: DType, seed: usize) -> Literal {
    let n: usize = shape.iter().product();
    let v: Vec<f32> = (0..n)
        .map(|i| ((i * 7 + seed * 13) % 23) as f32 / 7.0 - 1.5)
        .collect();
    let a = ArrayD::from_shape_vec(IxDyn(shape), v).unwrap();
    match dtype {
        DType::F32 => Literal::F32(a),
        DType::I32 => Literal::I32(a.mapv(|x| (x * 3.0) as i32)),
        DType::Bool => Literal::Bool(a.mapv(|x| x > 0.0)),
        DType::BF16 | DType::F16 => Literal::F32(a).convert(dtype),
        other => panic!("not covered by this test: {other:?}"),
    }
}

fn assert_close(want: &Literal, got: &Literal, what: &str) {
    assert_eq!(want.shape(), got.shape(), "{what}");
    match (want, got) {
        (Literal::F32(a), Literal::F32(b)) => {
            let scale = a.iter().fold(1.0f32, |m, x| m.max(x.abs()));
            let diff = a
                .iter()
                .zip(b.iter())
                .map(|(x, y)| (x - y).abs())
                .fold(0.0, f32::max);
            assert!(diff <= 1e-4 * scale, "{what}: max difference {diff}");
        }
        _ => assert_eq!(want, got, "{what}"),
    }
}

fn meshes() -> Vec<Mesh> {
    vec![
        Mesh::new([("x", 1)]).unwrap(),
        Mesh::new([("x", 2)]).unwrap(),
        Mesh::new([("x", 4)]).unwrap(),
        Mesh::new([("x", 8)]).unwrap(),
        Mesh::new([("data", 2), ("model", 2)]).unwrap(),
        Mesh::new([("data", 2), ("model", 4)]).unwrap(),
        Mesh::with_device_order([("data", 4), ("model", 2)], vec![3, 6, 0, 5, 7, 1, 4, 2]).unwrap(),
        Mesh::new([("a", 2), ("b", 2), ("c", 2)]).unwrap(),
    ]
}

/// Partitions `program` with `trials` random sharding assignments on every mesh and
/// compares each run with the interpreter.
fn check(program: &Program, trials: usize, seed: u64) {
    check_with(program, trials, seed, |_, _| {});
}

/// [`check`], with `fix` overriding some of the random shardings on each mesh.
fn check_with(program: &Program, trials: usize, seed: u64, fix: impl Fn(&Mesh, &mut Program)) {
    let inputs: Vec<Literal> = program
        .params
        .iter()
        .enumerate()
        .map(|(i, &p)| input(&program.ty(p).shape, program.ty(p).dtype, i))
        .collect();
    let want = interpret(program, &inputs).unwrap();
    let mut rng = Xoshiro256PlusPlus::seed_from_u64(seed);
    for mesh in meshes() {
        let threads = ThreadMesh::new(mesh.clone()).unwrap();
        for trial in 0..trials {
            let mut p = program.clone();
            randomize(&mut p, &mut rng, &mesh, &mut HashMap::new());
            fix(&mesh, &mut p);
            let what = format!("{} on {mesh}, trial {trial}", program.name);
            let spmd = partition(&p, &mesh).unwrap_or_else(|e| panic!("{what}: {e}\n{p}"));
            let got = Arc::new(Loaded::new(spmd.clone()))
                .run(&threads, &inputs)
                .unwrap_or_else(|e| panic!("{what}: {e}\n{}", spmd.report()));
            for (k, (w, g)) in want.iter().zip(&got).enumerate() {
                assert_close(w, g, &format!("{what}, output {k}\n{p}\n{}", spmd.report()));
            }
            op_coverage::record("partitioned", &spmd.program);
        }
    }
}

/// Gives every value of `program` a random sharding, in the regions of its control
/// flow ops too (each instance's regions once: `done` maps the regions seen to their
/// randomized form).
fn randomize(
    program: &mut Program,
    rng: &mut Xoshiro256PlusPlus,
    mesh: &Mesh,
    done: &mut HashMap<*const Flow, Arc<Flow>>,
) {
    for node in &mut program.nodes {
        node.sharding = Some(random_sharding(rng, mesh, node.ty.rank()));
        if let Op::Flow { flow, result } = &node.op {
            let key = Arc::as_ptr(flow);
            let randomized = match done.get(&key) {
                Some(f) => f.clone(),
                None => {
                    let f = flow.try_map_regions(|r| {
                        let mut r = r.clone();
                        randomize(&mut r, rng, mesh, &mut HashMap::new());
                        Ok::<_, ()>(r)
                    });
                    let f = Arc::new(f.unwrap());
                    done.insert(key, f.clone());
                    f
                }
            };
            node.op = Op::Flow {
                flow: randomized,
                result: *result,
            };
        }
    }
}

fn build(name: &str, f: impl FnOnce(&Builder) -> Vec<Tensor>) -> Program {
    let b = Builder::new(name);
    let outs = f(&b);
    let refs: Vec<&Tensor> = outs.iter().collect();
    b.finish(&refs).unwrap()
}

#[test]
fn mlp_with_uneven_dims() {
    let p = build("mlp", |b| {
        let x = b.parameter("x", [6, 10], DType::F32);
        let w1 = b.parameter("w1", [10, 12], DType::F32);
        let w2 = b.parameter("w2", [12, 10], DType::F32);
        vec![x.matmul(&w1).relu().matmul(&w2)]
    });
    check(&p, 6, 1);
}

#[test]
fn reductions_over_several_dims() {
    let p = build("reduce", |b| {
        let x = b.parameter("x", [4, 6, 5], DType::F32);
        vec![
            x.sum(&[0, 2]),
            x.max_over(&[1]),
            x.min_over(&[0, 1, 2]),
            x.softmax(-1),
        ]
    });
    check(&p, 5, 2);
}

#[test]
fn reshape_and_transpose_chains() {
    let p = build("shapes", |b| {
        let x = b.parameter("x", [8, 6], DType::F32);
        let y = x.reshape([2, 4, 6]).transpose(&[2, 0, 1]).reshape([12, 4]);
        let z = x.transpose(&[1, 0]).reshape([48]).reshape([4, 12]);
        vec![y, z]
    });
    check(&p, 6, 3);
}

#[test]
fn batched_dot_and_broadcast() {
    let p = build("attention", |b| {
        let q = b.parameter("q", [2, 4, 6], DType::F32);
        let k = b.parameter("k", [2, 4, 6], DType::F32);
        let bias = b.parameter("bias", [4], DType::F32);
        let s = gspmd_core::ir::einsum("bqd,bkd->bqk", &q, &k);
        vec![(&s + &bias).softmax(-1)]
    });
    check(&p, 6, 4);
}

#[test]
fn slice_pad_concatenate_iota_select() {
    let p = build("data", |b| {
        let x = b.parameter("x", [6, 9], DType::F32);
        let s = x.slice(&[1, 0], &[6, 9], &[2, 1]);
        let zero = x.scalar_like(0.0);
        let padded = x.pad(&zero, &[1, -1], &[0, 2], &[0, 1]);
        let c = b.concatenate(&[&x, &x.neg()], 1);
        let i = b.iota([6, 9], 1, DType::F32);
        let m = i.lt(&x).select(&x, &i);
        vec![s, padded, c, m]
    });
    check(&p, 5, 5);
}

/// Slices (strided too), pads without interior padding, slices of pads and rolls take the
/// halo paths when their dim is split on both sides (one- and multi-hop halos,
/// non-constant ones, edge fill, uneven shards, uneven rotations); the others gather.
#[test]
fn halo_slices_pads_and_rolls() {
    let p = build("halo", |b| {
        let x = b.parameter("x", [13, 16], DType::F32);
        let v = x.scalar_like(0.25);
        let padded = x.pad(&v, &[1, 2], &[1, 0], &[0, 0]);
        vec![
            x.slice(&[1, 2], &[12, 9], &[1, 1]),
            x.pad(&v, &[2, -1], &[-3, 2], &[0, 0]),
            padded.slice(&[0, 3], &[14, 18], &[1, 1]),
            padded.slice(&[2, 0], &[15, 16], &[1, 1]),
            x.roll(3, 0),
            x.roll(-1, 1),
            x.roll(9, 1),
            // Strided: windows of (chunk - 1) * stride + 1, some moving faster than the
            // blocks (a non-constant halo), some reaching past a neighbour (several hops).
            x.slice(&[1, 0], &[13, 16], &[2, 3]),
            x.slice(&[0, 5], &[11, 16], &[3, 2]),
            padded.slice(&[3, 1], &[15, 17], &[4, 5]),
            // Interior padding: windows spread locally and cut at a per-device offset.
            x.pad(&v, &[1, 0], &[1, 2], &[1, 2]),
            x.pad(&v, &[0, 3], &[2, 0], &[2, 1]),
            x.pad(&v, &[-1, -2], &[-2, 1], &[1, 3]),
            x.pad(&v, &[4, -3], &[0, -4], &[3, 1]),
        ]
    });
    check(&p, 12, 8);
}

/// Splits that move instead of gathering: slices inside one shard (the owners' part,
/// summed, then reduced or scattered), uneven merges and splits of reshapes (halo
/// exchange on the flattened dims, outer dims whole), sorts along a split dim.
#[test]
fn slices_in_one_shard_uneven_reshapes_and_sorts() {
    let p = build("moved", |b| {
        let x = b.parameter("x", [6, 4, 5], DType::F32);
        let n = b.parameter("n", [10, 3], DType::I32);
        vec![
            x.slice(&[5, 0, 0], &[6, 4, 5], &[1, 1, 1]),
            x.slice(&[2, 1, 1], &[3, 4, 5], &[1, 2, 3]),
            x.slice(&[0, 3, 0], &[6, 4, 5], &[1, 1, 1]),
            x.reshape([24, 5]),
            x.reshape([6, 20]).reshape([120]),
            x.reshape([3, 8, 5]),
            x.reshape([2, 3, 2, 10]),
            n.reshape([30]).reshape([5, 6]),
            n.slice(&[7, 0], &[8, 3], &[1, 1]),
            x.argsort(0, false).convert(DType::F32),
            x.sort(2, true).0,
        ]
    });
    check(&p, 12, 9);
}

#[test]
fn windowed_reductions_pooling_and_upsampling() {
    let p = build("window", |b| {
        let x = b.parameter("x", [5, 7, 6], DType::F32);
        let image = b.parameter("image", [2, 5, 6, 3], DType::F32);
        let ints = b.parameter("ints", [6, 5], DType::I32);
        let dilated = WindowDim::new(2, 1, (1, 0)).with_window_dilation(2);
        let (win, strides) = ([1, 2, 2, 1], [1, 2, 2, 1]);
        vec![
            x.reduce_window(
                ReduceKind::Max,
                &[1, 2, 2],
                &[1, 2, 2],
                &[(0, 0), (0, 1), (1, 0)],
            ),
            x.reduce_window(
                ReduceKind::Sum,
                &[2, 3, 1],
                &[1, 2, 1],
                &[(1, 1), (1, 1), (0, 0)],
            ),
            x.reduce_window_with(
                ReduceKind::Min,
                &[
                    WindowDim::new(1, 1, (0, 0)),
                    dilated,
                    WindowDim::new(3, 3, (0, 2)),
                ],
            ),
            image.max_pool(&win, &strides, Padding::Same),
            image.avg_pool(&[1, 3, 3, 1], &[1, 1, 1, 1], Padding::Same, false),
            image.upsample_nearest(&[1, 2, 1, 2]),
            ints.reduce_window(ReduceKind::Max, &[3, 1], &[2, 1], &[(1, 1), (0, 0)]),
            // Base dilation (XLA's base_dilations).
            x.reduce_window_with(
                ReduceKind::Max,
                &[
                    WindowDim::new(1, 1, (0, 0)),
                    WindowDim::new(3, 2, (1, 1)).with_base_dilation(2),
                    WindowDim::new(2, 1, (0, 1)).with_base_dilation(2),
                ],
            ),
        ]
    });
    check(&p, 4, 7);
}

#[test]
fn integer_and_bool_values() {
    let p = build("ints", |b| {
        let x = b.parameter("x", [5, 4], DType::I32);
        let t = x.gt(&x.scalar_like(0.0));
        vec![x.sum(&[1]), t.convert(DType::I32).max_over(&[0]), t]
    });
    check(&p, 5, 6);
}

/// The math ops on uneven dims under random shardings (padding holds arbitrary values:
/// no kernel may fail on it); the i32 divisors hold zeros (XLA's `x / 0 = -1`,
/// `x % 0 = x`).
#[test]
fn math_ops_on_uneven_dims() {
    let p = build("math", |b| {
        let x = b.parameter("x", [5, 7], DType::F32);
        let y = b.parameter("y", [5, 7], DType::F32);
        let i = b.parameter("i", [5, 7], DType::I32);
        let j = b.parameter("j", [5, 7], DType::I32);
        let steps = x.floor() + x.ceil() + (&x * 2.0).round() + x.sign();
        let waves = x.sin() * y.cos() + x.erf() + x.gelu_exact();
        let rests = &x % &y + x.remainder(&y) + x.floor_divide(&y) + x.clamp(&y, &(&y + 1.0));
        let ints = &i / &j + &i % &j + i.remainder(&j) + i.floor_divide(&j) + j.sign();
        vec![steps + waves + rests, ints, (&x / &y).is_finite()]
    });
    check(&p, 5, 8);
}

/// Dynamic slices and updates of f32, i32 and bool values along uneven dims at starts
/// in range, out of range and from parameters; scans forward and reversed; sorts.
#[test]
fn dynamic_slices_scans_and_sorts() {
    let p = build("along", |b| {
        let x = b.parameter("x", [7, 9], DType::F32);
        let n = b.parameter("n", [10, 3], DType::I32);
        let s = b.parameter("s", [], DType::I32);
        let c = |v: f64| b.full(Vec::<usize>::new(), DType::I32, v);
        let u = b.parameter("u", [3, 4], DType::F32);
        let flags = n.gt(&n.scalar_like(0.0));
        let on = b.full(vec![4, 3], DType::Bool, 1.0);
        let far = c(-7.0);
        vec![
            x.dynamic_slice(&[&s, &c(5.0)], &[3, 4]),
            x.dynamic_slice(&[&c(20.0), &far], &[7, 2]),
            n.dynamic_slice(&[&(&s + &c(6.0)), &c(1.0)], &[4, 3]),
            flags.dynamic_slice(&[&c(3.0), &c(0.0)], &[5, 3]),
            x.dynamic_update_slice(&u, &[&c(2.0), &(&s + &c(4.0))]),
            flags.dynamic_update_slice(&on, &[&s, &c(0.0)]),
            x.cumsum(0),
            x.cumulative(gspmd_core::ir::CumulativeKind::Sum, 1, true),
            n.cumprod(0),
            x.cumulative(gspmd_core::ir::CumulativeKind::Prod, 0, true),
            x.argsort(0, true),
            n.argsort(1, false),
            x.argmax(0),
            n.argmin(0),
        ]
    });
    check(&p, 4, 8);
}

#[test]
fn convolutions_in_every_configuration() {
    for (i, case) in conv_cases::cases().iter().enumerate() {
        let p = build(case.name, |b| {
            let (x, _, y) = case.trace(b, DType::F32);
            // A second user of the input, so the input's sharding is not only the
            // convolution's.
            vec![y, x.neg()]
        });
        check(&p, 3, 10 + i as u64);
    }
}

/// Convolutions with a spatial dim split over every mesh axis, the rest random: the
/// input and the output split alike along it (a halo exchange of the input), or the
/// kernel split along it (a spatial contraction: partial sums); uneven blocks (10 rows
/// on 4 or 8 devices), strides, dilations and negative padding.
#[test]
fn convolutions_split_along_spatial_dims() {
    let rows =
        |name, (kernel, strides), padding, (lhs_dilation, rhs_dilation)| conv_cases::ConvCase {
            name,
            labels: ["NHWC", "HWIO", "NHWC"],
            input: &[2, 10, 6, 3],
            kernel,
            strides,
            padding,
            lhs_dilation,
            rhs_dilation,
            groups: 1,
            batch_groups: 1,
        };
    let k3: &[usize] = &[3, 3, 3, 4];
    let mut cases = conv_cases::cases();
    cases.extend([
        rows(
            "10 rows, 3x3 SAME",
            (k3, &[1, 1]),
            &[(1, 1), (1, 1)],
            (&[], &[]),
        ),
        rows(
            "10 rows, stride 2",
            (k3, &[2, 1]),
            &[(1, 1), (0, 0)],
            (&[], &[]),
        ),
        rows(
            "10 rows, dilation 2",
            (k3, &[1, 1]),
            &[(2, 2), (1, 1)],
            (&[], &[2, 1]),
        ),
        rows(
            "10 rows, negative padding",
            (k3, &[1, 2]),
            &[(-1, 2), (0, -1)],
            (&[], &[]),
        ),
        // Halos from several neighbours, and undilated halos of a base-dilated input.
        rows(
            "10 rows, 9-row kernel",
            (&[9, 1, 3, 4], &[1, 1]),
            &[(4, 4), (0, 0)],
            (&[], &[]),
        ),
        rows(
            "10 rows, lhs dilation 2",
            (k3, &[1, 1]),
            &[(1, 2), (1, 1)],
            (&[2, 1], &[]),
        ),
    ]);
    for (i, case) in cases.iter().enumerate() {
        let p = build(case.name, |b| vec![case.trace(b, DType::F32).2]);
        let dn = case.dims();
        let (conv, x, k) = (p.outputs[0], p.params[0], p.params[1]);
        for d in 0..case.strides.len() {
            for contracted in [false, true] {
                let split = |node: &mut gspmd_core::ir::Node, dim: usize, mesh: &Mesh| {
                    let mut dims = vec![Vec::new(); node.ty.rank()];
                    dims[dim] = mesh.axis_names().map(String::from).collect();
                    node.sharding = Some(Sharding::new(dims.into_iter().map(DimSharding::closed)));
                };
                check_with(&p, 2, 100 + i as u64, |mesh, p| {
                    if contracted {
                        split(p.node_mut(k), dn.kernel_spatial[d], mesh);
                    } else {
                        split(p.node_mut(x), dn.input_spatial[d], mesh);
                        split(p.node_mut(conv), dn.output_spatial[d], mesh);
                    }
                });
            }
        }
    }
}

#[test]
fn reverse_and_a_conv2d_chain() {
    let p = build("reverse", |b| {
        let x = b.parameter("x", [3, 6, 5, 4], DType::F32);
        let k = b.parameter("k", [3, 3, 4, 6], DType::F32);
        let y = x.conv2d(&k, [1, 1], gspmd_core::ir::Padding::Same).relu();
        // Uneven splits: the mirrored blocks start mid-block (two mirrored shifts).
        let z = b.parameter("z", [13, 7], DType::F32);
        vec![y.reverse(&[1, 3]), x.reverse(&[0]), z.reverse(&[0, 1])]
    });
    check(&p, 5, 20);
}

/// Loops and branches under random shardings of everything, the carried state, the
/// regions' values and the stacked operands included (uneven dims): a `while` with a
/// matmul in its body and a condition reading the state, a scan with stacked outputs,
/// forwards and reversed, nested loops and a `cond`.
#[test]
fn control_flow_under_random_shardings() {
    let p = build("flow", |b| {
        let x = b.parameter("x", [6, 5], DType::F32);
        let w = b.parameter("w", [5, 5], DType::F32);
        let xs = b.parameter("xs", [3, 6, 5], DType::F32);
        let zero = b.constant(Literal::full(&[], DType::I32, 0.0));
        let looped = b.while_loop(
            |s| {
                let bound = s[0].builder().constant(Literal::full(&[], DType::I32, 3.0));
                s[0].lt(&bound)
                    .and(&s[1].abs().sum(&[0, 1]).lt(&b.scalar(1e6)))
            },
            |s| {
                let one = s[0].builder().constant(Literal::full(&[], DType::I32, 1.0));
                vec![s[0].add(&one), s[1].matmul(&w).tanh().add(&s[1])]
            },
            &[zero, x.clone()],
        );
        let (carry, ys) = b.scan(std::slice::from_ref(&xs), &[looped[1].clone()], |c, x| {
            let next = c[0].matmul(&w).add(&x[0]).tanh();
            (vec![next.clone()], vec![next.sum(&[1])])
        });
        let (back, _) = b.scan_reverse(&[xs], std::slice::from_ref(&x), |c, x| {
            (vec![c[0].mul(&x[0])], vec![])
        });
        let nested = b.fori_loop(2, &[carry[0].clone()], |_, c| {
            b.fori_loop(2, c, |j, c| vec![c[0].add(&j.convert(DType::F32))])
        });
        let pred = ys[0].sum(&[0, 1]).gt(&b.scalar(0.0));
        let branch = b.cond(&pred, |_| vec![nested[0].exp()], |_| vec![back[0].neg()]);
        vec![ys[0].clone(), branch[0].clone(), looped[1].clone()]
    });
    check(&p, 4, 11);
}

/// The SPMD-only op kinds (axis_index, dynamic_slice, every collective) get their
/// coverage here: each is in some partitioned program a test above runs and checks.
#[test]
fn gathers_and_scatters_with_indices_out_of_range() {
    let p = build("indexing", |b| {
        // An uneven vocabulary of 7 rows; ids in -4..=4 (some out of range).
        let table = b.parameter("table", [7, 3], DType::F32);
        let ids = b.parameter("ids", [5, 2], DType::I32);
        let x = b.parameter("x", [5, 6], DType::F32);
        let picks = b.parameter("picks", [5, 3], DType::I32);
        let rows = b.parameter("rows", [5, 3], DType::F32);
        let index = b.parameter("index", [5], DType::I32);
        let starts = b.parameter("starts", [2, 4], DType::I32);
        let looked_up = table.embedding(&ids);
        let flags = b.parameter("flags", [7, 3], DType::Bool).embedding(&ids);
        let along = x.take_along_dim(&picks, 1);
        let added = table.index_add(0, &index, &rows);
        // Distinct rows 6, 4, .., -2: the last two out of range.
        let two = b.full([5], DType::I32, 2.0);
        let distinct = b.iota([5], 0, DType::I32).reverse(&[0]).mul(&two).sub(&two);
        let rows_at = ScatterDims::along(0, 2);
        let replaced = table.scatter(&distinct, &rows, &rows_at);
        // Windows of 2 x 2 at (row, col) starts along dim 0 of `starts`.
        let windows = GatherDims {
            offset_dims: vec![0, 2],
            start_index_map: vec![0, 1],
            index_vector_dim: 0,
            slice_sizes: vec![2, 2],
            ..GatherDims::default()
        };
        let window = x.gather(&starts, &windows);
        let scattered = x.scatter_add(&starts, &window, &windows.to_scatter());
        // `along` added back where it came from: batching dims pair rows.
        let pairs = GatherDims {
            collapsed_slice_dims: vec![1],
            operand_batching_dims: vec![0],
            start_indices_batching_dims: vec![0],
            start_index_map: vec![1],
            index_vector_dim: 2,
            slice_sizes: vec![1, 1],
            ..GatherDims::default()
        };
        let back = x.scatter_add(&picks, &along, &pairs.to_scatter());
        vec![
            looked_up, flags, along, added, replaced, window, scattered, back,
        ]
    });
    check(&p, 6, 41);
}

/// Random draws with every value randomly sharded: keys split on their one dim,
/// stacked split keys on their word dim, draws on uneven dims; each device's block
/// must hold the global indices' draws.
#[test]
fn random_draws_under_random_shardings() {
    let p = build("random", |b| {
        let key = b.parameter("key", [2], DType::I32);
        let step = b.parameter("step", [], DType::I32);
        let x = b.parameter("x", [5, 9], DType::F32);
        let folded = random::fold_in(&key, &step);
        let k = random::split(&folded, 2)[1].clone();
        vec![
            random::split_stacked(&folded, 5),
            random::bits(&k, [7, 5, 3]),
            random::uniform(&key, [6, 10], -1.0, 2.0),
            random::dropout(&x, 0.3, &k),
            random::normal(&key, [4, 6]),
        ]
    });
    check(&p, 6, 43);
}

#[test]
fn covers_every_op_kind() {
    let kinds = op_coverage::kinds_checked("covers_every_op_kind");
    let spmd_only = |k: OpKind| k.is_spmd_only();
    op_coverage::assert_kinds("partitioned", kinds.get("partitioned"), spmd_only, |_| true);
}
