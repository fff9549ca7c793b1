//! Reverse-mode automatic differentiation as a program transformation: [`grad`] appends
//! to a program the backward pass that computes the gradient of a scalar loss with
//! respect to chosen parameters, in the same primitive ops, so the result propagates,
//! partitions and runs like any program.
//!
//! - `sweep`: the generic reverse sweep (activity, cotangent accumulation, outputs).
//! - `registry`: one vector-Jacobian rule per primitive op, in one exhaustive match.
//! - `flow`: the rules of control flow (`scan`, `cond`), whose backward regions are
//!   the VJPs of the forward regions.
//! - `remat`: a scan body's VJP reading the forward values its remat policy saves.
//! - `emit`: appends typed nodes located at the forward node they come from.
//!
//! Rules and conventions (the registry's documentation has the details):
//! - unary: `negate`, `abs` (`sign(x)`, 0 at 0), `exponential`, `log`, `sqrt`, `rsqrt`,
//!   `tanh`, `logistic`, `sine`, `cosine`, `erf`; `not` and `is_finite` have no
//!   gradient; `floor`, `ceil`, `round` and `sign` are piecewise constant: their
//!   results are constants of the sweep (JAX's zero derivative);
//! - binary: `add`, `subtract`, `multiply`, `divide`, `power`, `remainder` (both
//!   operands), `maximum`/`minimum` (ties split the cotangent in halves, as JAX's
//!   `lax.max`); `and`/`or` have none;
//! - `select`: the cotangent goes to the chosen branch, zeros to the other; none to the
//!   predicate or through `compare`;
//! - `convert`: identity from f32 to f32; no gradient to or from i32 and bool;
//! - `constant`, `iota`: none; `random_bits`: none (integer bits of an integer key:
//!   a draw is a constant of the sweep, so `dropout` passes the cotangent through the
//!   kept elements only);
//! - `broadcast` sums over the broadcast dims (and reshapes back size-1 dims);
//!   `reshape` reshapes back; `transpose` applies the inverse permutation;
//! - `reduce` sum broadcasts back; `reduce` max/min sends the cotangent to the positions
//!   equal to the result, shared equally among ties;
//! - `dot_general`: two `dot_general`s of the cotangent with the other operand, each
//!   transposed to restore the operand's dim order (batch dims included);
//! - `slice` pads with zeros (interior `stride - 1`); `pad` slices the cotangent (the
//!   padding value gets the sum over the padded positions); `concatenate` slices;
//! - `sharding_constraint`: the cotangent gets a `sharding_constraint` with the same
//!   annotation;
//! - `dynamic_slice` writes the cotangent into zeros with `dynamic_update_slice` at the
//!   same starts; `dynamic_update_slice` gives the operand the cotangent with the window
//!   zeroed and the update the window (`dynamic_slice`); starts get none;
//! - `cumsum`: the reversed `cumsum` of the cotangent; `cumprod`: a division-free
//!   `O(n^2)` composite per lane (exact where elements are 0);
//! - `argsort` (an i32 result) passes no gradient, like `compare`;
//! - `axis_index` and the collectives: [`crate::Error::NotDifferentiable`]
//!   (they only exist in partitioned programs);
//! - `scan` and `fori_loop`: the forward scan also stacks the carried values each
//!   iteration starts from; the backward pass is a scan the other way whose body
//!   recomputes the forward body from them and runs its VJP (JAX's `scan` under
//!   `jax.checkpoint`), reading instead the values its [`crate::ir::Remat`] policy
//!   saves (stacked by the forward scan too); `cond`: a `cond` of the branches' VJPs;
//! - `while` (a run-time trip count): [`crate::Error::NotDifferentiable`], as in JAX.

mod flow;
mod indexing;
mod manual;
mod registry;
mod remat;
mod sweep;

pub use registry::is_differentiable;
pub use sweep::grad;
