//! A group's code: its ops as instructions on registers ([`Instr`]), the lanes a
//! register holds ([`Lane`]: floats, bools as masks, i32 as bits), the pairing of two
//! arithmetic ops into one pass ([`pair`]) and the sharing of registers between ops
//! ([`allocate`]), all decided at plan time.

use smallvec::SmallVec;

use crate::ir::{BinaryOp, CompareOp, DType, UnaryOp};

/// One op of a fused loop, on register indices.
#[derive(Debug, Clone, PartialEq)]
pub(super) enum Instr {
    Unary(UnaryOp, usize),
    Binary(BinaryOp, usize, usize),
    /// A comparison of two registers of float or i32 lanes into bool lanes.
    Compare(CompareOp, Lane, usize, usize),
    /// `select(pred, on_true, on_false)`, the predicate bool lanes.
    Select(usize, usize, usize),
    /// A register of the given lanes converted to the loop's float: bools to 1 and 0,
    /// i32 rounded to f32, floats as they are (then rounded to a narrow loop's dtype).
    Convert(Lane, usize),
    /// `and` or `or` of two registers of bool lanes: bitwise on the masks.
    Logic(BinaryOp, usize, usize),
    /// A test of one register into bool lanes.
    Test(Test, usize),
    /// Two arithmetic ops (`add`, `sub`, `mul`, `div`) in one pass: `t = a first b`,
    /// then `t second c` (`t_left`) or `c second t`; `t` is read by nothing else, so
    /// it never goes through a register (see [`pair`]).
    Pair {
        first: BinaryOp,
        a: usize,
        b: usize,
        second: BinaryOp,
        c: usize,
        t_left: bool,
    },
}

/// A one-operand op giving bool lanes.
#[derive(Debug, Clone, Copy, PartialEq)]
pub(super) enum Test {
    /// `not` of bool lanes.
    Not,
    /// `is_finite` of float lanes.
    IsFinite,
    /// A float converted to bool: `v != 0` (NaN is true).
    NonZero,
}

impl Test {
    /// The test's bool lane of `v`.
    #[inline(always)]
    pub(super) fn apply(self, v: f32) -> f32 {
        match self {
            Test::Not => f32::from_bits(!v.to_bits()),
            Test::IsFinite => bool_lane(v.is_finite()),
            Test::NonZero => bool_lane(v != 0.0),
        }
    }
}

impl Instr {
    /// The registers the op reads.
    pub(super) fn reads(&self) -> SmallVec<[usize; 3]> {
        match *self {
            Instr::Unary(_, a) | Instr::Convert(_, a) | Instr::Test(_, a) => {
                smallvec::smallvec![a]
            }
            Instr::Binary(_, a, b) | Instr::Compare(_, _, a, b) | Instr::Logic(_, a, b) => {
                smallvec::smallvec![a, b]
            }
            Instr::Select(p, t, f) => smallvec::smallvec![p, t, f],
            Instr::Pair { a, b, c, .. } => smallvec::smallvec![a, b, c],
        }
    }

    /// The op reading `rename(r)` for each register `r` it reads.
    pub(super) fn renamed(self, rename: impl Fn(usize) -> usize) -> Instr {
        match self {
            Instr::Unary(op, a) => Instr::Unary(op, rename(a)),
            Instr::Binary(op, a, b) => Instr::Binary(op, rename(a), rename(b)),
            Instr::Compare(op, lane, a, b) => Instr::Compare(op, lane, rename(a), rename(b)),
            Instr::Select(p, t, f) => Instr::Select(rename(p), rename(t), rename(f)),
            Instr::Convert(lane, a) => Instr::Convert(lane, rename(a)),
            Instr::Logic(op, a, b) => Instr::Logic(op, rename(a), rename(b)),
            Instr::Test(test, a) => Instr::Test(test, rename(a)),
            Instr::Pair {
                first,
                a,
                b,
                second,
                c,
                t_left,
            } => Instr::Pair {
                first,
                a: rename(a),
                b: rename(b),
                second,
                c: rename(c),
                t_left,
            },
        }
    }
}

/// Whether `op` may be one of a [`Instr::Pair`]'s ops.
pub(super) fn arithmetic(op: BinaryOp) -> bool {
    matches!(
        op,
        BinaryOp::Add | BinaryOp::Sub | BinaryOp::Mul | BinaryOp::Div
    )
}

/// `code` (op `k` writing register `base + k`, reading lower ones: the leaves' below
/// `base`) with pairs of arithmetic ops merged into [`Instr::Pair`]s: an op whose value
/// is read once, by a later arithmetic op, not stored (`stores`) and not the last op
/// (a reduction folds it), is computed inside its reader, which then merges no other
/// and is merged into none. The bits do not change: the pair applies the two ops'
/// scalar functions in the same order to the same values, in f32 (only f32 loops
/// pair: a narrow loop rounds each op's lanes). Returns the code and `stores` in the
/// same numbering (op `k` of the result writing `base + k`).
pub(super) fn pair(base: usize, code: Vec<Instr>, stores: Vec<usize>) -> (Vec<Instr>, Vec<usize>) {
    let n = code.len();
    let mut reads = vec![0usize; n];
    for instr in &code {
        for r in instr.reads() {
            if let Some(op) = r.checked_sub(base) {
                reads[op] += 1;
            }
        }
    }
    let kept = |op: usize| op + 1 == n || stores.contains(&(base + op));
    // The op each op merged (`merged[j] = Some(k)`: `k` computed inside `j`).
    let mut merged: Vec<Option<usize>> = vec![None; n];
    let mut inside = vec![false; n];
    for j in 0..n {
        let Instr::Binary(second, x, y) = code[j] else {
            continue;
        };
        if !arithmetic(second) {
            continue;
        }
        let mergeable = |r: usize| {
            r.checked_sub(base).filter(|&k| {
                matches!(code[k], Instr::Binary(first, ..) if arithmetic(first))
                    && reads[k] == 1
                    && !kept(k)
                    && merged[k].is_none()
            })
        };
        if let Some(k) = mergeable(x).or_else(|| mergeable(y)) {
            merged[j] = Some(k);
            inside[k] = true;
        }
    }
    // Each surviving op's new index.
    let mut index = vec![usize::MAX; n];
    let mut next = 0;
    for k in 0..n {
        if !inside[k] {
            index[k] = next;
            next += 1;
        }
    }
    let rename = |r: usize| r.checked_sub(base).map_or(r, |op| base + index[op]);
    let mut out = Vec::with_capacity(next);
    for j in 0..n {
        if inside[j] {
            continue;
        }
        out.push(match (merged[j], &code[j]) {
            (Some(k), &Instr::Binary(second, x, y)) => {
                let Instr::Binary(first, a, b) = code[k] else {
                    unreachable!("only binary ops are merged")
                };
                let t_left = x == base + k;
                Instr::Pair {
                    first,
                    a: rename(a),
                    b: rename(b),
                    second,
                    c: rename(if t_left { y } else { x }),
                    t_left,
                }
            }
            (_, instr) => instr.clone().renamed(rename),
        });
    }
    let stores = stores.into_iter().map(rename).collect();
    (out, stores)
}

/// A bool held in an f32 register as a mask: every bit set for true (a NaN), none
/// for false. A comparison writes these (the vector compare instructions' own result),
/// a select blends with them bit by bit ([`select_lane`]).
#[inline(always)]
pub(super) fn bool_lane(b: bool) -> f32 {
    f32::from_bits(0u32.wrapping_sub(u32::from(b)))
}

/// The bits of 1.0: a true [`bool_lane`] masked with them is 1.0, a false one 0.0.
pub(super) const ONE: u32 = 0x3f80_0000;

/// An i32 held in an f32 lane: its bits.
#[inline(always)]
pub(super) fn int_lane(v: f32) -> i32 {
    v.to_bits().cast_signed()
}

/// `if p { t } else { f }` for a [`bool_lane`] `p`, as a bitwise blend: the compiler
/// vectorises it where a branch on each lane would become a gather of the picked
/// elements.
#[inline(always)]
pub(super) fn select_lane(p: f32, t: f32, f: f32) -> f32 {
    let m = p.to_bits();
    f32::from_bits((t.to_bits() & m) | (f.to_bits() & !m))
}

/// What a register's lanes hold: floats (f32, or a narrow float widened exactly), bools
/// ([`bool_lane`] masks), or i32 (their bits).
#[derive(Debug, Clone, Copy, PartialEq)]
pub(super) enum Lane {
    Float,
    Bool,
    Int,
}

impl Lane {
    /// The lanes a value of `dtype` is held in.
    pub(super) fn of(dtype: DType) -> Lane {
        match dtype {
            DType::Bool => Lane::Bool,
            DType::I32 => Lane::Int,
            _ => Lane::Float,
        }
    }
}

/// Registers for `code` (op `k` writing register `base + k`, reading lower ones: the
/// leaves' below `base`), so that the ops share few: each op writes a register no live
/// value holds (never one of its operands'), and a register is free again after its
/// value's last reader, unless the value is stored (`stores`) or is the last op's (a
/// reduction folds it); a stored value's register is used for nothing else. Returns the code with each op's register, `stores` renamed,
/// and the number of registers.
pub(super) fn allocate(
    base: usize,
    code: Vec<Instr>,
    stores: Vec<usize>,
) -> (Vec<(Instr, usize)>, Vec<usize>, usize) {
    // The last op reading each op's value; `usize::MAX`: kept to the chunk's end.
    let mut last = vec![0; code.len()];
    for (k, instr) in code.iter().enumerate() {
        for r in instr.reads() {
            if let Some(op) = r.checked_sub(base) {
                last[op] = k;
            }
        }
    }
    for &r in stores.iter().chain(&[base + code.len().saturating_sub(1)]) {
        if let Some(slot) = r.checked_sub(base).and_then(|op| last.get_mut(op)) {
            *slot = usize::MAX;
        }
    }
    // Each op's register, as assigned so far.
    let mut register: Vec<usize> = Vec::with_capacity(code.len());
    let (mut free, mut registers) = (Vec::new(), base);
    let mut out = Vec::with_capacity(code.len());
    for (k, instr) in code.into_iter().enumerate() {
        // A stored value's register is its own (no other op writes it), so that a run
        // may keep the value in its result's buffer instead (see `Group::direct`).
        let reused = if stores.contains(&(base + k)) {
            None
        } else {
            free.pop()
        };
        let dst = reused.unwrap_or_else(|| {
            registers += 1;
            registers - 1
        });
        let operands = instr.reads();
        let renamed = instr.renamed(|r| r.checked_sub(base).map_or(r, |op| register[op]));
        // The operands read for the last time here free their registers (once each).
        for op in operands.iter().filter_map(|r| r.checked_sub(base)) {
            if last[op] == k && !free.contains(&register[op]) {
                free.push(register[op]);
            }
        }
        register.push(dst);
        out.push((renamed, dst));
    }
    let stores = (stores.iter())
        .map(|&r| r.checked_sub(base).map_or(r, |op| register[op]))
        .collect();
    (out, stores, registers)
}
