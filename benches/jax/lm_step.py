"""The training step of `examples/train_transformer.rs` in JAX, for timing side by side.

The model is `gspmd::models::transformer::language_model`: a learned position table
added to a vocabulary-parallel embedding, pre-norm layers (causal multi-head attention,
then a tanh-GELU FFN; layer norm without scale or bias, eps 1e-5), a final layer norm,
the unembedding, and the mean weighted next-token cross-entropy. The update is the
repository's AdamW (lr 3e-3, betas 0.9/0.99, eps 1e-8, no weight decay; bias
corrections computed in f64 per step and passed in as f32). Shardings are the model's
`#[shard]`s on a `data` x `model` mesh, given as `NamedSharding`s and sharding
constraints, with the parameters and optimizer state donated to the jitted step.

The initial parameters and the first batches come from a file the example writes
(`train_transformer N --bench --dump PATH`), so the first losses can be compared with
the ones gspmd recorded there. Prints those losses, their relative difference from
gspmd's, and the median ms/step after the warm-up steps (`twin.py`: JAX gets as many
host devices as `--mesh` has).

    python lm_step.py --dump /tmp/lm.safetensors --mesh 2x4 --steps 30

Setup: see benches/README.md.
"""

import twin

ARGS = twin.parse(__doc__)

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
from jax.sharding import NamedSharding, PartitionSpec as P  # noqa: E402
from layers import attention, gelu, layer_norm, log_softmax, one_hot  # noqa: E402

SPECS = {
    "embed": P("model", None),
    "position": P(None, None),
    "wq": P(None, "data", "model", None),
    "wk": P(None, "data", "model", None),
    "wv": P(None, "data", "model", None),
    "wo": P(None, "model", None, "data"),
    "w1": P(None, "data", "model"),
    "w2": P(None, "model", "data"),
    "unembed": P("data", "model"),
}


def make_loss(mesh):
    def pin(x, *spec):
        return jax.lax.with_sharding_constraint(x, NamedSharding(mesh, P(*spec)))

    def loss(params, tokens, targets, weights):
        p = params
        vocab = p["embed"].shape[0]
        x = pin(jnp.take(p["embed"], tokens, axis=0, mode="clip") + p["position"], "data", None, None)
        for l in range(p["wq"].shape[0]):
            a = attention(layer_norm(x), p["wq"][l], p["wk"][l], p["wv"][l], p["wo"][l])
            attended = pin(x + a, "data", None, None)
            hidden = pin(gelu(jnp.einsum("bsd,df->bsf", layer_norm(attended), p["w1"][l])), "data", None, "model")
            x = attended + jnp.einsum("bsf,fd->bsd", hidden, p["w2"][l])
        x = pin(x, "data", None, None)
        logits = jnp.einsum("bsd,dv->bsv", layer_norm(x), p["unembed"])
        picked = (log_softmax(logits) * one_hot(targets, vocab)).sum(-1)
        return -((picked * weights).sum() / weights.sum())

    return loss


if __name__ == "__main__":
    twin.run(ARGS, ("data", "model"), SPECS, make_loss, ("tokens", "targets", "weights"), P("data", None), "LM")
