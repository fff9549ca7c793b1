//! Small f32 matrix products without packing: a batch of `[m, k] x [k, n]` products
//! (attention's per head, an MoE's per expert, the small models' projections) where a
//! packing GEMM's set-up per product (allocating and filling its panels for both
//! operands) costs as much as the arithmetic.
//!
//! One `pulp` dispatch runs the whole batch. Per product, tiles of [`ROWS`] rows of the
//! result by one or two vector registers of columns keep their sums in registers over
//! the contracted index: each step loads a register of `b`'s row and broadcasts one
//! element of `a` per tile row. `a` is read in place through its strides (one element
//! at a time), `b` in place where its rows are contiguous, else copied row-major once
//! per product into a stack buffer (the attention scores' `k` transposed): no heap
//! scratch at all. Each result element is the sum over the contracted index in
//! increasing order, one (fused where the CPU has FMA) multiply-add per step.

use pulp::{Simd, bytemuck};

/// One product of a batch: sizes and element strides. `a` is `[m, k]`, `b` `[k, n]`,
/// the result `[m, n]` with adjacent columns.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) struct Layout {
    pub(super) m: usize,
    pub(super) k: usize,
    pub(super) n: usize,
    /// `a`'s strides along `m` and `k`.
    pub(super) a: [usize; 2],
    /// `b`'s strides along `k` and `n`.
    pub(super) b: [usize; 2],
    /// The distance between the result's rows.
    pub(super) c_row: usize,
}

/// Products of at most this many multiply-adds (`m * k * n`) run here (see
/// benches/README.md, "Small products (issue 28)", for the crossover against
/// matrixmultiply).
const MOST_WORK: usize = 32 * 32 * 32;

/// The most elements of `b` copied row-major (when its rows are not contiguous): the
/// stack buffer's size.
const MOST_COPIED: usize = 16 * 16;

/// The fewest result columns taken: narrower results (a vector register's lanes
/// mostly idle, partial loads and stores) ran slower than matrixmultiply.
const FEWEST_COLUMNS: usize = 8;

/// The result rows of a tile: each register of `b` loaded serves this many rows.
const ROWS: usize = 4;

impl Layout {
    /// Whether [`products`] takes this product: small enough, wide enough, and `b`
    /// read in place or small enough to copy.
    pub(super) fn is_small(&self) -> bool {
        small_work(self.m, self.k, self.n) && self.copyable()
    }

    /// Whether `b`'s rows are read in place or it is small enough to copy.
    fn copyable(&self) -> bool {
        self.n <= 1 || self.b[1] == 1 || self.k * self.n <= MOST_COPIED
    }
}

/// Whether an `[m, k] x [k, n]` product is small and wide enough for [`products`]
/// (whatever its layout).
pub(super) fn small_work(m: usize, k: usize, n: usize) -> bool {
    m * k * n <= MOST_WORK && n >= FEWEST_COLUMNS
}

/// `c[oc..] = a[oa..] · b[ob..]` laid out as `layout`, for each `[oa, ob, oc]` of
/// `offsets`; `c`'s prior contents are ignored (NaN included).
///
/// Any sizes work (zero included), [`Layout::is_small`] tells where this is faster
/// than a packing GEMM. Panics if an operand's elements reach past its slice, or if
/// `b` would need a copy larger than the stack buffer.
pub(super) fn products(
    layout: &Layout,
    [a, b]: [&[f32]; 2],
    c: &mut [f32],
    offsets: impl Iterator<Item = [usize; 3]>,
) {
    assert!(layout.copyable(), "b too large to copy: {layout:?}");
    pulp::Arch::new().dispatch(Batch {
        layout,
        a,
        b,
        c,
        offsets,
    });
}

/// [`products`] run by `pulp` with the CPU's vector features enabled.
struct Batch<'l, 'x, I> {
    layout: &'l Layout,
    a: &'x [f32],
    b: &'x [f32],
    c: &'x mut [f32],
    offsets: I,
}

impl<I: Iterator<Item = [usize; 3]>> pulp::WithSimd for Batch<'_, '_, I> {
    type Output = ();

    #[inline(always)]
    fn with_simd<S: Simd>(self, simd: S) {
        let Batch {
            layout:
                &Layout {
                    m,
                    k,
                    n,
                    a: a_strides,
                    b: [bk, bn],
                    c_row,
                },
            a,
            b,
            c,
            offsets,
        } = self;
        let product = |oa: usize| Product {
            a: &a[oa..],
            a_strides,
            k,
        };
        if n <= 1 || bn == 1 {
            for [oa, ob, oc] in offsets {
                product(oa).run(simd, (&b[ob..], bk), [m, n], (&mut c[oc..], c_row));
            }
        } else {
            let mut copy = [0.0f32; MOST_COPIED];
            for [oa, ob, oc] in offsets {
                for (q, row) in copy.chunks_exact_mut(n).take(k).enumerate() {
                    for (j, to) in row.iter_mut().enumerate() {
                        *to = b[ob + q * bk + j * bn];
                    }
                }
                product(oa).run(simd, (&copy, n), [m, n], (&mut c[oc..], c_row));
            }
        }
    }
}

/// One product's `a`, read through its strides.
struct Product<'x> {
    a: &'x [f32],
    a_strides: [usize; 2],
    k: usize,
}

/// A matrix's elements and the distance between its rows (its columns adjacent).
type Rows<'x, X> = (X, usize);

impl Product<'_> {
    /// The `[m, n]` result `a · b` into `c`: column blocks of two registers, then one,
    /// then a partial one; row blocks of [`ROWS`], then single rows. No closure here
    /// runs vector code (a closure is not compiled with the dispatch's CPU features).
    #[inline(always)]
    fn run<S: Simd>(
        &self,
        simd: S,
        b: Rows<'_, &[f32]>,
        [m, n]: [usize; 2],
        c: Rows<'_, &mut [f32]>,
    ) {
        let lanes = S::F32_LANES;
        let (c, c_row) = c;
        let mut j = 0;
        while j + 2 * lanes <= n {
            self.columns::<S, 2>(simd, b, m, [j, 2 * lanes], (&mut *c, c_row));
            j += 2 * lanes;
        }
        if j + lanes <= n {
            self.columns::<S, 1>(simd, b, m, [j, lanes], (&mut *c, c_row));
            j += lanes;
        }
        if j < n {
            self.columns::<S, 1>(simd, b, m, [j, n - j], (c, c_row));
        }
    }

    /// Every row of the result's columns `j .. j + width` (`width` at most `V`
    /// registers; under one register, partial loads and stores).
    #[inline(always)]
    fn columns<S: Simd, const V: usize>(
        &self,
        simd: S,
        b: Rows<'_, &[f32]>,
        m: usize,
        columns: [usize; 2],
        c: Rows<'_, &mut [f32]>,
    ) {
        let (c, c_row) = c;
        let mut i = 0;
        while i + ROWS <= m {
            self.tile::<S, ROWS, V>(simd, b, [i, columns[0], columns[1]], (&mut *c, c_row));
            i += ROWS;
        }
        while i < m {
            self.tile::<S, 1, V>(simd, b, [i, columns[0], columns[1]], (&mut *c, c_row));
            i += 1;
        }
    }

    /// Rows `i .. i + R` by columns `j .. j + width` of the result: `R * V`
    /// accumulators, each summing over the contracted index in order.
    #[inline(always)]
    fn tile<S: Simd, const R: usize, const V: usize>(
        &self,
        simd: S,
        (b, b_row): Rows<'_, &[f32]>,
        [i, j, width]: [usize; 3],
        (c, c_row): Rows<'_, &mut [f32]>,
    ) {
        let lanes = S::F32_LANES;
        let [am, ak] = self.a_strides;
        let whole = width == V * lanes;
        let mut acc = [[simd.splat_f32s(0.0); V]; R];
        for q in 0..self.k {
            let row = &b[q * b_row + j..][..width];
            let y: [S::f32s; V] = if whole {
                let registers: &[S::f32s] = bytemuck::cast_slice(row);
                std::array::from_fn(|v| registers[v])
            } else {
                [simd.partial_load_f32s(row); V]
            };
            for (r, acc) in acc.iter_mut().enumerate() {
                let x = simd.splat_f32s(self.a[(i + r) * am + q * ak]);
                for (acc, &y) in acc.iter_mut().zip(&y) {
                    *acc = simd.mul_add_e_f32s(x, y, *acc);
                }
            }
        }
        for (r, acc) in acc.iter().enumerate() {
            let row = &mut c[(i + r) * c_row + j..][..width];
            if whole {
                let registers: &mut [S::f32s] = bytemuck::cast_slice_mut(row);
                registers.copy_from_slice(acc);
            } else {
                simd.partial_store_f32s(row, acc[0]);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use proptest::prelude::*;

    use super::*;

    /// `len` values in `[-1.5, 1.5)` from a seed.
    fn values(seed: u64, len: usize) -> Vec<f32> {
        let mut state = seed;
        (0..len)
            .map(|_| {
                state = state
                    .wrapping_mul(6364136223846793005)
                    .wrapping_add(1442695040888963407);
                ((state >> 40) as f32 / (1u64 << 24) as f32 - 0.5) * 3.0
            })
            .collect()
    }

    /// Strides of an `[rows, cols]` matrix: row-major or (when `t`) column-major, the
    /// major stride `pad` elements longer than packed.
    fn strides(rows: usize, cols: usize, t: bool, pad: usize) -> [usize; 2] {
        if t { [1, rows + pad] } else { [cols + pad, 1] }
    }

    /// The elements an `[rows, cols]` matrix with `strides` spans.
    fn span(rows: usize, cols: usize, [r, c]: [usize; 2]) -> usize {
        if rows == 0 || cols == 0 {
            0
        } else {
            (rows - 1) * r + (cols - 1) * c + 1
        }
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(400))]

        /// Batches of products on random shapes (zero-size dims, `k` = 1, widths
        /// across a register's lanes, row counts across the tiles) and layouts (each
        /// operand row- or column-major, padded rows; `b` with strided rows is copied):
        /// each result element is the definition's sum within the rounding of `k`
        /// multiply-adds, and the result's padding is left as it was.
        #[test]
        fn batches_equal_the_definition(
            [m, k, n] in (0usize..21, 0usize..13, 0usize..41).prop_map(|(m, k, n)| [m, k, n]),
            batch in 0usize..4,
            transposed in proptest::array::uniform2(any::<bool>()),
            pads in proptest::array::uniform3(0usize..3),
            seed in any::<u64>(),
        ) {
            let a_strides = strides(m, k, transposed[0], pads[0]);
            let b_strides = strides(k, n, transposed[1], pads[1]);
            let c_row = n + pads[2];
            let layout = Layout { m, k, n, a: a_strides, b: b_strides, c_row };
            prop_assume!(layout.copyable());
            // Each product's operands and result one span (plus a gap) after the last.
            let steps = [
                span(m, k, a_strides) + 1,
                span(k, n, b_strides) + 2,
                span(m, n, [c_row, 1]) + 1,
            ];
            let a = values(seed, steps[0] * batch.max(1));
            let b = values(seed ^ 0x5eed, steps[1] * batch.max(1));
            let mut c = vec![f32::NAN; steps[2] * batch.max(1)];
            let offsets = (0..batch).map(|t| steps.map(|s| s * t));
            products(&layout, [&a, &b], &mut c, offsets.clone());
            let mut written = vec![false; c.len()];
            for [oa, ob, oc] in offsets {
                for i in 0..m {
                    for j in 0..n {
                        let terms = (0..k).map(|q| {
                            let x = a[oa + i * a_strides[0] + q * a_strides[1]] as f64;
                            let y = b[ob + q * b_strides[0] + j * b_strides[1]] as f64;
                            x * y
                        });
                        let want: f64 = terms.clone().sum();
                        let bound: f64 = terms.map(f64::abs).sum::<f64>() * k as f64 * 1.2e-7;
                        let at = oc + i * c_row + j;
                        let got = c[at] as f64;
                        prop_assert!((got - want).abs() <= bound, "c[{}, {}] = {} not {}", i, j, got, want);
                        written[at] = true;
                    }
                }
            }
            for (at, _) in written.iter().enumerate().filter(|(_, w)| !**w) {
                prop_assert!(c[at].is_nan(), "padding at {} overwritten", at);
            }
        }
    }
}
