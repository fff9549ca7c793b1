//! A GShard mixture-of-experts language model (paper section 5.2; Lepikhin et al.,
//! "GShard", 2020): a Transformer layer whose feed-forward network is a set of experts,
//! each token sent to its two best experts.
//!
//! Tokens are cut in groups `G` (the batch); every group routes its `S` tokens
//! independently, so gating is local to the devices that hold the group. Each expert
//! takes at most `capacity` tokens per group (the rest are dropped: they pass through the
//! residual connection only). Dispatch is the einsum `gsec,gsm->egcm`: annotated with the
//! experts over `expert`, it moves from "groups split over all devices" to "experts split
//! over `expert`" — one all-to-all — and the combine `gsec,egcm->gsm` is the all-to-all
//! back. The auxiliary load-balancing loss (GShard's `mean(density * density_proxy)`,
//! scaled by `E²`) pushes the router towards equal loads.

use super::transformer::{one_hot, rotary_attention};
use crate::ir::{DType, Tensor, einsum};

/// What the router decides for `x: [G, S, M]`.
pub struct Routing {
    /// `[G, S, E, C]`: the weight of expert `e`'s output at capacity slot `c` in token
    /// `(g, s)`'s result (zero where the token was not routed there).
    pub combine: Tensor,
    /// `[G, S, E, C]`: 1 where token `(g, s)` is sent to slot `c` of expert `e`.
    pub dispatch: Tensor,
    /// The load-balancing loss, an f32 scalar (1 when the loads are equal).
    pub aux_loss: Tensor,
    /// `[E]`: how many tokens chose each expert first (before capacity), as f32.
    pub counts: Tensor,
}

/// `x` broadcast to `shape`, its dims going to `dims`.
fn spread(x: &Tensor, shape: &[usize], dims: &[usize]) -> Tensor {
    x.broadcast_in_dim(shape.to_vec(), dims)
}

/// GShard's top-2 gating of `x: [G, S, M]` with router weights `wg: [M, E]`, at most
/// `capacity` tokens per expert and group. Second choices are kept whatever their gate
/// (GShard samples them by gate; this router is deterministic), and queue behind every
/// first choice of the same expert.
pub fn top2_gating(x: &Tensor, wg: &Tensor, capacity: usize) -> Routing {
    let (groups, seq, experts) = (x.shape()[0], x.shape()[1], wg.shape()[1]);
    let gates = einsum("gsm,me->gse", x, wg).softmax(-1);
    let first = one_hot(&gates.argmax(-1), experts);
    let aux_loss =
        (&first.mean(&[1]) * &gates.mean(&[1])).mean(&[0, 1]) * (experts * experts) as f32;
    let counts = first.sum(&[0, 1]);
    let second = one_hot(&(&gates * &(1.0 - &first)).argmax(-1), experts);

    // Slot of each token in its expert's queue: first choices in token order, then
    // second choices; tokens past the capacity are dropped.
    let fits = |position: &Tensor| {
        position
            .lt(&position.scalar_like(capacity as f64))
            .convert(DType::F32)
    };
    let position1 = &(first.cumsum(1) - 1.0) * &first;
    let first = &first * &fits(&position1);
    let taken = spread(&first.sum(&[1]), &[groups, seq, experts], &[0, 2]);
    let position2 = &(&(second.cumsum(1) - 1.0) + &taken) * &second;
    let second = &second * &fits(&position2);

    let gate1 = (&gates * &first).sum(&[-1]);
    let gate2 = (&gates * &second).sum(&[-1]);
    let norm = &(&gate1 + &gate2) + 1e-9;
    let shape = [groups, seq, experts, capacity];
    // `[G, S, E, C]`: expert mask times the one-hot of the token's slot.
    let route = |mask: &Tensor, position: &Tensor| {
        let slot = one_hot(&(position * mask).sum(&[-1]).convert(DType::I32), capacity);
        &spread(mask, &shape, &[0, 1, 2]) * &spread(&slot, &shape, &[0, 1, 3])
    };
    let (route1, route2) = (route(&first, &position1), route(&second, &position2));
    let combine = &(&spread(&(&gate1 / &norm), &shape, &[0, 1]) * &route1)
        + &(&spread(&(&gate2 / &norm), &shape, &[0, 1]) * &route2);
    Routing {
        combine,
        dispatch: &route1 + &route2,
        aux_loss,
        counts,
    }
}

/// The mixture-of-experts feed-forward layer over `x: [G, S, M]`: router `wg: [M, E]`,
/// expert weights `wi: [E, M, H]` and `wo: [E, H, M]` (split over `expert`). Returns the
/// layer's output, the load-balancing loss and the per-expert first-choice counts.
#[crate::model(mesh = (data, expert))]
pub fn moe_ffn(
    x: Tensor<G, S, M>,
    wg: Tensor<M, E>,
    wi: Tensor<E, M, H>,
    wo: Tensor<E, H, M>,
    capacity: usize,
) -> (Tensor<G, S, M>, Tensor, Tensor<E>) {
    let routing = top2_gating(&x, &wg, capacity);
    // The routing tensors are split over groups like the tokens (GShard's Algorithm 2),
    // and so are their cotangents: without this, the dot giving the combine's cotangent
    // would keep `expert` on the expert dim of the larger `expert_out` (Shardy's conflict
    // rule across factors) and reshard every routing tensor of the backward pass.
    #[shard((data, expert), _, _, _)]
    let dispatch = routing.dispatch;
    #[shard((data, expert), _, _, _)]
    let combine = routing.combine;
    #[shard(expert, data, _, _)]
    let dispatched = einsum("gsec,gsm->egcm", &dispatch, &x);
    #[shard(expert, data, _, _)]
    let hidden = einsum("egcm,emh->egch", &dispatched, &wi).gelu();
    #[shard(expert, data, _, _)]
    let expert_out = einsum("egch,ehm->egcm", &hidden, &wo);
    #[shard((data, expert), _, _)]
    let combined = einsum("gsec,egcm->gsm", &combine, &expert_out);
    (combined, routing.aux_loss, routing.counts)
}

/// The weight of the load-balancing loss in the training loss (GShard's 1e-2).
pub const AUX_LOSS_WEIGHT: f32 = 0.01;

/// The weights of [`moe_language_model()`], named by field (`embed`, `wq`, .., `w_in`,
/// `w_out`, `unembed`): dense weights replicated, the experts' split over `expert`;
/// initialised uniform in ±1/sqrt(fan-in) (1 for the embedding, the heads and head dim
/// for `wo`, the dim after the expert dim for the experts' weights).
#[crate::params(mesh = (data, expert))]
pub struct MoeLanguageModel {
    /// The token embedding table.
    #[shard(_, _)]
    #[init(uniform(1.0))]
    pub embed: Tensor<V, M>,
    /// Attention queries.
    #[shard(_, _, _)]
    #[init(fan_in(0))]
    pub wq: Tensor<M, N, K>,
    /// Attention keys.
    #[shard(_, _, _)]
    #[init(fan_in(0))]
    pub wk: Tensor<M, N, K>,
    /// Attention values.
    #[shard(_, _, _)]
    #[init(fan_in(0))]
    pub wv: Tensor<M, N, K>,
    /// The attention's output projection.
    #[shard(_, _, _)]
    #[init(fan_in(0, 1))]
    pub wo: Tensor<N, K, M>,
    /// The gating weights.
    #[shard(_, _)]
    #[init(fan_in(0))]
    pub wg: Tensor<M, E>,
    /// The experts' first layer.
    #[shard(expert, _, _)]
    #[init(fan_in(1))]
    pub w_in: Tensor<E, M, H>,
    /// The experts' second layer.
    #[shard(expert, _, _)]
    #[init(fan_in(1))]
    pub w_out: Tensor<E, H, M>,
    /// The output projection to the vocabulary.
    #[shard(_, _)]
    #[init(fan_in(0))]
    pub unembed: Tensor<M, V>,
}

/// A one-layer language model with self-attention (rotary positions) and a [`moe_ffn()`]
/// feed-forward layer:
/// returns the training loss (the mean weighted next-token cross-entropy plus
/// [`AUX_LOSS_WEIGHT`] times the load-balancing loss) and the per-expert counts.
/// Groups (the batch) are split over both mesh axes; the weights are a
/// [`MoeLanguageModel`].
#[crate::model(mesh = (data, expert))]
pub fn moe_language_model(
    #[shard((data, expert), _)] tokens: Tensor<G, S, i32>,
    #[shard((data, expert), _)] targets: Tensor<G, S, i32>,
    #[shard((data, expert), _)] weights: Tensor<G, S>,
    #[params(V, M, N, K, E, H)] p: &MoeLanguageModel,
    capacity: usize,
) -> (Tensor, Tensor<E>) {
    let vocab = p.embed.shape()[0];
    #[shard((data, expert), _, _)]
    let x = einsum("gsv,vm->gsm", &one_hot(&tokens, vocab), &p.embed);
    let x = &x + &rotary_attention(&x.layer_norm(-1, 1e-5), &p.wq, &p.wk, &p.wv, &p.wo);
    let (ffn, aux_loss, counts) = moe_ffn(
        x.layer_norm(-1, 1e-5),
        p.wg.clone(),
        p.w_in.clone(),
        p.w_out.clone(),
        capacity,
    );
    let x = &x + &ffn;
    let logits = einsum("gsm,mv->gsv", &x.layer_norm(-1, 1e-5), &p.unembed);
    let log_p = (&logits.log_softmax(-1) * &one_hot(&targets, vocab)).sum(&[-1]);
    let cross_entropy = -((&log_p * &weights).sum(&[0, 1]) / weights.sum(&[0, 1]));
    (&cross_entropy + &(aux_loss * AUX_LOSS_WEIGHT), counts)
}
