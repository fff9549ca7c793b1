//! f32 matrix products without a packing GEMM's set-up: a batch of `[m, k] x [k, n]`
//! products (attention's per head, an MoE's per expert, the small models' projections,
//! FFN products and their small weight gradients) where a packing GEMM's set-up per
//! product (allocating and filling its panels for both operands) costs as much as the
//! arithmetic, or, for mid-size products whose `a` rows are read in place, where
//! packing `a` is a fifth of the product's time.
//!
//! One `pulp` dispatch runs the whole batch. Per product, in passes over blocks of
//! [`KC`] contracted elements by [`NC`] columns, the block of `b` is read in place
//! where its rows are adjacent columns, else copied into panels two vector registers
//! wide (rows adjacent); then tiles of [`ROWS`] rows of the result by two registers of
//! columns (12 accumulators with AVX2, as XLA's YNNPACK `dot_fp32_6x16`) keep their
//! sums in registers over the block: each step loads two registers of `b`'s row and
//! broadcasts one element of `a` per tile row. `a` is read in place by rows, or, when
//! transposed (a weight gradient's), a row block's [`ROWS`] rows over the block are
//! copied once into a stripe (each contracted index's elements adjacent) that all the
//! block's column tiles read; other strides element by element. A tile checks its
//! operands' bounds once, so its loop is the loads, broadcasts and multiply-adds alone;
//! it loads whole registers only (a packed block's last panel padded with zeros to
//! whole registers, else the last partial register of columns copied into a padded
//! [`Tail`]: `pulp`'s partial load is a call that kept the accumulators in memory),
//! and a row block's tiles run in a function of their own ([`apart`]), so the
//! accumulators and the rows' addresses keep their registers.
//! Each result element is the sum over the contracted index in increasing order, one
//! (fused where the CPU has FMA) multiply-add per step, each block's sum added to the
//! result after the first: matrixmultiply's order, so on CPUs with FMA the two give
//! the same bits and moving a product between them changes no result. Panels of at
//! most [`STACK_PANEL`] elements and the stripe live on the stack; larger panels are
//! allocated once per batch (counted by [`scratch`]).

use std::mem::MaybeUninit;

use pulp::{Simd, bytemuck};

/// One product of a batch: sizes and element strides. `a` is `[m, k]`, `b` `[k, n]`,
/// the result `[m, n]` with adjacent columns: `c = a · b`, or `c = a · b + c` when
/// `accumulate`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) struct Layout {
    pub(super) m: usize,
    pub(super) k: usize,
    pub(super) n: usize,
    /// `a`'s strides along `m` and `k`.
    pub(super) a: [usize; 2],
    /// `b`'s strides along `k` and `n`.
    pub(super) b: [usize; 2],
    /// `b`'s columns in groups of `columns`, `stride` elements apart (`[columns,
    /// stride]`): column `j` at `(j / columns) * stride + (j % columns) * b[1]`, so a
    /// free dim of `b` that does not merge with the columns' (the MoE's experts beside
    /// their columns, the batch dim between them) is one product's columns. `b` is
    /// then packed whatever its strides. `None`: column `j` at `j * b[1]`.
    pub(super) b_groups: Option<[usize; 2]>,
    /// The distance between the result's rows.
    pub(super) c_row: usize,
    /// Whether the product adds its sums to the result's prior contents (`beta = 1`)
    /// instead of overwriting them: each element's sum over the first block of [`KC`]
    /// contracted elements is added to it (one rounding, as an `add` of the product
    /// and `c` rounds when `k <= KC`), the next blocks' sums after that.
    pub(super) accumulate: bool,
}

/// Products of at most this many multiply-adds run here whatever their layout (see
/// benches/README.md, "Small products (issue 28)").
const MOST_WORK: usize = 32 * 32 * 32;

/// Products of more multiply-adds run elsewhere whatever their layout
/// ([`blocked_product`](super::blocked_product), matrixmultiply or `gemm`): the
/// largest measured in a step (d_model 128's `[2048, 512] x [512, 128]`).
const MOST_MID_WORK: usize = 1 << 27;

/// The fewest result columns taken: narrower results (a vector register's lanes
/// mostly idle, partial loads and stores) ran slower than matrixmultiply.
const FEWEST_COLUMNS: usize = 8;

/// The most rows of a mid-size product with a transposed `a` taken (see [`takes`]).
const MOST_PACKED_ROWS: usize = 64;

/// The fewest columns of a mid-size product with a transposed `a` taken: each packed
/// stripe of `a` serves this many columns at least (see [`takes`]). At 32 (the MoE's
/// `32x256x32` and `64x192x32` weight gradients) the tile took 0.89-0.94x
/// matrixmultiply's time (benches/README.md, h39e).
const FEWEST_PACKED_COLUMNS: usize = 32;

/// The result rows of a tile: each register of `b` loaded serves this many rows.
pub(super) const ROWS: usize = 6;

/// The contracted elements one pass over the result sums: a tile's panel of `b` this
/// long stays in the L1 cache while the tile's rows of `a` stream past it.
pub(super) const KC: usize = 256;

/// The columns of `b` one pass packs: a block of `b` [`KC`] by this many stays in the
/// L2 cache while the row blocks of `a` sweep it.
const NC: usize = 256;

/// The elements of the largest packed block of `b` kept on the stack (16 KB); larger
/// ones are allocated once per batch.
const STACK_PANEL: usize = 4096;

impl Layout {
    /// Whether [`products`] takes this product (see [`takes`]).
    pub(super) fn runs_here(&self) -> bool {
        takes([self.m, self.k, self.n], self.a[1], !self.packs_b())
    }

    /// Whether `b` is packed (see [`ColumnOffsets::packed`]).
    fn packs_b(&self) -> bool {
        self.columns().packed()
    }

    /// Where `b`'s columns start.
    fn columns(&self) -> ColumnOffsets {
        ColumnOffsets {
            bn: self.b[1],
            groups: self.b_groups,
        }
    }
}

/// Where `b`'s columns start: column `j` at `j * bn`, or in groups (see
/// [`Layout::b_groups`]).
#[derive(Clone, Copy)]
struct ColumnOffsets {
    bn: usize,
    groups: Option<[usize; 2]>,
}

impl ColumnOffsets {
    /// Whether a `b` with these columns is packed: its rows are not adjacent columns.
    fn packed(self) -> bool {
        self.bn != 1 || self.groups.is_some()
    }

    /// Column `j`'s offset from column 0's.
    #[inline(always)]
    fn at(self, j: usize) -> usize {
        match self.groups {
            None => j * self.bn,
            Some([columns, stride]) => {
                let columns = columns.max(1);
                (j / columns) * stride + (j % columns) * self.bn
            }
        }
    }
}

/// Whether [`products`] takes an `[m, k] x [k, n]` product whose `a` has stride `ak`
/// along `k` and whose `b` has adjacent columns when `b_rows` (the rest run on
/// [`blocked_product`](super::blocked_product), matrixmultiply or `gemm`): one of at least [`FEWEST_COLUMNS`] result columns that
/// is small (at most [`MOST_WORK`] multiply-adds) or, on CPUs without AVX-512 (where
/// `gemm` runs the rest), mid-size (at most [`MOST_MID_WORK`]) with `a`'s rows read in
/// place (`ak` 1), or a transposed `a` (a weight gradient's) of at most
/// [`MOST_PACKED_ROWS`] rows and one block of [`KC`] contracted elements by at least
/// [`FEWEST_PACKED_COLUMNS`] columns of a `b` read in place. Other transposed `a`s ran
/// 1.0-1.5x matrixmultiply's time (its packed `b` is read once for all row blocks,
/// where these tiles stream `b` from the L2 cache once per row block: benches/README.md,
/// "Products near the peak").
pub(super) fn takes([m, k, n]: [usize; 3], ak: usize, b_rows: bool) -> bool {
    let work = m * k * n;
    let weight_gradient = m <= MOST_PACKED_ROWS && k <= KC && n >= FEWEST_PACKED_COLUMNS && b_rows;
    n >= FEWEST_COLUMNS
        && (work <= MOST_WORK
            || (work <= MOST_MID_WORK
                && (ak == 1 || weight_gradient)
                && !super::contraction::avx512()))
}

/// The scratch elements [`products`] allocates for a batch of `[m, k] x [k, n]`
/// products whose `b` is packed (its rows not adjacent columns): its packed block of
/// `b` when larger than [`STACK_PANEL`].
pub(super) fn scratch([k, n]: [usize; 2]) -> usize {
    let panel = k.min(KC) * n.min(NC);
    if panel > STACK_PANEL { panel } else { 0 }
}

/// `c[oc..] = a[oa..] · b[ob..]` laid out as `layout`, for each `[oa, ob, oc]` of
/// `offsets`; `c`'s prior contents are ignored (NaN included), or added to when
/// `layout.accumulate`.
///
/// Any sizes and strides work (zero included); [`Layout::runs_here`] tells where this is
/// faster than a packing GEMM. Panics if an operand's elements reach past its slice.
pub(super) fn products(
    layout: &Layout,
    [a, b]: [&[f32]; 2],
    c: &mut [f32],
    offsets: impl Iterator<Item = [usize; 3]>,
) {
    let batch = Batch {
        layout,
        a,
        b,
        c,
        offsets,
    };
    // A result narrower than an AVX-512 register runs on AVX2's: in the wider one
    // half its lanes or more idle (the MoE's attention products of 8 columns ran
    // 1.9-2.1x slower on a Zen 4 core).
    #[cfg(target_arch = "x86_64")]
    if layout.n < NARROW_COLUMNS
        && let Some(avx2) = pulp::x86::V3::try_new()
    {
        return Simd::vectorize(avx2, batch);
    }
    pulp::Arch::new().dispatch(batch);
}

/// Results of fewer columns than this run on AVX2 registers where the CPU has AVX-512
/// too: an AVX-512 register's lanes (see [`products`]).
const NARROW_COLUMNS: usize = 16;

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
                    b: [bk, _],
                    c_row,
                    accumulate,
                    ..
                },
            a,
            b,
            c,
            offsets,
        } = self;
        let columns = self.layout.columns();
        let packs = columns.packed();
        let lanes = S::F32_LANES;
        let kc = k.min(KC);
        // The stack buffers below are zeroed only as far as the batch uses them:
        // zeroing whole ones (up to 38 KB a dispatch) was ~1% of the MoE step.
        // The panel for packing `b`: none where `b` is read in place (its rows adjacent
        // columns); on the stack up to [`STACK_PANEL`] elements (as many as the blocks
        // padded to whole registers take, so [`pads`] says the same as for a whole one).
        let mut stack = [MaybeUninit::<f32>::uninit(); STACK_PANEL];
        let mut heap = Vec::new();
        let panel: &mut [f32] = if !packs {
            &mut []
        } else if scratch([k, n]) == 0 {
            let padded = kc * n.next_multiple_of(lanes).min(NC);
            zeroed(&mut stack, padded.min(STACK_PANEL))
        } else {
            heap.resize(kc * n.min(NC), 0.0);
            &mut heap
        };
        // The stripe for packing a transposed `a`'s rows of a tile (up to 6 KB, on the
        // stack; none for other layouts).
        let mut stripe_stack = [MaybeUninit::<f32>::uninit(); ROWS * KC];
        let stripe: &mut [f32] = if a_strides[0] == 1 && a_strides[1] != 1 {
            zeroed(&mut stripe_stack, ROWS * kc)
        } else {
            &mut []
        };
        // The padded copy of a panel's last partial register of columns (see
        // [`Tail`]): only where `n` leaves one and `b` is not packed padded.
        let mut tail_stack = [MaybeUninit::<f32>::uninit(); KC * MOST_LANES];
        let tail: &mut [f32] = if n % lanes != 0 && !(packs && pads(panel.len(), [k, n], lanes)) {
            zeroed(&mut tail_stack, kc * lanes)
        } else {
            &mut []
        };
        for [oa, ob, oc] in offsets {
            let product = Product {
                a: &a[oa..],
                a_strides,
                k,
                accumulate,
            };
            let b = B {
                data: &b[ob..],
                bk,
                columns,
            };
            product.run(
                simd,
                b,
                [m, n],
                (&mut c[oc..], c_row),
                [&mut *panel, &mut *stripe, &mut *tail],
            );
        }
    }
}

/// The most `f32` lanes of a vector register `pulp` dispatches to (AVX-512's).
pub(super) const MOST_LANES: usize = 16;

/// The first `len` elements of `buffer` (a stack buffer, uninitialized) set to zero,
/// as `f32`s. Panics if `buffer` is shorter than `len`.
#[inline(always)]
#[allow(unsafe_code)]
fn zeroed(buffer: &mut [MaybeUninit<f32>], len: usize) -> &mut [f32] {
    let used = &mut buffer[..len];
    for x in used.iter_mut() {
        x.write(0.0);
    }
    // SAFETY: every element of `used` was initialized just above, and
    // `MaybeUninit<f32>` has the size, alignment and ABI of `f32`.
    unsafe { &mut *(std::ptr::from_mut(used) as *mut [f32]) }
}

/// Whether a packing panel of `capacity` elements holds the blocks of `b` of a `[k, n]`
/// product with the last panel's columns padded to whole registers of `lanes`.
fn pads(capacity: usize, [k, n]: [usize; 2], lanes: usize) -> bool {
    capacity >= k.min(KC) * n.next_multiple_of(lanes).min(NC)
}

/// One product's `a`, read through its strides, and whether the product adds to the
/// result ([`Layout::accumulate`]).
struct Product<'x> {
    a: &'x [f32],
    a_strides: [usize; 2],
    k: usize,
    accumulate: bool,
}

/// One product's `b`: its elements, its stride along `k` and where its columns start
/// (which say whether it is packed, else its rows are adjacent columns, read in place).
#[derive(Clone, Copy)]
struct B<'x> {
    data: &'x [f32],
    bk: usize,
    columns: ColumnOffsets,
}

/// A matrix's elements and the distance between its rows (its columns adjacent).
pub(super) type Rows<'x, X> = (X, usize);

/// The elements of `a` a tile of `R` rows multiplies by `b`'s row `q` of a block of
/// contracted elements.
pub(super) trait Column<const R: usize> {
    /// The contracted elements of the block it holds: [`Column::at`] takes `q` below this.
    fn len(&self) -> usize;

    /// The tile's `R` elements for the block's `q`-th contracted element.
    ///
    /// # Safety
    /// `q < self.len()`.
    #[allow(unsafe_code)]
    unsafe fn at(&self, q: usize) -> [f32; R];
}

/// `a` with adjacent columns: `R` rows `am` apart, each `len` long from the block's
/// start.
struct RowMajor<'x> {
    a: &'x [f32],
    am: usize,
    len: usize,
}

impl<'x> RowMajor<'x> {
    /// Panics unless `R` rows of `len` elements, `am` apart, lie in `a`.
    fn new<const R: usize>(a: &'x [f32], am: usize, len: usize) -> Self {
        assert!(
            len == 0 || (R - 1) * am + len <= a.len(),
            "a's rows reach past it"
        );
        RowMajor { a, am, len }
    }
}

impl<const R: usize> Column<R> for RowMajor<'_> {
    fn len(&self) -> usize {
        self.len
    }

    #[inline(always)]
    #[allow(unsafe_code)]
    unsafe fn at(&self, q: usize) -> [f32; R] {
        // SAFETY: `r * am + q < (R - 1) * am + len <= a.len()` for `r < R` and `q <
        // len` (checked in `new`, and `q < len` by the caller). Checking each of the `R`
        // loads instead took the tile's registers for the rows' bounds (see
        // benches/README.md, "Mid-size products").
        std::array::from_fn(|r| unsafe { *self.a.get_unchecked(r * self.am + q) })
    }
}

/// `a`'s `R` rows over a block packed by [`Packed::new`]: the `R` elements of each
/// contracted index adjacent, one index after the other.
pub(super) struct Packed<'x> {
    pub(super) stripe: &'x [f32],
}

impl<'x> Packed<'x> {
    /// `a`'s `R` rows from `a[0]` (adjacent: `a` transposed) over `len` contracted
    /// elements `ak` apart, copied into the front of `stripe`. Panics if they reach
    /// past `a` or `stripe` is shorter than `R * len`.
    fn new<const R: usize>(a: &[f32], ak: usize, len: usize, stripe: &'x mut [f32]) -> Self {
        let stripe = &mut stripe[..R * len];
        pack_rows(a, [1, ak], R, stripe);
        Packed { stripe }
    }
}

/// `a`'s `rows` rows from `a[0]` (strides `[am, ak]`) over `to.len() / rows`
/// contracted elements copied into `to` as [`Packed`] reads them: the `rows` elements
/// of each contracted index adjacent, one index after the other. Panics if they reach
/// past `a`.
#[inline(always)]
#[allow(unsafe_code)]
pub(super) fn pack_rows(a: &[f32], [am, ak]: [usize; 2], rows: usize, to: &mut [f32]) {
    if am == 1 {
        for (q, to) in to.chunks_exact_mut(rows).enumerate() {
            to.copy_from_slice(&a[q * ak..][..rows]);
        }
        return;
    }
    let len = to.len() / rows;
    assert!(
        len == 0 || (rows - 1) * am + (len - 1) * ak < a.len(),
        "a's rows reach past it"
    );
    for (q, to) in to.chunks_exact_mut(rows).enumerate() {
        for (r, to) in to.iter_mut().enumerate() {
            // SAFETY: `r < rows` and `q < len`, so the index is at most the one
            // asserted within `a` above. Checked, packing a row-major `a` was 4% of a
            // large product's time (benches/README.md, h41g).
            *to = unsafe { *a.get_unchecked(r * am + q * ak) };
        }
    }
}

impl<const R: usize> Column<R> for Packed<'_> {
    fn len(&self) -> usize {
        self.stripe.len() / R
    }

    #[inline(always)]
    #[allow(unsafe_code)]
    unsafe fn at(&self, q: usize) -> [f32; R] {
        // SAFETY: `q * R + R <= stripe.len()` for `q < len()` (the caller's contract).
        std::array::from_fn(|r| unsafe { *self.stripe.get_unchecked(q * R + r) })
    }
}

/// `a` with any strides: element by element.
struct Strided<'x> {
    a: &'x [f32],
    strides: [usize; 2],
    len: usize,
}

impl<const R: usize> Column<R> for Strided<'_> {
    fn len(&self) -> usize {
        self.len
    }

    #[inline(always)]
    #[allow(unsafe_code)]
    unsafe fn at(&self, q: usize) -> [f32; R] {
        let [am, ak] = self.strides;
        std::array::from_fn(|r| self.a[r * am + q * ak])
    }
}

impl Product<'_> {
    /// The `[m, n]` result `a · b` into `c`, in passes over blocks of [`KC`] contracted
    /// elements (the first writes `c`, or adds to it when accumulating; the next add
    /// their sums to it) and [`NC`] columns, each block of `b` copied into `panel`
    /// (see [`pack`]; its last partial register of columns into `tail` where `panel`
    /// does not pad it: see [`Tail`]), then row blocks of [`ROWS`] (and the rest) along
    /// the block's columns, `a`'s rows packed into `stripe` where it is transposed
    /// (see [`Packed`]). No closure here runs
    /// vector code (a closure is not compiled with the dispatch's CPU features).
    #[inline(always)]
    fn run<S: Simd>(
        &self,
        simd: S,
        b: B<'_>,
        [m, n]: [usize; 2],
        (c, c_row): Rows<'_, &mut [f32]>,
        [panel, stripe, tail]: [&mut [f32]; 3],
    ) {
        let lanes = S::F32_LANES;
        let packs = b.columns.packed();
        let pad = packs && pads(panel.len(), [self.k, n], lanes);
        let mut q0 = 0;
        loop {
            let block = [q0, self.k.min(q0 + KC)];
            let mut j0 = 0;
            while j0 < n {
                let columns = [j0, n.min(j0 + NC)];
                let panel = if !packs {
                    let B { data, bk, .. } = b;
                    let data = data.get(block[0] * bk + j0..).unwrap_or_default();
                    Panel::InPlace { data, bk }
                } else {
                    let pad_to = if pad { lanes } else { 1 };
                    let data = match b.columns.groups {
                        None => pack::<S>(
                            (b.data, [b.bk, b.columns.bn]),
                            block,
                            columns,
                            pad_to,
                            panel,
                        ),
                        Some(_) => pack_grouped::<S>(b, block, columns, pad_to, panel),
                    };
                    Panel::Packed {
                        data,
                        len: block[1] - block[0],
                        pad_to,
                    }
                };
                let c = (&mut c[j0..], c_row);
                let width = columns[1] - columns[0];
                let tail = Tail::of::<S>(panel, width, block[1] - block[0], tail);
                let mut i = 0;
                while i + ROWS <= m {
                    let c = (&mut *c.0, c_row);
                    self.row_block::<S, ROWS>(simd, [panel, tail], i, width, block, c, stripe);
                    i += ROWS;
                }
                match m - i {
                    0 => {}
                    1 => self.row_block::<S, 1>(simd, [panel, tail], i, width, block, c, stripe),
                    2 => self.row_block::<S, 2>(simd, [panel, tail], i, width, block, c, stripe),
                    3 => self.row_block::<S, 3>(simd, [panel, tail], i, width, block, c, stripe),
                    4 => self.row_block::<S, 4>(simd, [panel, tail], i, width, block, c, stripe),
                    _ => self.row_block::<S, 5>(simd, [panel, tail], i, width, block, c, stripe),
                }
                j0 = columns[1];
            }
            q0 = block[1];
            if q0 >= self.k {
                break;
            }
        }
    }

    /// Rows `i .. i + R` of the result's first `width` columns over the contracted
    /// `block`, `b`'s block read from `panel`, `a` read as its strides allow: in place
    /// by rows, or (transposed) its `R` rows over the block packed into `stripe` once
    /// for all the block's columns, else element by element.
    #[inline(always)]
    #[allow(clippy::too_many_arguments)]
    fn row_block<S: Simd, const R: usize>(
        &self,
        simd: S,
        panel: [Panel<'_>; 2],
        i: usize,
        width: usize,
        [q0, q1]: [usize; 2],
        c: Rows<'_, &mut [f32]>,
        stripe: &mut [f32],
    ) {
        let [am, ak] = self.a_strides;
        let len = q1 - q0;
        let add = q0 != 0 || self.accumulate;
        let row_block = RowBlock {
            panel,
            at: [i, width],
            block: [q0, q1],
            add,
            c,
        };
        if len == 0 {
            // Nothing contracted: zeros, `a` not read.
            let a = Strided {
                a: &[],
                strides: [am, ak],
                len,
            };
            apart(simd, Columns::<_, R> { a: &a, row_block });
        } else if ak == 1 {
            let a = RowMajor::new::<R>(&self.a[i * am + q0..], am, len);
            apart(simd, Columns::<_, R> { a: &a, row_block });
        } else if am == 1 && R > 1 {
            let a = Packed::new::<R>(&self.a[i + q0 * ak..], ak, len, stripe);
            apart(simd, Columns::<_, R> { a: &a, row_block });
        } else {
            let a = Strided {
                a: &self.a[i * am + q0 * ak..],
                strides: [am, ak],
                len,
            };
            apart(simd, Columns::<_, R> { a: &a, row_block });
        }
    }
}

/// [`columns`]' arguments besides `a`: `b`'s block and tail, the rows and columns
/// `[i, width]`, the contracted block, whether to add to the result, and the result.
struct RowBlock<'x, 'c> {
    panel: [Panel<'x>; 2],
    at: [usize; 2],
    block: [usize; 2],
    add: bool,
    c: Rows<'c, &'c mut [f32]>,
}

/// [`columns`]' arguments, run by [`apart`].
struct Columns<'x, 'c, A, const R: usize> {
    a: &'x A,
    row_block: RowBlock<'x, 'c>,
}

impl<const R: usize, A: Column<R>> pulp::WithSimd for Columns<'_, '_, A, R> {
    type Output = ();

    #[inline(always)]
    fn with_simd<S: Simd>(self, simd: S) {
        let Columns {
            a,
            row_block:
                RowBlock {
                    panel,
                    at,
                    block,
                    add,
                    c,
                },
        } = self;
        columns::<S, R>(simd, a, panel, at, block, add, c);
    }
}

/// `op` run with `simd`'s features in a function of its own, not inlined into the
/// caller: a row block's tile loops get the registers to themselves. Inlined into the
/// batch's loops (whose slices and counters stay live across them), the 12-accumulator
/// loop reloaded `a`'s row stride from the stack for each of its rows.
#[inline(never)]
pub(super) fn apart<S: Simd, Op: pulp::WithSimd>(simd: S, op: Op) -> Op::Output {
    simd.vectorize(op)
}

/// Rows `i .. i + R` of the result's first `width` columns over the contracted
/// `block`, `b`'s block read from `panel` (and its last partial register of columns
/// from `tail` unless `panel` is padded: see [`Tail`]), written or (`add`) added to
/// the result: tiles of two registers of columns, then one, then the partial one;
/// every tile loads whole registers of `b`.
#[inline(always)]
fn columns<S: Simd, const R: usize>(
    simd: S,
    a: &impl Column<R>,
    [panel, tail]: [Panel<'_>; 2],
    [i, width]: [usize; 2],
    block: [usize; 2],
    add: bool,
    (c, c_row): Rows<'_, &mut [f32]>,
) {
    let lanes = S::F32_LANES;
    let mut j = 0;
    while j + 2 * lanes <= width {
        let b = panel.columns(j, 2 * lanes);
        tile::<S, R, 2>(simd, a, b, [i, 2 * lanes], block, add, (&mut c[j..], c_row));
        j += 2 * lanes;
    }
    let rest = width - j;
    if rest == 0 {
        return;
    }
    let b = panel.columns(j, rest);
    if panel.padded() {
        // The last panel's rows padded to whole registers: one tile over its columns.
        let c = (&mut c[j..], c_row);
        if rest > lanes {
            tile::<S, R, 2>(simd, a, b, [i, rest], block, add, c);
        } else {
            tile::<S, R, 1>(simd, a, b, [i, rest], block, add, c);
        }
        return;
    }
    if rest >= lanes {
        tile::<S, R, 1>(simd, a, b, [i, lanes], block, add, (&mut c[j..], c_row));
    }
    let part = rest % lanes;
    if part > 0 {
        let c = (&mut c[width - part..], c_row);
        tile::<S, R, 1>(simd, a, tail.columns(0, part), [i, part], block, add, c);
    }
}

/// A block of `b`'s rows as the tiles read it: in place (its rows adjacent columns,
/// `bk` apart, `data` from the block's first element) or packed by [`pack`] (`len`
/// rows a panel, the last panel's rows padded to a multiple of `pad_to` columns).
#[derive(Clone, Copy)]
pub(super) enum Panel<'x> {
    InPlace {
        data: &'x [f32],
        bk: usize,
    },
    Packed {
        data: &'x [f32],
        len: usize,
        pad_to: usize,
    },
}

impl<'x> Panel<'x> {
    /// The block's columns from `j` (a panel's first when packed, `width` its
    /// columns) and the distance between their rows; empty when nothing is contracted.
    #[inline(always)]
    pub(super) fn columns(self, j: usize, width: usize) -> Rows<'x, &'x [f32]> {
        match self {
            Panel::InPlace { data, bk } => (data.get(j..).unwrap_or_default(), bk),
            Panel::Packed { data, len, pad_to } => (
                data.get(j * len..).unwrap_or_default(),
                round_up(width, pad_to),
            ),
        }
    }

    /// Whether the rows of its last panel are padded to whole registers (packed).
    #[inline(always)]
    fn padded(self) -> bool {
        matches!(self, Panel::Packed { pad_to, .. } if pad_to > 1)
    }
}

/// `x` rounded up to a multiple of `pad_to`, a power of two (1 or a register's
/// lanes): by a mask, not `next_multiple_of`'s division (of a value the compiler does
/// not know: several a product, in each row block's tiles too).
#[inline(always)]
fn round_up(x: usize, pad_to: usize) -> usize {
    debug_assert!(pad_to.is_power_of_two());
    (x + pad_to - 1) & !(pad_to - 1)
}

/// The last partial register of a block's columns (`width % lanes` of them) where its
/// panel does not pad them, copied into rows of a whole register (`lanes` apart, the
/// columns past them zero), so that every tile's loop loads whole registers: a
/// partial load is an indirect call on AVX2 (`pulp`'s mask table), which kept a
/// tile's accumulators in memory across each step (benches/README.md, "The small
/// steps' slow products in isolation").
struct Tail;

impl Tail {
    /// `panel`'s last `width % lanes` columns over `len` rows copied into the front
    /// of `buffer` (its columns past them zero, at least `len * lanes` long) and read
    /// from there; an empty panel where there are none or `panel` is padded.
    #[inline(always)]
    fn of<'t, S: Simd>(
        panel: Panel<'_>,
        width: usize,
        len: usize,
        buffer: &'t mut [f32],
    ) -> Panel<'t> {
        let lanes = S::F32_LANES;
        let part = width % lanes;
        if part == 0 || panel.padded() || len == 0 {
            return Panel::InPlace { data: &[], bk: 0 };
        }
        // The panel holding the part: the last (packed ones are two registers wide).
        let start = width - width % (2 * lanes);
        let (b, b_row) = panel.columns(start, width - start);
        let from = width - part - start;
        let buffer = &mut buffer[..len * lanes];
        for (q, row) in buffer.chunks_exact_mut(lanes).enumerate() {
            row[..part].copy_from_slice(&b[q * b_row + from..][..part]);
        }
        Panel::InPlace {
            data: buffer,
            bk: lanes,
        }
    }
}

/// `b`'s rows `block` by its columns `columns` (its rows not adjacent columns: `b`
/// transposed) copied into `panel` as consecutive panels of two registers of columns
/// (the last narrower when the columns run out, its rows padded with zeros to a
/// multiple of `pad_to` columns), each panel's rows adjacent; the packed part of
/// `panel` returned.
#[inline(always)]
#[allow(unsafe_code)]
pub(super) fn pack<'p, S: Simd>(
    (b, [bk, bn]): (&[f32], [usize; 2]),
    [q0, q1]: [usize; 2],
    [j0, j1]: [usize; 2],
    pad_to: usize,
    panel: &'p mut [f32],
) -> &'p [f32] {
    let len = q1 - q0;
    let step = 2 * S::F32_LANES;
    let full = (j1 - j0) / step * step;
    let last = round_up(j1 - j0 - full, pad_to);
    let panel = &mut panel[..len * (full + last)];
    let (full_panels, last_panel) = panel.split_at_mut(len * full);
    let panels = full_panels.chunks_exact_mut((len * step).max(1));
    let widths = std::iter::repeat_n(step, full / step).chain((last > 0).then_some(last));
    for (p, (panel, width)) in panels
        .chain((last > 0).then_some(last_panel))
        .zip(widths)
        .enumerate()
    {
        let j = j0 + p * step;
        let columns = width.min(j1 - j);
        let b = &b[j * bn + q0 * bk..];
        assert!(
            len == 0 || columns == 0 || (columns - 1) * bn + (len - 1) * bk < b.len(),
            "b's block reaches past it"
        );
        for (q, row) in panel.chunks_exact_mut(width).enumerate() {
            let (row, padding) = row.split_at_mut(columns);
            for (x, to) in row.iter_mut().enumerate() {
                // SAFETY: `x < columns` and `q < len`, so the index is at most the one
                // asserted within `b` above. Checking each element's index was a
                // quarter of a 16x32x12 product's time (its `b` packed per product).
                *to = unsafe { *b.get_unchecked(x * bn + q * bk) };
            }
            padding.fill(0.0);
        }
    }
    panel
}

/// [`pack`] for a `b` whose columns are in groups ([`Layout::b_groups`]): each panel's
/// columns' first elements listed, then copied as [`pack`] copies them. A function of
/// its own: in [`pack`]'s loop the list slowed the tiny packed products of attention.
#[inline(never)]
#[allow(unsafe_code)]
fn pack_grouped<'p, S: Simd>(
    B {
        data: b,
        bk,
        columns: offsets,
        ..
    }: B<'_>,
    [q0, q1]: [usize; 2],
    [j0, j1]: [usize; 2],
    pad_to: usize,
    panel: &'p mut [f32],
) -> &'p [f32] {
    let len = q1 - q0;
    let step = 2 * S::F32_LANES;
    let widths = (j0..j1)
        .step_by(step)
        .map(|j| round_up((j1 - j).min(step), pad_to));
    let total: usize = widths.clone().sum();
    let panel = &mut panel[..len * total];
    let mut rest = &mut *panel;
    for (p, width) in widths.enumerate() {
        let (this, next) = std::mem::take(&mut rest).split_at_mut(len * width);
        rest = next;
        let j = j0 + p * step;
        let columns = width.min(j1 - j);
        let mut starts = [0; 2 * MOST_LANES];
        let starts = &mut starts[..columns];
        for (x, start) in starts.iter_mut().enumerate() {
            *start = offsets.at(j + x) + q0 * bk;
        }
        let last = starts
            .iter()
            .max()
            .map_or(0, |&s| s + len.saturating_sub(1) * bk);
        assert!(
            len == 0 || columns == 0 || last < b.len(),
            "b's block reaches past it"
        );
        for (q, row) in this.chunks_exact_mut(width).enumerate() {
            let (row, padding) = row.split_at_mut(columns);
            for (to, &start) in row.iter_mut().zip(&*starts) {
                // SAFETY: `q < len`, so the index is at most `last`, asserted within
                // `b` above.
                *to = unsafe { *b.get_unchecked(start + q * bk) };
            }
            padding.fill(0.0);
        }
    }
    panel
}

/// Rows `i .. i + R` by the first `width` columns of the result over the contracted
/// `q0 .. q1` (`a`'s elements from `a.at(0)` for `q0`, `b`'s rows from `q0`, each
/// read as `V` whole registers whatever `width`): `R * V` accumulators, each summing
/// over the contracted index in order from zero, then stored, or (`add`) added to the
/// result's value (its first `width` columns). The loop calls nothing, so the
/// accumulators stay in registers. Panics if `b`'s rows or `a`'s block are shorter
/// than that.
#[inline(always)]
#[allow(unsafe_code)]
pub(super) fn tile<S: Simd, const R: usize, const V: usize>(
    simd: S,
    a: &impl Column<R>,
    (b, b_row): Rows<'_, &[f32]>,
    [i, width]: [usize; 2],
    [q0, q1]: [usize; 2],
    add: bool,
    (c, c_row): Rows<'_, &mut [f32]>,
) {
    let lanes = S::F32_LANES;
    let len = q1 - q0;
    assert!(width <= V * lanes && V * lanes <= 2 * MOST_LANES && a.len() >= len);
    assert!(
        len == 0 || (len - 1) * b_row + V * lanes <= b.len(),
        "b's rows reach past it"
    );
    let mut acc = [[simd.splat_f32s(0.0); V]; R];
    for q in 0..len {
        // SAFETY: row `q < len` of `b` spans `q * b_row .. q * b_row + V * lanes`,
        // within `b` (asserted above); `V` registers of `f32`s (any bit pattern is
        // one), read unaligned. Checking each row's bounds here took two compares and
        // a register a step from the 12-accumulator loop.
        let y: [S::f32s; V] = unsafe {
            let registers = b.as_ptr().add(q * b_row).cast::<S::f32s>();
            std::array::from_fn(|v| registers.add(v).read_unaligned())
        };
        // SAFETY: `q < len <= a.len()` (asserted above).
        let xs = unsafe { a.at(q) };
        for (acc, &x) in acc.iter_mut().zip(&xs) {
            let x = simd.splat_f32s(x);
            for (acc, &y) in acc.iter_mut().zip(&y) {
                *acc = simd.mul_add_e_f32s(x, y, *acc);
            }
        }
    }
    for (r, acc) in acc.iter().enumerate() {
        let row = &mut c[(i + r) * c_row..][..width];
        if width == V * lanes {
            let registers: &mut [S::f32s] = bytemuck::cast_slice_mut(row);
            if !add {
                registers.copy_from_slice(acc);
            } else {
                for (c, &acc) in registers.iter_mut().zip(acc) {
                    *c = simd.add_f32s(acc, *c);
                }
            }
        } else {
            // The sums of the first `width` lanes, through the stack (indexing the
            // accumulators statically, no partial store).
            let mut sums = [0.0f32; 2 * MOST_LANES];
            // SAFETY: `V * lanes <= sums.len()` (asserted above): `V` registers
            // written unaligned into `sums`.
            unsafe {
                let registers = sums.as_mut_ptr().cast::<S::f32s>();
                for (v, &acc) in acc.iter().enumerate() {
                    registers.add(v).write_unaligned(acc);
                }
            }
            for (c, &sum) in row.iter_mut().zip(&sums) {
                *c = if add { sum + *c } else { sum };
            }
        }
    }
}

#[cfg(test)]
pub(super) mod tests {
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

    /// The product laid out as `layout` of `batch` operands, each one span (plus a
    /// gap) after the last, the result's padding NaN: `(a, b, c, offsets)`.
    #[allow(clippy::type_complexity)]
    fn batch_of(
        layout: &Layout,
        batch: usize,
        seed: u64,
    ) -> (Vec<f32>, Vec<f32>, Vec<f32>, Vec<[usize; 3]>) {
        let &Layout {
            m,
            k,
            n,
            a,
            b,
            c_row,
            ..
        } = layout;
        let steps = [
            span(m, k, a) + 1,
            span(k, n, b) + 2,
            span(m, n, [c_row, 1]) + 1,
        ];
        let a = values(seed, steps[0] * batch.max(1));
        let b = values(seed ^ 0x5eed, steps[1] * batch.max(1));
        let c = vec![f32::NAN; steps[2] * batch.max(1)];
        let offsets = (0..batch).map(|t| steps.map(|s| s * t)).collect();
        (a, b, c, offsets)
    }

    /// Checks each result element of `products` against the definition's sum (within
    /// the rounding of `k` multiply-adds) and that the result's padding is left NaN.
    fn check(layout: &Layout, batch: usize, seed: u64) -> Result<(), TestCaseError> {
        let &Layout {
            m,
            k,
            n,
            a: a_strides,
            b: b_strides,
            c_row,
            ..
        } = layout;
        let (a, b, mut c, offsets) = batch_of(layout, batch, seed);
        products(layout, [&a, &b], &mut c, offsets.iter().copied());
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
                    prop_assert!(
                        (got - want).abs() <= bound,
                        "c[{}, {}] = {} not {}",
                        i,
                        j,
                        got,
                        want
                    );
                    written[at] = true;
                }
            }
        }
        for (at, _) in written.iter().enumerate().filter(|(_, w)| !**w) {
            prop_assert!(c[at].is_nan(), "padding at {} overwritten", at);
        }
        Ok(())
    }

    /// An `[rows, cols]` matrix with `strides` in `x`.
    fn view(
        x: &[f32],
        [rows, cols]: [usize; 2],
        [r, c]: [usize; 2],
    ) -> ndarray::ArrayView2<'_, f32> {
        use ndarray::ShapeBuilder;
        ndarray::ArrayView2::from_shape(
            (rows, cols).strides((r, c)),
            &x[..span(rows, cols, [r, c])],
        )
        .unwrap()
    }

    /// Products longer than a block of contracted elements ([`KC`]) and wider than a
    /// packed block of `b` ([`NC`]), in each layout, against the definition.
    #[test]
    fn blocks_of_k_and_n_equal_the_definition() {
        for transposed in [[false, false], [true, false], [false, true], [true, true]] {
            let [m, k, n] = [7, KC * 2 + 3, NC + 21];
            let layout = Layout {
                m,
                k,
                n,
                a: strides(m, k, transposed[0], 1),
                b: strides(k, n, transposed[1], 2),
                c_row: n + 3,
                accumulate: false,
                b_groups: None,
            };
            check(&layout, 2, 7).unwrap();
        }
    }

    /// The weight gradients' layouts `takes` moves here (a transposed `a` of at most
    /// 64 rows, one block of contracted elements, a `b` read in place) at their step
    /// shapes and at the rule's edges: packed stripes of `a` (six rows and the rest)
    /// against the definition, batched, with padded rows.
    #[test]
    fn transposed_weight_gradients_equal_the_definition() {
        for [m, k, n] in [
            [64, 256, 64],
            [64, 256, 256],
            [61, 255, 67],
            [5, KC, 64],
            [32, 256, 32],
            [64, 192, 33],
        ] {
            assert!(takes([m, k, n], m + 1, true) || contraction_avx512());
            let layout = Layout {
                m,
                k,
                n,
                a: strides(m, k, true, 1),
                b: strides(k, n, false, 2),
                c_row: n + 1,
                accumulate: false,
                b_groups: None,
            };
            check(&layout, 2, 11).unwrap();
        }
        assert!(!takes([65, 256, 64], 65, true));
        assert!(!takes([64, KC + 1, 64], 64, true));
        assert!(!takes([64, 256, 31], 64, true));
        assert!(!takes([64, 256, 64], 64, false));
    }

    /// Whether this CPU runs the rest on `gemm` (then no mid-size product runs here).
    fn contraction_avx512() -> bool {
        super::super::contraction::avx512()
    }

    /// The partial register of columns each way it is read (`n` 12: one register and
    /// a part): a packed `b` padded on the stack (`k` 32), a packed `b` too large to
    /// pad its heap panel (`k` 256 by 20 columns: the part copied into the tail
    /// buffer), a `b` read in place (the part copied), with one, several and a partial
    /// row block, overwriting and accumulating: bit for bit matrixmultiply's.
    #[test]
    #[cfg(target_arch = "x86_64")]
    fn partial_registers_equal_matrixmultiply_bit_for_bit() {
        if !std::arch::is_x86_feature_detected!("fma") {
            return;
        }
        for [k, n] in [[32, 12], [256, 20], [256, 4], [300, 37], [7, 9]] {
            for (m, transposed, accumulate) in [(16, true, false), (5, false, true)] {
                for b_transposed in [transposed, !transposed] {
                    let transposed = [false, b_transposed];
                    equal_matrixmultiply(run, [m, k, n], transposed, 0, accumulate, 5).unwrap();
                }
            }
        }
    }

    /// [`products`] of one product at offset 0.
    fn run(layout: &Layout, operands: [&[f32]; 2], c: &mut [f32]) {
        products(layout, operands, c, std::iter::once([0; 3]));
    }

    /// Checks `run` (a kernel's products, one at offset 0) on one `[m, k] x [k, n]`
    /// product (`transposed`: each operand column-major; its major stride `pad`
    /// elements longer than packed) bit for bit against matrixmultiply's
    /// `general_mat_mul` (`beta` 1 onto prior values when `accumulate`, else onto NaN
    /// that must not show).
    #[cfg(target_arch = "x86_64")]
    pub(in crate::runtime::kernels) fn equal_matrixmultiply(
        run: impl Fn(&Layout, [&[f32]; 2], &mut [f32]),
        [m, k, n]: [usize; 3],
        transposed: [bool; 2],
        pad: usize,
        accumulate: bool,
        seed: u64,
    ) -> Result<(), TestCaseError> {
        let layout = Layout {
            m,
            k,
            n,
            a: strides(m, k, transposed[0], pad),
            b: strides(k, n, transposed[1], pad),
            c_row: n,
            accumulate,
            b_groups: None,
        };
        let (a, b, mut c, _) = batch_of(&layout, 1, seed);
        // Accumulating: onto values of any sign and size (-0.0 among them).
        let prior: Vec<f32> = values(seed ^ 0xacc, m * n)
            .into_iter()
            .enumerate()
            .map(|(x, v)| if x % 7 == 3 { -0.0 } else { v * 4.0 })
            .collect();
        if accumulate {
            c[..m * n].copy_from_slice(&prior);
        }
        run(&layout, [&a, &b], &mut c);
        let (a, b) = (view(&a, [m, k], layout.a), view(&b, [k, n], layout.b));
        let mut want = ndarray::Array2::from_shape_vec((m, n), prior).unwrap();
        let beta = if accumulate { 1.0 } else { 0.0 };
        ndarray::linalg::general_mat_mul(1.0, &a, &b, beta, &mut want);
        let got = ndarray::ArrayView2::from_shape((m, n), &c[..m * n]).unwrap();
        prop_assert!(
            got.iter()
                .zip(&want)
                .all(|(x, y)| x.to_bits() == y.to_bits()),
            "{:?}",
            layout
        );
        Ok(())
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(300))]

        /// A product whose `b` has its columns in groups ([`Layout::b_groups`]: groups
        /// `stride` apart, `b` row- or column-major within them) equals, bit for bit, the
        /// products of its groups' columns one group at a time (each a product of its
        /// own, `b` packed or read in place), overwriting or accumulating, `k` below and
        /// above a block of [`KC`], widths across a register's lanes.
        #[test]
        fn grouped_columns_equal_each_group_bit_for_bit(
            m in 1usize..14,
            k in prop_oneof![1usize..40, (KC - 2)..(KC + 20)],
            columns in 1usize..20,
            groups in 1usize..5,
            transposed in any::<bool>(),
            gap in 0usize..3,
            accumulate in any::<bool>(),
            seed in any::<u64>(),
        ) {
            let b_strides = strides(k, columns, transposed, 0);
            let stride = span(k, columns, b_strides) + gap;
            let n = columns * groups;
            let grouped = Layout {
                m,
                k,
                n,
                a: strides(m, k, false, 1),
                b: b_strides,
                c_row: n + 1,
                accumulate,
                b_groups: Some([columns, stride]),
            };
            let a = values(seed, span(m, k, grouped.a));
            let b = values(seed ^ 0x5eed, stride * groups);
            let prior = values(seed ^ 0xacc, m * (n + 1));
            let mut got = prior.clone();
            products(&grouped, [&a, &b], &mut got, std::iter::once([0; 3]));
            let each = Layout {
                n: columns,
                b_groups: None,
                ..grouped
            };
            let mut want = prior;
            let offsets = (0..groups).map(|g| [0, g * stride, g * columns]);
            products(&each, [&a, &b], &mut want, offsets);
            prop_assert!(
                got.iter().zip(&want).all(|(x, y)| x.to_bits() == y.to_bits()),
                "{:?}",
                grouped
            );
        }

        /// Batches of products on random shapes (zero-size dims, `k` = 1 and `k` across a
        /// block of [`KC`], widths across a register's lanes and a tile's two, row counts
        /// across the [`ROWS`]-row tiles) and layouts (each operand row- or
        /// column-major, padded rows): each result element is the definition's sum
        /// within the rounding of `k` multiply-adds, and the result's padding is left
        /// as it was.
        #[test]
        fn batches_equal_the_definition(
            m in 0usize..27,
            k in prop_oneof![0usize..13, (KC - 2)..(KC + 3)],
            n in 0usize..70,
            batch in 0usize..4,
            transposed in proptest::array::uniform2(any::<bool>()),
            pads in proptest::array::uniform3(0usize..3),
            seed in any::<u64>(),
        ) {
            let layout = Layout {
                m,
                k,
                n,
                a: strides(m, k, transposed[0], pads[0]),
                b: strides(k, n, transposed[1], pads[1]),
                c_row: n + pads[2],
                accumulate: false,
                b_groups: None,
            };
            check(&layout, batch, seed)?;
        }

        /// On x86-64 CPUs with FMA, the products are matrixmultiply's bit for bit (both
        /// sum each element in order with fused multiply-adds, blocks of [`KC`] added to
        /// the result), so moving a product between the two changes no result; so are
        /// the products accumulated into the result and matrixmultiply's with `beta`
        /// 1 (each block's sum added to the result in turn), `k` below and above [`KC`].
        #[test]
        #[cfg(target_arch = "x86_64")]
        fn products_equal_matrixmultiply_bit_for_bit(
            m in prop_oneof![1usize..40, 60usize..70],
            n in prop_oneof![1usize..40, 60usize..80],
            k in prop_oneof![1usize..40, (KC - 2)..(KC + 40)],
            transposed in proptest::array::uniform2(any::<bool>()),
            accumulate in any::<bool>(),
            seed in any::<u64>(),
        ) {
            prop_assume!(std::arch::is_x86_feature_detected!("fma"));
            equal_matrixmultiply(run, [m, k, n], transposed, 0, accumulate, seed)?;
        }
    }
}
