//! `dot_general` as 2-D matrix products over strided views of the operands' memory:
//! each operand's free dims merge into one matrix dim and its contracting dims into
//! the other wherever their strides allow it (adjacent in memory and in order: the
//! projections `bsm,mhk->bshk`, attention `bqhd,bkhd->bhqk` and `bhqk,bkhd->bqhd`,
//! the weight gradients `bsm,bsf->mf`), so those read their operands in place.
//! Batch dims, and the major free dims that do not merge with the rest, are loops:
//! each index selects a matrix of each operand and a block of the result by offset,
//! multiplied by a matmul kernel that takes any strides (it packs them itself)
//! straight into the result: a buffer of the device's pool (see
//! [`buffers`]), every element of which the products overwrite, so a step's products
//! reuse the last step's result memory instead of faulting in fresh pages. Only
//! contracting dims that do not merge (`bhsk,hkd->bsd` on head-major values: `h` and
//! `k` apart) make a copy of their operand, in `[batch, free, contracting]` order.
//!
//! The f32 kernel: small products (at most 32^3 multiply-adds, at least 8 result
//! columns), and on CPUs without AVX-512 mid-size ones whose lhs rows are read in
//! place (up to 2^27 multiply-adds), on [`small_product`], a register-blocked loop
//! that packs no lhs and runs a whole batch in one vector dispatch (it allocates
//! nothing for small products, where matrixmultiply allocates and fills its packing
//! buffers on every product); on CPUs with AVX-512,
//! the `gemm` crate's (one thread) for the rest, a transposed `b` first copied into
//! rows by an AVX transpose ([`copies_b`]); else, with AVX2 and FMA, the large
//! ones (at least 8 result columns, 128 where the lhs is transposed) on
//! [`blocked_product`], BLIS's loop nest around the same tile (1.03-1.13x
//! matrixmultiply's rate on the LMs' products, bit for bit its results), and the
//! rest on matrixmultiply's (via ndarray's `general_mat_mul`); i32 a wrapping loop. Measured single-threaded on the
//! shapes the LM steps run (d_model 512: `[2048, 512] x [512, 2048]` and the like in
//! every operand layout, 128 attention products of `[128, 64] x [64, 128]`; the example
//! LM: `[256, 64] x [64, 256]` down to batches of `[16, 16] x [16, 16]`), `gemm` with
//! AVX-512 reached 1.0-1.7x matrixmultiply's rate (0.6x on the tiny batches), with
//! AVX2 only 0.4-0.9x; a plain row loop 0.15-0.35x (benches/README.md, "Matrix
//! products").

use std::borrow::Cow;

use ndarray::{
    ArrayD, ArrayView2, ArrayViewMut2, Axis, IxDyn, ShapeBuilder, Zip, linalg::general_mat_mul,
};

use smallvec::{SmallVec, smallvec};

use super::Dims;
use super::blocked_product;
use super::small_product::{self, Layout};
use super::tiles::{self, Matrix};
use crate::ir::{DotDims, Element, Literal};
use crate::runtime::buffers::{self, Pooled};

/// Element types `dot_general` multiplies: `c = a · b` for 2-D operands (`c`'s prior
/// contents are ignored: it may hold anything, NaN included), or `c = a · b + c` when
/// `accumulate` (see [`Layout::accumulate`]).
pub(super) trait DotScalar: Pooled + Copy + Default {
    fn matmul_into(
        a: ArrayView2<'_, Self>,
        b: ArrayView2<'_, Self>,
        c: ArrayViewMut2<'_, Self>,
        accumulate: bool,
    );

    /// `acc + a * b` in the element type's arithmetic (wrapping for integers), for the
    /// kernels that accumulate one product at a time.
    fn mul_add(acc: Self, a: Self, b: Self) -> Self;

    /// The products of a batch laid out as `layout`: `c[oc..] = a[oa..] · b[ob..]` for
    /// each `[oa, ob, oc]` of `offsets`, `c`'s prior contents ignored (added to when
    /// `layout.accumulate`). By default one [`DotScalar::matmul_into`] each.
    fn products_into(
        layout: &Layout,
        operands: [&[Self]; 2],
        c: &mut [Self],
        offsets: Offsets,
    ) -> Result<(), String> {
        each_product(layout, operands, c, offsets)
    }

    /// Whether [`DotScalar::products_into`] takes `layout` with its columns in groups
    /// ([`Layout::b_groups`]). By default not.
    fn takes_groups(layout: &Layout) -> bool {
        let _ = layout;
        false
    }
}

/// [`DotScalar::products_into`] one [`DotScalar::matmul_into`] a product.
fn each_product<T: DotScalar>(
    layout: &Layout,
    [a, b]: [&[T]; 2],
    c: &mut [T],
    offsets: impl Iterator<Item = [usize; 3]>,
) -> Result<(), String> {
    let &Layout {
        m,
        k,
        n,
        a: [am, ak],
        b: [bk, bn],
        b_groups,
        c_row,
        accumulate,
    } = layout;
    if b_groups.is_some() {
        return Err("grouped columns of b on a kernel that reads b through strides".into());
    }
    let view_err = |e: ndarray::ShapeError| e.to_string();
    for [oa, ob, oc] in offsets {
        let a = ArrayView2::from_shape((m, k).strides((am, ak)), &a[oa..]);
        let b = ArrayView2::from_shape((k, n).strides((bk, bn)), &b[ob..]);
        let c = ArrayViewMut2::from_shape((m, n).strides((c_row, 1)), &mut c[oc..]);
        T::matmul_into(
            a.map_err(view_err)?,
            b.map_err(view_err)?,
            c.map_err(view_err)?,
            accumulate,
        );
    }
    Ok(())
}

impl DotScalar for f32 {
    /// The `gemm` crate's kernel on machines with AVX-512, else matrixmultiply's (see
    /// the module docs). Each is deterministic: the same shapes, strides and values
    /// give the same bits on every run on a machine. Accumulating, matrixmultiply's
    /// runs with `beta` 1: it adds `c` to each element's sum over the first block of
    /// `PACK[0]` contracted elements (one rounding).
    fn matmul_into(
        a: ArrayView2<'_, f32>,
        b: ArrayView2<'_, f32>,
        mut c: ArrayViewMut2<'_, f32>,
        accumulate: bool,
    ) {
        if avx512() {
            gemm_f32(a, b, c, accumulate);
        } else {
            let beta = if accumulate { 1.0 } else { 0.0 };
            general_mat_mul(1.0, &a, &b, beta, &mut c);
        }
    }

    /// Small and mid-size products ([`Layout::runs_here`]) on [`small_product`], large
    /// ones [`blocked_product`] takes there, the rest one [`DotScalar::matmul_into`]
    /// each, on a copy of `b` in rows where [`copies_b`]. Deterministic as those are.
    fn products_into(
        layout: &Layout,
        operands: [&[f32]; 2],
        c: &mut [f32],
        offsets: Offsets,
    ) -> Result<(), String> {
        if layout.runs_here() {
            small_product::products(layout, operands, c, offsets);
            Ok(())
        } else if layout.b_groups.is_none()
            && blocked_product::takes(
                [layout.m, layout.k, layout.n],
                layout.a[1],
                layout.b[1] == 1,
            )
        {
            blocked_product::products(layout, operands, c, offsets);
            Ok(())
        } else if layout.b_groups.is_none()
            && copies_b(
                [layout.m, layout.k, layout.n],
                layout.b[0],
                layout.b[1] == 1,
            )
        {
            products_on_b_in_rows(layout, operands, c, offsets)
        } else {
            each_product(layout, operands, c, offsets)
        }
    }

    /// Where [`small_product`] takes the product (its `b` packed with the groups'
    /// columns side by side).
    fn takes_groups(layout: &Layout) -> bool {
        layout.runs_here()
    }

    fn mul_add(acc: f32, a: f32, b: f32) -> f32 {
        acc + a * b
    }
}

/// Whether this CPU has AVX-512F (where `gemm`'s kernels beat matrixmultiply's). A
/// test may pin the kernels of CPUs without it (`tests::without_avx512`).
pub(super) fn avx512() -> bool {
    #[cfg(test)]
    if tests::WITHOUT_AVX512.get() {
        return false;
    }
    #[cfg(target_arch = "x86_64")]
    {
        std::arch::is_x86_feature_detected!("avx512f")
    }
    #[cfg(not(target_arch = "x86_64"))]
    {
        false
    }
}

/// Whether f32 `[m, k] x [k, n]` products whose `b` has stride `bk` along `k` and
/// adjacent columns when `b_rows` (see [`Layout::b`]) run on `gemm` with `b` first
/// copied to a `[k, n]` buffer in rows ([`products_on_b_in_rows`]): on CPUs with
/// AVX-512 (where `gemm` runs), for a `b` transposed (adjacent along `k`, its columns
/// apart), which `gemm` reads element by element with a strided gather. The product
/// gives the same bits either way (`gemm` packs the same values in the same order).
/// Measured on one Zen 4 core, the copy and `gemm` took 0.97x the strided `gemm`'s time
/// on the d_model-1024 FFN's `[2048, 1024] x [1024, 4096]`, 0.31-0.78x on `k = n =
/// 1024` by 256 rows or fewer, 0.98-1.00x on the attention's `k = 64` (benches/README.md,
/// "Transposed `b` copied by an AVX transpose before `gemm`").
fn copies_b([_, k, n]: [usize; 3], bk: usize, b_rows: bool) -> bool {
    bk == 1 && !b_rows && n > 1 && k > 1 && avx512()
}

/// [`each_product`] on a copy of each product's `b` in rows, `[k, n]` on a pooled
/// buffer, made by an AVX transpose ([`tiles::transpose`]) once for each run of
/// products on the same `b`. Needs AVX2 (which every CPU with AVX-512 has) and `b`
/// adjacent along `k` (see [`copies_b`]).
fn products_on_b_in_rows(
    layout: &Layout,
    [a, b]: [&[f32]; 2],
    c: &mut [f32],
    offsets: impl Iterator<Item = [usize; 3]>,
) -> Result<(), String> {
    let &Layout {
        k, n, b: [_, bn], ..
    } = layout;
    let in_rows = Layout {
        b: [n, 1],
        ..*layout
    };
    let mut rows = buffers::take::<f32>(k * n);
    let mut copied = None;
    let mut result = Ok(());
    for [oa, ob, oc] in offsets {
        if copied != Some(ob) {
            let from = Matrix {
                offset: ob,
                row: bn,
            };
            let to = Matrix { offset: 0, row: n };
            if !tiles::transpose(b, from, &mut rows, to, [n, k]) {
                result = Err("a copy of b in rows without AVX2".to_string());
                break;
            }
            copied = Some(ob);
        }
        result = each_product(&in_rows, [a, &rows], c, std::iter::once([oa, 0, oc]));
        if result.is_err() {
            break;
        }
    }
    buffers::give_buffer(rows);
    result
}

/// `c = a · b` by the `gemm` crate on one thread, `c`'s prior contents ignored (NaN
/// included: `gemm` does not read the destination when told not to), or `c = a · b + c`
/// when `accumulate`.
///
/// Panics unless the shapes agree (`a` is `[m, k]`, `b` `[k, n]`, `c` `[m, n]`).
#[allow(unsafe_code)]
fn gemm_f32(
    a: ArrayView2<'_, f32>,
    b: ArrayView2<'_, f32>,
    mut c: ArrayViewMut2<'_, f32>,
    accumulate: bool,
) {
    let ((m, k), (k2, n)) = (a.dim(), b.dim());
    assert!(k == k2 && c.dim() == (m, n), "matmul shapes disagree");
    if m == 0 || n == 0 || (k == 0 && accumulate) {
        return;
    }
    if k == 0 {
        c.fill(0.0);
        return;
    }
    let [ars, acs] = [a.strides()[0], a.strides()[1]];
    let [brs, bcs] = [b.strides()[0], b.strides()[1]];
    let [crs, ccs] = [c.strides()[0], c.strides()[1]];
    // SAFETY: `gemm` reads `a.as_ptr() + i * ars + p * acs` for `i < m`, `p < k` (and
    // the like for `b`): exactly the elements of the views `a` and `b`, which ndarray
    // guarantees lie in their live allocations (the views borrow them for this call);
    // it writes `c.as_ptr() + i * crs + j * ccs` for `i < m`, `j < n`: the elements of
    // `c`, a mutable view, so distinct from each other (ndarray rejects overlapping
    // strides for mutable views) and, being a unique borrow, from `a`'s and `b`'s.
    // `read_dst` (`accumulate`) false: `c` is written, never read (else `alpha` 1
    // keeps it). `Parallelism::None`: no threads outlive the call. All dims are
    // non-zero here.
    unsafe {
        gemm::gemm(
            m,
            n,
            k,
            c.as_mut_ptr(),
            ccs,
            crs,
            accumulate,
            a.as_ptr(),
            acs,
            ars,
            b.as_ptr(),
            bcs,
            brs,
            if accumulate { 1.0 } else { 0.0 },
            1.0,
            false,
            false,
            false,
            gemm::Parallelism::None,
        );
    }
}

impl DotScalar for i32 {
    /// Wrapping arithmetic (XLA's), one rank-1 update per contracted index.
    fn matmul_into(
        a: ArrayView2<'_, i32>,
        b: ArrayView2<'_, i32>,
        mut c: ArrayViewMut2<'_, i32>,
        accumulate: bool,
    ) {
        if !accumulate {
            c.fill(0);
        }
        for (col, row) in a.columns().into_iter().zip(b.rows()) {
            Zip::from(&mut c)
                .and_broadcast(&col.insert_axis(Axis(1)))
                .and_broadcast(&row.insert_axis(Axis(0)))
                .for_each(|c, &p, &q| *c = c.wrapping_add(p.wrapping_mul(q)));
        }
    }

    fn mul_add(acc: i32, a: i32, b: i32) -> i32 {
        acc.wrapping_add(a.wrapping_mul(b))
    }
}

/// The contracted elements, rows of `a` and columns of `b` matrixmultiply packs at most
/// per product (its f32 `KC`, `MC` and `NC`), each packed panel padded to a multiple of
/// [`PACK_ALIGN`]; the `gemm` crate blocks by sizes of the same order.
const PACK: [usize; 3] = [256, 64, 1024];

/// The rows and columns a packed panel is padded to (the micro-kernel's tile).
const PACK_ALIGN: usize = 16;

/// The scratch bytes [`dot_general`] holds besides its result for operands of shapes
/// `lhs` and `rhs` in standard layout (every value the runtime makes is) and elements
/// of `element` bytes: a copy of each operand whose contracting dims do not merge (see
/// [`Flat::merging`]), and the matmul kernel's packing buffers for one product (at most
/// [`PACK`]: about 1.1 MB of f32), or, for products on [`small_product`], its packed
/// block of a transposed rhs ([`small_product::scratch`]), or, on
/// [`blocked_product`], its packed blocks of both operands for a batch
/// ([`blocked_product::scratch`]), and, on `gemm` with a transposed rhs, that rhs's
/// copy in rows ([`copies_b`]: `k * n` elements more; f32 only, so a bound for i32).
/// Products read their operands in place and write
/// straight into the result, so that is all; a dim beyond an operand's rank counts as
/// size 1.
pub(crate) fn scratch_bytes(dd: &DotDims, lhs: &[usize], rhs: &[usize], element: usize) -> usize {
    let Standard {
        mkn: [m, k, n],
        ak,
        bk,
        rhs_rows,
        copies,
    } = Standard::of(dd, lhs, rhs);
    let [kc, mc, nc] = PACK;
    let panels = m.min(mc).next_multiple_of(PACK_ALIGN) + n.min(nc).next_multiple_of(PACK_ALIGN);
    let packed = if small_product::takes([m, k, n], ak, rhs_rows) {
        if rhs_rows {
            0
        } else {
            small_product::scratch([k, n])
        }
    } else if blocked_product::takes([m, k, n], ak, rhs_rows) {
        blocked_product::scratch([m, k, n])
    } else if copies_b([m, k, n], bk, rhs_rows) {
        k.min(kc) * panels + k * n
    } else {
        k.min(kc) * panels
    };
    (copies + packed) * element
}

/// Whether an f32 `dot_general` of operands of shapes `lhs` and `rhs` in standard
/// layout adds its result to an accumulator as an `add` of its result would, bit for
/// bit, in place ([`dot_general_add`]; see [`adds_exactly`]).
pub(crate) fn adds_in_place(dd: &DotDims, lhs: &[usize], rhs: &[usize]) -> bool {
    let Standard {
        mkn, ak, rhs_rows, ..
    } = Standard::of(dd, lhs, rhs);
    adds_exactly(mkn, ak, rhs_rows)
}

/// Whether f32 `[m, k] x [k, n]` products whose `a` has stride `ak` along `k` and whose
/// `b` has adjacent columns when `b_rows`, run accumulating ([`Layout::accumulate`]),
/// give bitwise `a · b + c` as the product then an `add` round it: when something is
/// contracted in one block of [`KC`](PACK) elements (each element's sum then complete
/// before `c` is added, one rounding) on [`small_product`], [`blocked_product`] or
/// matrixmultiply (not `gemm`, whose order is its own). All block by 256: with more, `c` would be added
/// to the first block's sum.
fn adds_exactly([m, k, n]: [usize; 3], ak: usize, b_rows: bool) -> bool {
    (1..=PACK[0]).contains(&k)
        && m * n > 0
        && (small_product::takes([m, k, n], ak, b_rows) || !avx512())
}

/// The matrix products of a `dot_general` of operands in standard layout (see
/// [`Standard::of`]).
struct Standard {
    /// The sizes `[m, k, n]` of each product.
    mkn: [usize; 3],
    /// The lhs's stride along `k`.
    ak: usize,
    /// The rhs's stride along `k`.
    bk: usize,
    /// Whether the rhs's rows are adjacent columns (read in place, else packed).
    rhs_rows: bool,
    /// The elements of the operands copied (where their contracting dims do not
    /// merge: see [`Flat::merging`]).
    copies: usize,
}

impl Standard {
    /// The products of operands of shapes `lhs` and `rhs` in standard layout (every
    /// value the runtime makes is); a dim beyond an operand's rank counts as size 1.
    fn of(dd: &DotDims, lhs: &[usize], rhs: &[usize]) -> Standard {
        let size = |shape: &[usize], d: usize| shape.get(d).copied().unwrap_or(1);
        // The contracting dims merged: `None` where they do not (the operand is copied).
        let contracted = |shape: &[usize], contracting: &[usize]| {
            let strides = super::row_major(shape);
            let dims: SmallVec<[(usize, usize); 6]> = (contracting.iter())
                .map(|&d| (size(shape, d), strides.get(d).copied().unwrap_or(0)))
                .collect();
            merged(&dims)
        };
        let copy = |shape: &[usize], contracting: &[usize]| match contracted(shape, contracting) {
            Some(_) => 0,
            None => shape.iter().product(),
        };
        let product =
            |shape: &[usize], dims: &[usize]| dims.iter().map(|&d| size(shape, d)).product();
        let k: usize = product(lhs, &dd.lhs_contracting);
        let m: usize = dd.lhs_free(lhs.len()).map(|d| size(lhs, d)).product();
        let n: usize = dd.rhs_free(rhs.len()).map(|d| size(rhs, d)).product();
        // The lhs's stride along `k` (a copy puts the contracting dims minor-most).
        let ak = contracted(lhs, &dd.lhs_contracting).map_or(1, |(_, stride)| stride);
        // The rhs's (a copy puts the free dims minor-most, after the contracting ones).
        let bk = contracted(rhs, &dd.rhs_contracting).map_or(n, |(_, stride)| stride);
        // Whether the rhs's rows are adjacent columns (read in place, else packed): a
        // copy puts its free dims minor-most (see [`Flat::merging`]).
        let rhs_rows = if copy(rhs, &dd.rhs_contracting) == 0 {
            let strides = super::row_major(rhs);
            let dims: SmallVec<[(usize, usize); 6]> = dd
                .rhs_free(rhs.len())
                .map(|d| (rhs[d], strides[d]))
                .collect();
            split_minor(&dims).1.1 == 1
        } else {
            n > 1
        };
        Standard {
            mkn: [m, k, n],
            ak,
            bk,
            rhs_rows,
            copies: copy(lhs, &dd.lhs_contracting) + copy(rhs, &dd.rhs_contracting),
        }
    }
}

/// An operand as flat memory: element `ix` at `data[sum(ix[d] * strides[d])]`.
struct Flat<'a, T: Clone> {
    data: Cow<'a, [T]>,
    strides: Dims,
    shape: Dims,
}

impl<'a, T: Clone> Flat<'a, T> {
    /// `a`'s memory when it is contiguous with non-negative strides (any order of
    /// dims), else a standard-layout copy.
    fn new(a: &'a ArrayD<T>) -> Self {
        let shape = Dims::from_slice(a.shape());
        let strides: Option<Dims> = a
            .strides()
            .iter()
            .map(|&s| usize::try_from(s).ok())
            .collect();
        match (a.as_slice_memory_order(), strides) {
            (Some(data), Some(strides)) => Flat {
                data: Cow::Borrowed(data),
                strides,
                shape,
            },
            _ => Flat {
                data: Cow::Owned(a.iter().cloned().collect()),
                strides: super::row_major(&shape),
                shape,
            },
        }
    }

    /// The `(size, stride)` of each of `dims`.
    fn dims(&self, dims: &[usize]) -> SmallVec<[(usize, usize); 6]> {
        dims.iter()
            .map(|&d| (self.shape[d], self.strides[d]))
            .collect()
    }

    /// The array itself if its `contracting` dims merge (contracting dims must merge on
    /// both sides of a product), else copied with its dims in `order` (major first, the
    /// `contracting` dims adjacent in it, in their order, so that they merge): the
    /// lhs's `[batch, free, contracting]` (its rows read in place), the rhs's `[batch,
    /// contracting, free]` (its rows adjacent columns, read in place rather than
    /// packed again by [`small_product`]).
    fn merging(self, contracting: &[usize], order: [&[usize]; 3]) -> Flat<'a, T>
    where
        T: Element,
    {
        if merged(&self.dims(contracting)).is_some() {
            return self;
        }
        let perm: Dims = order.into_iter().flatten().copied().collect();
        self.permuted(&perm)
    }

    /// The same array copied with its dims laid out in the order `perm` (major
    /// first): its strides still by the original dims.
    fn permuted(&self, perm: &[usize]) -> Flat<'a, T>
    where
        T: Element,
    {
        let sizes: Dims = perm.iter().map(|&d| self.shape[d]).collect();
        let read: Dims = perm.iter().map(|&d| self.strides[d]).collect();
        let data = super::movement::permuted_copy(&sizes, &self.data, &read);
        let mut strides: Dims = smallvec![0; perm.len()];
        for (&d, s) in perm.iter().zip(super::row_major(&sizes)) {
            strides[d] = s;
        }
        Flat {
            data: Cow::Owned(data),
            strides,
            shape: self.shape.clone(),
        }
    }
}

/// The `(size, stride)` of `dims` (major first) merged into one dim, dims of size 1
/// skipped: `None` unless each stride is the next one times the next size. No dims
/// merge into `(1, 0)`.
fn merged(dims: &[(usize, usize)]) -> Option<(usize, usize)> {
    let mut out = (1, 0);
    for &(n, s) in dims.iter().rev().filter(|(n, _)| *n != 1) {
        out = match out {
            (1, _) => (n, s),
            (m, t) if s == m * t => (m * n, t),
            _ => return None,
        };
    }
    Some(out)
}

/// `dims` cut into its major dims and the longest minor suffix that merges (see
/// [`merged`]), that suffix merged.
fn split_minor(dims: &[(usize, usize)]) -> (&[(usize, usize)], (usize, usize)) {
    (0..=dims.len())
        .find_map(|k| merged(&dims[k..]).map(|m| (&dims[..k], m)))
        .unwrap_or((dims, (1, 0)))
}

/// `dot_general` of `lhs` and `rhs` with result shape `shape` (batch dims, lhs free
/// dims, rhs free dims): one `[M, K] x [K, N]` product per index of the loop dims.
pub(super) fn dot_general<T: DotScalar>(
    dd: &DotDims,
    lhs: &ArrayD<T>,
    rhs: &ArrayD<T>,
    shape: &[usize],
) -> Result<ArrayD<T>, String> {
    // Pooled: its elements are unspecified until the products (or the fill) write them.
    let mut out = buffers::take::<T>(shape.iter().product());
    products(dd, [lhs, rhs], shape, &mut out, false)?;
    ArrayD::from_shape_vec(IxDyn(shape), out).map_err(|e| e.to_string())
}

/// `acc + lhs · rhs` for f32 literals (`acc` of the product's shape), bitwise as
/// [`dot_general`] then an `add` of its result and `acc` give it (either order: the
/// sum of two NaNs is a NaN of either's payload): in `acc`'s buffer when it is
/// handed over (owned, standard layout), else in a pooled copy of it, by one pass of
/// products adding to it where that rounds as the `add` does ([`adds_exactly`]),
/// else the product on a pooled buffer (scratch), then added.
pub(crate) fn dot_general_add(
    dd: &DotDims,
    lhs: &Literal,
    rhs: &Literal,
    acc: Cow<'_, Literal>,
) -> Result<Literal, String> {
    let (Literal::F32(lhs), Literal::F32(rhs)) = (lhs, rhs) else {
        return Err("a product accumulated into takes f32 operands".into());
    };
    let shape = Dims::from_vec(acc.shape());
    let total = shape.iter().product();
    let mut out: Vec<f32> = match acc {
        Cow::Owned(Literal::F32(a)) if a.is_standard_layout() => {
            let (buffer, offset) = a.into_raw_vec_and_offset();
            match offset.unwrap_or(0) {
                0 if buffer.len() == total => buffer,
                offset => {
                    let mut out = buffers::take(total);
                    out.copy_from_slice(&buffer[offset..][..total]);
                    buffers::give_buffer(buffer);
                    out
                }
            }
        }
        acc => {
            let Literal::F32(a) = acc.as_ref() else {
                return Err("a product accumulated into an accumulator that is not f32".into());
            };
            let mut out = buffers::take(total);
            out.iter_mut().zip(a.iter()).for_each(|(o, &x)| *o = x);
            out
        }
    };
    if !products(dd, [lhs, rhs], &shape, &mut out, true)? {
        let product = dot_general(dd, lhs, rhs, &shape)?;
        out.iter_mut()
            .zip(product.iter())
            .for_each(|(c, &p)| *c += p);
        buffers::give_buffer(product.into_raw_vec_and_offset().0);
    }
    Ok(Literal::F32(
        ArrayD::from_shape_vec(IxDyn(&shape), out).map_err(|e| e.to_string())?,
    ))
}

/// [`dot_general_add`] run by the evaluation loop for a planned
/// [`Accumulate`](crate::runtime::plan::Fusion::Accumulate): `operands` are the
/// product's and the accumulator (values, not views); the product's operands handed
/// over go back to the pool.
pub(crate) fn accumulate(dd: &DotDims, operands: super::Operands<'_>) -> Result<Literal, String> {
    fn value(x: super::Operand<'_>) -> Result<Cow<'_, Literal>, String> {
        match x {
            super::Operand::Value(x) => Ok(x),
            super::Operand::Broadcast { .. } => Err("a product accumulated into a view".into()),
        }
    }
    let mut operands = operands.into_iter().map(value);
    let (Some(lhs), Some(rhs), Some(acc), None) = (
        operands.next(),
        operands.next(),
        operands.next(),
        operands.next(),
    ) else {
        return Err("a product accumulated into takes three operands".into());
    };
    let (lhs, rhs) = (lhs?, rhs?);
    let sum = dot_general_add(dd, &lhs, &rhs, acc?);
    buffers::release_operand(lhs);
    buffers::release_operand(rhs);
    sum
}

/// Writes `lhs · rhs`, checked to have shape `shape`, into `out` (row-major, of that
/// shape), or when `accumulate` adds it to `out` if that is bitwise the product then
/// an `add` ([`adds_exactly`], f32) and else leaves `out` as it is and gives `false`.
fn products<T: DotScalar>(
    dd: &DotDims,
    [lhs, rhs]: [&ArrayD<T>; 2],
    shape: &[usize],
    out: &mut [T],
    accumulate: bool,
) -> Result<bool, String> {
    let lhs_free: Dims = dd.lhs_free(lhs.ndim()).collect();
    let rhs_free: Dims = dd.rhs_free(rhs.ndim()).collect();
    let total: usize = shape.iter().product();
    let sizes = |a: &'_ ArrayD<T>, dims: &'_ [usize]| {
        let shape = a.shape();
        dims.iter().map(move |&d| shape[d]).collect::<Dims>()
    };
    let want: Dims = (sizes(lhs, &dd.lhs_batch).into_iter())
        .chain(sizes(lhs, &lhs_free))
        .chain(sizes(rhs, &rhs_free))
        .collect();
    if want.as_slice() != shape {
        return Err(format!("the product has shape {want:?}, not {shape:?}"));
    }
    let contracted: usize = sizes(lhs, &dd.lhs_contracting).iter().product();
    if total > 0 && contracted > 0 {
        let (lb, lc) = (&dd.lhs_batch, &dd.lhs_contracting);
        let l = Flat::new(lhs).merging(lc, [lb, &lhs_free, lc]);
        let (rb, rc) = (&dd.rhs_batch, &dd.rhs_contracting);
        let r = Flat::new(rhs).merging(rc, [rb, rc, &rhs_free]);
        multiply(dd, [&l, &r], [&lhs_free, &rhs_free], shape, out, accumulate)
    } else if accumulate {
        Ok(false)
    } else {
        // Nothing contracted (an empty sum): zeros.
        out.fill(T::default());
        Ok(true)
    }
}

/// Writes the product of `lhs` and `rhs` (their contracting dims merge; `free` their
/// free dims) into `out`, the row-major result of `shape` (see [`dot_general`]), or
/// adds it as [`products`] does when `accumulate` (then `false` where it does not).
fn multiply<T: DotScalar>(
    dd: &DotDims,
    [l, r]: [&Flat<'_, T>; 2],
    [lhs_free, rhs_free]: [&[usize]; 2],
    shape: &[usize],
    out: &mut [T],
    accumulate: bool,
) -> Result<bool, String> {
    let out_strides = super::row_major(shape);
    let (nb, nl) = (dd.lhs_batch.len(), lhs_free.len());
    // The loop dims: size and the stride of the lhs, the rhs and the result along it.
    let mut loops: SmallVec<[(usize, [usize; 3]); 6]> = SmallVec::new();
    for (j, (&a, &b)) in dd.lhs_batch.iter().zip(&dd.rhs_batch).enumerate() {
        loops.push((shape[j], [l.strides[a], r.strides[b], out_strides[j]]));
    }
    let (l_dims, r_dims) = (l.dims(lhs_free), r.dims(rhs_free));
    let (l_major, (m, lm)) = split_minor(&l_dims);
    for (k, &(n, s)) in l_major.iter().enumerate() {
        loops.push((n, [s, 0, out_strides[nb + k]]));
    }
    let (r_major, (n, rn)) = split_minor(&r_dims);
    let merge = |f: &Flat<'_, T>, dims: &[usize]| {
        merged(&f.dims(dims)).ok_or_else(|| "contracting dims that do not merge".to_string())
    };
    let ((k, lk), (_, rk)) = (
        merge(l, &dd.lhs_contracting)?,
        merge(r, &dd.rhs_contracting)?,
    );
    // The result's rows (the merged minor lhs free dims) are `row` apart, its columns
    // (the merged minor rhs free dims) adjacent.
    let mut layout = Layout {
        m,
        k,
        n,
        a: [lm, lk],
        b: [rk, rn],
        b_groups: None,
        c_row: shape[nb + nl..].iter().product(),
        accumulate,
    };
    // The rhs's innermost major free dim as groups of the product's columns (the
    // result's columns run on across it) where the rhs is packed anyway and the kernel
    // takes the wider product: the MoE's `bsm,ebfm->bsef`, one 16x32x48 product per
    // batch index instead of four 16x32x12.
    let mut r_loops = r_major;
    if let Some((&(groups, stride), rest)) = r_major.split_last() {
        let grouped = Layout {
            n: groups * n,
            b_groups: Some([n, stride]),
            ..layout
        };
        if rn != 1 && T::takes_groups(&grouped) {
            (layout, r_loops) = (grouped, rest);
        }
    }
    for (k, &(size, s)) in r_loops.iter().enumerate() {
        loops.push((size, [0, s, out_strides[nb + nl + k]]));
    }
    if accumulate && !adds_exactly([m, k, layout.n], lk, rn == 1) {
        return Ok(false);
    }
    T::products_into(&layout, [&l.data, &r.data], out, Offsets::new(loops))?;
    Ok(true)
}

/// The offsets `[lhs, rhs, result]` of each product of a batch: an odometer over the
/// loop dims (each its size and the three strides along it), the last dim fastest.
pub(super) struct Offsets {
    loops: SmallVec<[(usize, [usize; 3]); 6]>,
    index: Dims,
    at: [usize; 3],
    done: bool,
}

impl Offsets {
    fn new(loops: SmallVec<[(usize, [usize; 3]); 6]>) -> Self {
        Offsets {
            index: smallvec![0; loops.len()],
            done: loops.iter().any(|&(size, _)| size == 0),
            loops,
            at: [0; 3],
        }
    }
}

impl Iterator for Offsets {
    type Item = [usize; 3];

    fn next(&mut self) -> Option<[usize; 3]> {
        if self.done {
            return None;
        }
        let now = self.at;
        let mut d = self.loops.len();
        loop {
            if d == 0 {
                self.done = true;
                break;
            }
            d -= 1;
            let (size, strides) = self.loops[d];
            self.index[d] += 1;
            if self.index[d] < size {
                (0..3).for_each(|x| self.at[x] += strides[x]);
                break;
            }
            self.index[d] = 0;
            (0..3).for_each(|x| self.at[x] -= strides[x] * (size - 1));
        }
        Some(now)
    }
}

#[cfg(test)]
pub(super) mod tests {
    use ndarray::{ArrayD, IxDyn};
    use proptest::prelude::*;

    use super::*;

    thread_local! {
        /// Whether [`avx512`] says no on this test's thread (see [`without_avx512`]).
        pub(super) static WITHOUT_AVX512: std::cell::Cell<bool> = const { std::cell::Cell::new(false) };
    }

    /// Runs `f` with the kernels of CPUs without AVX-512 (the tile, `blocked_product`,
    /// matrixmultiply), which all run on CPUs with it too. The bit-for-bit properties
    /// below are theirs: moving a product among them changes no bit. On CPUs with
    /// AVX-512 the products the tile does not take run on `gemm`, whose order is its
    /// own, so there they hold only where both sides run on the same kernel.
    pub(crate) fn without_avx512<R>(f: impl FnOnce() -> R) -> R {
        WITHOUT_AVX512.set(true);
        let result = f();
        WITHOUT_AVX512.set(false);
        result
    }

    fn counting(shape: &[usize]) -> ArrayD<i32> {
        let n: usize = shape.iter().product();
        ArrayD::from_shape_vec(IxDyn(shape), (0..n as i32).map(|v| v % 13 - 6).collect()).unwrap()
    }

    /// The definition, by indices: `out[b, i, j] = sum_k lhs[b, i, k] rhs[b, k, j]`
    /// over the multi-indices of each group.
    fn naive(dd: &DotDims, lhs: &ArrayD<i32>, rhs: &ArrayD<i32>) -> ArrayD<i32> {
        let lf: Vec<usize> = dd.lhs_free(lhs.ndim()).collect();
        let rf: Vec<usize> = dd.rhs_free(rhs.ndim()).collect();
        let sizes =
            |a: &ArrayD<i32>, ds: &[usize]| ds.iter().map(|&d| a.shape()[d]).collect::<Vec<_>>();
        let shape: Vec<usize> =
            [sizes(lhs, &dd.lhs_batch), sizes(lhs, &lf), sizes(rhs, &rf)].concat();
        let k_shape = sizes(lhs, &dd.lhs_contracting);
        ArrayD::from_shape_fn(IxDyn(&shape), |ix| {
            let (nb, nl) = (dd.lhs_batch.len(), lf.len());
            let mut sum = 0;
            for k in ndarray::indices(IxDyn(&k_shape)) {
                let mut li = vec![0; lhs.ndim()];
                let mut ri = vec![0; rhs.ndim()];
                for (j, (&l, &r)) in dd.lhs_batch.iter().zip(&dd.rhs_batch).enumerate() {
                    (li[l], ri[r]) = (ix[j], ix[j]);
                }
                for (j, &l) in lf.iter().enumerate() {
                    li[l] = ix[nb + j];
                }
                for (j, &r) in rf.iter().enumerate() {
                    ri[r] = ix[nb + nl + j];
                }
                for (j, (&l, &r)) in dd
                    .lhs_contracting
                    .iter()
                    .zip(&dd.rhs_contracting)
                    .enumerate()
                {
                    (li[l], ri[r]) = (k[j], k[j]);
                }
                sum += lhs[IxDyn(&li)] * rhs[IxDyn(&ri)];
            }
            sum
        })
    }

    /// Batch dims anywhere, several free and contracting dims in any order, empty
    /// groups (an outer product, a full contraction): the kernel equals the definition.
    #[test]
    fn every_grouping_equals_the_definition() {
        let cases: [(&[usize], &[usize], DotDims); 7] = [
            (&[3, 4], &[4, 5], DotDims::new(&[], &[], &[1], &[0])),
            (&[2, 3, 4], &[4, 5], DotDims::new(&[], &[], &[2], &[0])),
            (
                &[2, 5, 3, 4],
                &[2, 6, 3, 4],
                DotDims::new(&[0, 2], &[0, 2], &[3], &[3]),
            ),
            (
                &[2, 3, 5, 6],
                &[2, 6, 3, 4],
                DotDims::new(&[0, 1], &[0, 2], &[3], &[1]),
            ),
            (
                &[4, 3, 2],
                &[2, 3, 5],
                DotDims::new(&[], &[], &[2, 1], &[0, 1]),
            ),
            (&[3], &[4], DotDims::new(&[], &[], &[], &[])),
            (&[2, 3], &[3, 2], DotDims::new(&[], &[], &[0, 1], &[1, 0])),
        ];
        for (ls, rs, dd) in cases {
            let (lhs, rhs) = (counting(ls), counting(rs));
            let want = naive(&dd, &lhs, &rhs);
            let got = dot_general(&dd, &lhs, &rhs, want.shape()).unwrap();
            assert_eq!(got, want, "{ls:?} x {rs:?} {dd:?}");
            let (lf, rf) = (lhs.mapv(|v| v as f32), rhs.mapv(|v| v as f32));
            let got = dot_general(&dd, &lf, &rf, want.shape()).unwrap();
            assert_eq!(got, want.mapv(|v| v as f32), "f32 {ls:?} x {rs:?}");
        }
    }

    /// The result comes from the pool with whatever its last user left (here NaN):
    /// the products overwrite every element, and a product with nothing contracted
    /// is zeros.
    #[test]
    fn a_pooled_result_is_overwritten() {
        let cases: [(&[usize], &[usize], DotDims); 7] = [
            (&[3, 4], &[4, 5], DotDims::new(&[], &[], &[1], &[0])),
            (
                &[2, 5, 3, 4],
                &[2, 6, 3, 4],
                DotDims::new(&[0, 2], &[0, 2], &[3], &[3]),
            ),
            (&[3, 0], &[0, 5], DotDims::new(&[], &[], &[1], &[0])),
            // Above the tiny size: `gemm` where the CPU has AVX-512, each layout.
            (&[40, 70], &[70, 33], DotDims::new(&[], &[], &[1], &[0])),
            (&[70, 40], &[33, 70], DotDims::new(&[], &[], &[0], &[1])),
            (&[1, 300], &[300, 50], DotDims::new(&[], &[], &[1], &[0])),
            (
                &[3, 20, 300],
                &[3, 2, 300],
                DotDims::new(&[0], &[0], &[2], &[2]),
            ),
        ];
        let _run = buffers::start_run(1 << 20, 0);
        for (ls, rs, dd) in cases {
            let (lhs, rhs) = (counting(ls), counting(rs));
            let want = naive(&dd, &lhs, &rhs).mapv(|v| v as f32);
            let stale = ArrayD::from_elem(want.shape(), f32::NAN);
            buffers::give(crate::ir::Literal::F32(stale));
            let (lf, rf) = (lhs.mapv(|v| v as f32), rhs.mapv(|v| v as f32));
            let got = dot_general(&dd, &lf, &rf, want.shape()).unwrap();
            assert_eq!(got, want, "{ls:?} x {rs:?} {dd:?}");
        }
    }

    /// The Transformer's products merge both operands' contracting dims: no operand
    /// is copied.
    #[test]
    fn transformer_products_read_their_operands_in_place() {
        let cases: [(&[usize], &[usize], DotDims); 5] = [
            // Projection bsm,mf->bsf.
            (&[2, 8, 16], &[16, 32], DotDims::new(&[], &[], &[2], &[0])),
            // Its weight gradient bsm,bsf->mf.
            (
                &[2, 8, 16],
                &[2, 8, 32],
                DotDims::new(&[], &[], &[0, 1], &[0, 1]),
            ),
            // Scores bqhd,bkhd->bhqk.
            (
                &[2, 8, 4, 16],
                &[2, 8, 4, 16],
                DotDims::new(&[0, 2], &[0, 2], &[3], &[3]),
            ),
            // Context bhqk,bkhd->bhqd.
            (
                &[2, 4, 8, 8],
                &[2, 8, 4, 16],
                DotDims::new(&[0, 1], &[0, 2], &[3], &[1]),
            ),
            // Output projection bshk,hkd->bsd.
            (
                &[2, 8, 4, 16],
                &[4, 16, 32],
                DotDims::new(&[], &[], &[2, 3], &[0, 1]),
            ),
        ];
        for (ls, rs, dd) in cases {
            let (lhs, rhs) = (counting(ls), counting(rs));
            let (l, r) = (Flat::new(&lhs), Flat::new(&rhs));
            assert!(
                merged(&l.dims(&dd.lhs_contracting)).is_some(),
                "lhs of {dd:?}"
            );
            assert!(
                merged(&r.dims(&dd.rhs_contracting)).is_some(),
                "rhs of {dd:?}"
            );
        }
    }

    /// The scratch a product holds: its packing panels, and a copy of an operand only
    /// where its contracting dims do not merge (`bhsk,hkd->bsd` on a head-major lhs).
    #[test]
    fn scratch_is_the_packing_panels_and_the_copies() {
        without_avx512(|| {
            // Projection bsm,mf->bsf, mid-size with the lhs's and the rhs's rows read in
            // place: no panels.
            let projection = DotDims::new(&[], &[], &[2], &[0]);
            assert_eq!(scratch_bytes(&projection, &[4, 8, 16], &[16, 128], 4), 0);
            assert_eq!(scratch_bytes(&projection, &[4, 8, 256], &[256, 128], 4), 0);
            // With the rhs transposed (bsm,fm->bsf), its block packed.
            let transposed = DotDims::new(&[], &[], &[2], &[1]);
            assert_eq!(
                scratch_bytes(&transposed, &[4, 8, 256], &[128, 256], 4),
                256 * 128 * 4
            );
            // Its weight gradient bsm,bsf->mf (the lhs transposed): on the tile (its stripe
            // on the stack) up to 64 rows, else the blocked product's blocks of at most 96
            // rows of `a` and 1024 columns of `b` (on CPUs with AVX2 and not AVX-512), or
            // matrixmultiply's panels (64 rows).
            let gradient = DotDims::new(&[], &[], &[0, 1], &[0, 1]);
            assert_eq!(scratch_bytes(&gradient, &[4, 8, 16], &[4, 8, 128], 4), 0);
            let rows = |mkn, ak, b_rows, blocked_rows| {
                if blocked_product::takes(mkn, ak, b_rows) {
                    blocked_rows
                } else {
                    64
                }
            };
            assert_eq!(
                scratch_bytes(&gradient, &[4, 8, 128], &[4, 8, 128], 4),
                32 * (rows([128, 32, 128], 128, true, 96) + 128) * 4
            );
            // A small product (at most 32^3 multiply-adds) packs nothing.
            assert_eq!(scratch_bytes(&projection, &[2, 8, 16], &[16, 32], 4), 0);
            // The d_model-1024 FFN: panels of at most 256 x (96 or 64 + 1024), not the
            // operands.
            let ffn = scratch_bytes(&projection, &[16, 128, 1024], &[1024, 4096], 4);
            let ffn_rows = rows([2048, 1024, 4096], 1, true, 96);
            assert_eq!(ffn, 256 * (ffn_rows + 1024) * 4);
            // Head-major bhsk,hkd->bsd: `h` and `k` apart in the lhs, which is copied.
            let heads = DotDims::new(&[], &[], &[1, 3], &[0, 1]);
            let (lhs, rhs) = ([2, 4, 8, 16], [4, 16, 32]);
            // 16 x 64 x 32 multiply-adds: small, no panels.
            let copied = 2 * 4 * 8 * 16 * 4;
            assert_eq!(scratch_bytes(&heads, &lhs, &rhs, 4), copied);
            let (lhs, rhs) = (counting(&lhs), counting(&rhs));
            let (l, r) = (Flat::new(&lhs), Flat::new(&rhs));
            assert!(merged(&l.dims(&heads.lhs_contracting)).is_none());
            assert!(merged(&r.dims(&heads.rhs_contracting)).is_some());
        })
    }

    /// Pseudo-random f32 values in [-1.5, 1.5) of `shape`, from `seed`.
    fn values(seed: u64, shape: &[usize]) -> ArrayD<f32> {
        let mut state = seed;
        ArrayD::from_shape_fn(IxDyn(shape), |_| {
            state = state
                .wrapping_mul(6364136223846793005)
                .wrapping_add(1442695040888963407);
            ((state >> 40) as f32 / (1u64 << 24) as f32 - 0.5) * 3.0
        })
    }

    /// A transposed `b` copied in rows ([`products_on_b_in_rows`]) gives the bits the
    /// product on the transposed `b` gives: one product and a batch of four (two `b`s,
    /// each copied once, the second at an offset), `k` and `n` not multiples of the
    /// transpose's tiles, `b`'s rows apart by more than `k`.
    #[test]
    fn a_transposed_b_copied_in_rows_gives_the_same_bits() {
        if !avx512() {
            return;
        }
        let _run = buffers::start_run(1 << 26, 0);
        let (m, k, n, row) = (203, 67, 45, 70);
        let a = values(1, &[2 * m * k]);
        let b = values(2, &[2 * n * row + 5]);
        let (a, b) = (a.as_slice().unwrap(), b.as_slice().unwrap());
        let layout = Layout {
            m,
            k,
            n,
            a: [k, 1],
            b: [1, row],
            b_groups: None,
            c_row: n,
            accumulate: false,
        };
        assert!(copies_b([m, k, n], 1, false));
        let one = || Offsets::new(smallvec![(1, [0, 0, 0])]);
        // Two `b`s (5 and 5 + n * row in), each under both `a`s.
        let four = || {
            let loops = smallvec![(2, [0, n * row, 2 * m * n]), (2, [m * k, 0, m * n])];
            Offsets::new(loops).map(|[oa, ob, oc]| [oa, ob + 5, oc])
        };
        let bits = |c: Vec<f32>| c.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
        let mut copied = vec![f32::NAN; m * n];
        products_on_b_in_rows(&layout, [a, b], &mut copied, one()).unwrap();
        let mut strided = vec![f32::NAN; m * n];
        each_product(&layout, [a, b], &mut strided, one()).unwrap();
        assert_eq!(bits(copied), bits(strided));
        let mut copied = vec![f32::NAN; 4 * m * n];
        products_on_b_in_rows(&layout, [a, b], &mut copied, four()).unwrap();
        let mut strided = vec![f32::NAN; 4 * m * n];
        each_product(&layout, [a, b], &mut strided, four()).unwrap();
        assert_eq!(bits(copied), bits(strided));
        // The memory analysis counts the copy: the FFN's `x . w^T` holds `w`'s elements
        // more than `x . w` does.
        let (rows, transposed) = (
            DotDims::new(&[], &[], &[2], &[0]),
            DotDims::new(&[], &[], &[2], &[1]),
        );
        assert_eq!(
            scratch_bytes(&transposed, &[16, 128, 1024], &[4096, 1024], 4),
            scratch_bytes(&rows, &[16, 128, 1024], &[1024, 4096], 4) + 4096 * 1024 * 4
        );
    }

    /// `acc + lhs · rhs` accumulated into `acc` is bitwise the product then an add of
    /// its result and `acc`, `acc` handed over or lent: in one pass where `k` fits one
    /// block of 256 (on the tile: `a` by rows; on matrixmultiply: `a` transposed, 128
    /// rows), the product then the add with `k` 300 and 257.
    #[test]
    fn products_added_to_an_accumulator_equal_the_product_then_the_add() {
        without_avx512(|| {
            let _run = buffers::start_run(1 << 24, 0);
            for k in [1, 64, 256, 257, 300] {
                for transposed in [false, true] {
                    let (m, n) = (128, 96);
                    let lhs_shape = if transposed { [k, m] } else { [m, k] };
                    let dd = DotDims::new(&[], &[], &[usize::from(!transposed)], &[0]);
                    let (lhs, rhs) = (values(1, &lhs_shape), values(2, &[k, n]));
                    assert_eq!(
                        adds_in_place(&dd, &lhs_shape, &[k, n]),
                        k <= 256,
                        "k {k}, transposed {transposed}"
                    );
                    let acc = values(3, &[m, n]).mapv(|v| v * 8.0);
                    let product = dot_general(&dd, &lhs, &rhs, &[m, n]).unwrap();
                    let want: Vec<u32> = (product.iter().zip(&acc))
                        .map(|(p, c)| (p + c).to_bits())
                        .collect();
                    let (l, r) = (Literal::F32(lhs), Literal::F32(rhs));
                    let lent = Literal::F32(acc.clone());
                    for acc in [Cow::Owned(Literal::F32(acc)), Cow::Borrowed(&lent)] {
                        let got = dot_general_add(&dd, &l, &r, acc).unwrap();
                        let got: Vec<u32> =
                            got.as_f32().unwrap().iter().map(|v| v.to_bits()).collect();
                        assert!(got == want, "k {k}, transposed {transposed}");
                    }
                }
            }
        })
    }

    /// An rhs whose contracting dims do not merge (the MoE's input gradient
    /// `bsef,ebfm->bsm`) is copied contracting-major, its rows then read in place:
    /// bit for bit the product of the rhs copied free-major beforehand (whose
    /// contracting dims merge, read transposed and packed: the copy's former order),
    /// on the tile's sizes, `k` above one block of 256, and a batch of one.
    #[test]
    fn a_copied_rhs_gives_the_product_of_its_free_major_copy_bit_for_bit() {
        without_avx512(|| {
            let cases: [(&[usize], &[usize], DotDims); 3] = [
                (
                    &[16, 16, 4, 12],
                    &[4, 16, 12, 32],
                    DotDims::new(&[0], &[1], &[2, 3], &[0, 2]),
                ),
                (
                    &[2, 40, 8, 40],
                    &[8, 2, 40, 70],
                    DotDims::new(&[0], &[1], &[2, 3], &[0, 2]),
                ),
                (
                    &[5, 6, 30],
                    &[30, 7, 5],
                    DotDims::new(&[], &[], &[2, 0], &[0, 2]),
                ),
            ];
            let _run = buffers::start_run(1 << 24, 0);
            for (ls, rs, dd) in cases {
                let (lhs, rhs) = (values(3, ls), values(4, rs));
                let rhs_free: Vec<usize> = dd.rhs_free(rs.len()).collect();
                let order: Vec<usize> =
                    [&dd.rhs_batch[..], &rhs_free, &dd.rhs_contracting].concat();
                let copy = rhs
                    .view()
                    .permuted_axes(IxDyn(&order))
                    .as_standard_layout()
                    .into_owned();
                let (nb, nf) = (dd.rhs_batch.len(), rhs_free.len());
                let moved = DotDims::new(
                    &dd.lhs_batch,
                    &(0..nb).collect::<Vec<_>>(),
                    &dd.lhs_contracting,
                    &(nb + nf..order.len()).collect::<Vec<_>>(),
                );
                let c = Flat::new(&copy);
                assert!(merged(&c.dims(&moved.rhs_contracting)).is_some());
                let lhs_free: Vec<usize> = dd.lhs_free(ls.len()).collect();
                let shape: Vec<usize> = (dd.lhs_batch.iter().map(|&d| ls[d]))
                    .chain(lhs_free.iter().map(|&d| ls[d]))
                    .chain(rhs_free.iter().map(|&d| rs[d]))
                    .collect();
                let got = dot_general(&dd, &lhs, &rhs, &shape).unwrap();
                let want = dot_general(&moved, &lhs, &copy, &shape).unwrap();
                assert!(
                    got.iter()
                        .zip(&want)
                        .all(|(x, y)| x.to_bits() == y.to_bits()),
                    "{ls:?} x {rs:?} {dd:?}"
                );
            }
        })
    }

    /// An rhs whose innermost major free dim does not merge with its columns (the MoE's
    /// expert inputs `bsm,ebfm->bsef`: the batch dim between `e` and `f`) is one
    /// product per batch index with its columns in groups: bit for bit the product of
    /// the rhs copied with its free dims merged (`[b, e, f, m]`, one packed product of
    /// 48 columns), written and added to an accumulator, on the step's shape, widths
    /// across the tile's registers, `k` above a block of 256, two major free dims.
    #[test]
    #[allow(clippy::type_complexity)]
    fn grouped_rhs_columns_give_the_product_of_a_merged_copy_bit_for_bit() {
        without_avx512(|| {
            let cases: [(&[usize], &[usize], DotDims, &[usize]); 4] = [
                (
                    &[16, 16, 32],
                    &[4, 16, 12, 32],
                    DotDims::new(&[0], &[1], &[2], &[3]),
                    &[1, 0, 2, 3],
                ),
                (
                    &[3, 7, 20],
                    &[5, 3, 7, 20],
                    DotDims::new(&[0], &[1], &[2], &[3]),
                    &[1, 0, 2, 3],
                ),
                (
                    &[2, 13, 300],
                    &[3, 2, 9, 300],
                    DotDims::new(&[0], &[1], &[2], &[3]),
                    &[1, 0, 2, 3],
                ),
                (
                    &[9, 24],
                    &[2, 3, 24, 10],
                    DotDims::new(&[], &[], &[1], &[2]),
                    &[2, 0, 1, 3],
                ),
            ];
            let _run = buffers::start_run(1 << 24, 0);
            for (ls, rs, dd, relayout) in cases {
                let (lhs, rhs) = (values(5, ls), values(6, rs));
                let lhs_free: Vec<usize> = dd.lhs_free(ls.len()).collect();
                let shape: Vec<usize> = (dd.lhs_batch.iter().map(|&d| ls[d]))
                    .chain(lhs_free.iter().map(|&d| ls[d]))
                    .chain(dd.rhs_free(rs.len()).map(|d| rs[d]))
                    .collect();
                // The same rhs stored in the order `relayout` (its logical shape unchanged):
                // its free dims merge there.
                let mut inverse = vec![0; relayout.len()];
                for (i, &d) in relayout.iter().enumerate() {
                    inverse[d] = i;
                }
                let stored = rhs
                    .view()
                    .permuted_axes(IxDyn(relayout))
                    .as_standard_layout()
                    .into_owned();
                let merged_copy = stored.permuted_axes(IxDyn(&inverse));
                let got = dot_general(&dd, &lhs, &rhs, &shape).unwrap();
                let want = dot_general(&dd, &lhs, &merged_copy, &shape).unwrap();
                let bits = |a: &ArrayD<f32>| a.iter().map(|v| v.to_bits()).collect::<Vec<_>>();
                assert!(bits(&got) == bits(&want), "{ls:?} x {rs:?} {dd:?}");
                let acc = values(7, &shape);
                let (l, r) = (Literal::F32(lhs), Literal::F32(rhs));
                let (lent, copy) = (Literal::F32(acc.clone()), Literal::F32(merged_copy));
                let got = dot_general_add(&dd, &l, &r, Cow::Borrowed(&lent)).unwrap();
                let want = dot_general_add(&dd, &l, &copy, Cow::Owned(Literal::F32(acc))).unwrap();
                assert!(
                    bits(got.as_f32().unwrap()) == bits(want.as_f32().unwrap()),
                    "{ls:?} x {rs:?} {dd:?} accumulated"
                );
            }
        })
    }

    /// A product of the swapped operands is bitwise the transpose of the product
    /// (what `simplify`'s `product_transposes` relies on): each element sums the same
    /// products in the same order of the contracted indices, whichever operand is the
    /// lhs, on the 6x16 tile and on matrixmultiply (both taken below), with `k` below
    /// and above one block of 256, a batch dim, and two contracting dims.
    #[test]
    fn swapped_operands_give_the_transposed_product_bit_for_bit() {
        without_avx512(|| {
            let swap = |dd: &DotDims| {
                DotDims::new(
                    &dd.rhs_batch,
                    &dd.lhs_batch,
                    &dd.rhs_contracting,
                    &dd.lhs_contracting,
                )
            };
            let cases: [(&[usize], &[usize], DotDims); 10] = [
                // Weight gradients `ct[t, n] x x[t, k]` contracting `t`.
                (&[256, 256], &[256, 64], DotDims::new(&[], &[], &[0], &[0])),
                (&[256, 64], &[256, 256], DotDims::new(&[], &[], &[0], &[0])),
                (&[300, 40], &[300, 72], DotDims::new(&[], &[], &[0], &[0])),
                (&[600, 130], &[600, 90], DotDims::new(&[], &[], &[0], &[0])),
                // Row-major products, small and mid-size, `k` 16, 256, 257.
                (&[12, 16], &[16, 40], DotDims::new(&[], &[], &[1], &[0])),
                (&[64, 256], &[256, 64], DotDims::new(&[], &[], &[1], &[0])),
                (&[70, 257], &[257, 200], DotDims::new(&[], &[], &[1], &[0])),
                // Batched (attention-like), the rhs transposed.
                (
                    &[4, 24, 32],
                    &[4, 40, 32],
                    DotDims::new(&[0], &[0], &[2], &[2]),
                ),
                (
                    &[3, 20, 300],
                    &[3, 2, 300],
                    DotDims::new(&[0], &[0], &[2], &[2]),
                ),
                // Two contracting dims, in different orders on the two sides.
                (
                    &[5, 6, 30],
                    &[30, 7, 5],
                    DotDims::new(&[], &[], &[2, 0], &[0, 2]),
                ),
            ];
            let (mut tile, mut other) = (false, false);
            let _run = buffers::start_run(1 << 24, 0);
            for (ls, rs, dd) in cases {
                let lhs_free: Dims = dd.lhs_free(ls.len()).collect();
                let (nb, nl) = (dd.lhs_batch.len(), lhs_free.len());
                let (lhs, rhs) = (values(1, ls), values(2, rs));
                let shape: Vec<usize> = (dd.lhs_batch.iter().map(|&d| ls[d]))
                    .chain(lhs_free.iter().map(|&d| ls[d]))
                    .chain(dd.rhs_free(rs.len()).map(|d| rs[d]))
                    .collect();
                let product = dot_general(&dd, &lhs, &rhs, &shape).unwrap();
                let nr = product.ndim() - nb - nl;
                let perm: Vec<usize> = (0..nb)
                    .chain(nb + nl..nb + nl + nr)
                    .chain(nb..nb + nl)
                    .collect();
                let transposed = product.view().permuted_axes(IxDyn(&perm));
                let swapped = dot_general(&swap(&dd), &rhs, &lhs, transposed.shape()).unwrap();
                let bits = |a: ndarray::ArrayViewD<'_, f32>| {
                    a.iter().map(|v| v.to_bits()).collect::<Vec<_>>()
                };
                assert!(
                    bits(transposed) == bits(swapped.view()),
                    "{ls:?} x {rs:?} {dd:?}"
                );
                for (d, l, r) in [(&dd, ls, rs), (&swap(&dd), rs, ls)] {
                    let s = Standard::of(d, l, r);
                    if small_product::takes(s.mkn, s.ak, s.rhs_rows) {
                        tile = true;
                    } else {
                        other = true;
                    }
                }
            }
            assert!(tile && other, "both product paths are taken");
        })
    }

    /// `a` with its memory laid out in the order `perm` (its logical shape unchanged).
    fn relaid(a: &ArrayD<i32>, perm: &[usize]) -> ArrayD<i32> {
        let mut inverse = vec![0; perm.len()];
        for (i, &d) in perm.iter().enumerate() {
            inverse[d] = i;
        }
        let stored = a
            .view()
            .permuted_axes(IxDyn(perm))
            .as_standard_layout()
            .into_owned();
        stored.permuted_axes(IxDyn(&inverse))
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(300))]

        /// Any number of batch, free and contracting dims (sizes 0 to 3), in any order on
        /// each side and in any memory layout: the kernel equals the definition, in i32
        /// and (exactly representable) in f32.
        #[test]
        fn any_layout_equals_the_definition(
            counts in proptest::array::uniform4(0usize..3),
            sizes in proptest::collection::vec(0usize..4, 8),
            orders in proptest::array::uniform4(any::<u64>()),
        ) {
            let [nb, nc, nl, nr] = counts;
            // Logical dims: batch, contracting, lhs free, rhs free, each its size.
            let size = |k: usize| sizes[k % sizes.len()];
            let batch: Vec<usize> = (0..nb).map(size).collect();
            let contracting: Vec<usize> = (nb..nb + nc).map(size).collect();
            let lfree: Vec<usize> = (0..nl).map(|k| size(nb + nc + k)).collect();
            let rfree: Vec<usize> = (0..nr).map(|k| size(nb + nc + nl + k + 1)).collect();
            // A permutation of 0..n from a seed.
            let shuffled = |n: usize, seed: u64| -> Vec<usize> {
                let mut v: Vec<usize> = (0..n).collect();
                let mut x = seed;
                for i in (1..n).rev() {
                    x = x.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
                    v.swap(i, (x >> 33) as usize % (i + 1));
                }
                v
            };
            // Operand dim `place[j]` holds logical dim `j` (batch, contracting, free).
            let lplace = shuffled(nb + nc + nl, orders[0]);
            let rplace = shuffled(nb + nc + nr, orders[1]);
            let lsizes: Vec<usize> = [&batch[..], &contracting, &lfree].concat();
            let rsizes: Vec<usize> = [&batch[..], &contracting, &rfree].concat();
            let mut ls = vec![0; lsizes.len()];
            let mut rs = vec![0; rsizes.len()];
            for (j, &p) in lplace.iter().enumerate() {
                ls[p] = lsizes[j];
            }
            for (j, &p) in rplace.iter().enumerate() {
                rs[p] = rsizes[j];
            }
            let dd = DotDims {
                lhs_batch: lplace[..nb].to_vec(),
                rhs_batch: rplace[..nb].to_vec(),
                lhs_contracting: lplace[nb..nb + nc].to_vec(),
                rhs_contracting: rplace[nb..nb + nc].to_vec(),
            };
            let lhs = relaid(&counting(&ls), &shuffled(ls.len(), orders[2]));
            let rhs = relaid(&counting(&rs), &shuffled(rs.len(), orders[3]));
            let want = naive(&dd, &lhs, &rhs);
            let got = dot_general(&dd, &lhs, &rhs, want.shape()).unwrap();
            prop_assert_eq!(&got, &want);
            let (lf, rf) = (lhs.mapv(|v| v as f32), rhs.mapv(|v| v as f32));
            let got = dot_general(&dd, &lf, &rf, want.shape()).unwrap();
            prop_assert_eq!(got, want.mapv(|v| v as f32));
        }
    }
}
