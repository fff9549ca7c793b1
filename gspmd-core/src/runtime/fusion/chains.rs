//! Compiled chains: fused loops compiled ahead of time, element by element, with every
//! value of the chain in machine registers.
//!
//! The interpreter of a group's code ([`Group::chunk`](super::Group)) runs one pass
//! over a chunk per op (or per [pair](super::code::pair) of ops): each op loads its
//! operands' registers and stores its own, a load or a store per op and vector that a
//! loop compiled for the chain does not make. Without a compiler at run time, such
//! loops exist for the chains known when gspmd is built: the f32 groups of the model
//! library's training steps (the language model's and the MoE's GELU and its gradient,
//! the AdamW update, softmax, layer norm and cross-entropy pieces; see
//! `tests/compiled_chains.rs` in the workspace, which lists the programs). Their code is
//! in [`compiled`](super::compiled), generated from the groups' own code by [`source`]:
//! each chain is a function of one element of each input, straight-line, calling the
//! scalar functions the interpreter's passes call, in the same order — so a compiled
//! chain's results are bitwise the interpreter's, hence the unfused kernels'.
//!
//! A group runs its compiled chain when its code, in canonical form ([`Chain`]: the
//! ops depth first from the stores, the leaves numbered by first use, each op writing
//! its own register), equals one in
//! [`compiled::CHAINS`](super::compiled::CHAINS); whatever reads or writes the chain's
//! values around it (leaves loaded or read in place, stores into the results' buffers,
//! a trailing reduction's fold) is the interpreter's, unchanged.

use std::borrow::Cow;
use std::fmt::Write;

use crate::ir::{BinaryOp, CompareOp, UnaryOp};
use crate::runtime::kernels::{
    WithBinary, WithCompare, WithUnary, compare_fn, f32_binary, f32_unary,
};

use super::code::{Instr, Lane, ONE, bool_lane, int_lane};

/// A group's code in canonical form: its ops in a canonical order (depth first from
/// the stores, in order: each op right after the ops it reads, in operand order), op
/// `k` writing register `inputs + k`, the `inputs` leaves numbered in the order that
/// code first reads them, and the registers the group stores (its results', in order;
/// with a reduction, the folded one last). The same ops in another order, over leaves
/// in another order, are the same chain.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct Chain {
    pub(crate) inputs: usize,
    pub(crate) code: Cow<'static, [Instr]>,
    pub(crate) stores: Cow<'static, [usize]>,
}

/// The fewest passes (ops, a pair one) of a chain worth compiling: a single pass
/// already runs at the interpreter's speed.
pub(crate) const FEWEST_PASSES: usize = 2;

impl Chain {
    /// The canonical form of `code` (op `k` writing register `base + k`, the leaves'
    /// registers below `base`) storing `stores`, and the leaf register of each of its
    /// inputs; `None` if a store is a leaf's (a reduction of a leaf alone) or one value
    /// is stored twice.
    pub(super) fn of(base: usize, code: &[Instr], stores: &[usize]) -> Option<(Chain, Vec<usize>)> {
        let repeated = (stores.iter().enumerate()).any(|(j, s)| stores[..j].contains(s));
        if repeated || stores.iter().any(|&s| s < base || s - base >= code.len()) {
            return None;
        }
        // The ops in canonical order; any no store reads after them, in code order.
        let mut order = Vec::with_capacity(code.len());
        let mut placed = vec![false; code.len()];
        for op in stores.iter().map(|&s| s - base).chain(0..code.len()) {
            place(op, base, code, &mut placed, &mut order);
        }
        let mut position = vec![0; code.len()];
        for (k, &op) in order.iter().enumerate() {
            position[op] = k;
        }
        let mut leaves: Vec<usize> = Vec::new();
        for r in order.iter().flat_map(|&op| code[op].reads()) {
            if r < base && !leaves.contains(&r) {
                leaves.push(r);
            }
        }
        let inputs = leaves.len();
        let rename = |r: usize| match r.checked_sub(base) {
            Some(op) => inputs + position[op],
            None => leaves.iter().position(|&l| l == r).unwrap_or(usize::MAX),
        };
        let chain = Chain {
            inputs,
            code: order
                .iter()
                .map(|&op| code[op].clone().renamed(rename))
                .collect(),
            stores: stores.iter().map(|&s| rename(s)).collect(),
        };
        Some((chain, leaves))
    }

    /// Whether the chain may be compiled: enough passes, every op with a scalar f32
    /// function.
    pub(crate) fn compilable(&self) -> bool {
        self.code.len() >= FEWEST_PASSES
            && !self.stores.is_empty()
            && self.code.iter().all(|instr| match *instr {
                Instr::Unary(op, _) => f32_unary(op, Scalar(0.0)).is_some(),
                Instr::Binary(op, ..) => f32_binary(op, Scalars(0.0, 0.0)).is_some(),
                _ => true,
            })
    }
}

/// Appends op `op` of `code` to `order` after the ops it reads (registers from `base`),
/// depth first in operand order, unless `placed` says it is there already.
fn place(op: usize, base: usize, code: &[Instr], placed: &mut [bool], order: &mut Vec<usize>) {
    if placed[op] {
        return;
    }
    placed[op] = true;
    for r in code[op].reads() {
        if let Some(read) = r.checked_sub(base) {
            place(read, base, code, placed, order);
        }
    }
    order.push(op);
}

/// An op's f32 function applied to one value (`NaN` for an op without one, which
/// [`Chain::compilable`] excludes).
#[inline(always)]
pub(super) fn unary(op: UnaryOp, v: f32) -> f32 {
    f32_unary(op, Scalar(v)).unwrap_or(f32::NAN)
}

/// An op's f32 function applied to two values (`NaN` for an op without one, which
/// [`Chain::compilable`] excludes).
#[inline(always)]
pub(super) fn binary(op: BinaryOp, a: f32, b: f32) -> f32 {
    f32_binary(op, Scalars(a, b)).unwrap_or(f32::NAN)
}

/// A comparison of two lanes (floats, or i32 bits) as a bool lane.
#[inline(always)]
pub(super) fn compare(op: CompareOp, lane: Lane, a: f32, b: f32) -> f32 {
    bool_lane(match lane {
        Lane::Int => compare_fn(op, Scalars(int_lane(a), int_lane(b))),
        _ => compare_fn(op, Scalars(a, b)),
    })
}

/// A lane of `lane`s converted to f32, as the interpreter converts it.
#[inline(always)]
pub(super) fn convert(lane: Lane, v: f32) -> f32 {
    match lane {
        Lane::Bool => f32::from_bits(v.to_bits() & ONE),
        Lane::Int => int_lane(v) as f32,
        Lane::Float => v,
    }
}

/// `and` or `or` of two bool lanes.
#[inline(always)]
pub(super) fn logic(op: BinaryOp, p: f32, q: f32) -> f32 {
    if op == BinaryOp::And {
        f32::from_bits(p.to_bits() & q.to_bits())
    } else {
        f32::from_bits(p.to_bits() | q.to_bits())
    }
}

/// One value handed to an op's function.
struct Scalar(f32);

impl WithUnary for Scalar {
    type Out = f32;
    #[inline(always)]
    fn with(self, f: impl Fn(f32) -> f32 + Copy) -> f32 {
        f(self.0)
    }
}

/// Two values handed to an op's function.
struct Scalars<T>(T, T);

impl WithBinary for Scalars<f32> {
    type Out = f32;
    #[inline(always)]
    fn with(self, f: impl Fn(f32, f32) -> f32 + Copy) -> f32 {
        f(self.0, self.1)
    }
}

impl<T: Copy> WithCompare<T> for Scalars<T> {
    type Out = bool;
    #[inline(always)]
    fn with(self, f: impl Fn(T, T) -> bool + Copy) -> bool {
        f(self.0, self.1)
    }
}

/// The Rust source of the [`compiled`](super::compiled) module for `chains` (each
/// [compilable](Chain::compilable)): the table `CHAINS`, a function per chain, and
/// `run`, which runs chain `k` of the table over a chunk.
pub(crate) fn source(chains: &[Chain]) -> String {
    let mut out = String::new();
    let w = &mut out;
    let _ = writeln!(
        w,
        "//! Compiled chains (see [`chains`](super::chains)). Generated by `tests/compiled_chains.rs`\n\
         //! in the workspace (`GSPMD_BLESS=1 cargo test --release --test compiled_chains` writes it):\n\
         //! do not edit.\n\n\
         #![allow(clippy::needless_range_loop, clippy::too_many_arguments)]\n\n\
         use std::borrow::Cow;\n\n\
         #[allow(unused_imports)]\n\
         use super::chains::{{Chain, binary, compare, convert, logic, unary}};\n\
         #[allow(unused_imports)]\n\
         use super::code::{{Instr, Lane, Test, select_lane}};\n\
         #[allow(unused_imports)]\n\
         use crate::ir::{{BinaryOp, CompareOp, UnaryOp}};\n"
    );
    let _ = writeln!(
        w,
        "/// The compiled chains, in the order of `run`'s functions."
    );
    let _ = writeln!(w, "pub(crate) static CHAINS: [Chain; {}] = [", chains.len());
    for chain in chains {
        let _ = writeln!(w, "    Chain {{\n        inputs: {},", chain.inputs);
        let _ = writeln!(w, "        code: Cow::Borrowed(&[");
        for instr in chain.code.iter() {
            let _ = writeln!(w, "            {},", instr_source(instr));
        }
        let _ = writeln!(w, "        ]),");
        let _ = writeln!(
            w,
            "        stores: Cow::Borrowed(&{:?}),\n    }},",
            chain.stores
        );
    }
    let _ = writeln!(w, "];\n");
    let _ = writeln!(
        w,
        "/// Runs chain `k` of [`CHAINS`] over `len` elements: `ins` its inputs' elements (in\n\
         /// canonical order), `outs` its stores' (at least `len` each). Nothing for another `k`\n\
         /// or other counts of `ins` and `outs`.\n\
         #[inline(always)]\n\
         pub(crate) fn run(k: usize, ins: &[&[f32]], outs: &mut [&mut [f32]], len: usize) {{\n    \
         match k {{"
    );
    for k in 0..chains.len() {
        let _ = writeln!(w, "        {k} => chain_{k}(ins, outs, len),");
    }
    let _ = writeln!(w, "        _ => {{}}\n    }}\n}}");
    for (k, chain) in chains.iter().enumerate() {
        chain_source(w, k, chain);
    }
    out
}

/// The functions of chain `k`: `chain_k`, which hands each input and store to
/// `chain_k_loop` as its own slice of `len` (function arguments, so the compiler knows
/// the stores alias nothing and vectorises the loop without run-time overlap checks),
/// and the loop.
fn chain_source(w: &mut String, k: usize, chain: &Chain) {
    let n = chain.inputs;
    let list = |prefix: &str, count: usize, each: &dyn Fn(&str, usize) -> String| {
        (0..count)
            .map(|j| each(prefix, j))
            .collect::<Vec<_>>()
            .join(", ")
    };
    let name = |p: &str, j: usize| format!("{p}{j}");
    let stores = chain.stores.len();
    let _ = writeln!(
        w,
        "\n#[inline(always)]\nfn chain_{k}(ins: &[&[f32]], outs: &mut [&mut [f32]], len: usize) {{"
    );
    let _ = writeln!(
        w,
        "    let [{}] = ins else {{ return }};",
        list("i", n, &name)
    );
    let _ = writeln!(
        w,
        "    let [{}] = outs else {{ return }};",
        list("o", stores, &name)
    );
    let _ = writeln!(
        w,
        "    chain_{k}_loop({}, {});\n}}",
        list("i", n, &|p, j| format!("&{p}{j}[..len]")),
        list("o", stores, &|p, j| format!("&mut {p}{j}[..len]"))
    );
    let _ = writeln!(
        w,
        "\n#[inline(always)]\nfn chain_{k}_loop({}, {}) {{",
        list("i", n, &|p, j| format!("{p}{j}: &[f32]")),
        list("o", stores, &|p, j| format!("{p}{j}: &mut [f32]"))
    );
    let _ = writeln!(w, "    let len = o0.len();");
    for j in 0..n {
        let _ = writeln!(w, "    let i{j} = &i{j}[..len];");
    }
    for j in 1..stores {
        let _ = writeln!(w, "    let o{j} = &mut o{j}[..len];");
    }
    let _ = writeln!(w, "    for e in 0..len {{");
    for j in 0..n {
        let _ = writeln!(w, "        let r{j} = i{j}[e];");
    }
    for (op, instr) in chain.code.iter().enumerate() {
        let r = |x: usize| format!("r{x}");
        let value = match *instr {
            Instr::Unary(op, a) => format!("unary(UnaryOp::{op:?}, {})", r(a)),
            Instr::Binary(op, a, b) => format!("binary(BinaryOp::{op:?}, {}, {})", r(a), r(b)),
            Instr::Compare(op, lane, a, b) => format!(
                "compare(CompareOp::{op:?}, Lane::{lane:?}, {}, {})",
                r(a),
                r(b)
            ),
            Instr::Select(p, t, f) => format!("select_lane({}, {}, {})", r(p), r(t), r(f)),
            Instr::Convert(lane, a) => format!("convert(Lane::{lane:?}, {})", r(a)),
            Instr::Logic(op, a, b) => format!("logic(BinaryOp::{op:?}, {}, {})", r(a), r(b)),
            Instr::Test(test, a) => format!("Test::{test:?}.apply({})", r(a)),
            Instr::Pair {
                first,
                a,
                b,
                second,
                c,
                t_left,
            } => {
                let t = format!("binary(BinaryOp::{first:?}, {}, {})", r(a), r(b));
                if t_left {
                    format!("binary(BinaryOp::{second:?}, {t}, {})", r(c))
                } else {
                    format!("binary(BinaryOp::{second:?}, {}, {t})", r(c))
                }
            }
        };
        let _ = writeln!(w, "        let r{} = {value};", n + op);
    }
    for (j, s) in chain.stores.iter().enumerate() {
        let _ = writeln!(w, "        o{j}[e] = r{s};");
    }
    let _ = writeln!(w, "    }}\n}}");
}

/// `instr` as a Rust expression.
fn instr_source(instr: &Instr) -> String {
    match *instr {
        Instr::Unary(op, a) => format!("Instr::Unary(UnaryOp::{op:?}, {a})"),
        Instr::Binary(op, a, b) => format!("Instr::Binary(BinaryOp::{op:?}, {a}, {b})"),
        Instr::Compare(op, lane, a, b) => {
            format!("Instr::Compare(CompareOp::{op:?}, Lane::{lane:?}, {a}, {b})")
        }
        Instr::Select(p, t, f) => format!("Instr::Select({p}, {t}, {f})"),
        Instr::Convert(lane, a) => format!("Instr::Convert(Lane::{lane:?}, {a})"),
        Instr::Logic(op, a, b) => format!("Instr::Logic(BinaryOp::{op:?}, {a}, {b})"),
        Instr::Test(test, a) => format!("Instr::Test(Test::{test:?}, {a})"),
        Instr::Pair {
            first,
            a,
            b,
            second,
            c,
            t_left,
        } => format!(
            "Instr::Pair {{ first: BinaryOp::{first:?}, a: {a}, b: {b}, second: BinaryOp::{second:?}, c: {c}, t_left: {t_left} }}"
        ),
    }
}

#[cfg(test)]
mod tests {
    use std::borrow::Cow;

    use ndarray::{ArrayD, IxDyn};
    use rand::rngs::Xoshiro256PlusPlus;
    use rand::{RngExt, SeedableRng};
    use smallvec::SmallVec;

    use super::super::compiled::CHAINS;
    use super::super::{Group, Leaf, Registered};
    use super::*;
    use crate::ir::{DType, Literal, ValueId};
    use crate::runtime::kernels::Operand;

    /// A group over `[n]` computing `chain` from its inputs (leaf `j` an f32 value of
    /// that shape), by its compiled loop `compiled` or, if `None`, by the interpreter.
    fn group(chain: &Chain, n: usize, compiled: Option<usize>) -> Group {
        let Registered {
            code,
            stores,
            writers,
            last_reads,
            registers,
        } = Registered::new(chain.inputs, chain.code.to_vec(), chain.stores.to_vec());
        let leaves: Vec<Leaf> = (0..chain.inputs)
            .map(|j| Leaf {
                value: ValueId(j as u32),
                dims: None,
                dtype: DType::F32,
            })
            .collect();
        Group {
            members: Vec::new(),
            copies: Vec::new(),
            through: Vec::new(),
            results: (0..stores.len()).map(|j| ValueId(j as u32)).collect(),
            layouts: vec![None; leaves.len()],
            leaves,
            shape: vec![n],
            code,
            stores,
            writers,
            last_reads,
            registers,
            reduce: None,
            epilogue: None,
            dtype: DType::F32,
            chain: Some((chain.clone(), (0..chain.inputs).collect())),
            compiled,
        }
    }

    /// An f32 of every kind a lane may hold: ordinary values, values near the ends
    /// of the functions' ranges, zeros of both signs, infinities, NaN, subnormals, and
    /// arbitrary bits (a bool mask, an i32).
    fn lane(rng: &mut Xoshiro256PlusPlus) -> f32 {
        match rng.random_range(0..10) {
            0 => f32::from_bits(rng.random()),
            1 => [
                0.0,
                -0.0,
                f32::INFINITY,
                f32::NEG_INFINITY,
                f32::NAN,
                1e-40,
                -1e-40,
            ][rng.random_range(0..7)],
            2 => rng.random_range(-120.0f32..120.0),
            3 => bool_lane(rng.random()),
            _ => rng.random_range(-4.0f32..4.0),
        }
    }

    /// Every compiled chain gives bitwise the interpreter's results (NaN for NaN), on
    /// random lanes of every kind, over lengths cutting chunks whole and not, its inputs
    /// lent or handed over.
    #[test]
    fn every_compiled_chain_equals_the_interpreted_code_bitwise() {
        let mut rng = Xoshiro256PlusPlus::seed_from_u64(28);
        for (k, chain) in CHAINS.iter().enumerate() {
            assert!(chain.compilable(), "chain {k}");
            for n in [1, 7, 512, 1300] {
                let inputs: Vec<Literal> = (0..chain.inputs)
                    .map(|_| {
                        let v = (0..n).map(|_| lane(&mut rng)).collect();
                        Literal::F32(ArrayD::from_shape_vec(IxDyn(&[n]), v).expect("fits"))
                    })
                    .collect();
                // Inputs lent, or handed over (their buffers become the results', read
                // by the chain as leaves while it writes the others).
                let run = |compiled: Option<usize>, owned: bool| {
                    let mut operands = (inputs.iter())
                        .map(|x| match owned {
                            true => Operand::Value(Cow::Owned(x.clone())),
                            false => Operand::Value(Cow::Borrowed(x)),
                        })
                        .collect();
                    let mut results = SmallVec::new();
                    (group(chain, n, compiled).run(&mut operands, &mut results)).expect("runs");
                    results
                };
                let want = run(None, false);
                for got in [run(Some(k), false), run(Some(k), true)] {
                    assert_eq!(want.len(), got.len(), "chain {k}");
                    for (w, g) in want.iter().zip(&got) {
                        let (w, g) = (w.as_f32().expect("f32"), g.as_f32().expect("f32"));
                        for (e, (w, g)) in w.iter().zip(g).enumerate() {
                            assert!(
                                w.to_bits() == g.to_bits() || (w.is_nan() && g.is_nan()),
                                "chain {k}, {n} elements, element {e}: interpreted {w:e}, compiled {g:e}"
                            );
                        }
                    }
                }
            }
        }
    }

    /// A chain's canonical form numbers the leaves by first use: the same code over
    /// leaves in another order is the same chain, read through another map.
    #[test]
    fn canonical_forms_number_leaves_by_first_use() {
        let code = [
            Instr::Binary(BinaryOp::Mul, 2, 0),
            Instr::Pair {
                first: BinaryOp::Add,
                a: 3,
                b: 1,
                second: BinaryOp::Mul,
                c: 2,
                t_left: true,
            },
        ];
        let (chain, leaves) = Chain::of(3, &code, &[4]).expect("canonical");
        assert_eq!(leaves, vec![2, 0, 1]);
        assert_eq!(chain.inputs, 3);
        assert_eq!(
            chain.code.to_vec(),
            vec![
                Instr::Binary(BinaryOp::Mul, 0, 1),
                Instr::Pair {
                    first: BinaryOp::Add,
                    a: 3,
                    b: 2,
                    second: BinaryOp::Mul,
                    c: 0,
                    t_left: true,
                },
            ]
        );
        assert_eq!(chain.stores.to_vec(), vec![4]);
        // A store of a leaf (a reduction of a leaf alone) has no chain, nor has a
        // value stored twice.
        assert!(Chain::of(3, &code, &[1]).is_none());
        assert!(Chain::of(3, &code, &[4, 4]).is_none());
    }

    /// The same ops in another order are the same chain: the ReLU's gradient as the
    /// U-Net's step has it (`x == y` first) and with `0 == y` first, over its leaves
    /// `x`, `y`, zero, the cotangent and one half (registers 0-4).
    #[test]
    fn canonical_forms_order_the_ops_from_the_stores() {
        use crate::ir::CompareOp;
        let eq = |a, b| Instr::Compare(CompareOp::Eq, Lane::Float, a, b);
        let unet = [
            eq(0, 1),
            eq(2, 1),
            Instr::Binary(BinaryOp::Mul, 3, 4),
            Instr::Select(6, 7, 3),
            Instr::Select(5, 8, 2),
        ];
        let other = [
            eq(2, 1),
            Instr::Binary(BinaryOp::Mul, 3, 4),
            Instr::Select(5, 6, 3),
            eq(0, 1),
            Instr::Select(8, 7, 2),
        ];
        let (a, leaves_a) = Chain::of(5, &unet, &[9]).expect("canonical");
        let (b, leaves_b) = Chain::of(5, &other, &[9]).expect("canonical");
        assert_eq!(a, b);
        assert_eq!(leaves_a, leaves_b);
        // Depth first from the store: the selects' operands before each select.
        assert_eq!(
            a.code.to_vec(),
            vec![
                eq(0, 1),
                eq(2, 1),
                Instr::Binary(BinaryOp::Mul, 3, 4),
                Instr::Select(6, 7, 3),
                Instr::Select(5, 8, 2),
            ]
        );
        assert_eq!(leaves_a, vec![0, 1, 2, 3, 4]);
    }
}
