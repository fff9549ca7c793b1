//! Initial parameter values by name, made where they live: an [`Initializer`] maps
//! name patterns to an [`Init`] and draws every element from a counter-based generator
//! keyed by `(seed, name, global index)`, so each device can make just its block of a
//! sharded weight ([`Initializer::block`]) and the blocks assemble to exactly the array
//! an unsharded initialisation makes ([`Initializer::global`]), bit for bit.

use super::names::glob_match;
use crate::error::{Error, InputProblem, Result};
use crate::ir::Literal;
use ndarray::{ArrayD, IxDyn};

/// How one parameter's elements are drawn.
#[derive(Debug, Clone, PartialEq)]
#[non_exhaustive]
pub enum Init {
    /// All zero.
    Zeros,
    /// All one (norm scales).
    Ones,
    /// Normal with mean 0 and standard deviation `std`.
    Normal {
        /// The standard deviation, >= 0.
        std: f32,
    },
    /// Uniform in `[-bound, bound)`.
    Uniform {
        /// The half-width, >= 0.
        bound: f32,
    },
    /// Uniform in `±scale / sqrt(fan_in)` where `fan_in` is the product of the sizes of
    /// dims `in_dims` (1 if empty): LeCun's scaling, e.g. `in_dims: vec![0]` for a
    /// `[in, out]` matrix, `vec![1]` for one stacked `[layers, in, out]`.
    FanIn {
        /// The bound's scale (1 for LeCun-uniform up to the sqrt(3)).
        scale: f32,
        /// The input dims.
        in_dims: Vec<usize>,
    },
    /// Normal with mean 0 and standard deviation `1 / sqrt(fan_in)`, `fan_in` as in
    /// [`Init::FanIn`]: variance `1 / fan_in` (LeCun-normal without truncation; μP's
    /// hidden weights).
    NormalFanIn {
        /// The input dims.
        in_dims: Vec<usize>,
    },
}

impl Init {
    /// Whether this rule can draw a parameter shaped `shape`: its scale, bound or
    /// standard deviation finite and not negative, a fan-in rule's dims distinct dims
    /// of `shape`; else what is wrong.
    fn check(&self, shape: &[usize]) -> std::result::Result<(), String> {
        let (what, value) = match self {
            Init::Zeros | Init::Ones | Init::NormalFanIn { .. } => ("", 0.0),
            Init::Normal { std } => ("standard deviation", *std),
            Init::Uniform { bound } => ("bound", *bound),
            Init::FanIn { scale, .. } => ("scale", *scale),
        };
        if !value.is_finite() || value < 0.0 {
            return Err(format!(
                "the initializer's {what} is {value}: it must be finite and not negative"
            ));
        }
        if let Init::FanIn { in_dims, .. } | Init::NormalFanIn { in_dims } = self {
            for (k, &d) in in_dims.iter().enumerate() {
                if d >= shape.len() {
                    return Err(format!(
                        "the fan-in initializer's input dim {d} is not a dim of the \
                         parameter's shape {shape:?} (rank {})",
                        shape.len()
                    ));
                }
                if in_dims[..k].contains(&d) {
                    return Err(format!("the fan-in initializer names input dim {d} twice"));
                }
            }
        }
        Ok(())
    }

    /// [`Init::FanIn`] with scale 1: uniform in `±1 / sqrt(fan_in)`, the fan-in the
    /// product of the sizes of dims `in_dims`.
    pub fn fan_in(in_dims: &[usize]) -> Self {
        Init::FanIn {
            scale: 1.0,
            in_dims: in_dims.to_vec(),
        }
    }
}

/// Initial values for a model's parameters by name: the first rule whose glob pattern
/// ([`glob_match`]) matches a parameter's name decides its [`Init`]; `seed` keys the
/// generator.
#[derive(Debug, Clone, PartialEq)]
pub struct Initializer {
    /// The generator's seed.
    pub seed: u64,
    /// `(pattern, init)`, tried in order.
    pub rules: Vec<(String, Init)>,
}

impl Initializer {
    /// No rules yet, seeded with `seed`.
    pub fn new(seed: u64) -> Self {
        Initializer {
            seed,
            rules: Vec::new(),
        }
    }

    /// The same initializer with one more rule, tried after the others.
    pub fn rule(mut self, pattern: &str, init: Init) -> Self {
        self.rules.push((pattern.to_string(), init));
        self
    }

    /// The rule for parameter `name`: its [`Init`], or an [`Error::TrainerInput`]
    /// when no pattern matches it.
    pub fn init_of(&self, name: &str) -> Result<&Init> {
        self.rules
            .iter()
            .find(|(pattern, _)| glob_match(pattern, name))
            .map(|(_, init)| init)
            .ok_or_else(|| Error::TrainerInput {
                name: name.to_string(),
                problem: InputProblem::NoInitRule,
            })
    }

    /// The whole f32 array of parameter `name` shaped `shape`.
    pub fn global(&self, name: &str, shape: &[usize]) -> Result<Literal> {
        let whole: Vec<(usize, usize)> = shape.iter().map(|&n| (0, n)).collect();
        self.block(name, shape, &whole)
    }

    /// The block `block` (`(offset, len)` per dim, as
    /// [`Sharding::device_block`](crate::sharding::Sharding::device_block) gives it) of
    /// parameter `name`'s f32 array shaped `shape`, made without the rest of the array:
    /// each element is drawn from `(seed, name, its row-major index in the whole
    /// array)`.
    ///
    /// Errors ([`Error::TrainerInput`] naming the parameter): no rule matches it; its
    /// rule's parameter is NaN, infinite or negative; a fan-in rule names a dim (or a
    /// dim twice) that the parameter's shape does not have.
    pub fn block(&self, name: &str, shape: &[usize], block: &[(usize, usize)]) -> Result<Literal> {
        let init = self.init_of(name)?;
        init.check(shape).map_err(|reason| Error::TrainerInput {
            name: name.to_string(),
            problem: InputProblem::Invalid { reason },
        })?;
        let key = mix(self.seed ^ mix(fnv1a(name)));
        let sizes: Vec<usize> = block.iter().map(|b| b.1).collect();
        let count: usize = sizes.iter().product();
        let mut values = Vec::with_capacity(count);
        let mut index = vec![0usize; shape.len()];
        for _ in 0..count {
            let global = (index.iter().zip(block).zip(shape))
                .fold(0u64, |acc, ((&i, &(offset, _)), &n)| {
                    acc * n as u64 + (offset + i) as u64
                });
            values.push(draw(init, shape, key, global));
            // The next index of the block, row-major.
            for d in (0..index.len()).rev() {
                index[d] += 1;
                if index[d] < sizes[d] {
                    break;
                }
                index[d] = 0;
            }
        }
        let array =
            ArrayD::from_shape_vec(IxDyn(&sizes), values).map_err(|e| Error::TrainerInput {
                name: name.to_string(),
                problem: InputProblem::Invalid {
                    reason: e.to_string(),
                },
            })?;
        Ok(Literal::F32(array))
    }
}

/// Element `index` of a parameter shaped `shape` under `init`, from the parameter's
/// generator `key`.
fn draw(init: &Init, shape: &[usize], key: u64, index: u64) -> f32 {
    // Two independent uniforms in (0, 1) from counters 2i and 2i + 1.
    let uniform = |stream: u64| {
        let bits = mix(key ^ mix(2 * index + stream));
        ((bits >> 11) as f64 + 0.5) / (1u64 << 53) as f64
    };
    let symmetric = |bound: f32| ((2.0 * uniform(0) - 1.0) * f64::from(bound)) as f32;
    // Box-Muller.
    let normal = |std: f64| {
        let radius = (-2.0 * uniform(0).ln()).sqrt();
        let angle = 2.0 * std::f64::consts::PI * uniform(1);
        (radius * angle.cos() * std) as f32
    };
    match init {
        Init::Zeros => 0.0,
        Init::Ones => 1.0,
        Init::Uniform { bound } => symmetric(*bound),
        Init::FanIn { scale, in_dims } => symmetric(scale / fan_in(shape, in_dims).sqrt()),
        Init::Normal { std } => normal(f64::from(*std)),
        Init::NormalFanIn { in_dims } => normal(1.0 / f64::from(fan_in(shape, in_dims)).sqrt()),
    }
}

/// The product of the sizes of `shape`'s dims `in_dims` (checked to be dims of `shape`
/// by [`Init::check`]; a missing one would count 1), at least 1.
fn fan_in(shape: &[usize], in_dims: &[usize]) -> f32 {
    let fan_in: usize = (in_dims.iter())
        .map(|&d| shape.get(d).copied().unwrap_or(1))
        .product();
    fan_in.max(1) as f32
}

/// SplitMix64's finaliser: a bijective 64-bit mix (also [`Dataset::order`]'s
/// generator).
///
/// [`Dataset::order`]: super::Dataset::order
pub(super) fn mix(x: u64) -> u64 {
    let mut z = x.wrapping_add(0x9E37_79B9_7F4A_7C15);
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^ (z >> 31)
}

/// FNV-1a of `text`: the parameter name's part of the key.
fn fnv1a(text: &str) -> u64 {
    text.bytes().fold(0xCBF2_9CE4_8422_2325, |h, b| {
        (h ^ u64::from(b)).wrapping_mul(0x0100_0000_01B3)
    })
}
