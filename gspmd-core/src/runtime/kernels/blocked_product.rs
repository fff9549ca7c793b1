//! Large f32 matrix products (a d_model-512 or 1024 LM's projections, FFN products and
//! their gradients) on CPUs with AVX2 and FMA and without AVX-512 (where the `gemm`
//! crate runs them): BLIS's loop nest around [`small_product`]'s register tile.
//!
//! Per product, for each block of [`NC`] columns and then each block of [`KC`]
//! contracted elements, `b`'s block is packed once ([`small_product`]'s `pack`) into
//! panels two vector registers wide, each panel's rows adjacent (`KC` x 16 f32 with
//! AVX2: 16 KB, L1-resident while it is used), which every row block of the product
//! reuses (the whole block, up to 1 MB, from L2 or L3). For each block of [`MC`] rows,
//! `a`'s block is packed into stripes of [`ROWS`] rows, each contracted index's
//! elements adjacent (the block up to 96 KB: L2). Then, panel by panel, the tile
//! (6 rows by 16 columns, 12 accumulators) runs down the block's stripes, reading
//! both operands packed. Both operands are packed whatever their strides, so any
//! layout runs here (a transposed `a` or `b` is the common case).
//!
//! Each result element is summed as on [`small_product`] and matrixmultiply: over
//! the contracted index in increasing order, one fused multiply-add a step from
//! zero within each block of [`KC`], each block's sum then written (the first, not
//! accumulating: `c`'s prior contents, NaN included, never read) or added to the
//! result; so on CPUs with FMA the three give the same bits and a product moves
//! between them (when a program is sharded) without changing a result. The packed
//! blocks are allocated once per batch ([`scratch`] elements, counted by the memory
//! analysis through `dot_scratch_bytes`).
//!
//! [`small_product`]: super::small_product

use pulp::Simd;

use super::small_product::{
    self, KC, Layout, MOST_LANES, Packed, Panel, ROWS, Rows, apart, pack, pack_rows, tile,
};

/// The rows of `a` packed at a time: 16 stripes of [`ROWS`], `MC` x [`KC`] f32 (96
/// KB) staying in the L2 cache while the panels of `b` sweep them.
const MC: usize = 96;

/// The columns of `b` packed at a time: [`KC`] x `NC` f32 (1 MB), matrixmultiply's
/// `NC`.
const NC: usize = 1024;

/// The fewest result columns taken (see [`takes`]).
const FEWEST_COLUMNS: usize = 8;

/// The fewest result columns taken where `a`'s rows are not read along adjacent
/// elements (a weight gradient's transposed `a`; see [`takes`]).
const FEWEST_TRANSPOSED_COLUMNS: usize = 128;

/// Whether [`products`] takes an `[m, k] x [k, n]` product whose `a` has stride `ak`
/// along `k`, whose `b` has adjacent columns when `b_rows` and whose columns are not
/// in groups: on a CPU with AVX2 and FMA and without AVX-512, one that
/// [`small_product`] does not take of at least [`FEWEST_COLUMNS`] columns, or of
/// [`FEWEST_TRANSPOSED_COLUMNS`] where `ak` is not 1. Measured with matrixmultiply's
/// AVX2 kernel (benches/README.md, "Large products blocked", h41g): 1.03-1.13x its
/// rate on the LM's d_model 128-1024 products in every layout, 1.2-1.8x on 8-64
/// columns or 16 rows read in place; a transposed `a` by 24-64 columns ran 0.8-1.0x
/// (its packing, one cache line a contracted index, a larger share there).
///
/// [`small_product`]: super::small_product
pub(super) fn takes([m, k, n]: [usize; 3], ak: usize, b_rows: bool) -> bool {
    !small_product::takes([m, k, n], ak, b_rows)
        && n >= FEWEST_COLUMNS
        && (ak == 1 || n >= FEWEST_TRANSPOSED_COLUMNS)
        && avx2_only()
}

/// Whether this CPU has AVX2 and FMA and not AVX-512F.
fn avx2_only() -> bool {
    #[cfg(target_arch = "x86_64")]
    {
        std::arch::is_x86_feature_detected!("avx2")
            && std::arch::is_x86_feature_detected!("fma")
            && !super::contraction::avx512()
    }
    #[cfg(not(target_arch = "x86_64"))]
    {
        false
    }
}

/// The scratch elements [`products`] allocates for a batch of `[m, k] x [k, n]`
/// products: a packed block of `a` and one of `b` (its columns padded to whole
/// registers).
pub(super) fn scratch([m, k, n]: [usize; 3]) -> usize {
    k.min(KC) * (m.min(MC) + n.min(NC).next_multiple_of(MOST_LANES))
}

/// `c[oc..] = a[oa..] · b[ob..]` laid out as `layout` (its `b_groups` `None`), for
/// each `[oa, ob, oc]` of `offsets`; `c`'s prior contents are ignored (NaN included),
/// or added to when `layout.accumulate`.
///
/// Any sizes and strides work (zero included); [`takes`] tells where this is faster
/// than matrixmultiply. Panics if `b`'s columns are in groups or an operand's
/// elements reach past its slice.
pub(super) fn products(
    layout: &Layout,
    operands: [&[f32]; 2],
    c: &mut [f32],
    offsets: impl Iterator<Item = [usize; 3]>,
) {
    assert!(layout.b_groups.is_none(), "b's columns in groups");
    let &Layout { m, k, n, .. } = layout;
    let mut blocks = vec![0.0; scratch([m, k, n])];
    let (a_block, b_block) = blocks.split_at_mut(k.min(KC) * m.min(MC));
    let blocks = [a_block, b_block];
    pulp::Arch::new().dispatch(Batch {
        layout,
        operands,
        blocks,
        products: (c, offsets),
    });
}

/// [`products`] run by `pulp` with the CPU's vector features enabled: the operands,
/// the packed blocks of `a` and `b`, the result and the products' offsets.
struct Batch<'l, 'x, I> {
    layout: &'l Layout,
    operands: [&'x [f32]; 2],
    blocks: [&'x mut [f32]; 2],
    products: (&'x mut [f32], I),
}

impl<I: Iterator<Item = [usize; 3]>> pulp::WithSimd for Batch<'_, '_, I> {
    type Output = ();

    #[inline(always)]
    fn with_simd<S: Simd>(self, simd: S) {
        let Batch {
            layout,
            operands: [a, b],
            blocks: [a_block, b_block],
            products: (c, offsets),
        } = self;
        let [m, k, n] = [layout.m, layout.k, layout.n];
        let (a_strides, b_strides) = (layout.a, layout.b);
        let (c_row, accumulate) = (layout.c_row, layout.accumulate);
        let lanes = S::F32_LANES;
        for [oa, ob, oc] in offsets {
            let (a, b, c) = (&a[oa..], &b[ob..], &mut c[oc..]);
            if k == 0 {
                // Nothing contracted: zeros, or the result as it was.
                if !accumulate {
                    for i in 0..m {
                        c[i * c_row..][..n].fill(0.0);
                    }
                }
                continue;
            }
            for j0 in (0..n).step_by(NC) {
                let j1 = n.min(j0 + NC);
                for q0 in (0..k).step_by(KC) {
                    let q1 = k.min(q0 + KC);
                    let len = q1 - q0;
                    let data = pack::<S>((b, b_strides), [q0, q1], [j0, j1], lanes, b_block);
                    let panels = Panel::Packed {
                        data,
                        len,
                        pad_to: lanes,
                    };
                    for i0 in (0..m).step_by(MC) {
                        let rows = m.min(i0 + MC) - i0;
                        let a_block = &mut a_block[..rows * len];
                        for (s, stripe) in a_block.chunks_mut(ROWS * len).enumerate() {
                            let a = &a[(i0 + s * ROWS) * a_strides[0] + q0 * a_strides[1]..];
                            // Whole stripes by the constant: the copies inlined.
                            match stripe.len() / len {
                                ROWS => pack_rows(a, a_strides, ROWS, stripe),
                                rows => pack_rows(a, a_strides, rows, stripe),
                            }
                        }
                        let block = Block {
                            stripes: a_block,
                            panels,
                            rows,
                            width: j1 - j0,
                            len,
                            add: q0 != 0 || accumulate,
                            c: (&mut c[i0 * c_row + j0..], c_row),
                        };
                        apart(simd, block);
                    }
                }
            }
        }
    }
}

/// One block of `rows` rows of `a` packed into `stripes` by [`ROWS`] by `width`
/// columns of `b` packed into `panels`, over `len` contracted elements, written or
/// (`add`) added to the result `c`: run by [`apart`], panel by panel down the stripes.
struct Block<'x, 'c> {
    stripes: &'x [f32],
    panels: Panel<'x>,
    rows: usize,
    width: usize,
    len: usize,
    add: bool,
    c: Rows<'c, &'c mut [f32]>,
}

impl pulp::WithSimd for Block<'_, '_> {
    type Output = ();

    #[inline(always)]
    fn with_simd<S: Simd>(self, simd: S) {
        let Block {
            stripes,
            panels,
            rows,
            width,
            len,
            add,
            c: (c, c_row),
        } = self;
        let lanes = S::F32_LANES;
        let mut j = 0;
        while j < width {
            let columns = (2 * lanes).min(width - j);
            let b = panels.columns(j, columns);
            let c = (&mut c[j..], c_row);
            let at = [rows, columns, len];
            if columns > lanes {
                down::<S, 2>(simd, stripes, b, at, add, c);
            } else {
                down::<S, 1>(simd, stripes, b, at, add, c);
            }
            j += columns;
        }
    }
}

/// The result's `rows` rows by `columns` columns (at most `V` registers) over `len`
/// contracted elements: a panel of `b`'s (rows `V` registers apart) times each stripe
/// of `a`'s in turn, [`ROWS`] rows at a time and then the rest.
#[inline(always)]
fn down<S: Simd, const V: usize>(
    simd: S,
    stripes: &[f32],
    b: Rows<'_, &[f32]>,
    [rows, columns, len]: [usize; 3],
    add: bool,
    (c, c_row): Rows<'_, &mut [f32]>,
) {
    let whole = rows - rows % ROWS;
    for i in (0..whole).step_by(ROWS) {
        let a = Packed {
            stripe: &stripes[i * len..][..ROWS * len],
        };
        prefetch(&c[i * c_row..], ROWS, c_row);
        tile::<S, ROWS, V>(simd, &a, b, [i, columns], [0, len], add, (&mut *c, c_row));
    }
    let a = Packed {
        stripe: &stripes[whole * len..rows * len],
    };
    let at = [whole, columns];
    let c = (c, c_row);
    match rows - whole {
        0 => {}
        1 => tile::<S, 1, V>(simd, &a, b, at, [0, len], add, c),
        2 => tile::<S, 2, V>(simd, &a, b, at, [0, len], add, c),
        3 => tile::<S, 3, V>(simd, &a, b, at, [0, len], add, c),
        4 => tile::<S, 4, V>(simd, &a, b, at, [0, len], add, c),
        _ => tile::<S, 5, V>(simd, &a, b, at, [0, len], add, c),
    }
}

/// Asks the CPU to start loading the first 16 columns of `rows` rows of the result
/// (`c_row` apart) into the L1 cache: a tile reads and writes them only after its
/// loop, and without this each tile waited on the misses there (the result is
/// swept once per block of [`KC`], too large for the caches).
#[inline(always)]
#[allow(unsafe_code)]
fn prefetch(c: &[f32], rows: usize, c_row: usize) {
    #[cfg(target_arch = "x86_64")]
    for r in 0..rows {
        for x in [r * c_row, r * c_row + 15] {
            if let Some(x) = c.get(x) {
                use std::arch::x86_64::{_MM_HINT_T0, _mm_prefetch};
                // SAFETY: a prefetch is a hint that reads and writes nothing (here
                // of an element of `c`, so of mapped memory); it needs SSE, which every
                // x86-64 CPU has.
                unsafe { _mm_prefetch::<_MM_HINT_T0>(std::ptr::from_ref(x).cast()) };
            }
        }
    }
    #[cfg(not(target_arch = "x86_64"))]
    let _ = (c, rows, c_row);
}

#[cfg(test)]
mod tests {
    use proptest::prelude::*;

    use super::super::small_product::tests::equal_matrixmultiply;
    use super::*;

    /// [`products`] of one product at offset 0.
    fn run(layout: &Layout, operands: [&[f32]; 2], c: &mut [f32]) {
        products(layout, operands, c, std::iter::once([0; 3]));
    }

    /// Products wider than a block of `b` ([`NC`]) and taller than a block of `a`
    /// ([`MC`]), `k` over several blocks of [`KC`] with a partial last, each layout,
    /// overwriting and accumulating: bit for bit matrixmultiply's.
    #[test]
    #[cfg(target_arch = "x86_64")]
    fn blocks_equal_matrixmultiply_bit_for_bit() {
        if !std::arch::is_x86_feature_detected!("fma") {
            return;
        }
        for [m, k, n] in [[7, 3, NC + 21], [MC + 7, 2 * KC + 3, 37], [13, KC, NC]] {
            for transposed in [[false, false], [true, false], [false, true], [true, true]] {
                for accumulate in [false, true] {
                    equal_matrixmultiply(run, [m, k, n], transposed, 1, accumulate, 3).unwrap();
                }
            }
        }
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(200))]

        /// On x86-64 CPUs with FMA, the products are matrixmultiply's bit for bit on
        /// random shapes (`m` and `n` not multiples of the tile's 6 x 16 and across a
        /// block of [`MC`] rows, `k` from 1 to several blocks of [`KC`] with a partial
        /// last) in every layout (each operand row- or column-major, padded), writing
        /// over NaN or accumulating (each block's sum added to the result in turn).
        #[test]
        #[cfg(target_arch = "x86_64")]
        fn products_equal_matrixmultiply_bit_for_bit(
            m in prop_oneof![1usize..30, (MC - 3)..(MC + 8)],
            n in prop_oneof![1usize..40, 60usize..70],
            k in prop_oneof![1usize..20, (KC - 2)..(KC + 6), (2 * KC)..(3 * KC)],
            transposed in proptest::array::uniform2(any::<bool>()),
            pad in 0usize..3,
            accumulate in any::<bool>(),
            seed in any::<u64>(),
        ) {
            prop_assume!(std::arch::is_x86_feature_detected!("fma"));
            equal_matrixmultiply(run, [m, k, n], transposed, pad, accumulate, seed)?;
        }
    }
}
