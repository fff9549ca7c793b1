//! The execution plan's buffer reuse: elementwise ops on an operand at its last use
//! write in place (counted with an instrumented global allocator), and the results are
//! bitwise those of a fresh array for every op (node-by-node `kernels::eval`).

use std::alloc::System;
use std::sync::{Mutex, PoisonError};

use gspmd_core::ir::{Builder, DType, Literal, Program};
use gspmd_core::runtime::interpret;
use ndarray::{ArrayD, IxDyn};
use stats_alloc::{INSTRUMENTED_SYSTEM, Region, StatsAlloc};

mod node_by_node;
use node_by_node::node_by_node;

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

fn bits(lit: &Literal) -> Vec<u32> {
    lit.as_f32()
        .expect("f32")
        .iter()
        .map(|v| v.to_bits())
        .collect()
}

/// The bytes `interpret` allocates for `program` on `inputs`; checks its one output is
/// bitwise that of [`node_by_node`].
fn bytes_allocated(program: &Program, inputs: &[Literal]) -> usize {
    let region = Region::new(GLOBAL);
    let out = interpret(program, inputs).expect("runs");
    let allocated = region.change().bytes_allocated;
    assert_eq!(bits(&out[0]), bits(&node_by_node(program, inputs)[0]));
    allocated
}

#[test]
fn a_chain_of_unary_ops_allocates_one_array() {
    let _serial = ONE_AT_A_TIME.lock().unwrap_or_else(PoisonError::into_inner);
    let b = Builder::new("chain");
    let x = b.parameter("x", [N, N], DType::F32);
    let y = x.tanh().exp().neg().abs().sqrt().tanh();
    let program = b.finish(&[&y]).expect("traces");
    let allocated = bytes_allocated(&program, &[input()]);
    let array_bytes = N * N * 4;
    // The first op reads the parameter (lent, not owned) and makes the one array; the
    // five others overwrite it.
    assert!(
        allocated < 2 * array_bytes,
        "{allocated} bytes allocated for six ops on {array_bytes}-byte arrays"
    );
}

#[test]
fn gelu_with_broadcast_scalars_allocates_two_arrays() {
    let _serial = ONE_AT_A_TIME.lock().unwrap_or_else(PoisonError::into_inner);
    let b = Builder::new("gelu");
    let x = b.parameter("x", [N, N], DType::F32);
    let y = x.gelu();
    let program = b.finish(&[&y]).expect("traces");
    let allocated = bytes_allocated(&program, &[input()]);
    let array_bytes = N * N * 4;
    // Thirteen ops, four of them broadcasts of scalars: `x * x` and `0.5 * x` read
    // only lent values and make the two arrays; the broadcasts are views; every other
    // op overwrites an operand at its last use.
    assert!(
        allocated < 3 * array_bytes,
        "{allocated} bytes allocated for GELU on {array_bytes}-byte arrays"
    );
}

#[test]
fn in_place_results_are_bitwise_those_of_fresh_arrays() {
    let _serial = ONE_AT_A_TIME.lock().unwrap_or_else(PoisonError::into_inner);
    let b = Builder::new("mixed");
    let x = b.parameter("x", [N, N], DType::F32);
    let w = b.parameter("w", [N, N], DType::F32);
    let bias = b.parameter("bias", [N], DType::F32);
    // GELU (binary ops with broadcast scalars, tanh), broadcast vectors on either
    // side, a compare with a broadcast scalar, a select and a same-dtype convert,
    // with values dying on either side of a binary op.
    let g = x.gelu();
    let h = w.mul(&g).add(&x.exp()).add(&bias).sub(&bias.exp());
    let positive = h.gt(&h.scalar_like(0.0));
    let s = positive.select(&h.convert(DType::F32), &g.neg());
    let program = b.finish(&[&s, &h]).expect("traces");
    let bias = Literal::F32(ArrayD::from_shape_fn(IxDyn(&[N]), |i| i[0] as f32 * 0.01));
    let inputs = [input(), input(), bias];
    let want = node_by_node(&program, &inputs);
    let got = interpret(&program, &inputs).expect("runs");
    for (g, w) in got.iter().zip(&want) {
        assert_eq!(bits(g), bits(w));
    }
}

#[test]
fn a_second_run_reuses_the_buffers_the_first_freed() {
    let _serial = ONE_AT_A_TIME.lock().unwrap_or_else(PoisonError::into_inner);
    let b = Builder::new("reuse");
    let x = b.parameter("x", [N, N], DType::F32);
    // A fused loop's result, read by a transpose (handed over, dying there): its
    // buffer goes to the pool, and the next run's fused loop takes it again.
    let y = x.tanh().exp().transpose(&[1, 0]);
    let program = b.finish(&[&y]).expect("traces");
    let inputs = [input()];
    let array_bytes = N * N * 4;
    let first = bytes_allocated(&program, &inputs);
    let second = bytes_allocated(&program, &inputs);
    assert!(
        first >= 2 * array_bytes && second < first - array_bytes / 2,
        "{first} then {second} bytes allocated for two {array_bytes}-byte arrays"
    );
}

/// A fused loop of three results (all outputs) over two leaves it takes over (two
/// transposes, at their last use): two results are written into the leaves' buffers,
/// one into a new array, and all three are bitwise those of fresh arrays.
#[test]
fn a_group_of_several_results_writes_into_the_leaves_it_takes_over() {
    let _serial = ONE_AT_A_TIME.lock().unwrap_or_else(PoisonError::into_inner);
    let b = Builder::new("results");
    let x = b.parameter("x", [N, N], DType::F32);
    let y = b.parameter("y", [N, N], DType::F32);
    let (p, q) = (x.transpose(&[1, 0]), y.transpose(&[1, 0]));
    let product = p.mul(&q);
    let squashed = p.add(&q).tanh();
    let root = product.sub(&squashed).mul(&p);
    let program = b.finish(&[&root, &product, &squashed]).expect("traces");
    let groups = gspmd_core::runtime::fusion_groups(&program);
    assert_eq!(groups.len(), 1, "{groups:?}");
    let inputs = [input(), input()];
    let region = Region::new(GLOBAL);
    let out = interpret(&program, &inputs).expect("runs");
    let allocated = region.change().bytes_allocated;
    let want = node_by_node(&program, &inputs);
    for (got, want) in out.iter().zip(&want) {
        assert_eq!(bits(got), bits(want));
    }
    let array_bytes = N * N * 4;
    // The two transposes and the root's array; the other results overwrite the
    // transposes.
    assert!(
        allocated < 4 * array_bytes,
        "{allocated} bytes allocated for three results on {array_bytes}-byte arrays"
    );
}

/// `len` values in `[-1.5, 1.5)` from a seed (any sign and size, so sums round).
fn values(seed: u64, shape: &[usize]) -> Literal {
    let mut state = seed;
    let v = (0..shape.iter().product::<usize>())
        .map(|_| {
            state = state
                .wrapping_mul(6364136223846793005)
                .wrapping_add(1442695040888963407);
            ((state >> 40) as f32 / (1u64 << 24) as f32 - 0.5) * 3.0
        })
        .collect();
    Literal::F32(ArrayD::from_shape_vec(IxDyn(shape), v).expect("shape fits"))
}

/// A gradient sum `add(dot(a, w), c)` (or `add(c, dot)`), `c` itself a product, the
/// first product read by the add alone: where its `k` fits one block of contracted
/// elements (64, 256) the plan runs it adding into `c`'s buffer (see the plan's unit
/// tests), on the tile (`a` read by rows) and on matrixmultiply (`a` transposed, 512
/// rows); with `k` 300 it runs as a product then an add. Every output is bitwise that
/// of the unplanned node-by-node run.
#[test]
fn a_product_summed_into_a_value_adds_into_its_buffer_bitwise() {
    use gspmd_core::ir::DotDims;
    let _serial = ONE_AT_A_TIME.lock().unwrap_or_else(PoisonError::into_inner);
    const M: usize = 512;
    for k in [64, 256, 300] {
        for transposed in [false, true] {
            for dot_first in [true, false] {
                {
                    let b = Builder::new("gradient sum");
                    let a_shape = if transposed { [k, M] } else { [M, k] };
                    let a = b.parameter("a", a_shape, DType::F32);
                    let w = b.parameter("w", [k, M], DType::F32);
                    let x = b.parameter("x", [M, 32], DType::F32);
                    let v = b.parameter("v", [32, M], DType::F32);
                    let dims = DotDims {
                        lhs_batch: vec![],
                        rhs_batch: vec![],
                        lhs_contracting: vec![usize::from(!transposed)],
                        rhs_contracting: vec![0],
                    };
                    let product = a.dot_general(&w, dims);
                    let c = x.matmul(&v);
                    let sum = if dot_first {
                        product.add(&c)
                    } else {
                        c.add(&product)
                    };
                    let program = b.finish(&[&sum]).expect("traces");
                    let inputs = [
                        values(1, &a_shape),
                        values(2, &[k, M]),
                        values(3, &[M, 32]),
                        values(4, &[32, M]),
                    ];
                    let out = interpret(&program, &inputs).expect("runs");
                    let case = format!("k {k}, transposed {transposed}, dot first {dot_first}");
                    assert_eq!(
                        bits(&out[0]),
                        bits(&node_by_node(&program, &inputs)[0]),
                        "{case}"
                    );
                }
            }
        }
    }
}
