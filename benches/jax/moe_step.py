"""The training step of `examples/train_moe.rs` in JAX, for timing side by side.

The model is `gspmd::models::moe::moe_language_model`: a one-hot embedding, one layer of
causal self-attention with rotary positions, then GShard's mixture-of-experts FFN (top-2
gating with an expert capacity per group, dispatch and combine einsums, tanh-GELU
experts), a final layer norm, the unembedding, and the mean weighted next-token
cross-entropy plus 0.01 times the load-balancing loss. Groups are split over both mesh
axes `(data, expert)`, the experts' weights over `expert`, the rest replicated; the
dispatched tokens are pinned to experts over `expert` and groups over `data`, as the
model's `#[shard]`s. The update is the repository's AdamW (`twin.py`).

The initial weights and the first batches come from the file the example writes
(`train_moe N --bench --dump PATH`); prints the first losses, their relative difference
from gspmd's, and the median ms/step after the warm-up steps.

    python moe_step.py --dump /tmp/moe.safetensors --mesh 2x4 --steps 20

Setup: see benches/README.md.
"""

import twin

ARGS = twin.parse(__doc__)

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402
from jax.sharding import NamedSharding, PartitionSpec as P  # noqa: E402
from layers import attention, gelu, layer_norm, log_softmax, one_hot, rotary, softmax  # noqa: E402

# The example's expert capacity per group (1.5x an even share of 2 x 16 choices).
CAPACITY = 12
AUX_LOSS_WEIGHT = np.float32(0.01)
GROUPS = ("data", "expert")
SPECS = {
    "embed": P(None, None),
    "wq": P(None, None, None),
    "wk": P(None, None, None),
    "wv": P(None, None, None),
    "wo": P(None, None, None),
    "wg": P(None, None),
    "w_in": P("expert", None, None),
    "w_out": P("expert", None, None),
    "unembed": P(None, None),
}


def top2_gating(x, wg, capacity):
    """`gspmd::models::moe::top2_gating`: combine and dispatch `[G, S, E, C]` and the
    load-balancing loss."""
    experts = wg.shape[1]
    gates = softmax(jnp.einsum("gsm,me->gse", x, wg))
    first = one_hot(jnp.argmax(gates, -1), experts)
    aux_loss = (first.mean(1) * gates.mean(1)).mean() * np.float32(experts * experts)
    second = one_hot(jnp.argmax(gates * (1.0 - first), -1), experts)

    def fits(position):
        return (position < capacity).astype(jnp.float32)

    position1 = (jnp.cumsum(first, 1) - 1.0) * first
    first = first * fits(position1)
    taken = first.sum(1)[:, None, :]
    position2 = ((jnp.cumsum(second, 1) - 1.0) + taken) * second
    second = second * fits(position2)
    gate1 = (gates * first).sum(-1)
    gate2 = (gates * second).sum(-1)
    norm = gate1 + gate2 + np.float32(1e-9)

    def route(mask, position):
        slot = one_hot((position * mask).sum(-1).astype(jnp.int32), capacity)
        return mask[..., None] * slot[:, :, None, :]

    route1, route2 = route(first, position1), route(second, position2)
    combine = (gate1 / norm)[..., None, None] * route1 + (gate2 / norm)[..., None, None] * route2
    return combine, route1 + route2, aux_loss


def make_loss(mesh):
    def pin(x, *spec):
        return jax.lax.with_sharding_constraint(x, NamedSharding(mesh, P(*spec)))

    def loss(p, tokens, targets, weights):
        vocab = p["embed"].shape[0]
        x = pin(jnp.einsum("gsv,vm->gsm", one_hot(tokens, vocab), p["embed"]), GROUPS, None, None)
        x = x + attention(layer_norm(x), p["wq"], p["wk"], p["wv"], p["wo"], rotary)
        normed = layer_norm(x)
        combine, dispatch, aux_loss = top2_gating(normed, p["wg"], CAPACITY)
        dispatch = pin(dispatch, GROUPS, None, None, None)
        combine = pin(combine, GROUPS, None, None, None)
        dispatched = pin(jnp.einsum("gsec,gsm->egcm", dispatch, normed), "expert", "data", None, None)
        hidden = pin(gelu(jnp.einsum("egcm,emh->egch", dispatched, p["w_in"])), "expert", "data", None, None)
        expert_out = pin(jnp.einsum("egch,ehm->egcm", hidden, p["w_out"]), "expert", "data", None, None)
        x = x + pin(jnp.einsum("gsec,egcm->gsm", combine, expert_out), GROUPS, None, None)
        logits = jnp.einsum("gsm,mv->gsv", layer_norm(x), p["unembed"])
        picked = (log_softmax(logits) * one_hot(targets, vocab)).sum(-1)
        cross_entropy = -((picked * weights).sum() / weights.sum())
        return cross_entropy + aux_loss * AUX_LOSS_WEIGHT

    return loss


if __name__ == "__main__":
    twin.run(ARGS, ("data", "expert"), SPECS, make_loss, ("tokens", "targets", "weights"), P(GROUPS, None), "MoE")
