//! Property test of the whole pipeline: random well-typed programs, random meshes and
//! random user annotations go through `compile` (verify + propagate + partition), run on
//! a thread mesh, and must equal the reference interpreter. Propagation must also keep
//! every closed annotated dim exactly as annotated (and open ones as a prefix).
//!
//! The generator is seeded (`Xoshiro256PlusPlus`, a portable generator), so every case is reproducible:
//! `PIPELINE_CASES=3000 PIPELINE_SEED=7 cargo test -p gspmd-core --test pipeline_random`
//! runs more cases locally. A failing case is shrunk on the IR (outputs, annotations,
//! cutting values into parameters) and printed before the test fails.
//!
//! Values compared: f32 within `1e-4` times an error scale per element (the rounding
//! that summing in another order can cause there: see `error_scales`), i32 and bool
//! exactly. To keep bool results independent of summation order, comparisons only take
//! operands whose values are exact in f32 whatever the order (sums, maxima and moves of
//! inputs on a 1/8 grid); transcendental ops only see arguments where they are bounded
//! and well conditioned (`exp(tanh x)`, `sqrt(|x| + 1)`, `log(|x| + 1)`,
//! `(|x| + 1)^tanh(y)`).

use std::collections::{BTreeMap, BTreeSet};
use std::panic::{AssertUnwindSafe, catch_unwind};

use gspmd_core::autodiff::grad;
use gspmd_core::ir::random;
use gspmd_core::ir::{
    BinaryOp, Builder, ConvDimensionNumbers, CumulativeKind, DType, DotDims, Flow, GatherDims,
    Literal, Location, Op, OpKind, Padding, Program, PropagationDirection, ReduceKind, Remat,
    ScanOptions, ScatterDims, ScatterKind, Tensor, TensorType, UnaryOp, ValueId, WindowDim, einsum,
};
use gspmd_core::runtime::{ThreadMesh, interpret, kernels, uniform_f32};
use gspmd_core::sharding::{DimSharding, Mesh, Sharding};
use gspmd_core::{Executable, compile};
use ndarray::{ArrayD, Dimension, IxDyn};
use rand::rngs::Xoshiro256PlusPlus;
use rand::seq::{IndexedRandom, SliceRandom};
use rand::{RngExt, SeedableRng};

mod random_axes;

use random_axes::random_axes;

// ---- randomness ----------------------------------------------------------------------

/// A dim size in 1..=10, weighted towards sizes that do not divide evenly.
fn dim_size(rng: &mut Xoshiro256PlusPlus) -> usize {
    const SIZES: [usize; 16] = [1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 4, 6, 5, 7, 8, 12];
    SIZES[rng.random_range(0..SIZES.len())]
}

fn shape(rng: &mut Xoshiro256PlusPlus, rank: usize) -> Vec<usize> {
    (0..rank).map(|_| dim_size(rng)).collect()
}

// ---- meshes and annotations -----------------------------------------------------------

/// 1-3 axes of sizes 1-4, at most 8 devices, sometimes a permuted device order.
fn random_mesh(rng: &mut Xoshiro256PlusPlus) -> Mesh {
    let names = ["x", "y", "z"];
    let n_axes = 1 + rng.random_range(0..3);
    let mut axes = Vec::new();
    let mut devices = 1;
    for name in names.iter().take(n_axes) {
        let fits: Vec<usize> = (1..=4).filter(|s| devices * s <= 8).collect();
        let size = *fits.choose(rng).expect("a non-empty choice");
        devices *= size;
        axes.push((name.to_string(), size));
    }
    if devices > 1 && rng.random_ratio(1, 3) {
        let mut order: Vec<usize> = (0..devices).collect();
        order.shuffle(rng);
        Mesh::with_device_order(axes, order).unwrap()
    } else {
        Mesh::new(axes).unwrap()
    }
}

/// A valid sharding of a rank-`rank` value: each mesh axis, or sub-axis
/// ([`random_axes`]), unused or appended to a random dim; dims closed or open, sometimes
/// with a priority; rarely an explicitly replicated axis.
fn random_sharding(rng: &mut Xoshiro256PlusPlus, mesh: &Mesh, rank: usize) -> Sharding {
    let mut axes = random_axes(rng, mesh);
    axes.shuffle(rng);
    let mut dims: Vec<DimSharding> = (0..rank)
        .map(|_| {
            if rng.random_ratio(1, 2) {
                DimSharding::closed(Vec::<String>::new())
            } else {
                DimSharding::open(Vec::<String>::new())
            }
        })
        .collect();
    let mut replicated = Vec::new();
    // Sparse or dense: how often an axis is left unused.
    let choices = if rng.random_ratio(1, 2) { 6 } else { 4 };
    for a in axes {
        match rng.random_range(0..choices) {
            0 | 1 if rank > 0 => {
                let d = rng.random_range(0..rank);
                dims[d].axes.push(a);
            }
            2 if rank > 0 => {
                // Prefer multi-axis dims: put it next to an axis already used.
                let used: Vec<usize> = (0..rank).filter(|&d| !dims[d].axes.is_empty()).collect();
                let d = if used.is_empty() {
                    rng.random_range(0..rank)
                } else {
                    *used.choose(rng).expect("a non-empty choice")
                };
                dims[d].axes.push(a);
            }
            3 if rng.random_ratio(1, 4) => replicated.push(a),
            _ => {}
        }
    }
    if rng.random_ratio(1, 4) {
        for d in &mut dims {
            if rng.random_ratio(1, 2) {
                d.priority = Some(rng.random_range(0..3) as u32);
            }
        }
    }
    // Now and then a split dim in reversed device order (`-x`), as a user may write.
    for d in &mut dims {
        d.reversed = !d.axes.is_empty() && rng.random_ratio(1, 8);
    }
    Sharding {
        dims,
        replicated,
        unreduced: Vec::new(),
    }
}

// ---- program generator ----------------------------------------------------------------

/// A value the generator may use as an operand.
#[derive(Clone)]
struct Val {
    t: Tensor,
    /// Every element is exact in f32 whatever the order of evaluation (see module docs).
    exact: bool,
}

/// Largest number of elements of any generated value (keeps debug runs fast).
const MAX_ELEMENTS: usize = 1500;

struct Gen<'a> {
    rng: &'a mut Xoshiro256PlusPlus,
    b: Builder,
    mesh: &'a Mesh,
    pool: Vec<Val>,
    /// Probability (in 1/8) that a value gets an annotation.
    annotate_rate: usize,
    params: usize,
}

/// The size of `n` elements base-dilated by `w` (0 for none).
fn dilated(n: usize, w: &WindowDim) -> i64 {
    (n.saturating_sub(1) * w.base_dilation + usize::from(n > 0)) as i64
}

fn elements(shape: &[usize]) -> usize {
    shape.iter().product()
}

impl<'a> Gen<'a> {
    /// A generator of values traced by `b` for `mesh`, annotating at `annotate_rate`
    /// (in 1/8), with an empty pool.
    fn new(
        rng: &'a mut Xoshiro256PlusPlus,
        b: &Builder,
        mesh: &'a Mesh,
        annotate_rate: usize,
    ) -> Self {
        Gen {
            rng,
            b: b.clone(),
            mesh,
            pool: Vec::new(),
            annotate_rate,
            params: 0,
        }
    }

    fn parameter(&mut self, shape: Vec<usize>, dtype: DType) -> Val {
        let name = format!("p{}", self.params);
        self.params += 1;
        let mut t = self.b.parameter(&name, shape, dtype);
        if self.rng.random_range(0..8) < self.annotate_rate {
            let s = random_sharding(self.rng, self.mesh, t.rank());
            t = t.annotate(s);
        }
        let v = Val { t, exact: true };
        self.pool.push(v.clone());
        v
    }

    /// Adds a generated value to the pool, sometimes behind a sharding annotation.
    fn push(&mut self, t: Tensor, exact: bool) {
        let t = if self.rng.random_range(0..8) < self.annotate_rate {
            let s = random_sharding(self.rng, self.mesh, t.rank());
            match self.rng.random_range(0..10) {
                0 | 1 => t.annotate(s),
                // Two constraints in a row, likely in conflict.
                2 => t
                    .shard(s)
                    .shard(random_sharding(self.rng, self.mesh, t.rank())),
                _ => t.shard(s),
            }
        } else {
            t
        };
        self.pool.push(Val { t, exact });
    }

    /// An operand: usually one of the latest values (chains), else any.
    fn operand(&mut self, pred: impl Fn(&Val) -> bool) -> Option<Val> {
        let ok: Vec<&Val> = self.pool.iter().filter(|v| pred(v)).collect();
        if ok.is_empty() {
            return None;
        }
        let i = if self.rng.random_ratio(1, 2) {
            ok.len() - 1 - self.rng.random_range(0..ok.len().min(3))
        } else {
            self.rng.random_range(0..ok.len())
        };
        Some(ok[i].clone())
    }

    /// A value of exactly `shape` and `dtype`: from the pool if one fits, else a new
    /// parameter.
    fn value_of(&mut self, shape: &[usize], dtype: DType, need_exact: bool) -> Val {
        let fits: Vec<Val> = self
            .pool
            .iter()
            .filter(|v| v.t.shape() == shape && v.t.dtype() == dtype && (v.exact || !need_exact))
            .cloned()
            .collect();
        if !fits.is_empty() && self.rng.random_ratio(1, 2) {
            return fits.choose(self.rng).expect("a non-empty choice").clone();
        }
        self.parameter(shape.to_vec(), dtype)
    }

    /// A shape that NumPy-broadcasts with `shape`: some leading dims dropped, some dims
    /// 1, and size-1 dims of `shape` sometimes grown.
    fn broadcastable(&mut self, shape: &[usize]) -> Vec<usize> {
        let drop = if self.rng.random_ratio(1, 3) {
            self.rng.random_range(0..shape.len() + 1)
        } else {
            0
        };
        shape[drop..]
            .iter()
            .map(|&d| {
                if d == 1 && self.rng.random_ratio(1, 3) {
                    dim_size(self.rng)
                } else if self.rng.random_ratio(1, 4) {
                    1
                } else {
                    d
                }
            })
            .collect()
    }

    fn numeric(v: &Val) -> bool {
        v.t.dtype() != DType::Bool
    }

    fn step(&mut self) {
        match self.rng.random_range(0..32) {
            0 | 1 => self.unary(),
            2..=4 => self.binary(),
            5 => self.compare_select(),
            6 | 7 => self.reduce(),
            8 | 9 => self.dot(),
            10 => self.broadcast(),
            11 | 12 => self.reshape(),
            13 => self.transpose(),
            14 => self.slice(),
            15 => self.pad(),
            16 => self.concatenate(),
            17 => self.normalization(),
            18 => self.source(),
            19 => self.windowed(),
            20 => self.roll(),
            21 => self.convolution(),
            22 => self.reverse(),
            23 => self.jumps(),
            24 => self.dynamic_slicing(),
            25 => self.scan(),
            26 => self.sort(),
            27 => self.gather(),
            28 => self.scatter(),
            29 => self.control_flow(),
            30 => self.barrier(),
            _ => self.convert(),
        }
    }

    /// A random i32 start index for a dim of `n`: a constant in `-3..n + 3`, an i32
    /// scalar of the pool, or a parameter (inputs hold -4..=4) plus a constant; the
    /// op clamps each, so out-of-range starts are as likely as in-range ones.
    fn start_index(&mut self, n: usize) -> Tensor {
        let value = self.rng.random_range(-3..n as i64 + 3) as f64;
        match self.rng.random_range(0..4) {
            0 => self.value_of(&[], DType::I32, false).t,
            1 => {
                let p = self.value_of(&[], DType::I32, false).t;
                &p + &p.scalar_like(value)
            }
            _ => self.b.constant(Literal::full(&[], DType::I32, value)),
        }
    }

    /// `dynamic_slice` or `dynamic_update_slice` with random sizes (a dim kept whole
    /// now and then) and random starts.
    fn dynamic_slicing(&mut self) {
        let Some(a) = self.operand(|v| v.t.rank() > 0) else {
            return;
        };
        let sizes: Vec<usize> = (a.t.shape().iter())
            .map(|&n| match self.rng.random_ratio(1, 3) {
                true => n,
                false => 1 + self.rng.random_range(0..n),
            })
            .collect();
        let starts: Vec<Tensor> = (a.t.shape().iter()).map(|&n| self.start_index(n)).collect();
        let starts: Vec<&Tensor> = starts.iter().collect();
        if self.rng.random_ratio(1, 2) {
            let r = a.t.dynamic_slice(&starts, &sizes);
            self.push(r, a.exact);
        } else {
            let update = self.value_of(&sizes, a.t.dtype(), false);
            let r = a.t.dynamic_update_slice(&update.t, &starts);
            self.push(r, a.exact && update.exact);
        }
    }

    /// `cumsum` or `cumprod` (of values clamped to `[-2, 2]`, so products stay small),
    /// forward or reversed.
    fn scan(&mut self) {
        let Some(a) = self.operand(|v| Self::numeric(v) && v.t.rank() > 0) else {
            return;
        };
        let dim = self.rng.random_range(0..a.t.rank()) as isize
            - a.t.rank() as isize * isize::from(self.rng.random_ratio(1, 4));
        let reverse = self.rng.random_ratio(1, 3);
        let i32 = a.t.dtype() == DType::I32;
        let (r, exact) = if self.rng.random_ratio(1, 2) {
            (a.t.cumulative(CumulativeKind::Sum, dim, reverse), a.exact)
        } else {
            let small = a.t.max(&a.t.scalar_like(-2.0)).min(&a.t.scalar_like(2.0));
            (small.cumulative(CumulativeKind::Prod, dim, reverse), i32)
        };
        self.push(r, exact);
    }

    /// A sharding constraint of a rank-`rank` value inside a region, as often as the
    /// case annotates values.
    fn region_constraint(&mut self, rank: usize) -> Option<Sharding> {
        (self.rng.random_range(0..8) < self.annotate_rate)
            .then(|| random_sharding(self.rng, self.mesh, rank))
    }

    /// A manual region (`shard_map`) over one mesh axis on the f32 value `a`, cut along
    /// a dim the axis divides: the blocks all-gathered back, shifted around the ring
    /// (`ppermute`), exchanged to another such dim (`all_to_all`), or summed (`psum`);
    /// the block sometimes annotated over the other (automatic) axes.
    fn manual(&mut self, a: &Val) {
        let (axis, n) = (self.mesh.axes().choose(self.rng).cloned()).expect("a mesh axis");
        let shape = a.t.shape().to_vec();
        let dims: Vec<usize> = (0..shape.len())
            .filter(|&d| shape[d].is_multiple_of(n))
            .collect();
        let Some(&d) = dims.choose(self.rng) else {
            return;
        };
        let split = |at: Option<usize>| {
            Sharding::new((0..shape.len()).map(|i| match at == Some(i) {
                true => DimSharding::closed([axis.as_str()]),
                false => DimSharding::closed(Vec::<String>::new()),
            }))
        };
        let other = dims.iter().copied().find(|&e| e != d);
        let shift = self.rng.random_range(-2..=2);
        // Sometimes an annotation of the automatic axes inside the body.
        let auto = self
            .mesh
            .axes()
            .iter()
            .filter(|(name, _)| *name != axis)
            .cloned();
        let auto = Mesh::new(auto.collect::<Vec<_>>()).ok();
        let inside = match auto {
            Some(m) if m.num_devices() > 1 => self
                .region_constraint(shape.len())
                .map(|_| random_sharding(self.rng, &m, shape.len())),
            _ => None,
        };
        let (kind, out) = match self.rng.random_range(0..4) {
            0 => (0, None),
            1 => (1, Some(d)),
            2 if other.is_some() => (2, other),
            _ => (3, None),
        };
        let axes = [axis.as_str()];
        let r = self.b.shard_map(
            self.mesh,
            &axes,
            std::slice::from_ref(&a.t),
            &[split(Some(d))],
            &[split(out)],
            |_, x| {
                let x = match &inside {
                    Some(s) => vec![x[0].shard(s.clone())],
                    None => x.to_vec(),
                };
                vec![match kind {
                    0 => x[0].all_gather(&axes, d),
                    1 => x[0].ppermute(&axes, shift),
                    2 => x[0].all_to_all(&axes, other.unwrap_or(d), d),
                    _ => x[0].psum(&axes),
                }]
            },
        );
        self.push(r[0].clone(), a.exact && kind != 3);
    }

    /// A scan over the leading dim of the f32 value `a` (rank 1 or more) from a carried
    /// value of a slice's shape, forward or reversed, under a random remat policy (one of
    /// them saving the value named `mixed`): the body a dot with a captured weight when
    /// a slice has rank 2 or more, then `tanh` (named `mixed`),
    /// plus the slice, sometimes constrained; it stacks half the new carry. Returns the
    /// last carry and the stacked outputs.
    fn scan_loop(&mut self, a: &Val) -> (Tensor, Tensor) {
        let slice = a.t.shape()[1..].to_vec();
        let init = self.value_of(&slice, DType::F32, false);
        let w = match slice.last() {
            Some(&k) if slice.len() >= 2 => Some(self.value_of(&[k, k], DType::F32, false)),
            _ => None,
        };
        let s = self.region_constraint(slice.len());
        let remat = *[
            Remat::NothingSaveable,
            Remat::DotsSaveable,
            Remat::EverythingSaveable,
            Remat::SaveOnlyTheseNames(&["mixed"]),
        ]
        .choose(self.rng)
        .expect("a non-empty choice");
        let options = ScanOptions::new()
            .reverse(self.rng.random_ratio(1, 3))
            .remat(remat);
        let body = |c: &[Tensor], x: &[Tensor]| {
            let mixed = match &w {
                Some(w) => c[0].matmul(&w.t).tanh(),
                None => c[0].tanh(),
            }
            .named("mixed");
            let next = match &s {
                Some(s) => mixed.add(&x[0]).shard(s.clone()),
                None => mixed.add(&x[0]),
            };
            let y = next.mul(&x[0].builder().scalar(0.5));
            (vec![next], vec![y])
        };
        let (carry, ys) = self
            .b
            .scan_with(std::slice::from_ref(&a.t), &[init.t], options, body);
        (carry[0].clone(), ys[0].clone())
    }

    /// Control flow on an f32 value `a`: a scan over its leading dim
    /// ([`Gen::scan_loop`]), a `fori_loop`, a
    /// `while_loop` counting to a constant, or a `cond` on an exact i32 predicate. Loop
    /// bodies sometimes constrain the carried value (which the loop then carries with
    /// the initial value's sharding).
    fn control_flow(&mut self) {
        let Some(a) = self.operand(|v| v.t.dtype() == DType::F32) else {
            return;
        };
        let pin = |t: Tensor, s: &Option<Sharding>| match s {
            Some(s) => t.shard(s.clone()),
            None => t,
        };
        let b = self.b.clone();
        match self.rng.random_range(0..5) {
            4 => self.manual(&a),
            0 if a.t.rank() > 0 => {
                let (carry, ys) = self.scan_loop(&a);
                self.push(carry, false);
                self.push(ys, false);
            }
            0 | 1 => {
                let n = self.rng.random_range(0..4);
                let other = self.value_of(a.t.shape(), DType::F32, false);
                let s = self.region_constraint(a.t.rank());
                let r = b.fori_loop(n, std::slice::from_ref(&a.t), |i, c| {
                    let fi = i.convert(DType::F32);
                    let half = c[0].mul(&i.builder().scalar(0.5));
                    vec![pin(half.add(&fi).add(&other.t), &s)]
                });
                self.push(r[0].clone(), false);
            }
            2 => {
                let limit = self.rng.random_range(0..4);
                let s = self.region_constraint(a.t.rank());
                let zero = b.constant(Literal::full(&[], DType::I32, 0.0));
                let r = b.while_loop(
                    |st| {
                        let bound = st[0].builder().constant(Literal::full(
                            &[],
                            DType::I32,
                            f64::from(limit),
                        ));
                        st[0].lt(&bound)
                    },
                    |st| {
                        let one = st[0]
                            .builder()
                            .constant(Literal::full(&[], DType::I32, 1.0));
                        let quarter = st[1].mul(&st[1].builder().scalar(0.25));
                        vec![st[0].add(&one), pin(st[1].tanh().add(&quarter), &s)]
                    },
                    &[zero, a.t.clone()],
                );
                self.push(r[1].clone(), false);
            }
            _ => {
                let p = self.value_of(&[], DType::I32, true);
                let other = self.value_of(a.t.shape(), DType::F32, false);
                let pred = p.t.gt(&b.constant(Literal::full(&[], DType::I32, 0.0)));
                let r = b.cond(
                    &pred,
                    |inner| vec![a.t.mul(&inner.scalar(0.5)).tanh()],
                    |inner| vec![a.t.sub(&other.t).mul(&inner.scalar(2.0))],
                );
                self.push(r[0].clone(), false);
            }
        }
    }

    /// `argsort` (any dtype), `argmax` or `argmin` of a value exact in any order, so that
    /// the mesh sees the same order as the reference.
    fn sort(&mut self) {
        let Some(a) = self.operand(|v| v.exact && v.t.rank() > 0) else {
            return;
        };
        let dim = self.rng.random_range(0..a.t.rank()) as isize;
        let n = a.t.shape()[dim as usize];
        let descending = self.rng.random_ratio(1, 2);
        // Sorted values and the top k are the operand's elements, exact as it is.
        let r = match self.rng.random_range(0..6) {
            0 if Self::numeric(&a) => a.t.argmax(dim),
            1 if Self::numeric(&a) => a.t.argmin(dim),
            2 => a.t.sort(dim, descending).0,
            3 if n > 0 => a.t.top_k(self.rng.random_range(1..=n), dim).0,
            4 if n > 0 => a.t.top_k(self.rng.random_range(1..=n), dim).1,
            _ => a.t.argsort(dim, descending),
        };
        self.push(r, true);
    }

    fn unary(&mut self) {
        let Some(a) = self.operand(Self::numeric) else {
            return;
        };
        let t = &a.t;
        if t.dtype() == DType::I32 {
            let r = if self.rng.random_ratio(1, 2) {
                t.neg()
            } else {
                t.abs()
            };
            return self.push(r, true);
        }
        let (r, exact) = match self.rng.random_range(0..11) {
            0 => (t.neg(), a.exact),
            1 => (t.abs(), a.exact),
            2 => (t.tanh(), false),
            3 => (t.logistic(), false),
            4 => (t.tanh().exp(), false),
            5 => ((t.abs() + 1.0).sqrt(), false),
            6 => ((t.abs() + 1.0).log(), false),
            7 => (t.sin(), false),
            8 => (t.cos(), false),
            9 => (t.gelu_exact(), false),
            _ => (t.relu(), a.exact),
        };
        self.push(r, exact);
    }

    /// Ops with jumps (floor, ceil, round, sign, remainders, floor and integer division)
    /// and `is_finite`, on exact operands only: both programs then apply them to the
    /// same values (an argument rounded differently across a jump would be no error of
    /// the partitioner). Their results are small integers or grid values, exact again.
    fn jumps(&mut self) {
        let Some(a) = self.operand(|v| Self::numeric(v) && v.exact) else {
            return;
        };
        let shape = self.broadcastable(a.t.shape());
        let b = self.value_of(&shape, a.t.dtype(), true);
        if broadcast_elements(a.t.shape(), b.t.shape()) > MAX_ELEMENTS {
            return;
        }
        let (t, b) = (&a.t, &b.t);
        if t.dtype() == DType::I32 {
            // The inputs hold zeros: division and remainder by zero included.
            let r = match self.rng.random_range(0..5) {
                0 => t.sign(),
                1 => t / b,
                2 => t % b,
                3 => t.remainder(b),
                _ => t.floor_divide(b),
            };
            return self.push(r, true);
        }
        // A divisor of at least 1/2 keeps the quotients small.
        let divisor = b.abs() + 0.5;
        let r = match self.rng.random_range(0..10) {
            0 => t.floor(),
            1 => t.ceil(),
            // The 1/8 grid of the inputs holds ties: half to even.
            2 => t.round(),
            3 => t.sign(),
            4 => t % &divisor,
            5 => t.remainder(&(b - 0.25)),
            6 => t.floor_divide(&divisor),
            7 => t.clamp_scalar(-1.0, 0.5),
            8 => t.clamp(&b.neg(), &b.abs()),
            // x / 0 and 0 / 0 where b holds zeros.
            _ => (t / b).is_finite().select(t, b),
        };
        self.push(r, true);
    }

    fn binary(&mut self) {
        let Some(a) = self.operand(Self::numeric) else {
            return;
        };
        let shape = self.broadcastable(a.t.shape());
        let b = self.value_of(&shape, a.t.dtype(), false);
        let (x, y) = if self.rng.random_ratio(1, 2) {
            (a.clone(), b)
        } else {
            (b, a.clone())
        };
        let result_elements = broadcast_elements(x.t.shape(), y.t.shape());
        if result_elements > MAX_ELEMENTS {
            return;
        }
        let exact = x.exact && y.exact;
        let f32 = a.t.dtype() == DType::F32;
        let (r, exact) = match self.rng.random_range(0..7) {
            0 => (&x.t + &y.t, exact),
            1 => (&x.t - &y.t, exact),
            2 => (&x.t * &y.t, !f32),
            3 => (x.t.max(&y.t), exact),
            4 => (x.t.min(&y.t), exact),
            // A base >= 1 and an exponent in (-1, 1): bounded and well conditioned.
            5 if f32 => ((x.t.abs() + 1.0).pow(&y.t.tanh()), false),
            _ if f32 => (&x.t / &(y.t.abs() + 1.0), false),
            _ => (&x.t + &y.t, exact),
        };
        self.push(r, exact);
    }

    fn compare_select(&mut self) {
        let Some(a) = self.operand(|v| Self::numeric(v) && v.exact) else {
            return;
        };
        let shape = self.broadcastable(a.t.shape());
        let b = self.value_of(&shape, a.t.dtype(), true);
        if broadcast_elements(a.t.shape(), b.t.shape()) > MAX_ELEMENTS {
            return;
        }
        let pred = match self.rng.random_range(0..6) {
            0 => a.t.lt(&b.t),
            1 => a.t.le(&b.t),
            2 => a.t.gt(&b.t),
            3 => a.t.ge(&b.t),
            4 => a.t.eq(&b.t),
            _ => a.t.ne(&b.t),
        };
        let pred = match self.rng.random_range(0..4) {
            0 => pred.not(),
            1 => pred.and(&a.t.ne(&b.t)),
            2 => pred.or(&a.t.ge(&b.t)),
            _ => pred,
        };
        match self.rng.random_range(0..4) {
            0 => self.push(pred, true),
            1 => self.push(pred.convert(DType::F32), true),
            _ => {
                let r = pred.select(&a.t, &b.t);
                self.push(r, true);
            }
        }
    }

    fn reduce(&mut self) {
        let Some(a) = self.operand(|v| Self::numeric(v) && v.t.rank() > 0) else {
            return;
        };
        let rank = a.t.rank();
        let mut dims: Vec<isize> = (0..rank as isize)
            .filter(|_| self.rng.random_ratio(1, 2))
            .collect();
        if dims.is_empty() {
            dims.push(self.rng.random_range(0..rank) as isize);
        }
        if self.rng.random_ratio(1, 4) {
            // Negative dims count from the end.
            for d in &mut dims {
                *d -= rank as isize;
            }
        }
        let keep = self.rng.random_ratio(1, 3);
        let (kind, exact) = match self.rng.random_range(0..3) {
            0 => (ReduceKind::Sum, a.exact),
            1 => (ReduceKind::Max, a.exact),
            _ => (ReduceKind::Min, a.exact),
        };
        let r = a.t.reduce(kind, &dims, keep);
        self.push(r, exact || a.t.dtype() == DType::I32);
    }

    /// `dot_general`, `matmul` or a two-operand `einsum` with random batch, contracting
    /// and free dims; the rhs has the lhs's batch and contracting sizes in random order.
    fn dot(&mut self) {
        let Some(a) = self.operand(|v| Self::numeric(v) && v.t.rank() > 0) else {
            return;
        };
        let dtype = a.t.dtype();
        let sa = a.t.shape().to_vec();
        if self.rng.random_ratio(1, 4) {
            // matmul: [..., K] x [K, N].
            let k = *sa.last().unwrap();
            let rhs_shape = [k, dim_size(self.rng)];
            let b = self.value_of(&rhs_shape, dtype, false);
            if elements(&sa) / k * rhs_shape[1] <= MAX_ELEMENTS {
                let r = a.t.matmul(&b.t);
                self.push(r, dtype == DType::I32);
            }
            return;
        }
        // Roles of lhs dims: 0 batch, 1 contracting, 2 free, 3 summed (einsum only).
        let use_einsum = self.rng.random_ratio(1, 2);
        let roles: Vec<usize> = sa
            .iter()
            .map(|_| match self.rng.random_range(0..8) {
                0 | 1 => 0,
                2..=4 => 1,
                5 if use_einsum => 3,
                _ => 2,
            })
            .collect();
        let free_b: Vec<usize> = (0..self.rng.random_range(0..3))
            .map(|_| dim_size(self.rng))
            .collect();
        // rhs dims: (lhs dim or None for a free rhs dim, size), shuffled.
        let mut rhs: Vec<(Option<usize>, usize)> = roles
            .iter()
            .enumerate()
            .filter(|&(_, &r)| r <= 1)
            .map(|(d, _)| (Some(d), sa[d]))
            .chain(free_b.iter().map(|&s| (None, s)))
            .collect();
        rhs.shuffle(self.rng);
        let rhs_shape: Vec<usize> = rhs.iter().map(|&(_, s)| s).collect();
        let out_elements: usize = roles
            .iter()
            .zip(&sa)
            .filter(|&(&r, _)| r == 0 || r == 2)
            .map(|(_, &s)| s)
            .product::<usize>()
            * elements(&free_b);
        if out_elements > MAX_ELEMENTS || rhs_shape.len() > 4 {
            return;
        }
        let b = self.value_of(&rhs_shape, dtype, false);
        let r = if use_einsum {
            let letters: Vec<char> = "abcdefghijklmnop".chars().collect();
            let lhs_letters: String = (0..sa.len()).map(|d| letters[d]).collect();
            let mut next = sa.len();
            let mut rhs_letters = String::new();
            let mut out: Vec<char> = Vec::new();
            for &(d, _) in &rhs {
                let c = match d {
                    Some(d) => letters[d],
                    None => {
                        next += 1;
                        letters[next - 1]
                    }
                };
                rhs_letters.push(c);
                if d.is_none() {
                    out.push(c);
                }
            }
            out.extend(
                (0..sa.len())
                    .filter(|&d| roles[d] == 0 || roles[d] == 2)
                    .map(|d| letters[d]),
            );
            out.shuffle(self.rng);
            let out: String = out.into_iter().collect();
            einsum(&format!("{lhs_letters},{rhs_letters}->{out}"), &a.t, &b.t)
        } else {
            let mut batch: Vec<usize> = (0..sa.len()).filter(|&d| roles[d] == 0).collect();
            batch.shuffle(self.rng);
            let mut contracting: Vec<usize> = (0..sa.len()).filter(|&d| roles[d] == 1).collect();
            contracting.shuffle(self.rng);
            let rhs_pos =
                |d: usize| -> usize { rhs.iter().position(|&(x, _)| x == Some(d)).unwrap() };
            let dims = DotDims {
                rhs_batch: batch.iter().map(|&d| rhs_pos(d)).collect(),
                lhs_batch: batch,
                rhs_contracting: contracting.iter().map(|&d| rhs_pos(d)).collect(),
                lhs_contracting: contracting,
            };
            a.t.dot_general(&b.t, dims)
        };
        self.push(r, dtype == DType::I32);
    }

    fn broadcast(&mut self) {
        let Some(a) = self.operand(|v| v.t.rank() < 4) else {
            return;
        };
        let rank = a.t.rank();
        let out_rank = rank + 1 + self.rng.random_range(0..2.min(4 - rank));
        let mut positions: Vec<usize> = (0..out_rank).collect();
        positions.shuffle(self.rng);
        positions.truncate(rank);
        positions.sort_unstable();
        let mut shape: Vec<usize> = (0..out_rank).map(|_| dim_size(self.rng)).collect();
        for (i, &p) in positions.iter().enumerate() {
            let d = a.t.shape()[i];
            if d != 1 || self.rng.random_ratio(1, 2) {
                shape[p] = d;
            }
        }
        if elements(&shape) > MAX_ELEMENTS {
            return;
        }
        let r = a.t.broadcast_in_dim(shape, &positions);
        self.push(r, a.exact);
    }

    /// Splits a dim, merges adjacent dims, or refactors the whole element count.
    fn reshape(&mut self) {
        let Some(a) = self.operand(|_| true) else {
            return;
        };
        let sa = a.t.shape().to_vec();
        let shape: Vec<usize> = match self.rng.random_range(0..3) {
            0 if !sa.is_empty() && sa.len() < 4 => {
                let d = self.rng.random_range(0..sa.len());
                let divisors: Vec<usize> =
                    (1..=sa[d]).filter(|&k| sa[d].is_multiple_of(k)).collect();
                let k = *divisors.choose(self.rng).expect("a non-empty choice");
                let mut s = sa.clone();
                s.splice(d..=d, [k, sa[d] / k]);
                s
            }
            1 if sa.len() >= 2 => {
                let d = self.rng.random_range(0..sa.len() - 1);
                let mut s = sa.clone();
                s.splice(d..d + 2, [sa[d] * sa[d + 1]]);
                s
            }
            _ => {
                // A random factorisation of the element count into at most 4 dims.
                let mut n = elements(&sa);
                let mut s = Vec::new();
                while n > 1 && s.len() < 3 {
                    let divisors: Vec<usize> = (1..=n).filter(|&k| n.is_multiple_of(k)).collect();
                    let k = *divisors.choose(self.rng).expect("a non-empty choice");
                    s.push(k);
                    n /= k;
                }
                s.push(n);
                if self.rng.random_ratio(1, 4) {
                    s.insert(self.rng.random_range(0..s.len() + 1), 1);
                }
                s
            }
        };
        if shape.len() > 4 {
            return;
        }
        let r = a.t.reshape(shape);
        self.push(r, a.exact);
    }

    fn transpose(&mut self) {
        let Some(a) = self.operand(|v| v.t.rank() > 1) else {
            return;
        };
        let mut perm: Vec<usize> = (0..a.t.rank()).collect();
        perm.shuffle(self.rng);
        let r = a.t.transpose(&perm);
        self.push(r, a.exact);
    }

    fn slice(&mut self) {
        let Some(a) = self.operand(|v| v.t.rank() > 0) else {
            return;
        };
        let (mut start, mut limit, mut stride) = (Vec::new(), Vec::new(), Vec::new());
        for &n in a.t.shape() {
            if self.rng.random_ratio(1, 3) {
                start.push(0);
                limit.push(n);
                stride.push(1);
                continue;
            }
            let s = self.rng.random_range(0..n);
            start.push(s);
            limit.push(s + 1 + self.rng.random_range(0..n - s));
            stride.push(1 + self.rng.random_range(0..3));
        }
        let r = a.t.slice(&start, &limit, &stride);
        self.push(r, a.exact);
    }

    fn pad(&mut self) {
        let Some(a) = self.operand(|v| v.t.rank() > 0) else {
            return;
        };
        let (mut low, mut high, mut interior) = (Vec::new(), Vec::new(), Vec::new());
        let mut shape = Vec::new();
        for &n in a.t.shape() {
            loop {
                let i = if self.rng.random_ratio(1, 3) {
                    self.rng.random_range(0..3)
                } else {
                    0
                };
                let (l, h) = (self.rng.random_range(-2..=3), self.rng.random_range(-2..=3));
                let size = n as i64 + (n as i64 - 1) * i as i64 + l + h;
                if size >= 1 {
                    low.push(l);
                    high.push(h);
                    interior.push(i);
                    shape.push(size as usize);
                    break;
                }
            }
        }
        if elements(&shape) > MAX_ELEMENTS {
            return;
        }
        let value =
            a.t.scalar_like(f64::from(self.rng.random_range(-4..=4)) / 2.0);
        let r = a.t.pad(&value, &low, &high, &interior);
        self.push(r, a.exact);
    }

    fn roll(&mut self) {
        let Some(a) = self.operand(|v| v.t.rank() > 0) else {
            return;
        };
        let dim = self.rng.random_range(0..a.t.rank());
        let n = a.t.shape()[dim] as i64;
        let shift = self.rng.random_range(-n..=n);
        let r = a.t.roll(shift, dim as isize);
        self.push(r, a.exact);
    }

    /// `convolution` of a pool value of rank 3 or 4 (or a new one of rank 3 to 5): its
    /// dims, the kernel's and the output's take random roles; the window random sizes,
    /// strides, padding (negative too), dilations; random feature groups or batch groups.
    fn convolution(&mut self) {
        let a = match self.operand(|v| Self::numeric(v) && (3..=4).contains(&v.t.rank())) {
            Some(a) if self.rng.random_ratio(2, 3) => a,
            _ => {
                let rank = self.rng.random_range(3..=5);
                let shape: Vec<usize> =
                    (0..rank).map(|_| 1 + self.rng.random_range(0..6)).collect();
                self.parameter(shape, DType::F32)
            }
        };
        let sa = a.t.shape().to_vec();
        let rank = sa.len();
        let roles = |rng: &mut Xoshiro256PlusPlus| {
            let mut order: Vec<usize> = (0..rank).collect();
            order.shuffle(rng);
            order
        };
        let (x, k, o) = (roles(self.rng), roles(self.rng), roles(self.rng));
        let dn = ConvDimensionNumbers {
            input_batch: x[0],
            input_feature: x[1],
            input_spatial: x[2..].to_vec(),
            kernel_input_feature: k[0],
            kernel_output_feature: k[1],
            kernel_spatial: k[2..].to_vec(),
            output_batch: o[0],
            output_feature: o[1],
            output_spatial: o[2..].to_vec(),
        };
        let features = sa[dn.input_feature];
        let divisors: Vec<usize> = (1..=features).filter(|g| features % g == 0).collect();
        let groups = if self.rng.random_ratio(1, 2) {
            1
        } else {
            *divisors.choose(self.rng).expect("1 divides")
        };
        let batch = sa[dn.input_batch];
        let batch_groups = if groups == 1 && self.rng.random_ratio(1, 3) {
            let divisors: Vec<usize> = (1..=batch).filter(|g| batch % g == 0).collect();
            *divisors.choose(self.rng).expect("1 divides")
        } else {
            1
        };
        let mut kernel_shape = vec![0; rank];
        kernel_shape[dn.kernel_input_feature] = features / groups;
        kernel_shape[dn.kernel_output_feature] =
            groups * batch_groups * (1 + self.rng.random_range(0..3));
        let mut out_elements = batch / batch_groups * kernel_shape[dn.kernel_output_feature];
        let (mut strides, mut pads, mut lhs, mut rhs) = (vec![], vec![], vec![], vec![]);
        for i in 0..rank - 2 {
            let n = sa[dn.input_spatial[i]] as i64;
            let size = 1 + self.rng.random_range(0..3);
            let stride = 1 + self.rng.random_range(0..3) * usize::from(self.rng.random_ratio(1, 2));
            let l = if self.rng.random_ratio(1, 4) { 2 } else { 1 };
            let r = if self.rng.random_ratio(1, 4) { 2 } else { 1 };
            let low = self.rng.random_range(-1..=2);
            let dilated = (n - 1) * l as i64 + 1;
            let reach = (size as i64 - 1) * r as i64 + 1;
            // Enough high padding for one window at least.
            let high = self.rng.random_range(-1..=2).max(reach - low - dilated);
            kernel_shape[dn.kernel_spatial[i]] = size;
            out_elements *= ((low + dilated + high - reach) / stride as i64 + 1) as usize;
            strides.push(stride);
            pads.push((low, high));
            lhs.push(l);
            rhs.push(r);
        }
        if out_elements > MAX_ELEMENTS {
            return;
        }
        let kernel = self.value_of(&kernel_shape, a.t.dtype(), false);
        let r = a.t.conv_general_dilated_grouped(
            &kernel.t,
            &strides,
            Padding::Explicit(pads),
            &lhs,
            &rhs,
            &dn,
            groups,
            batch_groups,
        );
        self.push(r, a.t.dtype() == DType::I32);
    }

    fn reverse(&mut self) {
        let Some(a) = self.operand(|v| v.t.rank() > 0) else {
            return;
        };
        let dims: Vec<usize> = (0..a.t.rank())
            .filter(|_| self.rng.random_ratio(1, 2))
            .collect();
        let r = a.t.reverse(&dims);
        self.push(r, a.exact);
    }

    /// Random i32 indices of `shape` (from the pool or a parameter: values mostly in
    /// -4..=4, so out of range for many dims).
    fn indices(&mut self, shape: &[usize]) -> Tensor {
        self.value_of(shape, DType::I32, false).t
    }

    /// Random raw dimension numbers over an operand of `shape`: a non-empty shuffled
    /// index map, a window size per operand dim (whole, or random for indexed dims),
    /// some one-element windows dropped, 0-2 batch dims with the index vector dim at a
    /// random place, and the window dims at random places of the data. Returns the
    /// dimension numbers (as a gather's) and the indices' shape.
    fn random_indexing(&mut self, operand: &[usize]) -> (GatherDims, Vec<usize>) {
        let r = operand.len();
        let mut map: Vec<usize> = (0..r).filter(|_| self.rng.random_ratio(1, 2)).collect();
        if map.is_empty() {
            map.push(self.rng.random_range(0..r));
        }
        map.shuffle(self.rng);
        let sizes: Vec<usize> = (0..r)
            .map(|d| match map.contains(&d) && self.rng.random_ratio(2, 3) {
                true if self.rng.random_ratio(1, 2) => 1,
                true => self.rng.random_range(1..=operand[d]),
                false => operand[d],
            })
            .collect();
        let dropped: Vec<usize> = (0..r)
            .filter(|&d| sizes[d] == 1 && self.rng.random_ratio(2, 3))
            .collect();
        let q = self.rng.random_range(0..3);
        let mut indices = shape(self.rng, q);
        let vd = if map.len() == 1 && self.rng.random_ratio(1, 4) {
            // An implicit index vector dim.
            indices.len()
        } else {
            let vd = self.rng.random_range(0..=indices.len());
            indices.insert(vd, map.len());
            vd
        };
        let window_len = r - dropped.len();
        let batch_len = indices.len() - usize::from(vd < indices.len());
        let mut positions: Vec<usize> = (0..window_len + batch_len).collect();
        positions.shuffle(self.rng);
        let mut window: Vec<usize> = positions[..window_len].to_vec();
        window.sort_unstable();
        let dims = GatherDims {
            offset_dims: window,
            collapsed_slice_dims: dropped,
            start_index_map: map,
            index_vector_dim: vd,
            slice_sizes: sizes.clone(),
            ..GatherDims::default()
        };
        (dims, indices)
    }

    /// `take`, `take_along_dim`, an embedding lookup or a raw gather, at random
    /// indices.
    fn gather(&mut self) {
        let Some(a) = self.operand(|v| v.t.rank() > 0) else {
            return;
        };
        let (r, rank) = (a.t.shape().to_vec(), a.t.rank());
        let dim = self.rng.random_range(0..rank);
        let result = match self.rng.random_range(0..3) {
            0 => {
                let q = self.rng.random_range(0..3);
                let ids = shape(self.rng, q);
                if elements(&r) / r[dim].max(1) * elements(&ids) > MAX_ELEMENTS {
                    return;
                }
                let ids = self.indices(&ids);
                match rank {
                    2 if dim == 0 => a.t.embedding(&ids),
                    _ => a.t.take(&ids, dim as isize - rank as isize),
                }
            }
            1 => {
                let mut ids = r.clone();
                ids[dim] = dim_size(self.rng);
                if elements(&ids) > MAX_ELEMENTS {
                    return;
                }
                let ids = self.indices(&ids);
                a.t.take_along_dim(&ids, dim as isize)
            }
            _ => {
                let (dims, ids) = self.random_indexing(&r);
                let batch: usize = (0..ids.len())
                    .filter(|&d| d != dims.index_vector_dim)
                    .map(|d| ids[d])
                    .product();
                if elements(&dims.slice_sizes) * batch > MAX_ELEMENTS {
                    return;
                }
                let ids = self.indices(&ids);
                a.t.gather(&ids, &dims)
            }
        };
        self.push(result, a.exact);
    }

    /// `index_add`, a scatter-replace of distinct rows (an iota, maybe reversed, plus
    /// an offset that sends some out of range), or a raw scatter-add at random indices.
    fn scatter(&mut self) {
        let Some(a) = self.operand(|v| Self::numeric(v) && v.t.rank() > 0) else {
            return;
        };
        let (r, rank, dtype) = (a.t.shape().to_vec(), a.t.rank(), a.t.dtype());
        let dim = self.rng.random_range(0..rank);
        let (result, u) = match self.rng.random_range(0..3) {
            0 => {
                let mut rows = r.clone();
                rows[dim] = dim_size(self.rng);
                let index = self.indices(&[rows[dim]]);
                let u = self.value_of(&rows, dtype, false);
                (a.t.index_add(dim as isize, &index, &u.t), u)
            }
            1 => {
                let mut rows = r.clone();
                rows[dim] = self.rng.random_range(1..=r[dim]);
                let n = rows[dim];
                let mut index = self.b.iota([n], 0, DType::I32);
                if self.rng.random_ratio(1, 2) {
                    index = index.reverse(&[0]);
                }
                let offset = self.rng.random_range(-2..=2);
                let index = index.add(&self.b.full([n], DType::I32, f64::from(offset)));
                let u = self.value_of(&rows, dtype, false);
                let dims = ScatterDims::along(dim, rank);
                (a.t.scatter(&index, &u.t, &dims), u)
            }
            _ => {
                let (g, ids) = self.random_indexing(&r);
                let batch: Vec<usize> = (0..ids.len())
                    .filter(|&d| d != g.index_vector_dim)
                    .map(|d| ids[d])
                    .collect();
                let windows: Vec<usize> = (0..rank)
                    .filter(|d| !g.collapsed_slice_dims.contains(d))
                    .map(|d| g.slice_sizes[d])
                    .collect();
                let (mut w, mut bt) = (windows.iter(), batch.iter());
                let updates: Vec<usize> = (0..windows.len() + batch.len())
                    .map(|d| match g.offset_dims.contains(&d) {
                        true => *w.next().unwrap(),
                        false => *bt.next().unwrap(),
                    })
                    .collect();
                if elements(&updates) > MAX_ELEMENTS {
                    return;
                }
                let dims = g.to_scatter();
                let ids = self.indices(&ids);
                let u = self.value_of(&updates, dtype, false);
                (a.t.scatter_add(&ids, &u.t, &dims), u)
            }
        };
        self.push(result, a.exact && u.exact);
    }

    fn concatenate(&mut self) {
        let Some(a) = self.operand(|v| v.t.rank() > 0) else {
            return;
        };
        let dim = self.rng.random_range(0..a.t.rank());
        let mut parts = vec![a.clone()];
        for _ in 0..1 + self.rng.random_range(0..2) {
            let mut shape = a.t.shape().to_vec();
            if self.rng.random_ratio(1, 3) {
                parts.push(a.clone());
                continue;
            }
            shape[dim] = dim_size(self.rng);
            let v = self.value_of(&shape, a.t.dtype(), false);
            parts.push(v);
        }
        parts.shuffle(self.rng);
        let mut shape = a.t.shape().to_vec();
        shape[dim] = parts.iter().map(|p| p.t.shape()[dim]).sum();
        if elements(&shape) > MAX_ELEMENTS {
            return;
        }
        let refs: Vec<&Tensor> = parts.iter().map(|p| &p.t).collect();
        let exact = parts.iter().all(|p| p.exact);
        let r = self.b.concatenate(&refs, dim);
        self.push(r, exact);
    }

    /// `reduce_window` with a random window per dim (trivial, or of size 1-3, stride
    /// 1-3, padding below the window size and sometimes a base dilation up to the size,
    /// or dilation 2 unpadded: every window holds an operand element), a pooling layer,
    /// or a nearest-neighbour upsampling.
    fn windowed(&mut self) {
        let Some(a) = self.operand(|v| Self::numeric(v) && v.t.rank() > 0) else {
            return;
        };
        let shape = a.t.shape().to_vec();
        let rank = shape.len();
        let f32 = a.t.dtype() == DType::F32;
        match self.rng.random_range(0..5) {
            0 => {
                let factors: Vec<usize> =
                    (0..rank).map(|_| 1 + self.rng.random_range(0..2)).collect();
                let out: Vec<usize> = shape.iter().zip(&factors).map(|(n, f)| n * f).collect();
                if elements(&out) <= MAX_ELEMENTS {
                    let r = a.t.upsample_nearest(&factors);
                    self.push(r, a.exact);
                }
            }
            1 if f32 => {
                let mut sizes = || -> Vec<usize> {
                    (0..rank).map(|_| 1 + self.rng.random_range(0..3)).collect()
                };
                let (window, strides) = (sizes(), sizes());
                let (r, exact) = match self.rng.random_range(0..4) {
                    0 => (a.t.max_pool(&window, &strides, Padding::Same), a.exact),
                    1 => {
                        let fits: Vec<usize> =
                            window.iter().zip(&shape).map(|(&w, &n)| w.min(n)).collect();
                        (a.t.max_pool(&fits, &strides, Padding::Valid), a.exact)
                    }
                    include_pad => (
                        a.t.avg_pool(&window, &strides, Padding::Same, include_pad == 2),
                        false,
                    ),
                };
                self.push(r, exact);
            }
            _ => {
                let window: Vec<WindowDim> = shape
                    .iter()
                    .map(|&n| {
                        if self.rng.random_ratio(1, 3) {
                            return WindowDim::new(1, 1, (0, 0));
                        }
                        let (size, stride) = (
                            1 + self.rng.random_range(0..3),
                            1 + self.rng.random_range(0..3),
                        );
                        let w = if self.rng.random_ratio(1, 4) {
                            WindowDim::new(size, stride, (0, 0)).with_window_dilation(2)
                        } else {
                            let low = self.rng.random_range(0..size as i64);
                            let high = self.rng.random_range(0..size as i64);
                            let base = if self.rng.random_ratio(1, 4) {
                                1 + self.rng.random_range(0..size)
                            } else {
                                1
                            };
                            WindowDim::new(size, stride, (low, high)).with_base_dilation(base)
                        };
                        let span = ((w.size - 1) * w.window_dilation + 1) as i64;
                        if span > dilated(n, &w) + w.padding_low + w.padding_high {
                            WindowDim::new(1, stride, (0, 0))
                        } else {
                            w
                        }
                    })
                    .collect();
                let out: Vec<usize> = (shape.iter().zip(&window))
                    .map(|(&n, w)| {
                        let span = ((w.size - 1) * w.window_dilation + 1) as i64;
                        (dilated(n, w) + w.padding_low + w.padding_high - span) as usize / w.stride
                            + 1
                    })
                    .collect();
                if elements(&out) > MAX_ELEMENTS {
                    return;
                }
                let kind = *[ReduceKind::Sum, ReduceKind::Max, ReduceKind::Min]
                    .choose(self.rng)
                    .expect("a non-empty choice");
                let r = a.t.reduce_window_with(kind, &window);
                self.push(r, a.exact || !f32);
            }
        }
    }

    fn normalization(&mut self) {
        let Some(a) = self.operand(|v| v.t.dtype() == DType::F32 && v.t.rank() > 0) else {
            return;
        };
        let axis = self.rng.random_range(0..a.t.rank()) as isize;
        let r = match self.rng.random_range(0..3) {
            0 => a.t.softmax(axis),
            1 => a.t.log_softmax(axis),
            _ => a.t.layer_norm(axis, 1e-3),
        };
        self.push(r, false);
    }

    fn source(&mut self) {
        let rank = 1 + self.rng.random_range(0..3);
        let shape = shape(self.rng, rank);
        let dtype = if self.rng.random_ratio(1, 3) {
            DType::I32
        } else {
            DType::F32
        };
        match self.rng.random_range(0..4) {
            0 => {
                let dim = self.rng.random_range(0..rank);
                let r = self.b.iota(shape, dim, dtype);
                self.push(r, true);
            }
            3 => self.random(shape),
            1 => {
                let r = self
                    .b
                    .full(shape, dtype, f64::from(self.rng.random_range(-3..=3)) / 4.0);
                self.push(r, true);
            }
            _ => {
                self.parameter(shape, dtype);
            }
        }
    }

    /// Random draws of `shape` from an i32[2] key of the pool (any pair is a key),
    /// sometimes folded with an i32 scalar or split first: bits modulo 8 (small exact
    /// i32s, like the inputs), uniform floats (not on the exact grid), or a stacked
    /// split (`[n, 2]` keys modulo 8, their word dim possibly annotated split).
    fn random(&mut self, shape: Vec<usize>) {
        let mut key = self.value_of(&[2], DType::I32, true).t;
        if self.rng.random_ratio(1, 3) {
            let data = self.value_of(&[], DType::I32, true).t;
            key = random::fold_in(&key, &data);
        }
        if self.rng.random_ratio(1, 3) {
            let n = 1 + self.rng.random_range(0..3);
            key = random::split(&key, n)[self.rng.random_range(0..n)].clone();
        }
        let eight = self.b.full([], DType::I32, 8.0);
        match self.rng.random_range(0..3) {
            0 => self.push(random::bits(&key, shape).rem(&eight), true),
            1 => self.push(random::uniform(&key, shape, -1.0, 1.0), false),
            _ => {
                let n = dim_size(self.rng);
                self.push(random::split_stacked(&key, n).rem(&eight), true);
            }
        }
    }

    /// `convert` of an i32 or bool value to f32 (or bool to i32); one time in three, a
    /// [`Gen::narrow_round_trip`] instead.
    /// A propagation barrier (an identity) of a random allowed direction: the values on
    /// its two sides are propagated apart, so the partitioner reshards at it.
    fn barrier(&mut self) {
        let Some(a) = self.operand(|_| true) else {
            return;
        };
        let allowed = [
            PropagationDirection::None,
            PropagationDirection::Forward,
            PropagationDirection::Backward,
        ];
        let r = (a.t).propagation_barrier(*allowed.choose(self.rng).expect("a direction"));
        self.push(r, a.exact);
    }

    fn convert(&mut self) {
        if self.rng.random_ratio(1, 3) {
            return self.narrow_round_trip();
        }
        let Some(a) = self.operand(|v| v.t.dtype() != DType::F32) else {
            return;
        };
        let to = if a.t.dtype() == DType::Bool && self.rng.random_ratio(1, 2) {
            DType::I32
        } else {
            DType::F32
        };
        let r = a.t.convert(to);
        self.push(r, true);
    }

    /// bf16 (or f16) values: two exact f32 values converted down, added, subtracted or
    /// compared (max, min), the result transposed or reversed under a random sharding
    /// constraint (so it is resharded as bf16), and converted back. Exact values are on
    /// a 1/8 grid, which rounding to bf16 or f16 keeps them on, and each of these ops
    /// rounds once on identical operands wherever it runs: the result is exact (the
    /// same bits on every mesh).
    fn narrow_round_trip(&mut self) {
        let Some(a) = self.operand(|v| v.t.dtype() == DType::F32 && v.exact && v.t.rank() > 0)
        else {
            return;
        };
        let dtype = if self.rng.random_ratio(1, 3) {
            DType::F16
        } else {
            DType::BF16
        };
        let b = self.value_of(a.t.shape(), DType::F32, true);
        let (x, y) = (a.t.convert(dtype), b.t.convert(dtype));
        let r = match self.rng.random_range(0..4) {
            0 => &x + &y,
            1 => &x - &y,
            2 => x.max(&y),
            _ => x.min(&y),
        };
        let moved = if self.rng.random_ratio(1, 2) {
            let mut perm: Vec<usize> = (0..r.rank()).collect();
            perm.shuffle(self.rng);
            r.transpose(&perm)
        } else {
            r.reverse(&[0])
        };
        let s = random_sharding(self.rng, self.mesh, moved.rank());
        self.push(moved.shard(s).convert(DType::F32), true);
    }
}

fn broadcast_elements(a: &[usize], b: &[usize]) -> usize {
    let r = a.len().max(b.len());
    (0..r)
        .map(|i| {
            let da = if i + a.len() >= r {
                a[i + a.len() - r]
            } else {
                1
            };
            let db = if i + b.len() >= r {
                b[i + b.len() - r]
            } else {
                1
            };
            da.max(db)
        })
        .product()
}

/// A random program of 3 to `max_steps` generated steps (composite ops add more nodes) and the mesh
/// it is annotated for.
fn random_case(seed: u64, max_steps: usize) -> (Program, Mesh) {
    let mut rng = Xoshiro256PlusPlus::seed_from_u64(seed);
    let mesh = random_mesh(&mut rng);
    let annotate_rate = *[0, 1, 2, 2, 3, 3, 4, 6]
        .choose(&mut rng)
        .expect("a non-empty choice");
    let b = Builder::new(format!("case{seed}"));
    let mut g = Gen::new(&mut rng, &b, &mesh, annotate_rate);
    let first_dtype = if g.rng.random_ratio(1, 5) {
        DType::I32
    } else {
        DType::F32
    };
    for _ in 0..1 + g.rng.random_range(0..2) {
        let rank = *[0, 1, 1, 2, 2, 2, 3, 3]
            .choose(g.rng)
            .expect("a non-empty choice");
        let shape = shape(g.rng, rank);
        g.parameter(shape, first_dtype);
    }
    let steps = 3 + g.rng.random_range(0..max_steps.max(3) - 2);
    for _ in 0..steps {
        g.step();
    }
    // Outputs: the values nothing else uses (the last few), at most 4.
    let pool = g.pool.clone();
    let mut outputs: Vec<Tensor> = pool.iter().rev().take(4).map(|v| v.t.clone()).collect();
    outputs.dedup_by(|x, y| x.id() == y.id());
    let refs: Vec<&Tensor> = outputs.iter().collect();
    let program = b
        .finish(&refs)
        .unwrap_or_else(|e| panic!("generator built an ill-typed program (seed {seed}): {e}"));
    (program, mesh)
}

// ---- checking a case ------------------------------------------------------------------

fn input(shape: &[usize], dtype: DType, seed: usize) -> Literal {
    let n = elements(shape);
    // A 1/8 grid in [-2, 2]: sums and maxima of these are exact in any order.
    let v: Vec<f32> = (0..n)
        .map(|i| ((i * 7 + seed * 13 + (i * i) % 5) % 33) as f32 / 8.0 - 2.0)
        .collect();
    let a = ArrayD::from_shape_vec(IxDyn(shape), v).unwrap();
    match dtype {
        DType::F32 => Literal::F32(a),
        DType::I32 => Literal::I32(a.mapv(|x| (x * 2.0) as i32)),
        DType::Bool => Literal::Bool(a.mapv(|x| x > 0.0)),
        // The grid is exact in bf16 and f16.
        DType::BF16 | DType::F16 => Literal::F32(a).convert(dtype),
        other => panic!("not covered by this test: {other:?}"),
    }
}

fn inputs_for(program: &Program) -> Vec<Literal> {
    program
        .params
        .iter()
        .map(|&p| {
            // Seeded by name, so that a parameter keeps its data when shrinking removes
            // others.
            let name = program.node(p).name.as_deref().unwrap_or_default();
            let seed = name
                .bytes()
                .fold(0, |h, b| (h * 31 + usize::from(b)) % 1009);
            input(&program.ty(p).shape, program.ty(p).dtype, seed)
        })
        .collect()
}

/// How far an f32 output element may be from the reference: this many times its
/// error scale (see [`error_scales`]). About 1700 ε (ε = 2^-24): room for the rounding
/// of sums of hundreds of terms, taken in another order, through a few ops.
const TOLERANCE: f32 = 1e-4;

/// For every output of `program` on `inputs`, an error scale per element: the size of
/// the rounding errors that evaluating the program's sums in another order (as the
/// partitioned program does) can cause there, in units of ε. The tolerance is relative
/// to it, not to the result, so an output that cancels exactly (`sum(s - mean(s))`) is
/// judged against the size of the terms that cancelled, not against its ~0 value; and
/// values that nothing inexact reaches (inputs, constants, exact moves and elementwise
/// ops of them) must match bit for bit.
///
/// First-order error propagation, evaluated alongside the values. Each f32 value `v`
/// gets `e(v)`: inputs, constants and non-f32 values 0; a sum (`reduce` sum, `dot`)
/// adds the sum of its terms' magnitudes (its own rounding, in any order) to its
/// operands' errors carried through it (`Σ e`; `e(a)·|b| + |a|·e(b)` per product of a
/// dot); max, min and select pick the chosen operand's `e`; ops that move elements apply
/// themselves to `e`; other elementwise ops carry their operands' errors through their
/// derivative (`e(a) + e(b)` for add and subtract, `e(a)|b| + |a|e(b)` for multiply,
/// `(e(a) + |v| e(b)) / |b|` for divide, `|f'(x)| e(x)` for unary ops, ...) and, where
/// that is not 0, add `|v|` for their own rounding of a different argument. Comparisons
/// are not covered: the generator only compares values that are exact in any order.
/// Ops with jumps (floor, ceil, round, sign, remainder) are exact where their operands
/// are (0), and unchecked elsewhere (`inf`): an argument rounded across a jump moves the
/// result by a whole step; the generator only applies them to exact values. A bound
/// that is not a number (a log at 0) leaves the element unchecked (`inf`).
fn error_scales(program: &Program, inputs: &[Literal]) -> Result<Vec<ArrayD<f32>>, String> {
    let exact: Vec<ArrayD<f32>> = (inputs.iter())
        .map(|l| ArrayD::zeros(IxDyn(&l.shape())))
        .collect();
    Ok(values_and_errors(program, inputs, &exact)?.1)
}

/// The outputs of `program` on `inputs` whose error scales are `input_errors`, and the
/// outputs' error scales (see [`error_scales`]). A control-flow op carries values and
/// errors through its regions as the interpreter carries values.
fn values_and_errors(
    program: &Program,
    inputs: &[Literal],
    input_errors: &[ArrayD<f32>],
) -> Result<(Vec<Literal>, Vec<ArrayD<f32>>), String> {
    /// The error of an op with jumps: none from exact operands, else unbounded.
    fn jumps(_: f32, _: f32, _: f32, ea: f32, eb: f32) -> f32 {
        if ea == 0.0 && eb == 0.0 {
            0.0
        } else {
            f32::INFINITY
        }
    }
    let mut values: Vec<Literal> = Vec::with_capacity(program.nodes.len());
    let mut errors: Vec<ArrayD<f32>> = Vec::with_capacity(program.nodes.len());
    for node in &program.nodes {
        let operands: Vec<&Literal> = node.operands.iter().map(|o| &values[o.index()]).collect();
        let e: Vec<&ArrayD<f32>> = node.operands.iter().map(|o| &errors[o.index()]).collect();
        let mut flow_error = None;
        let value = match &node.op {
            Op::Parameter { index, .. } => inputs[*index].clone(),
            Op::Flow { flow, result } => {
                let (mut v, mut fe) = flow_values_and_errors(flow, &operands, &e)?;
                flow_error = Some(fe.swap_remove(*result));
                v.swap_remove(*result)
            }
            op => kernels::eval(op, &operands, &node.ty)?,
        };
        let x: Vec<ArrayD<f32>> = operands.iter().map(|l| magnitude(l)).collect();
        let y = magnitude(&value);
        let f32_ty = TensorType::new(node.ty.shape.clone(), DType::F32);
        // `op` applied to f32 arrays of this node's shape.
        let apply = |op: &Op, args: &[Literal]| -> Result<ArrayD<f32>, String> {
            match kernels::eval(op, &args.iter().collect::<Vec<_>>(), &f32_ty)? {
                Literal::F32(a) => Ok(a),
                other => Err(format!("error scale of {} is {other:?}", op.name())),
            }
        };
        let f32s = |arrays: &[&ArrayD<f32>]| -> Vec<Literal> {
            arrays.iter().map(|&a| Literal::F32(a.clone())).collect()
        };
        // Elementwise: the error `f(|v|, |a|, |b|, e(a), e(b))` carried from the operands
        // (`b` is `a` for unary ops), plus, if the op `rounds`, its own rounding `|v|`
        // where an error arrives.
        let elementwise = |rounds: bool, f: fn(f32, f32, f32, f32, f32) -> f32| {
            let (b, eb) = match node.operands.len() {
                1 => (&x[0], e[0]),
                _ => (&x[1], e[1]),
            };
            let mut out = y.clone();
            ndarray::Zip::from(&mut out)
                .and(&x[0])
                .and(b)
                .and(e[0])
                .and(eb)
                .for_each(|v, &a, &b, &ea, &eb| {
                    let carried = f(*v, a, b, ea, eb);
                    *v = if rounds && carried != 0.0 {
                        carried.abs() + *v
                    } else {
                        carried
                    };
                });
            out
        };
        let error = match &node.op {
            _ if node.ty.dtype != DType::F32 => ArrayD::zeros(y.raw_dim()),
            Op::Parameter { index, .. } => input_errors[*index].clone(),
            Op::Constant(_) | Op::Iota { .. } | Op::RandomBits { .. } => ArrayD::zeros(y.raw_dim()),
            Op::Flow { .. } => flow_error.take().ok_or("a flow result without its error")?,
            Op::Convert(_) if operands[0].dtype() != DType::F32 => ArrayD::zeros(y.raw_dim()),
            Op::Unary(u) => match u {
                UnaryOp::Neg | UnaryOp::Abs => e[0].clone(),
                UnaryOp::Exp => elementwise(true, |v, _, _, ea, _| v * ea),
                UnaryOp::Log => elementwise(true, |_, a, _, ea, _| ea / a),
                UnaryOp::Sqrt => elementwise(true, |v, _, _, ea, _| ea / (2.0 * v)),
                UnaryOp::Rsqrt => elementwise(true, |v, a, _, ea, _| v * ea / (2.0 * a)),
                UnaryOp::Tanh => elementwise(true, |v, _, _, ea, _| (1.0 - v * v) * ea),
                UnaryOp::Logistic => elementwise(true, |v, _, _, ea, _| v * (1.0 - v) * ea),
                UnaryOp::Sin => elementwise(true, |_, a, _, ea, _| a.cos().abs() * ea),
                UnaryOp::Cos => elementwise(true, |_, a, _, ea, _| a.sin().abs() * ea),
                UnaryOp::Erf => elementwise(true, |_, a, _, ea, _| {
                    std::f32::consts::FRAC_2_SQRT_PI * (-a * a).exp() * ea
                }),
                UnaryOp::Floor | UnaryOp::Ceil | UnaryOp::Round | UnaryOp::Sign => {
                    elementwise(false, jumps)
                }
                UnaryOp::Not => return Err("`not` of an f32".into()),
                UnaryOp::IsFinite => return Err("an `is_finite` with an f32 result".into()),
                other => panic!("not covered by this test: {other:?}"),
            },
            Op::Binary(op) => match op {
                BinaryOp::Add | BinaryOp::Sub => elementwise(true, |_, _, _, ea, eb| ea + eb),
                BinaryOp::Mul => elementwise(true, |_, a, b, ea, eb| ea * b + a * eb),
                BinaryOp::Div => elementwise(true, |v, _, b, ea, eb| (ea + v * eb) / b),
                // The chosen operand's error: picking a value does not round it.
                BinaryOp::Max | BinaryOp::Min => elementwise(false, |_, _, _, ea, eb| ea.max(eb)),
                BinaryOp::Pow => {
                    elementwise(true, |v, a, b, ea, eb| v * (b * ea / a + a.ln().abs() * eb))
                }
                BinaryOp::Rem => elementwise(false, jumps),
                BinaryOp::And | BinaryOp::Or => return Err("a logical op of f32s".into()),
                other => panic!("not covered by this test: {other:?}"),
            },
            Op::Reduce { kind, dims } => match kind {
                ReduceKind::Sum => {
                    let sum = |a: &ArrayD<f32>| apply(&node.op, &f32s(&[a]));
                    sum(e[0])? + sum(&x[0])?
                }
                ReduceKind::Max | ReduceKind::Min => {
                    let max = Op::Reduce {
                        kind: ReduceKind::Max,
                        dims: dims.clone(),
                    };
                    apply(&max, &f32s(&[e[0]]))?.mapv(|v| v.max(0.0))
                }
                other => panic!("not covered by this test: {other:?}"),
            },
            Op::ReduceWindow { kind, window } => match kind {
                ReduceKind::Sum => {
                    let sum = |a: &ArrayD<f32>| apply(&node.op, &f32s(&[a]));
                    sum(e[0])? + sum(&x[0])?
                }
                ReduceKind::Max | ReduceKind::Min => {
                    let max = Op::ReduceWindow {
                        kind: ReduceKind::Max,
                        window: window.clone(),
                    };
                    apply(&max, &f32s(&[e[0]]))?.mapv(|v| v.max(0.0))
                }
                other => panic!("not covered by this test: {other:?}"),
            },
            // A sum of the operand and the updates landing on each element.
            Op::Scatter {
                kind: ScatterKind::Add,
                ..
            } => {
                let add = |a: &ArrayD<f32>, u: &ArrayD<f32>| {
                    apply(
                        &node.op,
                        &[
                            Literal::F32(a.clone()),
                            operands[1].clone(),
                            Literal::F32(u.clone()),
                        ],
                    )
                };
                add(e[0], e[2])? + add(&x[0], &x[2])?
            }
            Op::Scatter {
                kind: ScatterKind::Replace,
                ..
            } => apply(
                &node.op,
                &[
                    Literal::F32(e[0].clone()),
                    operands[1].clone(),
                    Literal::F32(e[2].clone()),
                ],
            )?,
            Op::Gather(_) => apply(&node.op, &[Literal::F32(e[0].clone()), operands[1].clone()])?,
            // Bilinear: e(a)·|b| + |a|·e(b) + |a|·|b| (the last for the sum's rounding).
            Op::DotGeneral(_) | Op::Convolution(_) => {
                let dot = |a: &ArrayD<f32>, b: &ArrayD<f32>| apply(&node.op, &f32s(&[a, b]));
                dot(e[0], &x[1])? + dot(&x[0], e[1])? + dot(&x[0], &x[1])?
            }
            Op::Select => {
                let branches = f32s(&[e[1], e[2]]);
                apply(
                    &Op::Select,
                    &[
                        operands[0].clone(),
                        branches[0].clone(),
                        branches[1].clone(),
                    ],
                )?
            }
            Op::Convert(_)
            | Op::Broadcast { .. }
            | Op::Reshape(_)
            | Op::Transpose(_)
            | Op::Slice { .. }
            | Op::Pad { .. }
            | Op::Concatenate(_)
            | Op::Reverse(_)
            | Op::ShardingConstraint
            | Op::PropagationBarrier(_) => apply(&node.op, &f32s(&e))?,
            Op::Compare(_) => return Err("a compare with an f32 result".into()),
            // Moves: the operand's (and update's) errors moved alike; starts are exact.
            Op::DynamicSlice(_) | Op::DynamicUpdateSlice => {
                let data = if matches!(node.op, Op::DynamicSlice(_)) {
                    1
                } else {
                    2
                };
                let mut args = f32s(&e[..data]);
                args.extend(operands[data..].iter().map(|&l| l.clone()));
                apply(&node.op, &args)?
            }
            Op::Cumulative { kind, dim, reverse } => {
                let scan = |kind, a: &ArrayD<f32>| {
                    let op = Op::Cumulative {
                        kind,
                        dim: *dim,
                        reverse: *reverse,
                    };
                    apply(&op, &f32s(&[a]))
                };
                match kind {
                    // Like a reduce sum, per prefix.
                    CumulativeKind::Sum => {
                        scan(CumulativeKind::Sum, e[0])? + scan(CumulativeKind::Sum, &x[0])?
                    }
                    // Each prefix product carries each factor's error times the other
                    // factors (at most the product of max(|x|, 1)), and rounds once per
                    // factor, in any order: `M Σe + k |v|`.
                    CumulativeKind::Prod => {
                        let big = scan(CumulativeKind::Prod, &x[0].mapv(|v| v.max(1.0)))?;
                        let count = scan(CumulativeKind::Sum, &x[0].mapv(|_| 1.0))?;
                        big * scan(CumulativeKind::Sum, e[0])? + count * &y
                    }
                    other => panic!("not covered by this test: {other:?}"),
                }
            }
            Op::Argsort { .. } => return Err("an argsort with an f32 result".into()),
            Op::AxisIndex(_)
            | Op::AllReduce { .. }
            | Op::AllGather { .. }
            | Op::ReduceScatter { .. }
            | Op::AllToAll { .. }
            | Op::CollectivePermute { .. }
            | Op::CollectiveShift { .. } => return Err("an SPMD op in a global program".into()),
            other => panic!("not covered by this test: {other:?}"),
        };
        errors.push(error.mapv(|v| if v.is_nan() { f32::INFINITY } else { v.abs() }));
        values.push(value);
    }
    let outputs = program
        .outputs
        .iter()
        .map(|o| values[o.index()].clone())
        .collect();
    let output_errors = program
        .outputs
        .iter()
        .map(|o| errors[o.index()].clone())
        .collect();
    Ok((outputs, output_errors))
}

/// All results of a control-flow op and their error scales: its regions run by
/// [`values_and_errors`] (a branch or trip count follows the values; the generator
/// only makes predicates and conditions that are exact).
fn flow_values_and_errors(
    flow: &Flow,
    values: &[&Literal],
    errors: &[&ArrayD<f32>],
) -> Result<(Vec<Literal>, Vec<ArrayD<f32>>), String> {
    let mut v: Vec<Literal> = values.iter().map(|&l| l.clone()).collect();
    let mut e: Vec<ArrayD<f32>> = errors.iter().map(|&a| a.clone()).collect();
    let truth = |l: &Literal| l.as_bool().and_then(|a| a.iter().next().copied());
    match flow {
        Flow::While { cond, body } => {
            let n = body.outputs.len();
            while truth(&values_and_errors(cond, &v, &e)?.0[0]).ok_or("a bad condition")? {
                let (nv, ne) = values_and_errors(body, &v, &e)?;
                v.splice(..n, nv);
                e.splice(..n, ne);
            }
            v.truncate(n);
            e.truncate(n);
            Ok((v, e))
        }
        Flow::Scan {
            body,
            carried,
            stacked,
            length,
            reverse,
            ..
        } => {
            let (n, k) = (*carried, *stacked);
            let xs: Vec<Literal> = v.drain(n..n + k).collect();
            let xe: Vec<ArrayD<f32>> = e.drain(n..n + k).collect();
            let mut ys: Vec<Vec<(Literal, ArrayD<f32>)>> = Vec::new();
            for step in 0..*length {
                let i = if *reverse { length - 1 - step } else { step };
                let mut args = v[..n].to_vec();
                args.extend(xs.iter().map(|x| index_leading(x, i)));
                args.extend_from_slice(&v[n..]);
                let mut arg_errors = e[..n].to_vec();
                arg_errors.extend(
                    xe.iter()
                        .map(|x| x.index_axis(ndarray::Axis(0), i).to_owned()),
                );
                arg_errors.extend_from_slice(&e[n..]);
                let (mut nv, mut ne) = values_and_errors(body, &args, &arg_errors)?;
                ys.push(nv.split_off(n).into_iter().zip(ne.split_off(n)).collect());
                v.splice(..n, nv);
                e.splice(..n, ne);
            }
            if *reverse {
                ys.reverse();
            }
            v.truncate(n);
            e.truncate(n);
            for (j, &o) in body.outputs[n..].iter().enumerate() {
                let ty = body.ty(o);
                let mut shape = vec![*length];
                shape.extend_from_slice(&ty.shape);
                let column = ys.iter().map(|y| y[j].0.clone());
                v.push(stack(column, &shape, ty.dtype)?);
                let errors = ys.iter().map(|y| Literal::F32(y[j].1.clone()));
                match stack(errors, &shape, DType::F32)? {
                    Literal::F32(a) => e.push(a),
                    _ => return Err("stacked errors are not f32".into()),
                }
            }
            Ok((v, e))
        }
        Flow::Cond { on_true, on_false } => {
            let branch = if truth(&v[0]).ok_or("a bad predicate")? {
                on_true
            } else {
                on_false
            };
            values_and_errors(branch, &v[1..], &e[1..])
        }
        // The generator's bodies only move and sum f32 blocks: the region moves and
        // sums the errors and the magnitudes alike.
        Flow::Manual { .. } => {
            let f32s = |arrays: &[ArrayD<f32>]| -> Vec<Literal> {
                arrays.iter().map(|a| Literal::F32(a.clone())).collect()
            };
            let magnitudes: Vec<ArrayD<f32>> = v.iter().map(magnitude).collect();
            let moved_errors = flow_alone(flow, &f32s(&e))?;
            let moved_magnitudes = flow_alone(flow, &f32s(&magnitudes))?;
            let errors = (moved_errors.iter().zip(&moved_magnitudes))
                .map(|(a, b)| match (a, b) {
                    (Literal::F32(a), Literal::F32(b)) => Ok(a + b),
                    _ => Err("a manual region's errors are not f32".to_string()),
                })
                .collect::<Result<_, _>>()?;
            Ok((flow_alone(flow, &v)?, errors))
        }
        other => Err(format!("no error model for this flow op: {}", other.name())),
    }
}

/// All results of `flow` on `operands`, by the reference interpreter.
fn flow_alone(flow: &Flow, operands: &[Literal]) -> Result<Vec<Literal>, String> {
    let flow = std::sync::Arc::new(flow.clone());
    let mut program = Program::new("flow");
    let location = Location::caller();
    for (index, x) in operands.iter().enumerate() {
        let ty = TensorType::new(x.shape(), x.dtype());
        let p = (program.push_op(Op::Parameter { index, ty }, &[], location))
            .map_err(|e| e.to_string())?;
        program.params.push(p);
    }
    let params = program.params.clone();
    let results = flow.regions()[0].outputs.len();
    for result in 0..results {
        let op = Op::Flow {
            flow: flow.clone(),
            result,
        };
        let r = program
            .push_op(op, &params, location)
            .map_err(|e| e.to_string())?;
        program.outputs.push(r);
    }
    interpret(&program, operands).map_err(|e| e.to_string())
}

/// `x[i]` along the leading dim.
fn index_leading(x: &Literal, i: usize) -> Literal {
    match x {
        Literal::F32(a) => Literal::F32(a.index_axis(ndarray::Axis(0), i).to_owned()),
        Literal::I32(a) => Literal::I32(a.index_axis(ndarray::Axis(0), i).to_owned()),
        Literal::Bool(a) => Literal::Bool(a.index_axis(ndarray::Axis(0), i).to_owned()),
        Literal::BF16(_) | Literal::F16(_) => {
            index_leading(&x.convert(DType::F32), i).convert(x.dtype())
        }
        other => panic!("not covered by this test: {other:?}"),
    }
}

/// `parts` stacked along a new leading dim into a value of `shape`.
fn stack(
    parts: impl Iterator<Item = Literal>,
    shape: &[usize],
    dtype: DType,
) -> Result<Literal, String> {
    let rows: Vec<Literal> = parts
        .map(|p| {
            let mut one = vec![1];
            one.extend(p.shape());
            kernels::eval(
                &Op::Reshape(one.clone()),
                &[&p],
                &TensorType::new(one, dtype),
            )
        })
        .collect::<Result<_, _>>()?;
    if rows.is_empty() {
        return Ok(Literal::full(shape, dtype, 0.0));
    }
    let refs: Vec<&Literal> = rows.iter().collect();
    kernels::eval(
        &Op::Concatenate(0),
        &refs,
        &TensorType::new(shape.to_vec(), dtype),
    )
}

/// `|v|` as f32 (bools as 0 and 1).
fn magnitude(v: &Literal) -> ArrayD<f32> {
    match v {
        Literal::F32(a) => a.mapv(f32::abs),
        Literal::I32(a) => a.mapv(|x| x.unsigned_abs() as f32),
        Literal::Bool(a) => a.mapv(f32::from),
        Literal::BF16(_) | Literal::F16(_) => magnitude(&v.convert(DType::F32)),
        other => panic!("not covered by this test: {other:?}"),
    }
}

/// f32 outputs must agree within [`TOLERANCE`] of each element's error scale; i32 and
/// bool outputs exactly.
fn compare(want: &Literal, got: &Literal, scale: &ArrayD<f32>) -> Result<(), String> {
    if want.shape() != got.shape() {
        return Err(format!("shape {:?} != {:?}", got.shape(), want.shape()));
    }
    match (want, got) {
        (Literal::F32(a), Literal::F32(b)) => {
            for ((index, x), (y, m)) in a.indexed_iter().zip(b.iter().zip(scale)) {
                if x == y || (x.is_nan() && y.is_nan()) {
                    continue;
                }
                let d = (x - y).abs();
                if !d.is_finite() || d > TOLERANCE * m {
                    return Err(format!(
                        "{y} where the reference has {x} at {:?} (error scale {m})",
                        index.slice()
                    ));
                }
            }
            Ok(())
        }
        _ if want == got => Ok(()),
        _ => Err(format!("got {got:?}\nwant {want:?}")),
    }
}

/// An output that cancels exactly is judged against the size of what cancelled: the
/// partitioned `sum(s - mean(s))` differs from the reference by rounding only, which is
/// far more than `1e-4` of the ~0 result, and passes; an error the size of one term
/// fails.
#[test]
fn exact_cancellation_is_judged_against_its_terms() {
    let b = Builder::new("cancel");
    let x = b.parameter("x", [37], DType::F32);
    let x = x.annotate("(data)".parse().expect("a sharding"));
    let s = &x * 1000.3;
    let centered = &s - &s.mean(&[0]);
    let program = b.finish(&[&centered.sum(&[0])]).expect("well typed");
    let mesh = Mesh::new([("data", 4)]).expect("a mesh");
    let inputs = vec![uniform_f32(
        &mut Xoshiro256PlusPlus::seed_from_u64(3),
        &[37],
        -2.0,
        2.0,
    )];
    let want = interpret(&program, &inputs).expect("the reference runs");
    let exe = compile(&program, &mesh).expect("compiles");
    let threads = ThreadMesh::new(mesh).expect("threads");
    let got = exe.run(&threads, &inputs).expect("runs");
    let scales = error_scales(&program, &inputs).expect("error scales");
    let (w, g) = (want[0].as_f32().unwrap()[[]], got[0].as_f32().unwrap()[[]]);
    assert!(
        (w - g).abs() > 1e-4,
        "rounding must differ for this test to mean anything: {w} vs {g}"
    );
    compare(&want[0], &got[0], &scales[0]).expect("rounding differences pass");
    let one_term = inputs[0].as_f32().unwrap()[[0]].abs() * 1000.3;
    let wrong = Literal::F32(ndarray::arr0(g + one_term).into_dyn());
    assert!(
        compare(&want[0], &wrong, &scales[0]).is_err(),
        "an error of one term fails"
    );
}

/// Closed annotated dims must come out exactly as annotated; open ones may only gain
/// minor axes; explicitly replicated axes stay unused. Compared digit by digit: both
/// shardings are cut at each other's sub-axis boundaries first (`x` annotated as
/// `(x:(1)2, x:(2)2)` is kept).
fn check_annotations(propagated: &Program, mesh: &Mesh) -> Result<(), String> {
    for v in propagated.values() {
        let node = propagated.node(v);
        let (Some(ann), Some(s)) = (&node.annotation, &node.sharding) else {
            continue;
        };
        let parts = [ann.parts(mesh), s.parts(mesh)].concat();
        let (ann_cut, s_cut) = (ann.cut_at(mesh, &parts), s.cut_at(mesh, &parts));
        for (d, (a, got)) in ann_cut.dims.iter().zip(&s_cut.dims).enumerate() {
            let kept = if a.closed {
                got.axes == a.axes
            } else {
                got.axes.starts_with(&a.axes)
            };
            if !kept {
                return Err(format!("{v} dim {d}: annotated {ann}, propagated {s}"));
            }
        }
        if let Some(a) = s_cut
            .axes()
            .find(|a| ann_cut.replicated.iter().any(|r| r == a))
        {
            return Err(format!(
                "{v}: annotated {ann} replicated, propagated {s} uses {a}"
            ));
        }
    }
    Ok(())
}

/// What the cases exercised: ops whose propagated result is split, collectives and
/// partitioner warnings (printed by the test with `--nocapture`).
#[derive(Default)]
struct Coverage {
    cases: usize,
    multi_device: usize,
    annotated: usize,
    split_values: BTreeMap<&'static str, usize>,
    collectives: BTreeMap<&'static str, usize>,
    warnings: usize,
}

impl Coverage {
    fn record(&mut self, mesh: &Mesh, exe: &Executable) {
        self.cases += 1;
        self.multi_device += usize::from(mesh.num_devices() > 1);
        for node in &exe.propagated().nodes {
            self.annotated += usize::from(node.annotation.is_some());
            if node.sharding.as_ref().is_some_and(|s| !s.is_replicated()) {
                *self.split_values.entry(node.op.name()).or_default() += 1;
            }
        }
        for (kind, (count, _)) in exe.spmd().collectives().by_kind {
            *self.collectives.entry(kind.name()).or_default() += count;
        }
        self.warnings += exe.spmd().warnings.len();
    }
}

/// Compiles, runs and compares one case; `Err` describes the first failure (panics in
/// the library are failures too).
fn run_case(program: &Program, mesh: &Mesh, coverage: Option<&mut Coverage>) -> Result<(), String> {
    let inputs = inputs_for(program);
    let want = interpret(program, &inputs).map_err(|e| format!("reference failed: {e}"))?;
    let scales = error_scales(program, &inputs).map_err(|e| format!("error scales: {e}"))?;
    let outcome = catch_unwind(AssertUnwindSafe(|| -> Result<Executable, String> {
        let exe = compile(program, mesh).map_err(|e| format!("compile: {e}"))?;
        check_annotations(exe.propagated(), mesh)
            .map_err(|e| format!("annotation not kept: {e}\n{}", exe.propagated()))?;
        let threads = ThreadMesh::new(mesh.clone()).map_err(|e| format!("mesh: {e}"))?;
        let got = exe
            .run(&threads, &inputs)
            .map_err(|e| format!("run: {e}\n{}", exe.report()))?;
        for (k, ((w, g), m)) in want.iter().zip(&got).zip(&scales).enumerate() {
            compare(w, g, m).map_err(|e| format!("output {k}: {e}\n{}", exe.report()))?;
        }
        Ok(exe)
    }));
    let exe = outcome.unwrap_or_else(|p| {
        let msg = p
            .downcast_ref::<String>()
            .cloned()
            .or_else(|| p.downcast_ref::<&str>().map(|s| s.to_string()))
            .unwrap_or_default();
        Err(format!("panic: {msg}"))
    })?;
    if let Some(c) = coverage {
        c.record(mesh, &exe);
    }
    Ok(())
}

// ---- shrinking ------------------------------------------------------------------------

/// What a node becomes in a shrunk program.
#[derive(Clone, Copy, PartialEq)]
enum Edit {
    Keep,
    /// Dropped (only for nodes nothing uses).
    Remove,
    /// A fresh parameter of the same type (keeps the annotation): cuts off the node's
    /// inputs.
    Parameter,
    /// Replaced by another value of the same type.
    Alias(ValueId),
    /// Kept without its annotation.
    Unannotate,
}

/// `program` with `edits` applied, returning `outputs`, parameters renumbered. Nodes
/// are kept unless removed, except that `dead_code` drops every node that neither an
/// output nor an annotated node needs. (Dead annotated nodes still steer propagation,
/// so they are only dropped by an explicit edit.)
fn rebuild(program: &Program, edits: &[Edit], outputs: &[ValueId], dead_code: bool) -> Program {
    let resolve = |mut v: ValueId| {
        while let Edit::Alias(to) = edits[v.index()] {
            v = to;
        }
        v
    };
    let mut live = vec![false; program.nodes.len()];
    for &o in outputs {
        live[resolve(o).index()] = true;
    }
    for v in program.values() {
        let root = !dead_code || program.node(v).annotation.is_some();
        if root
            && matches!(
                edits[v.index()],
                Edit::Keep | Edit::Unannotate | Edit::Parameter
            )
        {
            live[v.index()] = true;
        }
    }
    for v in program.values().collect::<Vec<_>>().into_iter().rev() {
        if live[v.index()] && matches!(edits[v.index()], Edit::Keep | Edit::Unannotate) {
            for &o in &program.node(v).operands {
                live[resolve(o).index()] = true;
            }
        }
    }
    let mut out = Program::new(program.name.clone());
    let mut map: Vec<Option<ValueId>> = vec![None; program.nodes.len()];
    for v in program.values() {
        if !live[v.index()] {
            continue;
        }
        let node = program.node(v);
        let mut new = node.clone();
        match edits[v.index()] {
            Edit::Parameter => {
                new.op = Op::Parameter {
                    index: 0,
                    ty: node.ty.clone(),
                };
                new.operands.clear();
            }
            Edit::Unannotate => new.annotation = None,
            _ => {}
        }
        for o in &mut new.operands {
            *o = map[resolve(*o).index()].expect("live operands are rebuilt first");
        }
        if let Op::Parameter { index, .. } = &mut new.op {
            *index = out.params.len();
            if new.name.is_none() {
                new.name = Some(format!("cut{}_{}", v.index(), program.nodes.len()));
            }
        }
        let is_param = matches!(new.op, Op::Parameter { .. });
        let id = out.push(new);
        if is_param {
            out.params.push(id);
        }
        map[v.index()] = Some(id);
    }
    out.outputs = outputs
        .iter()
        .map(|&o| map[resolve(o).index()].expect("outputs are live"))
        .collect();
    out
}

/// The kind of a failure (the first word of its message: compile, annotation, run,
/// output, panic), so that shrinking keeps the failure it started from rather than
/// drifting to another one.
fn kind(failure: &str) -> &str {
    failure.split([' ', ':']).next().unwrap_or_default()
}

/// Smaller variants of `program`: without dead code, without one output, and with one
/// node removed, cut into a parameter, bypassed, or stripped of its annotation.
fn shrink_candidates(program: &Program) -> Vec<Program> {
    let keep = vec![Edit::Keep; program.nodes.len()];
    let mut candidates = vec![rebuild(program, &keep, &program.outputs, true)];
    if program.outputs.len() > 1 {
        for i in 0..program.outputs.len() {
            let mut outputs = program.outputs.clone();
            outputs.remove(i);
            candidates.push(rebuild(program, &keep, &outputs, false));
        }
    }
    let users = program.users();
    for v in program.values().collect::<Vec<_>>().into_iter().rev() {
        let node = program.node(v);
        let mut edits: Vec<Edit> = Vec::new();
        if users[v.index()].is_empty() && !program.outputs.contains(&v) {
            edits.push(Edit::Remove);
        }
        if matches!(node.op, Op::ShardingConstraint | Op::PropagationBarrier(_)) {
            edits.push(Edit::Alias(node.operands[0]));
        } else if node.annotation.is_some() {
            edits.push(Edit::Unannotate);
        }
        if !matches!(node.op, Op::Parameter { .. }) {
            edits.push(Edit::Parameter);
            edits.extend(
                (node.operands.iter())
                    .filter(|&&o| program.ty(o) == &node.ty)
                    .map(|&o| Edit::Alias(o)),
            );
        }
        for e in edits {
            let mut all = keep.clone();
            all[v.index()] = e;
            candidates.push(rebuild(program, &all, &program.outputs, false));
        }
    }
    let size = |p: &Program| (p.nodes.len(), annotations(p), p.outputs.len());
    candidates.retain(|c| size(c) < size(program));
    candidates
}

/// Greedily takes smaller variants that fail in the same way until none does.
fn shrink(mut program: Program, mesh: &Mesh, failure: &str) -> Program {
    while let Some(smaller) = shrink_candidates(&program)
        .into_iter()
        .find(|c| run_case(c, mesh, None).is_err_and(|e| kind(&e) == kind(failure)))
    {
        program = smaller;
    }
    program
}

fn annotations(p: &Program) -> usize {
    p.nodes.iter().filter(|n| n.annotation.is_some()).count()
}

// ---- the property ---------------------------------------------------------------------

fn env_or(name: &str, default: u64) -> u64 {
    std::env::var(name)
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(default)
}

/// Cases run by default.
const CASES: u64 = 1500;
/// The default first seed.
const FIRST_SEED: u64 = 1;
/// The default bound on generated steps per program.
const MAX_STEPS: usize = 15;

/// Every op kind of a global program is in some case the default run generates.
#[test]
fn covers_every_op_kind() {
    let mut kinds = BTreeSet::new();
    let mut narrow = BTreeSet::new();
    for seed in FIRST_SEED..FIRST_SEED + CASES {
        let (program, _) = random_case(seed, MAX_STEPS);
        kinds.extend(program.nodes.iter().map(|n| n.op.kind()));
        let dtypes = program.nodes.iter().map(|n| n.ty.dtype.to_string());
        narrow.extend(dtypes.filter(|d| d.ends_with("f16")));
    }
    assert_eq!(narrow, BTreeSet::from(["bf16".into(), "f16".into()]));
    let missing: Vec<OpKind> = (OpKind::ALL.iter().copied())
        .filter(|k| !k.is_spmd_only() && !kinds.contains(k))
        .collect();
    let unexpected: Vec<&OpKind> = kinds.iter().filter(|k| k.is_spmd_only()).collect();
    assert!(
        missing.is_empty() && unexpected.is_empty(),
        "the generator has no case for {missing:?}; generates SPMD ops {unexpected:?}"
    );
}

/// Differentiated cases: scans under random remat policies.
const GRADIENT_CASES: u64 = 120;

/// Scans under random remat policies, differentiated: for each of `GRADIENT_CASES` seeds,
/// the generator's scan ([`Gen::scan_loop`]: a random policy, direction, captured weight
/// and constraint) over a random f32 value on a random mesh, the loss the sum of the
/// squares of the last carry and of the stacked outputs, its gradient with respect to
/// every input; the partitioned gradient program must equal the reference interpreter
/// (as `random_programs_on_random_meshes` checks, shrinking a failure), and every
/// policy must occur.
#[test]
fn gradients_of_scans_under_random_remat_policies() {
    let mut policies = BTreeSet::new();
    let mut failures = Vec::new();
    for seed in 1..=GRADIENT_CASES {
        let mut rng = Xoshiro256PlusPlus::seed_from_u64(seed);
        let mesh = random_mesh(&mut rng);
        let annotate_rate = rng.random_range(0..5);
        let b = Builder::new(format!("gradient{seed}"));
        let mut g = Gen::new(&mut rng, &b, &mesh, annotate_rate);
        let rank = 2 + g.rng.random_range(0..2);
        let dims = shape(g.rng, rank);
        let a = g.parameter(dims, DType::F32);
        let (carry, ys) = g.scan_loop(&a);
        let square_sum = |t: &Tensor| t.mul(t).sum(&(0..t.rank() as isize).collect::<Vec<_>>());
        let loss = square_sum(&carry).add(&square_sum(&ys));
        let forward = b
            .finish(&[&loss])
            .unwrap_or_else(|e| panic!("seed {seed}: the generator built an ill-typed scan: {e}"));
        for node in &forward.nodes {
            if let Op::Flow { flow, .. } = &node.op
                && let Flow::Scan { remat, .. } = flow.as_ref()
            {
                policies.insert(remat.name());
            }
        }
        let wrt: Vec<usize> = (0..forward.params.len()).collect();
        let program = grad(&forward, 0, &wrt)
            .unwrap_or_else(|e| panic!("seed {seed}: no gradient: {e}\n{forward}"));
        if let Err(e) = run_case(&program, &mesh, None) {
            let small = shrink(program.clone(), &mesh, &e);
            eprintln!(
                "FAILED gradient seed {seed} on mesh {mesh}: {e}\n{program}\n-- shrunk to --\n{small}\n"
            );
            failures.push(seed);
        }
    }
    assert!(failures.is_empty(), "failing seeds: {failures:?}");
    assert_eq!(
        policies,
        BTreeSet::from([
            "nothing_saveable",
            "dots_saveable",
            "everything_saveable",
            "save_only_these_names"
        ])
    );
}

/// Runs `PIPELINE_CASES` (default 1500, ~12 s in debug) cases from `PIPELINE_SEED`
/// (default 1); shrinks and prints the first failure. `PIPELINE_KEEP_GOING=1` reports
/// every failure; `PIPELINE_PRINT=1` prints every case and its compiled form;
/// `PIPELINE_MAX_STEPS` (default 15) bounds the generated ops per program.
#[test]
fn random_programs_on_random_meshes() {
    let cases = env_or("PIPELINE_CASES", CASES);
    let first = env_or("PIPELINE_SEED", FIRST_SEED);
    let max_steps = env_or("PIPELINE_MAX_STEPS", MAX_STEPS as u64) as usize;
    let keep_going = std::env::var("PIPELINE_KEEP_GOING").is_ok();
    let mut failures = Vec::new();
    let mut coverage = Coverage::default();
    for seed in first..first + cases {
        let (program, mesh) = random_case(seed, max_steps);
        if std::env::var("PIPELINE_PRINT").is_ok() {
            eprintln!("seed {seed} on {mesh}\n{program}");
            if let Ok(exe) = compile(&program, &mesh) {
                eprintln!("{}", exe.report());
            }
        }
        if let Err(e) = run_case(&program, &mesh, Some(&mut coverage)) {
            let small = shrink(program.clone(), &mesh, &e);
            let why = run_case(&small, &mesh, None).err().unwrap_or_default();
            eprintln!(
                "FAILED seed {seed} on mesh {mesh}: {e}\n{program}\n-- shrunk to --\n{small}\n{why}\n"
            );
            failures.push(seed);
            if !keep_going {
                break;
            }
        }
    }
    eprintln!(
        "{} cases passed ({} on several devices), {} annotated values\nsplit results by op: {:?}\ncollectives: {:?}\npartitioner warnings: {}",
        coverage.cases,
        coverage.multi_device,
        coverage.annotated,
        coverage.split_values,
        coverage.collectives,
        coverage.warnings
    );
    assert!(failures.is_empty(), "failing seeds: {failures:?}");
}
