"""The training step of `examples/train_unet.rs` in JAX, for timing side by side.

The model is `gspmd::models::unet::denoise`: NHWC, 3x3 `SAME` convolutions with ReLU,
2x2 max pooling, 2x nearest upsampling, skip connections joined along channels, a 1x1
output convolution and the mean squared error against the clean images; every kernel
replicated, the images split over `data` (batch) and `space` (height), as the model's
`#[shard]`s. The update is the repository's AdamW (`twin.py`).

The initial kernels and the first batches come from the file the example writes
(`train_unet N --bench --dump PATH`); prints the first losses, their relative
difference from gspmd's, and the median ms/step after the warm-up steps.

    python unet_step.py --dump /tmp/unet.safetensors --mesh 2x4 --steps 20

Setup: see benches/README.md.
"""

import twin

ARGS = twin.parse(__doc__)

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402
from jax.sharding import NamedSharding, PartitionSpec as P  # noqa: E402

NAMES = ["down1a", "down1b", "down2", "bottleneck", "up2", "merge2", "up1", "merge1", "out"]
IMAGES = P("data", "space", None, None)


def conv(x, w, padding="SAME"):
    return jax.lax.conv_general_dilated(x, w, (1, 1), padding, dimension_numbers=("NHWC", "HWIO", "NHWC"))


def conv_relu(x, w):
    return jax.nn.relu(conv(x, w))


def pool(x):
    return jax.lax.reduce_window(x, -np.inf, jax.lax.max, (1, 2, 2, 1), (1, 2, 2, 1), "VALID")


def upsample(x):
    return jnp.repeat(jnp.repeat(x, 2, axis=1), 2, axis=2)


def make_loss(mesh):
    def pin(x):
        return jax.lax.with_sharding_constraint(x, NamedSharding(mesh, IMAGES))

    def up(x, skip, w_up, w_merge):
        return conv_relu(jnp.concatenate([conv_relu(upsample(x), w_up), skip], axis=3), w_merge)

    def loss(p, noisy, clean):
        skip1 = pin(conv_relu(conv_relu(noisy, p["down1a"]), p["down1b"]))
        skip2 = pin(conv_relu(pool(skip1), p["down2"]))
        deep = pin(conv_relu(pool(skip2), p["bottleneck"]))
        y2 = pin(up(deep, skip2, p["up2"], p["merge2"]))
        predicted = pin(conv(up(y2, skip1, p["up1"], p["merge1"]), p["out"], "VALID"))
        error = predicted - clean
        return (error * error).mean()

    return loss


if __name__ == "__main__":
    specs = {n: P(None, None, None, None) for n in NAMES}
    twin.run(ARGS, ("data", "space"), specs, make_loss, ("noisy", "clean"), IMAGES, "U-Net")
