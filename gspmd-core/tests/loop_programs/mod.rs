//! What the loop suites (`loop_counts`, `loop_collectives`) share: programs built with
//! sharded parameters on a 2x2 mesh, deterministic inputs, and the collectives and
//! control-flow ops of a per-device program's own nodes.

use std::collections::BTreeMap;

use gspmd_core::ir::{Builder, CollectiveKind, DType, Flow, Literal, Op, Program, Tensor};
use gspmd_core::partition::bytes_received;
use gspmd_core::sharding::{Mesh, Sharding};
use ndarray::{ArrayD, IxDyn};

pub fn s(text: &str) -> Sharding {
    text.parse().unwrap()
}

pub fn build(name: &str, f: impl FnOnce(&Builder) -> Vec<Tensor>) -> Program {
    let b = Builder::new(name);
    let outs = f(&b);
    let refs: Vec<&Tensor> = outs.iter().collect();
    b.finish(&refs).unwrap()
}

/// Deterministic inputs: f32 in [-0.75, 0.75], i32 scalars `int`.
pub fn inputs(program: &Program, int: i32) -> Vec<Literal> {
    (program.params.iter().enumerate())
        .map(|(seed, &p)| {
            let ty = program.ty(p);
            match ty.dtype {
                DType::I32 => Literal::full(&ty.shape, DType::I32, f64::from(int)),
                _ => {
                    let n: usize = ty.shape.iter().product();
                    let v = (0..n)
                        .map(|i| (((i * 7 + seed * 13) % 29) as f32 / 9.0 - 1.5) * 0.5)
                        .collect();
                    Literal::F32(ArrayD::from_shape_vec(IxDyn(&ty.shape), v).unwrap())
                }
            }
        })
        .collect()
}

/// An f32 parameter of `b` annotated with `sharding`.
pub fn sharded(b: &Builder, name: &str, shape: &[usize], sharding: &str) -> Tensor {
    b.parameter(name, shape.to_vec(), DType::F32)
        .annotate(s(sharding))
}

pub fn mesh_2x2() -> Mesh {
    Mesh::new([("data", 2), ("model", 2)]).unwrap()
}

/// `x <- tanh(x @ w)` under a `fori_loop` of 3 steps inside one of 2, `x` and `w`
/// parameters of the given shapes and shardings.
pub fn nested_loops(x: (&[usize], &str), w: (&[usize], &str)) -> Program {
    build("nested", |b| {
        let x = sharded(b, "x", x.0, x.1);
        let w = sharded(b, "w", w.0, w.1);
        b.fori_loop(2, &[x], |_, c| {
            b.fori_loop(3, c, |_, c| vec![c[0].matmul(&w).tanh()])
        })
    })
}

/// `x <- tanh(x @ w)` under a `while` loop counting to the i32 parameter `n`, `x` and
/// `w` parameters of the given shapes and shardings; returns the count and `x`.
pub fn while_loop(x: (&[usize], &str), w: (&[usize], &str)) -> Program {
    build("while", |b| {
        let x = sharded(b, "x", x.0, x.1);
        let w = sharded(b, "w", w.0, w.1);
        let n = b.parameter("n", [], DType::I32);
        let zero = b.constant(Literal::full(&[], DType::I32, 0.0));
        b.while_loop(
            |st| st[0].lt(&n),
            |st| {
                let one = (st[0].builder()).constant(Literal::full(&[], DType::I32, 1.0));
                vec![st[0].add(&one), st[1].matmul(&w).tanh()]
            },
            &[zero, x],
        )
    })
}

/// The collectives of `program`'s own nodes (its regions left out), by kind: (count,
/// bytes received per device).
pub fn own(program: &Program, mesh: &Mesh) -> BTreeMap<CollectiveKind, (usize, usize)> {
    let mut by_kind: BTreeMap<CollectiveKind, (usize, usize)> = BTreeMap::new();
    for node in &program.nodes {
        let Some(kind) = node.op.collective_kind() else {
            continue;
        };
        let e = by_kind.entry(kind).or_default();
        e.0 += 1;
        e.1 += bytes_received(program, node, mesh);
    }
    by_kind
}

/// The control-flow ops of `program`'s own nodes (each once).
pub fn flows(program: &Program) -> Vec<&Flow> {
    let mut seen: Vec<&Flow> = Vec::new();
    for node in &program.nodes {
        if let Op::Flow { flow, .. } = &node.op
            && !seen.iter().any(|f| std::ptr::eq(*f, &**flow))
        {
            seen.push(flow);
        }
    }
    seen
}
