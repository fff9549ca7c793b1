//! The execution plan's buffer reuse: elementwise ops on an operand at its last use
//! write in place (counted with an instrumented global allocator), and the results are
//! bitwise those of a fresh array for every op (node-by-node `kernels::eval`).

use std::alloc::System;
use std::sync::{Mutex, PoisonError};

use gspmd_core::ir::{Builder, DType, Literal, Program};
use gspmd_core::runtime::{interpret, kernels};
use ndarray::{ArrayD, IxDyn};
use stats_alloc::{INSTRUMENTED_SYSTEM, Region, StatsAlloc};

#[global_allocator]
static GLOBAL: &StatsAlloc<System> = &INSTRUMENTED_SYSTEM;

/// Tests here count the process's allocations: one at a time.
static ONE_AT_A_TIME: Mutex<()> = Mutex::new(());

const N: usize = 512;

fn input() -> Literal {
    let v = (0..N * N)
        .map(|i| ((i % 29) as f32 - 14.0) * 0.07)
        .collect();
    Literal::F32(ArrayD::from_shape_vec(IxDyn(&[N, N]), v).expect("shape fits"))
}

/// Each node of `program` computed from fresh arrays by the checked kernels.
fn node_by_node(program: &Program, inputs: &[Literal]) -> Vec<Literal> {
    let mut values: Vec<Literal> = Vec::new();
    for node in &program.nodes {
        let value = match &node.op {
            gspmd_core::ir::Op::Parameter { index, .. } => inputs[*index].clone(),
            op => {
                let operands: Vec<&Literal> =
                    node.operands.iter().map(|o| &values[o.index()]).collect();
                kernels::eval(op, &operands, &node.ty).expect("kernel runs")
            }
        };
        values.push(value);
    }
    program
        .outputs
        .iter()
        .map(|o| values[o.index()].clone())
        .collect()
}

fn bits(lit: &Literal) -> Vec<u32> {
    lit.as_f32()
        .expect("f32")
        .iter()
        .map(|v| v.to_bits())
        .collect()
}

#[test]
fn a_chain_of_unary_ops_allocates_one_array() {
    let _serial = ONE_AT_A_TIME.lock().unwrap_or_else(PoisonError::into_inner);
    let b = Builder::new("chain");
    let x = b.parameter("x", [N, N], DType::F32);
    let y = x.tanh().exp().neg().abs().sqrt().tanh();
    let program = b.finish(&[&y]).expect("traces");
    let inputs = [input()];
    let array_bytes = N * N * 4;
    let region = Region::new(GLOBAL);
    let out = interpret(&program, &inputs).expect("runs");
    let allocated = region.change().bytes_allocated;
    // The first op reads the parameter (lent, not owned) and makes the one array; the
    // five others overwrite it.
    assert!(
        allocated < 2 * array_bytes,
        "{allocated} bytes allocated for six ops on {array_bytes}-byte arrays"
    );
    assert_eq!(bits(&out[0]), bits(&node_by_node(&program, &inputs)[0]));
}

#[test]
fn in_place_results_are_bitwise_those_of_fresh_arrays() {
    let _serial = ONE_AT_A_TIME.lock().unwrap_or_else(PoisonError::into_inner);
    let b = Builder::new("mixed");
    let x = b.parameter("x", [N, N], DType::F32);
    let w = b.parameter("w", [N, N], DType::F32);
    // GELU (binary ops with broadcast scalars, tanh), a select and a same-dtype
    // convert, with values dying on either side of a binary op.
    let g = x.gelu();
    let h = w.mul(&g).add(&x.exp());
    let positive = h.gt(&h.scalar_like(0.0));
    let s = positive.select(&h.convert(DType::F32), &g.neg());
    let program = b.finish(&[&s, &h]).expect("traces");
    let inputs = [input(), input()];
    let want = node_by_node(&program, &inputs);
    let got = interpret(&program, &inputs).expect("runs");
    for (g, w) in got.iter().zip(&want) {
        assert_eq!(bits(g), bits(w));
    }
}
