//! A decoder-only Transformer language model with GSPMD's 2-D sharding (paper section
//! 5.1): the batch over `data`; attention heads and the FFN's hidden dim over `model`;
//! weights split over both axes, so each device stores `1/(data*model)` of every weight,
//! gathers it just before use and reduce-scatters its gradient (weight-update sharding).
//!
//! Tokens enter as `i32` ids and are looked up in an embedding table split over `model`
//! by vocabulary (Megatron's vocabulary-parallel embedding: each device looks up the ids
//! in its range, then one all-reduce); the logits and the cross-entropy stay split by
//! vocabulary too. The loss is weighted per position so that positions whose target is
//! unpredictable can be left out.
//!
//! [`axlearn`] is the same model under axlearn's mesh rule (`data`, `fsdp`, `model`).

use crate::ir::{DType, Tensor, einsum, random};
use crate::params::Stacked;

pub mod axlearn;

/// `scores: [B, H, S, T]` with every key after its query (`t > s`) set to -1e9.
pub fn causal(scores: &Tensor) -> Tensor {
    let b = scores.builder();
    let (s, t) = (scores.shape()[2], scores.shape()[3]);
    let query = b.iota([s, t], 0, DType::I32);
    let key = b.iota([s, t], 1, DType::I32);
    query.ge(&key).select(scores, &scores.scalar_like(-1e9))
}

/// Causal multi-head self-attention over `x: [B, S, D]` with `wq, wk, wv: [D, H, K]`
/// and `wo: [H, K, D]`.
pub fn attention(x: &Tensor, wq: &Tensor, wk: &Tensor, wv: &Tensor, wo: &Tensor) -> Tensor {
    attend(
        x,
        [wq, wk, wv, wo],
        |t| t.clone(),
        inverse_sqrt_head_dim(wq),
    )
}

/// [`attention()`] with rotary positions: queries and keys pass through [`rotary()`], so
/// that scores depend on the distance between query and key (no position table needed).
pub fn rotary_attention(x: &Tensor, wq: &Tensor, wk: &Tensor, wv: &Tensor, wo: &Tensor) -> Tensor {
    attend(x, [wq, wk, wv, wo], rotary, inverse_sqrt_head_dim(wq))
}

/// `1 / sqrt(K)` for `wq: [D, H, K]`: the usual attention scale.
fn inverse_sqrt_head_dim(wq: &Tensor) -> f32 {
    1.0 / (wq.shape()[2] as f32).sqrt()
}

/// Rotary position embedding (RoFormer, Su et al. 2021) of `x: [B, H, S, K]`, `K` even:
/// at position `s`, the pair of elements `i` and `i + K/2` is rotated by the angle
/// `s * 10000^(-2i/K)`.
pub fn rotary(x: &Tensor) -> Tensor {
    let (seq, k) = (x.shape()[2], x.shape()[3]);
    let half = k / 2;
    let b = x.builder();
    let position = b.iota([seq, half], 0, DType::F32);
    let frequency = (b.iota([seq, half], 1, DType::F32) * (-2.0 * 10000f32.ln() / k as f32)).exp();
    let angle = &position * &frequency;
    let spread = |t: Tensor| t.broadcast_in_dim([x.shape()[0], x.shape()[1], seq, half], &[2, 3]);
    let (cos, sin) = (spread(angle.cos()), spread(angle.sin()));
    let (x1, x2) = (x.slice_axis(-1, 0, half), x.slice_axis(-1, half, k));
    let first = &(&x1 * &cos) - &(&x2 * &sin);
    let second = &(&x2 * &cos) + &(&x1 * &sin);
    b.concatenate(&[&first, &second], 3)
}

/// Causal multi-head self-attention over `x: [B, S, D]` with `[wq, wk, wv, wo]` as in
/// [`attention()`], `position` applied to the queries and keys ([`rotary()`], or the
/// identity) and the scores `q . k` multiplied by `scale` (`1 / sqrt(K)` usually; μP's
/// is `1 / K`).
pub fn attend(
    x: &Tensor,
    [wq, wk, wv, wo]: [&Tensor; 4],
    position: impl Fn(&Tensor) -> Tensor,
    scale: f32,
) -> Tensor {
    let q = position(&einsum("bsd,dhk->bhsk", x, wq)).named("q");
    let k = position(&einsum("btd,dhk->bhtk", x, wk));
    let v = einsum("btd,dhk->bhtk", x, wv);
    let scores = causal(&(einsum("bhsk,bhtk->bhst", &q, &k) * scale)).named("scores");
    let context = einsum("bhst,bhtk->bhsk", &scores.softmax(-1), &v).named("context");
    einsum("bhsk,hkd->bsd", &context, wo)
}

/// RMSNorm without a gain (Zhang & Sennrich 2019): `x / sqrt(mean(x^2) + eps)` along
/// the last dim.
pub fn rms_norm(x: &Tensor, eps: f32) -> Tensor {
    let kept: Vec<usize> = (0..x.rank() - 1).collect();
    let rms = ((x * x).mean(&[-1]) + eps).sqrt();
    x / &rms.broadcast_in_dim(x.shape().to_vec(), &kept)
}

/// The mean over positions, weighted by `weights: [B, S]`, of the cross-entropy of
/// `logits: [B, S, V]` (f32) against the ids `targets: [B, S]`.
pub fn weighted_cross_entropy(logits: &Tensor, targets: &Tensor, weights: &Tensor) -> Tensor {
    let vocab = logits.shape()[2];
    let log_p = (&logits.log_softmax(-1) * &one_hot(targets, vocab)).sum(&[-1]);
    let total = (&log_p * weights).sum(&[0, 1]);
    -(total / weights.sum(&[0, 1]))
}

/// `t` converted to `dtype` (`t` itself if it has that dtype: no convert op).
pub fn cast(t: &Tensor, dtype: DType) -> Tensor {
    if t.dtype() == dtype {
        t.clone()
    } else {
        t.convert(dtype)
    }
}

/// `one_hot(ids)[.., v] = 1.0` where `ids[..] == v`, for `v < vocab`.
pub fn one_hot(ids: &Tensor, vocab: usize) -> Tensor {
    let mut shape = ids.shape().to_vec();
    shape.push(vocab);
    let rank = ids.rank();
    let classes = ids.builder().iota(shape.clone(), rank, DType::I32);
    let dims: Vec<usize> = (0..rank).collect();
    classes
        .eq(&ids.broadcast_in_dim(shape, &dims))
        .convert(DType::F32)
}

/// One layer's attention weights: `wq, wk, wv: [D, H, K]`, `wo: [H, K, D]`, with the
/// paper's 2-D finalized sharding (heads over `model`, the model dim over `data`).
#[crate::params(mesh = (data, model))]
pub struct Attention {
    /// Queries.
    #[shard(data, model, _)]
    #[init(fan_in(0))]
    pub wq: Tensor<D, H, K>,
    /// Keys.
    #[shard(data, model, _)]
    #[init(fan_in(0))]
    pub wk: Tensor<D, H, K>,
    /// Values.
    #[shard(data, model, _)]
    #[init(fan_in(0))]
    pub wv: Tensor<D, H, K>,
    /// The output projection.
    #[shard(model, _, data)]
    #[init(fan_in(0, 1))]
    pub wo: Tensor<H, K, D>,
}

/// One layer's feed-forward weights `w1: [D, F]`, `w2: [F, D]` (the hidden dim over
/// `model`, the model dim over `data`).
#[crate::params(mesh = (data, model))]
pub struct Ffn {
    /// Into the hidden dim.
    #[shard(data, model)]
    #[init(fan_in(0))]
    pub w1: Tensor<D, F>,
    /// Out of the hidden dim.
    #[shard(model, data)]
    #[init(fan_in(0))]
    pub w2: Tensor<F, D>,
}

/// One Transformer layer's weights: `attn.{wq,wk,wv,wo}`, `ffn.{w1,w2}`.
#[crate::params(mesh = (data, model))]
pub struct Block {
    /// Self-attention.
    pub attn: Attention,
    /// Feed-forward.
    pub ffn: Ffn,
}

/// `L` layers stacked over a leading dim: `layers.attn.wq: [L, D, H, K]`, ...
#[crate::params(mesh = (data, model))]
pub struct Layers {
    /// The layers.
    pub layers: Stacked<Block, L>,
}

/// The language model's weights: `embed: [V, D]` (split by vocabulary over `model`),
/// `position: [S, D]`, the stacked `layers` and `unembed: [D, V]`.
#[crate::params(mesh = (data, model))]
pub struct LanguageModel {
    /// The token embedding table.
    #[shard(model, _)]
    #[init(uniform(1.0))]
    pub embed: Tensor<V, D>,
    /// The position table.
    #[shard(_, _)]
    #[init(uniform(1.0))]
    pub position: Tensor<S, D>,
    /// The layers.
    pub layers: Stacked<Block, L>,
    /// The output projection to the vocabulary.
    #[shard(data, model)]
    #[init(fan_in(0))]
    pub unembed: Tensor<D, V>,
}

/// The language model's weights (the leaves of [`LanguageModel`]) as name patterns: what
/// a step trains, e.g. `step_program(&model, 0, WEIGHTS, &optimizer)`; its other
/// parameters are the data and the random key `rng`.
pub const WEIGHTS: &[&str] = &["embed", "position", "layers.*", "unembed"];

/// `x` after dropout at `rate` drawn from the key `fold_in(key, site)`; `x` itself at
/// rate 0 (nothing drawn, `key` unused).
pub fn dropout_at(x: &Tensor, rate: f64, key: &Tensor, site: u32) -> Tensor {
    if rate == 0.0 {
        x.clone()
    } else {
        random::dropout(x, rate, &random::fold_in_index(key, site))
    }
}

/// One pre-norm Transformer layer's math on `x: [B, S, D]`: `y = x + attention(ln(x))`
/// with `[wq, wk, wv, wo]`, then `y + ffn(ln(y))` with a GELU FFN of `[w1, w2]`. A mesh
/// rule pins the activations: `pin_attended` is applied to `y`, `pin_hidden` to the
/// FFN's hidden activations `[B, S, F]` (each a `#[shard] let` in the rule's model).
/// `drop(branch, i)` is the dropout of the attention (`i = 0`) and the FFN (`i = 1`)
/// residual branches.
pub fn pre_norm_layer(
    x: &Tensor,
    [wq, wk, wv, wo]: [&Tensor; 4],
    [w1, w2]: [&Tensor; 2],
    pin_attended: impl FnOnce(Tensor) -> Tensor,
    pin_hidden: impl FnOnce(Tensor) -> Tensor,
    drop: impl Fn(&Tensor, u32) -> Tensor,
) -> Tensor {
    let a = attention(&x.layer_norm(-1, 1e-5), wq, wk, wv, wo);
    let attended = pin_attended(x + &drop(&a, 0));
    let hidden = pin_hidden(einsum("bsd,df->bsf", &attended.layer_norm(-1, 1e-5), w1).gelu());
    &attended + &drop(&einsum("bsf,fd->bsd", &hidden, w2), 1)
}

/// The language model's loss around its layers: the tokens' embeddings from `embed`
/// plus the `position` table, pinned by `pin_embedded` (the mesh rule's `#[shard]`),
/// then `layers(x, low)` (which runs the layers, each weight passed through `low`: the
/// cast to `compute`), a layer norm, the logits by `unembed`, and the mean over
/// positions (weighted by `weights`) of the cross-entropy against `targets`.
pub fn language_model_loss(
    [tokens, targets, weights]: [&Tensor; 3],
    [embed, position, unembed]: [&Tensor; 3],
    compute: DType,
    pin_embedded: impl FnOnce(Tensor) -> Tensor,
    layers: impl FnOnce(Tensor, &dyn Fn(&Tensor) -> Tensor) -> Tensor,
) -> Tensor {
    let low = |t: &Tensor| cast(t, compute);
    let x = pin_embedded(&low(embed).embedding(tokens) + &low(position));
    let x = layers(x, &low);
    let logits = einsum("bsd,dv->bsv", &x.layer_norm(-1, 1e-5), &low(unembed));
    weighted_cross_entropy(&cast(&logits, DType::F32), targets, weights)
}

/// One pre-norm Transformer layer ([`pre_norm_layer()`]), number `layer` of its stack,
/// with residual dropout at `rate` (as GPT-2's) drawn from [`dropout_at`] sites
/// `2 layer` and `2 layer + 1` of `key`. Its `#[shard]`s pin the activations of every
/// layer it is used for: the batch over `data`, the FFN's hidden dim over `model`.
#[crate::model(mesh = (data, model))]
pub fn block(
    x: Tensor<B, S, D>,
    #[params(D, H, K, F)] w: &Block,
    key: Tensor<2, i32>,
    rate: f64,
    layer: usize,
) -> Tensor<B, S, D> {
    let site = 2 * layer as u32;
    let Attention { wq, wk, wv, wo } = &w.attn;
    let ffn = [&w.ffn.w1, &w.ffn.w2];
    let pin_attended = |y: Tensor| {
        #[shard(data, _, _)]
        let attended = y;
        attended
    };
    let pin_hidden = |h: Tensor| {
        #[shard(data, _, model)]
        let hidden = h;
        hidden
    };
    let drop = |t: &Tensor, i: u32| dropout_at(t, rate, &key, site + i);
    pre_norm_layer(&x, [wq, wk, wv, wo], ffn, pin_attended, pin_hidden, drop)
}

/// `L` layers of [`block()`], weights stacked over layers, with the paper's 2-D finalized
/// sharding of the weights, and residual dropout at `rate` from `key`.
#[crate::model(mesh = (data, model), out = (data, _, _))]
pub fn stack(
    #[shard(data, _, _)] x: Tensor<B, S, D>,
    #[params(L, D, H, K, F)] w: &Layers,
    key: Tensor<2, i32>,
    rate: f64,
) -> Tensor<B, S, D> {
    let mut x = x;
    for l in 0..w.layers.len() {
        x = block(x, &w.layers.layer(l), key.clone(), rate, l);
    }
    x
}

/// The language model's loss ([`language_model_loss()`]): the mean over positions
/// (weighted by `weights`) of the cross-entropy of predicting `targets` from `tokens`,
/// with the layers of [`stack()`].
///
/// Its parameters form a tree of names: the data `tokens`, `targets`, `weights`; then
/// the leaves of [`LanguageModel`]: `embed`, `position`, `layers.attn.{wq,wk,wv,wo}` and
/// `layers.ffn.{w1,w2}` (stacked over the `L` layers: dim 0 is the layer) and
/// `unembed`, so `&["layers.*"]` picks the layers' weights, and
/// `LanguageModel::initializer(seed)` initialises them.
///
/// `compute` is the dtype of the activations: `DType::F32`, or `DType::BF16` for mixed
/// precision as in the GSPMD paper's setup: the weights stay f32 parameters (master
/// weights, updated in f32), each is converted to bf16 where it is used (so it is
/// gathered in bf16, and its gradient is reduced in bf16 and converted back to f32),
/// the layers run in bf16, and the logits return to f32 for the loss.
///
/// `dropout` is the rate of dropout on the embedding's output and on each layer's two
/// residual branches (0: none, and `rng` is unused; evaluate with a model traced with
/// 0). `rng` is the step's random key ([`crate::train::RNG`]: a trainer feeds a new
/// one each step); layer `l` draws from sites `2 l`, `2 l + 1` of [`dropout_at`], the
/// embedding from site `2 L`, so every draw has its own key and the masks are the same
/// on every mesh.
#[crate::model(mesh = (data, model))]
pub fn language_model(
    #[shard(data, _)] tokens: Tensor<B, S, i32>,
    #[shard(data, _)] targets: Tensor<B, S, i32>,
    #[shard(data, _)] weights: Tensor<B, S>,
    #[params(V, D, S, L, H, K, F)] p: &LanguageModel,
    rng: Tensor<2, i32>,
    compute: DType,
    dropout: f64,
) -> Tensor {
    let pin_embedded = |e: Tensor| {
        #[shard(data, _, _)]
        let x = dropout_at(&e, dropout, &rng, 2 * p.layers.len() as u32);
        x
    };
    language_model_loss(
        [&tokens, &targets, &weights],
        [&p.embed, &p.position, &p.unembed],
        compute,
        pin_embedded,
        |x, low| {
            let layers = Layers {
                layers: p.layers.map(low),
            };
            stack(x, &layers, rng.clone(), dropout)
        },
    )
}
