//! ThreadMesh and its shared-memory collectives: every collective on a matrix of meshes
//! and axis lists against results computed here from each device's input; failures,
//! panics, mismatches and timeouts end runs promptly with the right error; stores
//! persist; drop joins the threads; a re-entrant run is an error; NaN in max/min
//! reductions and memory limits agree with the reference interpreter.

use std::sync::mpsc;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use gspmd_core::compile;
use gspmd_core::error::{CollectiveProblem, RunPosition, ThreadMeshProblem};
use gspmd_core::ir::{
    AxisGroup, Builder, DType, Literal, Location, Op, Program, ReduceKind, Tensor, TensorType,
};
use gspmd_core::partition::SpmdProgram;
use gspmd_core::runtime::{
    DeviceContext, Loaded, ThreadMesh, interpret, interpret_with_memory_limit,
};
use gspmd_core::sharding::{DimSharding, Mesh, Sharding};
use gspmd_core::{Error, Result};
use ndarray::{ArrayD, Axis, Dimension, IxDyn, Slice};

// ---- inputs and independent expectations ---------------------------------------------

const SHAPE: [usize; 2] = [8, 8];

/// Device-specific inputs whose maxima and minima fall on different devices per element.
fn input(device: usize, dtype: DType) -> Literal {
    let value = |ix: IxDyn| (device * 31 + ix[0] * 7 + ix[1] * 3) % 23;
    match dtype {
        DType::F32 => ArrayD::from_shape_fn(IxDyn(&SHAPE), |ix| value(ix) as f32 - 11.0).into(),
        DType::I32 => ArrayD::from_shape_fn(IxDyn(&SHAPE), |ix| value(ix) as i32 * 3 - 30).into(),
        DType::Bool => ArrayD::from_shape_fn(IxDyn(&SHAPE), |ix| value(ix) % 3 == 0).into(),
        // Small integers: exact in bf16 and f16.
        DType::BF16 | DType::F16 => input(device, DType::F32).convert(dtype),
        other => panic!("not covered by this test: {other:?}"),
    }
}

/// The members of `device`'s group over `axes` in group order, and its index: found by
/// filtering all devices on the other axes' coordinates and sorting by the mixed-radix
/// index along `axes`.
fn group_of(mesh: &Mesh, device: usize, axes: &[String]) -> (Vec<usize>, usize) {
    let positions: Vec<usize> = axes.iter().map(|a| mesh.axis_index(a).unwrap()).collect();
    let coords = |d: usize| mesh.device_coords(d).unwrap();
    let mine = coords(device);
    let key = |d: usize| {
        let c = coords(d);
        positions
            .iter()
            .fold(0, |acc, &p| acc * mesh.axes()[p].1 + c[p])
    };
    let mut members: Vec<usize> = (0..mesh.num_devices())
        .filter(|&d| {
            let c = coords(d);
            (0..c.len()).all(|p| positions.contains(&p) || c[p] == mine[p])
        })
        .collect();
    members.sort_by_key(|&d| key(d));
    let index = members.iter().position(|&d| d == device).unwrap();
    (members, index)
}

fn axes(names: &[&str]) -> Vec<String> {
    names.iter().map(ToString::to_string).collect()
}

/// Every ordered list of distinct mesh axes of length 0 to 3.
fn axis_lists(mesh: &Mesh) -> Vec<Vec<String>> {
    let names: Vec<String> = mesh.axis_names().map(String::from).collect();
    let mut lists = vec![vec![]];
    let mut frontier: Vec<Vec<String>> = vec![vec![]];
    for _ in 0..names.len().min(3) {
        frontier = frontier
            .iter()
            .flat_map(|list| {
                names
                    .iter()
                    .filter(|n| !list.contains(n))
                    .map(|n| [list.clone(), vec![n.clone()]].concat())
                    .collect::<Vec<_>>()
            })
            .collect();
        lists.extend(frontier.iter().cloned());
    }
    lists
}

/// The collectives each device runs, in order, on `input(device, dtype)`.
#[derive(Debug, Clone, Copy)]
enum Case {
    AllReduce(ReduceKind, DType),
    AllGather(usize, DType),
    ReduceScatter(ReduceKind, usize, DType),
    AllToAll(usize, usize, DType),
    /// Shift by one towards higher group indices; the last member sends nothing, so
    /// member 0 receives zeros (a group of one keeps its value).
    ShiftUp(DType),
    /// Full cycle towards lower group indices.
    CycleDown(DType),
}

const CASES: &[Case] = &[
    Case::AllReduce(ReduceKind::Sum, DType::F32),
    Case::AllReduce(ReduceKind::Max, DType::F32),
    Case::AllReduce(ReduceKind::Min, DType::F32),
    Case::AllReduce(ReduceKind::Sum, DType::I32),
    Case::AllReduce(ReduceKind::Max, DType::I32),
    Case::AllReduce(ReduceKind::Min, DType::I32),
    Case::AllReduce(ReduceKind::Max, DType::Bool),
    Case::AllReduce(ReduceKind::Min, DType::Bool),
    Case::AllGather(0, DType::F32),
    Case::AllGather(1, DType::F32),
    Case::AllGather(1, DType::Bool),
    Case::ReduceScatter(ReduceKind::Sum, 0, DType::F32),
    Case::ReduceScatter(ReduceKind::Max, 1, DType::F32),
    Case::ReduceScatter(ReduceKind::Sum, 1, DType::I32),
    Case::AllToAll(0, 1, DType::F32),
    Case::AllToAll(1, 0, DType::F32),
    Case::AllToAll(0, 0, DType::I32),
    Case::AllToAll(1, 1, DType::Bool),
    Case::ShiftUp(DType::F32),
    Case::ShiftUp(DType::Bool),
    Case::CycleDown(DType::I32),
    Case::AllReduce(ReduceKind::Sum, DType::BF16),
    Case::AllReduce(ReduceKind::Max, DType::F16),
    Case::AllGather(0, DType::BF16),
    Case::ReduceScatter(ReduceKind::Sum, 1, DType::F16),
    Case::AllToAll(1, 0, DType::BF16),
    Case::ShiftUp(DType::F16),
];

fn pairs(case: Case, n: usize) -> Vec<(usize, usize)> {
    match case {
        Case::ShiftUp(_) if n == 1 => vec![(0, 0)],
        Case::ShiftUp(_) => (0..n - 1).map(|i| (i, i + 1)).collect(),
        Case::CycleDown(_) => (0..n).map(|i| (i, (i + n - 1) % n)).collect(),
        _ => vec![],
    }
}

fn dtype(case: Case) -> DType {
    match case {
        Case::AllReduce(_, t)
        | Case::AllGather(_, t)
        | Case::ReduceScatter(_, _, t)
        | Case::AllToAll(_, _, t)
        | Case::ShiftUp(t)
        | Case::CycleDown(t) => t,
    }
}

fn run_case(ctx: &DeviceContext, axes: &[String], case: Case) -> Result<Literal> {
    let comm = ctx.communicator();
    let x = input(ctx.device(), dtype(case));
    let n = axes
        .iter()
        .map(|a| ctx.mesh().axis_size(a).unwrap())
        .product();
    match case {
        Case::AllReduce(kind, _) => comm.all_reduce(axes, kind, x),
        Case::AllGather(dim, _) => comm.all_gather(axes, dim, x),
        Case::ReduceScatter(kind, dim, _) => comm.reduce_scatter(axes, kind, dim, x),
        Case::AllToAll(split, concat, _) => comm.all_to_all(axes, split, concat, x),
        Case::ShiftUp(_) | Case::CycleDown(_) => comm.collective_permute(axes, &pairs(case, n), x),
    }
}

/// Elementwise `f` over the blocks, as this test understands the reductions.
fn fold<T: Copy>(blocks: &[ArrayD<T>], f: impl Fn(T, T) -> T) -> ArrayD<T> {
    let mut acc = blocks[0].clone();
    for b in &blocks[1..] {
        acc.zip_mut_with(b, |a, &x| *a = f(*a, x));
    }
    acc
}

fn reduce(kind: ReduceKind, inputs: &[Literal]) -> Literal {
    fn arrays<T: Clone>(
        inputs: &[Literal],
        get: fn(&Literal) -> Option<&ArrayD<T>>,
    ) -> Vec<ArrayD<T>> {
        inputs.iter().map(|l| get(l).unwrap().clone()).collect()
    }
    match (&inputs[0], kind) {
        // In f32, rounded once.
        (x @ (Literal::BF16(_) | Literal::F16(_)), _) => {
            let wide: Vec<Literal> = inputs.iter().map(|l| l.convert(DType::F32)).collect();
            reduce(kind, &wide).convert(x.dtype())
        }
        (Literal::F32(_), ReduceKind::Sum) => {
            fold(&arrays(inputs, Literal::as_f32), |a, b| a + b).into()
        }
        (Literal::F32(_), ReduceKind::Max) => {
            fold(&arrays(inputs, Literal::as_f32), f32::max).into()
        }
        (Literal::F32(_), ReduceKind::Min) => {
            fold(&arrays(inputs, Literal::as_f32), f32::min).into()
        }
        (Literal::I32(_), ReduceKind::Sum) => {
            fold(&arrays(inputs, Literal::as_i32), |a, b| a + b).into()
        }
        (Literal::I32(_), ReduceKind::Max) => {
            fold(&arrays(inputs, Literal::as_i32), i32::max).into()
        }
        (Literal::I32(_), ReduceKind::Min) => {
            fold(&arrays(inputs, Literal::as_i32), i32::min).into()
        }
        (Literal::Bool(_), ReduceKind::Sum | ReduceKind::Max) => {
            fold(&arrays(inputs, Literal::as_bool), |a, b| a || b).into()
        }
        (Literal::Bool(_), ReduceKind::Min) => {
            fold(&arrays(inputs, Literal::as_bool), |a, b| a && b).into()
        }
        other => panic!("not covered by this test: {other:?}"),
    }
}

/// Block `index` of `n` along `dim`.
fn block(x: &Literal, dim: usize, n: usize, index: usize) -> Literal {
    fn cut<T: Clone>(a: &ArrayD<T>, dim: usize, n: usize, i: usize) -> ArrayD<T> {
        let size = a.shape()[dim] / n;
        a.slice_axis(Axis(dim), Slice::from(i * size..(i + 1) * size))
            .to_owned()
    }
    match x {
        Literal::F32(a) => cut(a, dim, n, index).into(),
        Literal::BF16(a) => cut(a, dim, n, index).into(),
        Literal::F16(a) => cut(a, dim, n, index).into(),
        Literal::I32(a) => cut(a, dim, n, index).into(),
        Literal::Bool(a) => cut(a, dim, n, index).into(),
        other => panic!("not covered by this test: {other:?}"),
    }
}

fn concat(dim: usize, blocks: &[Literal]) -> Literal {
    fn cat<T: Clone>(
        dim: usize,
        blocks: &[Literal],
        get: fn(&Literal) -> Option<&ArrayD<T>>,
    ) -> ArrayD<T> {
        let views: Vec<_> = blocks.iter().map(|b| get(b).unwrap().view()).collect();
        ndarray::concatenate(Axis(dim), &views).unwrap()
    }
    match &blocks[0] {
        Literal::F32(_) => cat(dim, blocks, Literal::as_f32).into(),
        Literal::BF16(_) => cat(dim, blocks, Literal::as_bf16).into(),
        Literal::F16(_) => cat(dim, blocks, Literal::as_f16).into(),
        Literal::I32(_) => cat(dim, blocks, Literal::as_i32).into(),
        Literal::Bool(_) => cat(dim, blocks, Literal::as_bool).into(),
        other => panic!("not covered by this test: {other:?}"),
    }
}

fn expected(mesh: &Mesh, device: usize, axes: &[String], case: Case) -> Literal {
    let (members, index) = group_of(mesh, device, axes);
    let n = members.len();
    let inputs: Vec<Literal> = members.iter().map(|&d| input(d, dtype(case))).collect();
    match case {
        Case::AllReduce(kind, _) => reduce(kind, &inputs),
        Case::AllGather(dim, _) => concat(dim, &inputs),
        Case::ReduceScatter(kind, dim, _) => block(&reduce(kind, &inputs), dim, n, index),
        Case::AllToAll(split, concat_dim, _) => {
            let blocks: Vec<Literal> = inputs.iter().map(|x| block(x, split, n, index)).collect();
            concat(concat_dim, &blocks)
        }
        Case::ShiftUp(t) | Case::CycleDown(t) => {
            match pairs(case, n).iter().find(|p| p.1 == index) {
                Some(&(source, _)) => inputs[source].clone(),
                None => Literal::full(&SHAPE, t, 0.0),
            }
        }
    }
}

/// Runs every case over every axis list of `mesh` and compares with the expectations.
fn check_all_collectives(mesh: Mesh) {
    let thread_mesh = ThreadMesh::new(mesh.clone()).unwrap();
    for list in axis_lists(&mesh) {
        let run_axes = list.clone();
        let results = thread_mesh
            .run(move |ctx| {
                CASES
                    .iter()
                    .map(|&case| run_case(ctx, &run_axes, case))
                    .collect::<Result<Vec<Literal>>>()
            })
            .unwrap_or_else(|e| panic!("{mesh} over {list:?}: {e}"));
        for (device, outputs) in results.iter().enumerate() {
            for (&case, output) in CASES.iter().zip(outputs) {
                assert_eq!(
                    *output,
                    expected(&mesh, device, &list, case),
                    "{mesh}, axes {list:?}, device {device}, {case:?}"
                );
            }
        }
    }
}

#[test]
fn collectives_on_1_device() {
    check_all_collectives(Mesh::new([("x", 1)]).unwrap());
}

#[test]
fn collectives_on_2_devices() {
    check_all_collectives(Mesh::new([("x", 2)]).unwrap());
}

#[test]
fn collectives_on_4_devices() {
    check_all_collectives(Mesh::new([("x", 4)]).unwrap());
}

#[test]
fn collectives_on_8_devices() {
    check_all_collectives(Mesh::new([("x", 8)]).unwrap());
}

#[test]
fn collectives_on_2x2() {
    check_all_collectives(Mesh::new([("data", 2), ("model", 2)]).unwrap());
}

#[test]
fn collectives_on_2x4() {
    check_all_collectives(Mesh::new([("data", 2), ("model", 4)]).unwrap());
}

#[test]
fn collectives_on_4x2_with_a_permuted_device_order() {
    let mesh =
        Mesh::with_device_order([("data", 4), ("model", 2)], vec![3, 6, 0, 5, 1, 7, 2, 4]).unwrap();
    check_all_collectives(mesh);
}

#[test]
fn collectives_on_2x2x2() {
    check_all_collectives(Mesh::new([("x", 2), ("y", 2), ("z", 2)]).unwrap());
}

#[test]
fn axis_lists_cover_both_orders() {
    let lists = axis_lists(&Mesh::new([("data", 2), ("model", 2)]).unwrap());
    assert!(lists.contains(&axes(&["data", "model"])));
    assert!(lists.contains(&axes(&["model", "data"])));
    assert_eq!(lists.len(), 5);
}

/// A sub-axis is a mixed-radix digit of its axis: the major and minor halves of
/// `model` together index like `model`, each group member inverts its index, and a
/// part listed with an overlapping one (or not dividing the axis) is an error.
#[test]
fn sub_axes_index_digits_of_their_axis() {
    let meshes = [
        Mesh::new([("data", 2), ("model", 4)]).unwrap(),
        Mesh::with_device_order([("data", 2), ("model", 4)], vec![3, 6, 0, 5, 1, 7, 2, 4]).unwrap(),
    ];
    let (major, minor) = (Mesh::sub_axis("model", 1, 2), Mesh::sub_axis("model", 2, 2));
    for mesh in &meshes {
        assert_eq!(mesh.axis_size(&major), Some(2));
        for device in 0..8 {
            let whole = mesh.group_index(device, &["data", "model"]).unwrap();
            let parts = [&"data".to_string(), &major, &minor];
            assert_eq!(mesh.group_index(device, &parts).unwrap(), whole);
            let swapped = [&minor, &"data".to_string(), &major];
            let index = mesh.group_index(device, &swapped).unwrap();
            let [d, m] = [whole / 4, whole % 4];
            assert_eq!(index, (m % 2) * 4 + d * 2 + m / 2, "{mesh} device {device}");
            for i in 0..8 {
                let member = mesh.group_member(device, &swapped, i).unwrap();
                assert_eq!(mesh.group_index(member, &swapped).unwrap(), i);
            }
            let quarter = [Mesh::sub_axis("model", 1, 2), "data".into()];
            let member = mesh.group_member(device, &quarter, 0).unwrap();
            // Only the major digit of model and data change.
            let m_member = mesh.group_index(member, &["model"]).unwrap();
            assert_eq!(m_member % 2, m % 2);
        }
        for bad in [
            vec!["model".to_string(), minor.clone()],
            vec![major.clone(), major.clone()],
            vec![Mesh::sub_axis("model", 1, 3)],
            vec![Mesh::sub_axis("model", 4, 2)],
            vec![Mesh::sub_axis("model", 1, 1)],
        ] {
            assert!(
                matches!(mesh.group_index(0, &bad), Err(Error::AxisGroup { .. })),
                "{bad:?}"
            );
        }
    }
}

// ---- failures --------------------------------------------------------------------------

/// Runs `f` on another thread and fails the test if it takes more than `limit`.
fn within<T: Send + 'static>(limit: Duration, f: impl FnOnce() -> T + Send + 'static) -> T {
    let (done, finished) = mpsc::channel();
    std::thread::spawn(move || done.send(f()));
    finished
        .recv_timeout(limit)
        .unwrap_or_else(|_| panic!("did not finish within {limit:?}: hang"))
}

fn one_dim(n: usize) -> Arc<ThreadMesh> {
    Arc::new(ThreadMesh::new(Mesh::new([("x", n)]).unwrap()).unwrap())
}

/// A 2x2 mesh `(a, x)` whose groups over `x` are devices {0, 1} and {2, 3}.
fn two_groups() -> Arc<ThreadMesh> {
    Arc::new(ThreadMesh::new(Mesh::new([("a", 2), ("x", 2)]).unwrap()).unwrap())
}

/// An all-reduce sum over `x` of `input(device, F32)`, checked against the expectation.
fn assert_all_reduce_works(mesh: &Arc<ThreadMesh>) {
    let runner = Arc::clone(mesh);
    let outputs = within(Duration::from_secs(5), move || {
        runner.run(|ctx| {
            let x = input(ctx.device(), DType::F32);
            ctx.communicator()
                .all_reduce(&axes(&["x"]), ReduceKind::Sum, x)
        })
    })
    .unwrap();
    for (device, output) in outputs.into_iter().enumerate() {
        let (members, _) = group_of(mesh.mesh(), device, &axes(&["x"]));
        let all: Vec<Literal> = members.iter().map(|&d| input(d, DType::F32)).collect();
        assert_eq!(output, reduce(ReduceKind::Sum, &all), "device {device}");
    }
}

/// A bf16 all-reduce sums in f32 and rounds once: `1 + 7 * 2^-8` is halfway between
/// two bf16 values and rounds to even, `1 + 2^-7 * 4`; rounding after each addition would
/// leave `1` (each `+ 2^-8` ties back down), so would summing in bf16.
#[test]
fn bf16_all_reduce_rounds_once() {
    let mesh = one_dim(8);
    // One round, and reduce-scatter then all-gather (more than 4096 elements).
    for len in [3, 5000] {
        let runner = Arc::clone(&mesh);
        let outputs = within(Duration::from_secs(5), move || {
            runner.run(move |ctx| {
                let v = if ctx.device() == 0 {
                    1.0
                } else {
                    2f64.powi(-8)
                };
                let x = Literal::full(&[len], DType::BF16, v);
                ctx.communicator()
                    .all_reduce(&axes(&["x"]), ReduceKind::Sum, x)
            })
        })
        .unwrap();
        let want = Literal::full(&[len], DType::BF16, 1.0 + 4.0 * 2f64.powi(-7));
        assert_eq!(
            want,
            Literal::full(&[len], DType::BF16, 1.0 + 7.0 * 2f64.powi(-8))
        );
        for output in outputs {
            assert_eq!(output, want, "{len} elements");
        }
    }
}

fn deliberate() -> Error {
    failure("deliberate failure")
}

/// A failure of a test's own program on a device (a stand-in for any error).
fn failure(reason: &str) -> Error {
    Error::ThreadMesh {
        problem: ThreadMeshProblem::Internal {
            reason: reason.into(),
        },
    }
}

#[test]
fn a_failing_device_releases_the_others_and_the_mesh_recovers() {
    let mesh = one_dim(8);
    let runner = Arc::clone(&mesh);
    let start = Instant::now();
    let result = within(Duration::from_secs(5), move || {
        runner.run(|ctx| {
            if ctx.device() == 3 {
                std::thread::sleep(Duration::from_millis(50));
                return Err(deliberate());
            }
            let x = input(ctx.device(), DType::F32);
            ctx.communicator()
                .all_reduce(&axes(&["x"]), ReduceKind::Sum, x)
        })
    });
    assert!(start.elapsed() < Duration::from_secs(5));
    assert_eq!(
        result,
        Err(Error::DeviceFailed {
            device: 3,
            cause: Box::new(deliberate())
        })
    );
    assert_eq!(
        result.unwrap_err().to_string(),
        "device 3 failed: thread mesh: internal: deliberate failure"
    );
    assert_all_reduce_works(&mesh);
}

#[test]
fn a_panicking_device_releases_the_others_and_the_mesh_recovers() {
    let mesh = one_dim(8);
    let runner = Arc::clone(&mesh);
    let result = within(Duration::from_secs(5), move || {
        runner.run(|ctx| {
            let x = input(ctx.device(), DType::F32);
            let y = ctx
                .communicator()
                .all_reduce(&axes(&["x"]), ReduceKind::Sum, x)?;
            if ctx.device() == 5 {
                panic!("deliberate panic on device {}", ctx.device());
            }
            ctx.communicator()
                .all_reduce(&axes(&["x"]), ReduceKind::Max, y)
        })
    });
    assert_eq!(
        result,
        Err(Error::DevicePanicked {
            device: 5,
            // A closure run on the mesh has no nodes: no position is known.
            position: RunPosition::unknown(5),
            message: "deliberate panic on device 5".into()
        })
    );
    assert_all_reduce_works(&mesh);
}

/// Runs `program` on `mesh`, recording each device's result of `collective`; returns the
/// run's result and the records.
type Records = Arc<Mutex<Vec<Option<Result<Literal>>>>>;

fn record(
    mesh: &Arc<ThreadMesh>,
    collective: impl Fn(&DeviceContext) -> Result<Literal> + Send + Sync + 'static,
) -> (Result<Vec<()>>, Vec<Option<Result<Literal>>>) {
    let records: Records = Arc::new(Mutex::new(vec![None; mesh.mesh().num_devices()]));
    let (runner, written) = (Arc::clone(mesh), Arc::clone(&records));
    let result = within(Duration::from_secs(5), move || {
        runner.run(move |ctx| {
            let outcome = collective(ctx);
            written.lock().unwrap()[ctx.device()] = Some(outcome.clone());
            outcome.map(|_| ())
        })
    });
    let records = records.lock().unwrap().clone();
    (result, records)
}

#[test]
fn mismatched_shapes_are_an_error_on_every_member() {
    let mesh = one_dim(4);
    let (result, records) = record(&mesh, |ctx| {
        let len = if ctx.device() == 2 { 3 } else { 4 };
        let x = Literal::full(&[len], DType::F32, 1.0);
        ctx.communicator()
            .all_reduce(&axes(&["x"]), ReduceKind::Sum, x)
    });
    assert!(
        matches!(result, Err(Error::Collective { .. })),
        "{result:?}"
    );
    for (device, record) in records.into_iter().enumerate() {
        match record {
            Some(Err(Error::Collective {
                device: d,
                problem:
                    CollectiveProblem::OperandsDiffer {
                        device: mine,
                        ty,
                        other_ty,
                        ..
                    },
                ..
            })) => {
                assert_eq!((d, mine), (device, device));
                let shapes = [ty.shape[0], other_ty.shape[0]];
                assert!(shapes == [3, 4] || shapes == [4, 3], "{shapes:?}");
            }
            other => panic!("device {device}: {other:?}"),
        }
    }
    assert_all_reduce_works(&mesh);
}

#[test]
fn mismatched_dtypes_in_one_group_fail_the_run_but_not_the_other_group() {
    let mesh = two_groups();
    let (result, records) = record(&mesh, |ctx| {
        let dtype = if ctx.device() == 0 {
            DType::I32
        } else {
            DType::F32
        };
        let x = Literal::full(&[4], dtype, 1.0);
        ctx.communicator()
            .all_reduce(&axes(&["x"]), ReduceKind::Sum, x)
    });
    assert!(
        matches!(result, Err(Error::Collective { .. })),
        "{result:?}"
    );
    // Devices 0 and 1 form the faulty group. Devices 2 and 3 synchronise only with each
    // other: their all-reduce completes, unless the abort came first and released them
    // (a device waiting in another group is released: see
    // `a_failure_in_one_group_releases_a_device_waiting_in_another`).
    assert!(matches!(records[0], Some(Err(Error::Collective { .. }))));
    assert!(matches!(records[1], Some(Err(Error::Collective { .. }))));
    for device in [2, 3] {
        match &records[device] {
            Some(Ok(sum)) => assert_eq!(*sum, Literal::full(&[4], DType::F32, 2.0)),
            Some(Err(Error::Aborted { device: d, .. })) => assert_eq!(*d, device),
            other => panic!("device {device}: {other:?}"),
        }
    }
}

#[test]
fn devices_at_different_collectives_are_an_error() {
    let mesh = one_dim(4);
    let (result, _) = record(&mesh, |ctx| {
        let x = input(ctx.device(), DType::F32);
        if ctx.device() == 1 {
            ctx.communicator().all_gather(&axes(&["x"]), 0, x)
        } else {
            ctx.communicator()
                .all_reduce(&axes(&["x"]), ReduceKind::Sum, x)
        }
    });
    let message = result.unwrap_err().to_string();
    assert!(message.contains("devices disagree"), "{message}");
    assert_all_reduce_works(&mesh);
}

#[test]
fn groups_synchronise_only_their_members() {
    let mesh = two_groups();
    // Devices 2 and 3 start only once devices 0 and 1 have finished three all-reduces
    // over their group: a meeting of more than the group would wait for ever.
    let finished = Arc::new((Mutex::new(0), std::sync::Condvar::new()));
    let (runner, done) = (Arc::clone(&mesh), Arc::clone(&finished));
    let outputs = within(Duration::from_secs(10), move || {
        runner.run(move |ctx| {
            let (count, changed) = &*done;
            let mut x = input(ctx.device(), DType::F32);
            if ctx.device() >= 2 {
                let waited = changed
                    .wait_timeout_while(count.lock().unwrap(), Duration::from_secs(5), |c| *c < 2)
                    .unwrap();
                if waited.1.timed_out() {
                    return Err(failure("devices 0 and 1 were held up"));
                }
            }
            for _ in 0..3 {
                x = ctx
                    .communicator()
                    .all_reduce(&axes(&["x"]), ReduceKind::Sum, x)?;
            }
            *count.lock().unwrap() += 1;
            changed.notify_all();
            Ok(x)
        })
    })
    .unwrap();
    for (device, output) in outputs.into_iter().enumerate() {
        let (members, _) = group_of(mesh.mesh(), device, &axes(&["x"]));
        let mut want = reduce(
            ReduceKind::Sum,
            &members
                .iter()
                .map(|&d| input(d, DType::F32))
                .collect::<Vec<_>>(),
        );
        for _ in 0..2 {
            want = reduce(ReduceKind::Sum, &[want.clone(), want]);
        }
        assert_eq!(output, want, "device {device}");
    }
}

#[test]
fn a_group_of_one_meets_nobody() {
    let mesh = one_dim(2);
    // Device 1 starts only once device 0 has run collectives over no axes: any meeting
    // of both would wait for ever.
    let (done, start) = mpsc::channel::<()>();
    let (done, start) = (Mutex::new(done), Mutex::new(start));
    let runner = Arc::clone(&mesh);
    let outputs = within(Duration::from_secs(10), move || {
        runner.run(move |ctx| {
            if ctx.device() == 1 {
                let started = start.lock().unwrap().recv_timeout(Duration::from_secs(5));
                started.map_err(|_| failure("device 0 was held up"))?;
            }
            let comm = ctx.communicator();
            let x = input(ctx.device(), DType::F32);
            let sum = comm.all_reduce(&[], ReduceKind::Sum, x.clone())?;
            let gathered = comm.all_gather(&[], 1, x.clone())?;
            let kept = comm.collective_permute(&[], &[(0, 0)], x.clone())?;
            let dropped = comm.collective_permute(&[], &[], x)?;
            if ctx.device() == 0 {
                done.lock().unwrap().send(()).unwrap();
            }
            Ok([sum, gathered, kept, dropped])
        })
    })
    .unwrap();
    for (device, outs) in outputs.into_iter().enumerate() {
        let x = input(device, DType::F32);
        let zeros = Literal::full(&SHAPE, DType::F32, 0.0);
        assert_eq!(outs, [x.clone(), x.clone(), x, zeros], "device {device}");
    }
}

#[test]
fn a_failure_in_one_group_releases_a_device_waiting_in_another() {
    let mesh = two_groups();
    // Device 3 arrives only after device 2 has left its collective: device 2 waits in
    // the meeting of {2, 3} until the failure in {0, 1} (mismatched shapes) releases it.
    let (left, arrive) = mpsc::channel::<()>();
    let (left, arrive) = (Mutex::new(left), Mutex::new(arrive));
    let (result, records) = record(&mesh, move |ctx| {
        let len = if ctx.device() == 0 { 3 } else { 4 };
        let x = Literal::full(&[len], DType::F32, 1.0);
        if ctx.device() == 3 {
            let released = arrive.lock().unwrap().recv_timeout(Duration::from_secs(4));
            released.map_err(|_| failure("device 2 was not released"))?;
        }
        let y = ctx
            .communicator()
            .all_reduce(&axes(&["x"]), ReduceKind::Sum, x);
        if ctx.device() == 2 {
            left.lock().unwrap().send(()).unwrap();
        }
        y
    });
    assert!(
        matches!(result, Err(Error::Collective { .. })),
        "{result:?}"
    );
    assert!(matches!(records[0], Some(Err(Error::Collective { .. }))));
    assert!(matches!(records[1], Some(Err(Error::Collective { .. }))));
    for device in [2, 3] {
        assert!(
            matches!(&records[device], Some(Err(Error::Aborted { device: d, .. })) if *d == device),
            "device {device}: {:?}",
            records[device]
        );
    }
    assert_all_reduce_works(&mesh);
}

#[test]
fn a_device_that_skips_a_collective_is_an_error_not_a_hang() {
    // Device 2 skips an all-reduce over `x`. On one axis the others meet it at the end of
    // the program; on 2x2 device 3 waits in the group {2, 3} for it while devices 0, 1
    // and 2 wait at the end for device 3.
    for (mesh, census) in [
        (
            one_dim(4),
            "devices [0, 1, 3] are at all_reduce(sum) over [x]; device 2 is at the end of its program",
        ),
        (
            two_groups(),
            "devices [0, 1, 2] are at the end of its program; device 3 is at all_reduce(sum) over [x]",
        ),
    ] {
        let (result, _) = record(&mesh, |ctx| {
            let x = input(ctx.device(), DType::F32);
            if ctx.device() == 2 {
                return Ok(x);
            }
            ctx.communicator()
                .all_reduce(&axes(&["x"]), ReduceKind::Sum, x)
        });
        let message = result.unwrap_err().to_string();
        assert!(message.contains(census), "{message}");
        assert_all_reduce_works(&mesh);
    }
}

type Collective = Box<dyn Fn(&DeviceContext) -> Result<Literal> + Send + Sync>;

#[test]
fn bad_collective_arguments_are_errors() {
    let mesh = one_dim(4);
    let x_axis = axes(&["x"]);
    let bad: Vec<(&str, Collective)> = vec![
        ("unknown mesh axis `y`", {
            Box::new(|ctx| {
                ctx.communicator()
                    .all_gather(&axes(&["y"]), 0, input(0, DType::F32))
            })
        }),
        ("listed twice", {
            Box::new(|ctx| {
                let twice = axes(&["x", "x"]);
                ctx.communicator()
                    .all_gather(&twice, 0, input(0, DType::F32))
            })
        }),
        ("out of range", {
            let a = x_axis.clone();
            Box::new(move |ctx| ctx.communicator().all_gather(&a, 2, input(0, DType::F32)))
        }),
        ("does not divide", {
            let a = x_axis.clone();
            Box::new(move |ctx| {
                let x = Literal::full(&[6], DType::F32, 1.0);
                ctx.communicator().reduce_scatter(&a, ReduceKind::Sum, 0, x)
            })
        }),
        ("target 1 appears in two pairs", {
            let a = x_axis.clone();
            Box::new(move |ctx| {
                ctx.communicator()
                    .collective_permute(&a, &[(0, 1), (2, 1)], input(0, DType::F32))
            })
        }),
        ("beyond the group size", {
            let a = x_axis.clone();
            Box::new(move |ctx| {
                ctx.communicator()
                    .collective_permute(&a, &[(0, 4)], input(0, DType::F32))
            })
        }),
    ];
    for (expected, collective) in bad {
        let (result, _) = record(&mesh, collective);
        let message = result.unwrap_err().to_string();
        assert!(
            message.contains(expected),
            "expected `{expected}` in: {message}"
        );
    }
    assert_all_reduce_works(&mesh);
}

// ---- the mesh's lifetime ----------------------------------------------------------------

#[test]
fn the_resident_store_persists_across_runs() {
    let mesh = ThreadMesh::new(Mesh::new([("data", 2), ("model", 2)]).unwrap()).unwrap();
    mesh.run(|ctx| {
        let w = input(ctx.device(), DType::F32);
        ctx.store_mut().insert("w".into(), w);
        Ok(())
    })
    .unwrap();
    // Two "training steps": w <- all_reduce_sum over data (w) each time.
    for _ in 0..2 {
        mesh.run(|ctx| {
            let (comm, store) = ctx.communicator_and_store();
            let w = store.remove("w").unwrap();
            let w = comm.all_reduce(&axes(&["data"]), ReduceKind::Sum, w)?;
            store.insert("w".into(), w);
            Ok(())
        })
        .unwrap();
    }
    let stored = mesh.run(|ctx| Ok(ctx.store()["w"].clone())).unwrap();
    for (device, w) in stored.iter().enumerate() {
        let (members, _) = group_of(mesh.mesh(), device, &axes(&["data"]));
        let once = reduce(
            ReduceKind::Sum,
            &members
                .iter()
                .map(|&d| input(d, DType::F32))
                .collect::<Vec<_>>(),
        );
        let twice = reduce(ReduceKind::Sum, &vec![once; members.len()]);
        assert_eq!(*w, twice, "device {device}");
    }
}

#[test]
fn settle_runs_on_every_device_in_the_run_and_knows_whether_all_succeeded() {
    let mesh = ThreadMesh::new(Mesh::new([("data", 2), ("model", 2)]).unwrap()).unwrap();
    let stage = |fail: Option<usize>| {
        move |ctx: &mut DeviceContext| {
            let x = input(ctx.device(), DType::F32);
            ctx.store_mut().insert("staged".into(), x);
            match fail {
                Some(device) if device == ctx.device() => Err(deliberate()),
                _ => Ok(std::thread::current().id()),
            }
        }
    };
    // Keeps the staged value if every device succeeded, on the thread of its program.
    let settle = |ctx: &mut DeviceContext, succeeded: bool| {
        let staged = ctx.store_mut().remove("staged").unwrap();
        if succeeded {
            ctx.store_mut().insert("kept".into(), staged);
        }
        ctx.store_mut()
            .insert("settled on".into(), Literal::full(&[], DType::Bool, 1.0));
    };
    let failed = mesh.run_then_settle(stage(Some(2)), settle);
    assert!(matches!(failed, Err(Error::DeviceFailed { device: 2, .. })));
    let stores = mesh.run(|ctx| Ok(ctx.store().clone())).unwrap();
    for store in &stores {
        assert!(store.contains_key("settled on") && !store.contains_key("kept"));
        assert!(!store.contains_key("staged"));
    }
    let threads = mesh.run_then_settle(stage(None), settle).unwrap();
    let kept = mesh
        .run(|ctx| {
            Ok((
                ctx.store().get("kept").cloned(),
                std::thread::current().id(),
            ))
        })
        .unwrap();
    for (device, (value, thread)) in kept.into_iter().enumerate() {
        assert_eq!(value, Some(input(device, DType::F32)), "device {device}");
        assert_eq!(thread, threads[device]);
    }
}

#[test]
fn results_are_indexed_by_device_and_threads_live_across_runs() {
    let mesh = ThreadMesh::new(
        Mesh::with_device_order([("data", 2), ("model", 2)], vec![2, 0, 3, 1]).unwrap(),
    )
    .unwrap();
    let first = mesh
        .run(|ctx| Ok((ctx.device(), std::thread::current().id())))
        .unwrap();
    let second = mesh
        .run(|ctx| Ok((ctx.device(), std::thread::current().id())))
        .unwrap();
    assert_eq!(first, second);
    for (i, (device, thread)) in first.iter().enumerate() {
        assert_eq!(i, *device);
        assert!(first[..i].iter().all(|(_, t)| t != thread));
    }
}

thread_local! {
    static TOKEN: std::cell::RefCell<Option<Arc<()>>> = const { std::cell::RefCell::new(None) };
}

#[test]
fn drop_joins_every_device_thread() {
    let token = Arc::new(());
    let mesh = ThreadMesh::new(Mesh::new([("x", 4)]).unwrap()).unwrap();
    let held = Arc::clone(&token);
    mesh.run(move |_| {
        TOKEN.with(|t| *t.borrow_mut() = Some(Arc::clone(&held)));
        Ok(())
    })
    .unwrap();
    // Each thread's local holds one; the program may still hold one while jobs finish.
    assert!(Arc::strong_count(&token) > 4);
    // A thread's locals are destroyed before it can be joined.
    drop(mesh);
    assert_eq!(Arc::strong_count(&token), 1);
}

#[test]
fn a_large_all_reduce_writes_into_the_operand_buffer() {
    // Large enough for reduce-scatter then all-gather (small operands are reduced in one
    // round into a fresh buffer).
    let mesh = ThreadMesh::new(Mesh::new([("x", 4)]).unwrap()).unwrap();
    let same = mesh
        .run(|ctx| {
            let x = Literal::full(&[64, 1024], DType::F32, ctx.device() as f64);
            let before = x.as_f32().unwrap().as_ptr() as usize;
            let y = ctx
                .communicator()
                .all_reduce(&axes(&["x"]), ReduceKind::Sum, x)?;
            Ok(before == y.as_f32().unwrap().as_ptr() as usize)
        })
        .unwrap();
    assert_eq!(same, vec![true; 4]);
}

#[test]
fn all_reduce_handles_uneven_lengths_and_transposed_operands() {
    let mesh = ThreadMesh::new(Mesh::new([("x", 8)]).unwrap()).unwrap();
    // 15 elements cut in 8 chunks; 2 elements (six empty chunks); a transposed view.
    let operand = |device: usize, shape: &[usize]| {
        ArrayD::from_shape_fn(IxDyn(shape), |ix| {
            (ix.slice().iter().fold(0, |a, &i| a * 7 + i) as i32 - 11) * (device as i32 % 3 - 1)
        })
    };
    let outputs = mesh
        .run(move |ctx| {
            let comm = ctx.communicator();
            let x_axis = axes(&["x"]);
            let d = ctx.device();
            let odd = comm.all_reduce(&x_axis, ReduceKind::Sum, operand(d, &[3, 5]).into())?;
            let tiny = comm.all_reduce(&x_axis, ReduceKind::Max, operand(d, &[2]).into())?;
            let transposed = operand(d, &[3, 5]).reversed_axes();
            let t = comm.all_reduce(&x_axis, ReduceKind::Sum, transposed.into())?;
            Ok([odd, tiny, t])
        })
        .unwrap();
    let sum = |shape: &[usize]| {
        fold(
            &(0..8).map(|d| operand(d, shape)).collect::<Vec<_>>(),
            |a, b| a + b,
        )
    };
    let max = fold(
        &(0..2).map(|d| operand(7 - d, &[2])).collect::<Vec<_>>(),
        i32::max,
    );
    for [odd, tiny, t] in outputs {
        assert_eq!(odd, sum(&[3, 5]).into());
        assert_eq!(tiny, max.clone().into());
        assert_eq!(t, sum(&[3, 5]).reversed_axes().into());
    }
}

/// The nested reduction order (`communicator/combine.rs`): members sorted by mesh
/// coordinates, the minor-most prime digit folded first. On `(data=2, model=4)` a group
/// over `[model, data]` sums model's minor digit, then its major one, then data:
/// `((o0 + o1) + (o2 + o3)) + ((o4 + o5) + (o6 + o7))`, whatever the axes' order.
#[test]
fn all_reduce_sums_in_the_nested_order_on_the_one_round_and_two_round_paths() {
    let mesh = ThreadMesh::new(Mesh::new([("data", 2), ("model", 4)]).unwrap()).unwrap();
    let group_axes = axes(&["model", "data"]);
    // Magnitudes spread over eight decades and mixed signs: f32 sums depend on order.
    let operand = |device: usize, len: usize| -> ArrayD<f32> {
        ArrayD::from_shape_fn(IxDyn(&[len]), |ix| {
            let sign = if (device + ix[0]).is_multiple_of(3) {
                -1.0
            } else {
                1.0
            };
            let scale = 10f32.powi(((device * 3 + ix[0]) % 8) as i32 - 4);
            sign * (1.0 + ix[0] as f32 * 1e-3) * scale
        })
    };
    // 7 elements take one round; 5000 (uneven chunks of 625) reduce-scatter first.
    let lens = [7, 5000];
    let run_axes = group_axes.clone();
    let outputs = mesh
        .run(move |ctx| {
            let d = ctx.device();
            lens.iter()
                .map(|&len| {
                    ctx.communicator().all_reduce(
                        &run_axes,
                        ReduceKind::Sum,
                        operand(d, len).into(),
                    )
                })
                .collect::<Result<Vec<Literal>>>()
        })
        .unwrap();
    let bits = |a: &ArrayD<f32>| a.iter().map(|x| x.to_bits()).collect::<Vec<u32>>();
    let add = |a: ArrayD<f32>, b: ArrayD<f32>| a + b;
    for (device, outs) in outputs.iter().enumerate() {
        for (&len, out) in lens.iter().zip(outs) {
            let o = |d: usize| operand(d, len);
            let pairs =
                |first: usize| add(add(o(first), o(first + 1)), add(o(first + 2), o(first + 3)));
            let want = add(pairs(0), pairs(4));
            assert_eq!(
                bits(out.as_f32().unwrap()),
                bits(&want),
                "device {device}, {len}"
            );
            // The former order, a left fold in group order, gives other bits here.
            let (members, _) = group_of(mesh.mesh(), device, &group_axes);
            let blocks: Vec<ArrayD<f32>> = members.iter().map(|&m| operand(m, len)).collect();
            let left = fold(&blocks, |a, b| a + b);
            assert_ne!(bits(&left), bits(&want), "order-insensitive operands");
        }
    }
}

#[test]
fn a_run_from_a_device_thread_is_an_error_not_a_deadlock() {
    let mesh = one_dim(4);
    let (runner, inner) = (Arc::clone(&mesh), Arc::clone(&mesh));
    let results = within(Duration::from_secs(5), move || {
        runner.run(move |ctx| {
            let device = ctx.device();
            Ok((device, inner.run(|_| Ok(()))))
        })
    })
    .unwrap();
    for (device, result) in results {
        assert_eq!(result, Err(Error::ReentrantRun { device }));
    }
    assert_all_reduce_works(&mesh);
}

/// Held by a program: when the program is dropped (on a device thread), waits for `go`,
/// then drops the last handle of the mesh there and reports the thread's name.
struct DropsTheMesh {
    mesh: Mutex<Option<Arc<ThreadMesh>>>,
    go: Mutex<mpsc::Receiver<()>>,
    done: mpsc::Sender<Option<String>>,
}

impl Drop for DropsTheMesh {
    fn drop(&mut self) {
        let go = self.go.lock().unwrap().recv_timeout(Duration::from_secs(5));
        let mesh = self.mesh.lock().unwrap().take();
        let last = mesh.as_ref().is_some_and(|m| Arc::strong_count(m) == 1);
        drop(mesh);
        let thread = std::thread::current().name().map(String::from);
        // Reports only if the wait ended by the signal and this was the last handle.
        let _ = self.done.send(thread.filter(|_| go.is_ok() && last));
    }
}

#[test]
fn dropping_the_last_handle_on_a_device_thread_is_clean() {
    let token = Arc::new(());
    let mesh = one_dim(4);
    let held = Arc::clone(&token);
    mesh.run(move |_| {
        TOKEN.with(|t| *t.borrow_mut() = Some(Arc::clone(&held)));
        Ok(())
    })
    .unwrap();
    let (go, wait) = mpsc::channel();
    let (done, finished) = mpsc::channel();
    let guard = DropsTheMesh {
        mesh: Mutex::new(Some(Arc::clone(&mesh))),
        go: Mutex::new(wait),
        done,
    };
    mesh.run(move |_| {
        let _held = &guard;
        Ok(())
    })
    .unwrap();
    drop(mesh);
    go.send(()).unwrap();
    let thread = finished
        .recv_timeout(Duration::from_secs(5))
        .expect("the drop panicked or hung");
    assert!(
        thread
            .as_deref()
            .is_some_and(|t| t.starts_with("gspmd-device-")),
        "dropped on {thread:?}"
    );
    // Every device thread ends, the detached one too, destroying its thread-locals.
    let start = Instant::now();
    while Arc::strong_count(&token) > 1 {
        assert!(
            start.elapsed() < Duration::from_secs(5),
            "a device thread lives on"
        );
        std::thread::sleep(Duration::from_millis(10));
    }
}

// ---- timeouts ---------------------------------------------------------------------------

#[test]
fn the_default_timeout_is_generous_and_can_be_changed() {
    let mesh = ThreadMesh::new(Mesh::new([("x", 2)]).unwrap()).unwrap();
    assert_eq!(mesh.timeout(), Some(ThreadMesh::DEFAULT_TIMEOUT));
    assert!(ThreadMesh::DEFAULT_TIMEOUT >= Duration::from_secs(60));
    let mesh = mesh.with_timeout(Duration::from_millis(5)).unwrap();
    assert_eq!(mesh.timeout(), Some(Duration::from_millis(5)));
    assert_eq!(mesh.with_timeout(None).unwrap().timeout(), None);
}

#[test]
fn a_device_that_does_not_arrive_times_out_by_name_and_the_mesh_recovers() {
    let timeout = Duration::from_millis(1000);
    let mesh = Arc::new(
        ThreadMesh::new(Mesh::new([("x", 4)]).unwrap())
            .unwrap()
            .with_timeout(timeout)
            .unwrap(),
    );
    // Device 3 is stuck (until released) before the all-reduce the others wait in.
    let (release, stuck) = mpsc::channel::<()>();
    let stuck = Arc::new(Mutex::new(stuck));
    let runner = Arc::clone(&mesh);
    let start = Instant::now();
    let result = within(Duration::from_secs(10), move || {
        runner.run(move |ctx| {
            if ctx.device() == 3 {
                let _ = stuck.lock().unwrap().recv();
            }
            let x = input(ctx.device(), DType::F32);
            ctx.communicator()
                .all_reduce(&axes(&["x"]), ReduceKind::Sum, x)
        })
    });
    assert!(start.elapsed() < 4 * timeout, "took {:?}", start.elapsed());
    match result {
        Err(Error::CollectiveTimeout {
            device,
            collective,
            missing,
            timeout: t,
        }) => {
            assert!(device < 3);
            assert_eq!(collective, "all_reduce(sum) over [x]");
            assert_eq!(missing, vec![3]);
            assert_eq!(t, timeout);
        }
        other => panic!("{other:?}"),
    }
    // Still stuck: the next run waits for device 3 at the end of its program and
    // times out again, naming it.
    let runner = Arc::clone(&mesh);
    let again = within(Duration::from_secs(10), move || runner.run(|_| Ok(())));
    let message = again.unwrap_err().to_string();
    assert!(
        message.contains("the end of its program: devices [3] did not arrive"),
        "{message}"
    );
    // Released, device 3 finishes its stale runs (their collectives fail at once, and
    // abort nothing), and the mesh works again.
    release.send(()).unwrap();
    assert_all_reduce_works(&mesh);
    assert_all_reduce_works(&mesh);
}

// ---- agreement with the reference interpreter -------------------------------------------

fn build(f: impl FnOnce(&Builder) -> Vec<Tensor>) -> Program {
    let b = Builder::new("test");
    let outs = f(&b);
    let refs: Vec<&Tensor> = outs.iter().collect();
    b.finish(&refs).unwrap()
}

fn s(text: &str) -> Sharding {
    text.parse().unwrap()
}

/// Bit-for-bit equal f32 literals, any NaN matching any NaN.
fn same_bits(want: &Literal, got: &Literal) -> bool {
    let (a, b) = (want.as_f32().unwrap(), got.as_f32().unwrap());
    a.shape() == b.shape()
        && a.iter()
            .zip(b.iter())
            .all(|(x, y)| (x.is_nan() && y.is_nan()) || x.to_bits() == y.to_bits())
}

#[test]
fn max_and_min_over_a_split_dim_propagate_nan_as_the_interpreter_does() {
    // Rows 0..10 split over the mesh; a NaN in a late shard, zeros of both signs as the
    // extreme values of a column in different shards.
    let rows = 10;
    let x: Literal = ArrayD::from_shape_fn(IxDyn(&[rows, 4]), |ix| match (ix[0], ix[1]) {
        (7, 1) => f32::NAN,
        (0, 2) => -1.0,
        (2, 2) => 0.0,
        (_, 2) => -0.0,
        (r, 3) => {
            if r == 8 {
                0.0
            } else {
                1.0 + r as f32
            }
        }
        (r, c) => (r * 4 + c) as f32 - 17.0,
    })
    .into();
    assert!(x.as_f32().unwrap()[[7, 1]].is_nan());
    let program = build(|b| {
        let x = b
            .parameter("x", [rows, 4], DType::F32)
            .annotate(s("(x, _)"));
        vec![x.max_over(&[0]), x.min_over(&[0]), x.max_over(&[0, 1])]
    });
    let want = interpret(&program, std::slice::from_ref(&x)).unwrap();
    assert!(want[0].as_f32().unwrap()[1].is_nan() && want[2].as_f32().unwrap()[[]].is_nan());
    for n in [2, 4, 8] {
        let mesh = Mesh::new([("x", n)]).unwrap();
        let exe = compile(&program, &mesh).unwrap();
        let got = exe
            .run(
                &ThreadMesh::new(mesh.clone()).unwrap(),
                std::slice::from_ref(&x),
            )
            .unwrap();
        for (k, (w, g)) in want.iter().zip(&got).enumerate() {
            assert!(same_bits(w, g), "{mesh}, output {k}: want {w:?}, got {g:?}");
        }
    }
}

/// The bytes of an f32 vector of `n` elements.
fn f32_bytes(n: usize) -> usize {
    n * DType::F32.size_in_bytes()
}

#[test]
fn a_value_beyond_memory_is_an_error_on_the_interpreter_and_the_mesh() {
    // f32[1000000, 1000000]: 4 TB, far beyond any host; it must not be allocated.
    let n = 1_000_000;
    let program = build(|b| {
        let x = b.parameter("x", [n], DType::F32);
        let big = x.broadcast_in_dim([n, n], &[1]).shard(s("(x, _)"));
        vec![big.sum(&[0])]
    });
    let x = Literal::full(&[n], DType::F32, 1.0);
    let line = line!() - 4;
    let is_big = |e: &Error, bytes: usize| match e {
        Error::OutOfMemory {
            op,
            location,
            bytes: b,
            ..
        } => {
            *op == "broadcast"
                && location.file.ends_with("thread_mesh.rs")
                && location.line == line
                && *b == bytes
        }
        _ => false,
    };
    let error = interpret(&program, std::slice::from_ref(&x)).unwrap_err();
    assert!(is_big(&error, f32_bytes(n * n)), "{error}");
    let mesh = Mesh::new([("x", 2)]).unwrap();
    let threads = ThreadMesh::new(mesh.clone()).unwrap();
    let error = compile(&program, &mesh)
        .unwrap()
        .run(&threads, std::slice::from_ref(&x))
        .unwrap_err();
    match &error {
        Error::DeviceFailed { cause, .. } => {
            assert!(is_big(cause, f32_bytes(n * n / 2)), "{error}")
        }
        other => panic!("{other}"),
    }
}

#[test]
fn the_limit_is_on_live_values_not_on_one_value() {
    // x, -x and |x| are live together (x dies after abs), then -x + |x|: three values
    // of 4 KB live at the peak, each fitting a limit of 12 KB - 1 alone. (i32, so that
    // the plan does not fuse the three ops into one loop, as it would f32 ones.)
    let n = 1000;
    let program = build(|b| {
        let x = b.parameter("x", [n], DType::I32).annotate(s("(x)"));
        let (e, t) = (x.neg(), x.abs());
        vec![&e + &t]
    });
    let line = line!() - 3;
    let x: Literal = ArrayD::from_shape_fn(IxDyn(&[n]), |ix| ix[0] as i32 - 500).into();
    let inputs = std::slice::from_ref(&x);
    let peak = 3 * f32_bytes(n);
    let want = interpret_with_memory_limit(&program, inputs, peak).unwrap();
    assert_eq!(want, interpret(&program, inputs).unwrap());
    let is_abs = |e: &Error, bytes: usize, limit: usize| {
        matches!(e, Error::OutOfMemory { op: "abs", location, bytes: b, live, limit: l, .. }
            if location.line == line && *b == bytes && *live == 2 * bytes && *l == limit)
    };
    let error = interpret_with_memory_limit(&program, inputs, peak - 1).unwrap_err();
    assert!(is_abs(&error, f32_bytes(n), peak - 1), "{error}");
    // On 2 devices each holds half of every value.
    let mesh = Mesh::new([("x", 2)]).unwrap();
    let exe = compile(&program, &mesh).unwrap();
    let per_device = 3 * f32_bytes(n / 2);
    let threads = ThreadMesh::new(mesh.clone())
        .unwrap()
        .with_memory_limit(per_device);
    assert_eq!(threads.memory_limit(), per_device);
    assert_eq!(exe.run(&threads, inputs).unwrap(), want);
    let threads = threads.with_memory_limit(per_device - 1);
    match exe.run(&threads, inputs) {
        Err(Error::DeviceFailed { cause, .. }) => {
            assert!(is_abs(&cause, f32_bytes(n / 2), per_device - 1), "{cause}")
        }
        other => panic!("{other:?}"),
    }
}

// ---- collective shift ------------------------------------------------------------------

/// A per-device program `collective_shift(x)` over `axes`, with `x` split along dim 0
/// over `axes` in blocks of two rows.
fn shift_program(mesh: &Mesh, axes: &[String], offset: i64, wrap: bool) -> SpmdProgram {
    let group = AxisGroup {
        axes: axes.to_vec(),
        size: mesh.axes_size(axes),
    };
    let op = Op::CollectiveShift {
        group,
        offset,
        wrap,
        mirror: false,
    };
    collective_program(mesh, axes, op)
}

/// A per-device program applying `op` to blocks of `[2 n, 3]` rows split over `axes`
/// (`n` devices), its output split alike.
fn collective_program(mesh: &Mesh, axes: &[String], op: Op) -> SpmdProgram {
    let n = mesh.axes_size(axes);
    let global = TensorType::new(vec![2 * n, 3], DType::I32);
    let mut program = Program::new("shift");
    let x = program
        .push_op(
            Op::Parameter {
                index: 0,
                ty: TensorType::new(vec![2, 3], DType::I32),
            },
            &[],
            Location::caller(),
        )
        .unwrap();
    let y = program.push_op(op, &[x], Location::caller()).unwrap();
    program.params = vec![x];
    program.outputs = vec![y];
    let sharding = Sharding::new([
        DimSharding::closed(axes.to_vec()),
        DimSharding::closed::<String>([]),
    ]);
    SpmdProgram {
        program,
        mesh: mesh.clone(),
        inputs: vec![(global.clone(), sharding.clone())],
        outputs: vec![(global, sharding)],
        warnings: vec![],
    }
}

/// Member `i` holds rows `2i, 2i+1`; after the shift it holds member `i - offset`'s rows
/// (modulo the group size with `wrap`), or zeros when there is no such member.
fn check_shift(mesh: &Mesh, axes: &[String], offset: i64, wrap: bool) {
    let n = mesh.axes_size(axes);
    let x = ArrayD::from_shape_fn(IxDyn(&[2 * n, 3]), |ix| (ix[0] * 3 + ix[1]) as i32 + 1);
    let expected = ArrayD::from_shape_fn(IxDyn(&[2 * n, 3]), |ix| {
        let (i, row) = ((ix[0] / 2) as i64, ix[0] % 2);
        let source = if wrap {
            (i - offset).rem_euclid(n as i64)
        } else {
            i - offset
        };
        if (0..n as i64).contains(&source) {
            x[[source as usize * 2 + row, ix[1]]]
        } else {
            0
        }
    });
    let spmd = shift_program(mesh, axes, offset, wrap);
    let thread_mesh = ThreadMesh::new(mesh.clone()).unwrap();
    let out = Arc::new(Loaded::new(spmd.clone()))
        .run(&thread_mesh, &[x.into()])
        .unwrap();
    assert_eq!(
        out[0],
        expected.into(),
        "{mesh}, axes {axes:?}, offset {offset}, wrap {wrap}"
    );
    // Only devices that receive from another count: none when the shift moves nothing.
    let moves = if wrap {
        offset.rem_euclid(n as i64) != 0
    } else {
        offset != 0 && offset.unsigned_abs() < n as u64
    };
    let bytes = spmd.collectives().bytes();
    assert_eq!(bytes, if moves { 2 * 3 * 4 } else { 0 }, "{offset} {wrap}");
}

/// A collective permute counts the bytes of a block exactly when it changes what some
/// device holds (blocks are distinct): a permute whose senders are the receivers
/// (the same order, or orders differing only in axes of size 1) moves nothing.
#[test]
fn collective_permute_counts_bytes_only_when_a_device_receives_from_another() {
    let meshes = [
        Mesh::new([("data", 2), ("model", 4)]).unwrap(),
        Mesh::new([("x", 2), ("one", 1), ("y", 2)]).unwrap(),
    ];
    let mut moved_and_not = [false; 2];
    for mesh in &meshes {
        for receivers in axis_lists(mesh).into_iter().filter(|l| !l.is_empty()) {
            for from in axis_lists(mesh) {
                let same_axes =
                    from.len() == receivers.len() && from.iter().all(|a| receivers.contains(a));
                if !same_axes {
                    continue;
                }
                let n = mesh.axes_size(&receivers);
                let group = AxisGroup {
                    axes: receivers.clone(),
                    size: n,
                };
                let op = Op::CollectivePermute { group, from };
                let spmd = collective_program(mesh, &receivers, op);
                let x = ArrayD::from_shape_fn(IxDyn(&[2 * n, 3]), |ix| (ix[0] * 3 + ix[1]) as i32);
                let thread_mesh = ThreadMesh::new(mesh.clone()).unwrap();
                let out = Arc::new(Loaded::new(spmd.clone()))
                    .run(&thread_mesh, &[x.clone().into()])
                    .unwrap();
                let moved = out[0] != x.into();
                moved_and_not[usize::from(moved)] = true;
                let bytes = spmd.collectives().bytes();
                assert_eq!(
                    bytes,
                    if moved { 2 * 3 * 4 } else { 0 },
                    "{}",
                    spmd.report()
                );
            }
        }
    }
    assert_eq!(moved_and_not, [true, true]);
}

#[test]
fn collective_shift_moves_blocks_along_the_group() {
    let meshes = [
        Mesh::new([("x", 4)]).unwrap(),
        Mesh::new([("x", 1)]).unwrap(),
        Mesh::new([("data", 2), ("model", 4)]).unwrap(),
        Mesh::with_device_order([("data", 4), ("model", 2)], vec![3, 6, 0, 5, 1, 7, 2, 4]).unwrap(),
    ];
    for mesh in &meshes {
        for list in axis_lists(mesh).into_iter().filter(|l| !l.is_empty()) {
            for offset in [-2, -1, 0, 1, 2, 5] {
                for wrap in [false, true] {
                    check_shift(mesh, &list, offset, wrap);
                }
            }
        }
    }
}
