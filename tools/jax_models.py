"""JAX models lowered to StableHLO for gspmd's import (the round trip of issue 31).

    python tools/jax_models.py DIR

For each model it writes DIR/NAME/: `jax.mlir` (`jax.jit(f).lower(..).as_text()`,
shardings over a 2x4 mesh of CPU devices as Shardy annotations), `inputs.safetensors`
and `outputs.safetensors` (JAX's outputs on those inputs) and `xla_collectives.txt`
(the collectives in XLA's optimized per-device program). `cargo run --example
export_check -- --import DIR` imports each module into gspmd, partitions it, runs it on
the thread mesh, compares with JAX's outputs and prints gspmd's collectives beside
XLA's.
"""

import json
import os
import struct
import sys
from pathlib import Path

os.environ["XLA_FLAGS"] = (
    os.environ.get("XLA_FLAGS", "") + " --xla_force_host_platform_device_count=8"
)
os.environ.setdefault("JAX_PLATFORMS", "cpu")

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402
from jax.sharding import AxisType, NamedSharding  # noqa: E402
from jax.sharding import PartitionSpec as P  # noqa: E402

sys.path.insert(0, str(Path(__file__).parent))
from xla_check import xla_collectives  # noqa: E402

MESH = jax.make_mesh((2, 4), ("data", "model"), axis_types=(AxisType.Auto,) * 2)


def constrain(x, *spec):
    return jax.lax.with_sharding_constraint(x, NamedSharding(MESH, P(*spec)))


def mlp(x, w1, b1, w2):
    h = jnp.maximum(x @ w1 + b1, 0.0)
    h = constrain(h, "data", "model")
    y = jnp.tanh(h) @ w2
    return jnp.mean(y * y), jnp.exp(-y).sum(axis=0)


def attention(x, wq, wk, wv, wo, scale):
    """One self-attention block with a residual and a layer norm: heads over
    `model` (Megatron), batch over `data`."""
    q = jnp.einsum("bsd,dhk->bhsk", x, wq)
    k = jnp.einsum("bsd,dhk->bhsk", x, wk)
    v = jnp.einsum("bsd,dhk->bhsk", x, wv)
    q = constrain(q, "data", "model", None, None)
    logits = jnp.einsum("bhsk,bhtk->bhst", q, k) * 0.25
    logits = logits - jnp.max(logits, axis=-1, keepdims=True)
    weights = jnp.exp(logits)
    weights = weights / jnp.sum(weights, axis=-1, keepdims=True)
    mixed = jnp.einsum("bhst,bhtk->bhsk", weights, v)
    y = x + jnp.einsum("bhsk,hkd->bsd", mixed, wo)
    mean = jnp.mean(y, axis=-1, keepdims=True)
    var = jnp.mean((y - mean) ** 2, axis=-1, keepdims=True)
    y = (y - mean) * jax.lax.rsqrt(var + 1e-5) * scale
    return jnp.sum(y * y)


def models():
    rng = np.random.default_rng(0)

    def arg(shape, *spec):
        value = rng.uniform(-0.5, 0.5, shape).astype(np.float32)
        return value, NamedSharding(MESH, P(*spec))

    yield "mlp", mlp, [
        arg((16, 32), "data", None),
        arg((32, 64), None, "model"),
        arg((64,), "model"),
        arg((64, 32), "model", None),
    ]
    yield "attention", attention, [
        arg((4, 8, 16), "data", None, None),
        arg((16, 4, 8), None, "model", None),
        arg((16, 4, 8), None, "model", None),
        arg((16, 4, 8), None, "model", None),
        arg((4, 8, 16), "model", None, None),
        arg((16,), None),
    ]


def write_safetensors(path, arrays):
    dtypes = {np.dtype(np.float32): "F32", np.dtype(np.int32): "I32"}
    header, offset, blobs = {}, 0, []
    for i, a in enumerate(arrays):
        a = np.ascontiguousarray(a)
        blob = a.tobytes()
        header[f"t{i:04}"] = {
            "dtype": dtypes[a.dtype],
            "shape": list(a.shape),
            "data_offsets": [offset, offset + len(blob)],
        }
        offset += len(blob)
        blobs.append(blob)
    text = json.dumps(header).encode()
    text += b" " * (-len(text) % 8)
    Path(path).write_bytes(struct.pack("<Q", len(text)) + text + b"".join(blobs))


def main():
    root = Path(sys.argv[1] if len(sys.argv) > 1 else "target/jax_models")
    for name, f, args in models():
        case = root / name
        case.mkdir(parents=True, exist_ok=True)
        values = [jax.device_put(v, s) for v, s in args]
        lowered = jax.jit(f).lower(*values)
        (case / "jax.mlir").write_text(lowered.as_text())
        outs = jax.jit(f)(*values)
        outs = outs if isinstance(outs, tuple) else (outs,)
        write_safetensors(case / "inputs.safetensors", [v for v, _ in args])
        write_safetensors(case / "outputs.safetensors", [np.asarray(o) for o in outs])
        counts = xla_collectives(lowered.compile().as_text())
        lines = "".join(f"{k} {n}\n" for k, n in sorted(counts.items()))
        (case / "xla_collectives.txt").write_text(lines)
        print(f"{name}: {len(args)} inputs, {len(outs)} outputs, XLA collectives {counts}")


if __name__ == "__main__":
    main()
