//! Transposing copies of 4-byte elements (f32, i32) in 8x8 register tiles: each tile's
//! eight source runs are loaded into AVX registers, transposed there by unpacks,
//! shuffles and lane permutes, and stored as eight destination runs. Tiles go through
//! the matrix in square blocks of [`BLOCK`] so that the rows a block reads and writes
//! (each a page or more apart in a large matrix) stay in the cache and the TLB while
//! it runs. The edges short of a whole tile are copied element by element.
//!
//! A copy moves bits: the destination holds the source's bit patterns (NaN payloads
//! included), as the generic copy in [`movement`](super::movement) gives them.

use crate::ir::Element;

/// Side of the square blocks of tiles the copy moves at a time (see the module docs):
/// 256 x 256 f32, 256 KB of the source and as much of the destination, within a Zen 4
/// core's 1 MB L2 cache. Blocks of 256 moved a `[4096, 1024]` f32 matrix in 2.4-2.9 ms
/// where blocks of 64 took 2.8-3.6 ms and of 1024 4.0-4.5 ms.
const BLOCK: usize = 256;

/// Side of a register tile: one AVX register of 4-byte elements.
const TILE: usize = 8;

/// One matrix of a copy: where its first element lies and the step between its rows
/// (its columns adjacent).
#[derive(Clone, Copy, Debug)]
pub(super) struct Matrix {
    pub(super) offset: usize,
    pub(super) row: usize,
}

/// Copies the `rows x cols` matrix of `src` at `from` to its transpose (`cols x
/// rows`) in `dst` at `to`: element `(i, j)` from `src[from.offset + i * from.row + j]`
/// to `dst[to.offset + j * to.row + i]`. `false` (nothing copied) unless the elements
/// are 4 bytes wide and the CPU has AVX2, where the caller copies another way.
///
/// Panics if a matrix reaches past its slice.
pub(super) fn transpose<T: Element>(
    src: &[T],
    from: Matrix,
    dst: &mut [T],
    to: Matrix,
    [rows, cols]: [usize; 2],
) -> bool {
    if size_of::<T>() != 4 {
        return false;
    }
    #[cfg(target_arch = "x86_64")]
    if let Some(simd) = pulp::x86::V3::try_new() {
        simd.vectorize(
            #[inline(always)]
            || blocks(simd, src, from, dst, to, [rows, cols]),
        );
        return true;
    }
    let _ = (src, from, dst, to, rows, cols);
    false
}

/// [`transpose`] on AVX2: whole tiles block by block, then the edges.
#[cfg(target_arch = "x86_64")]
#[inline(always)]
fn blocks<T: Element>(
    simd: pulp::x86::V3,
    src: &[T],
    from: Matrix,
    dst: &mut [T],
    to: Matrix,
    [rows, cols]: [usize; 2],
) {
    let (whole_rows, whole_cols) = (rows - rows % TILE, cols - cols % TILE);
    for i0 in (0..whole_rows).step_by(BLOCK) {
        let i_end = whole_rows.min(i0 + BLOCK);
        for j0 in (0..whole_cols).step_by(BLOCK) {
            let j_end = whole_cols.min(j0 + BLOCK);
            // Tiles in squares of four: each square's tiles read 16 adjacent source
            // elements of 16 rows and write 16 adjacent destination elements of 16
            // rows (a cache line of each when aligned).
            for i in (i0..i_end).step_by(2 * TILE) {
                for j in (j0..j_end).step_by(2 * TILE) {
                    for (i, j) in [(i, j), (i, j + TILE), (i + TILE, j), (i + TILE, j + TILE)] {
                        if i < i_end && j < j_end {
                            let s = from.offset + i * from.row + j;
                            let t = to.offset + j * to.row + i;
                            tile(simd, src, [s, from.row], dst, [t, to.row]);
                        }
                    }
                }
            }
        }
    }
    // The edges: the last rows (every column), the last columns of the other rows.
    let mut each = |i: usize, j: usize| {
        dst[to.offset + j * to.row + i] = src[from.offset + i * from.row + j];
    };
    for i in whole_rows..rows {
        (0..cols).for_each(|j| each(i, j));
    }
    for i in 0..whole_rows {
        (whole_cols..cols).for_each(|j| each(i, j));
    }
}

/// Copies the 8x8 tile at `s` in `src` (rows `s_row` apart) transposed to `t` in `dst`
/// (rows `t_row` apart).
#[cfg(target_arch = "x86_64")]
#[inline(always)]
fn tile<T: Element>(
    simd: pulp::x86::V3,
    src: &[T],
    [s, s_row]: [usize; 2],
    dst: &mut [T],
    [t, t_row]: [usize; 2],
) {
    use std::arch::x86_64::__m256;
    let load = |i: usize| -> __m256 {
        let at = s + i * s_row;
        let mut bits = [0u32; TILE];
        for (b, x) in bits.iter_mut().zip(&src[at..at + TILE]) {
            *b = x.bits();
        }
        pulp::cast(bits)
    };
    let avx = simd.avx;
    let r = [
        load(0),
        load(1),
        load(2),
        load(3),
        load(4),
        load(5),
        load(6),
        load(7),
    ];
    // Pairs of rows interleaved: (r0[0], r1[0], r0[1], r1[1] | r0[4], r1[4], ...).
    let u = [
        avx._mm256_unpacklo_ps(r[0], r[1]),
        avx._mm256_unpackhi_ps(r[0], r[1]),
        avx._mm256_unpacklo_ps(r[2], r[3]),
        avx._mm256_unpackhi_ps(r[2], r[3]),
        avx._mm256_unpacklo_ps(r[4], r[5]),
        avx._mm256_unpackhi_ps(r[4], r[5]),
        avx._mm256_unpacklo_ps(r[6], r[7]),
        avx._mm256_unpackhi_ps(r[6], r[7]),
    ];
    // Fours of rows: column `c` of rows 0-3 (or 4-7) in lane half `c / 4`.
    let q = [
        avx._mm256_shuffle_ps::<0x44>(u[0], u[2]),
        avx._mm256_shuffle_ps::<0xEE>(u[0], u[2]),
        avx._mm256_shuffle_ps::<0x44>(u[1], u[3]),
        avx._mm256_shuffle_ps::<0xEE>(u[1], u[3]),
        avx._mm256_shuffle_ps::<0x44>(u[4], u[6]),
        avx._mm256_shuffle_ps::<0xEE>(u[4], u[6]),
        avx._mm256_shuffle_ps::<0x44>(u[5], u[7]),
        avx._mm256_shuffle_ps::<0xEE>(u[5], u[7]),
    ];
    // Column `c` whole: the low halves of rows 0-3 and 4-7 for columns 0-3, the high
    // halves for 4-7.
    let columns = [
        avx._mm256_permute2f128_ps::<0x20>(q[0], q[4]),
        avx._mm256_permute2f128_ps::<0x20>(q[1], q[5]),
        avx._mm256_permute2f128_ps::<0x20>(q[2], q[6]),
        avx._mm256_permute2f128_ps::<0x20>(q[3], q[7]),
        avx._mm256_permute2f128_ps::<0x31>(q[0], q[4]),
        avx._mm256_permute2f128_ps::<0x31>(q[1], q[5]),
        avx._mm256_permute2f128_ps::<0x31>(q[2], q[6]),
        avx._mm256_permute2f128_ps::<0x31>(q[3], q[7]),
    ];
    for (j, column) in columns.into_iter().enumerate() {
        let at = t + j * t_row;
        let bits: [u32; TILE] = pulp::cast(column);
        for (x, b) in dst[at..at + TILE].iter_mut().zip(bits) {
            *x = T::from_bits(b).expect("the bits of an element");
        }
    }
}
