"""Times JAX's forward, input-gradient and kernel-gradient convolutions
(`lax.conv_general_dilated`, NHWC input, HWIO kernel, SAME, stride 1) on the layers of
gspmd's `conv_passes` bench (`gspmd-core/benches/conv.rs`) and prints one line per pass:
`conv_passes/<layer>/<pass> <median microseconds>`.

The gradients are `jax.vjp` of the convolution in one operand, jitted on their own (the
convolution is linear in each operand, so XLA keeps only the transposed convolution).
Each pass is timed in batches of calls until about `--seconds` have passed; the line
gives the median batch's time per call. Run under `taskset -c 0` with one host device
for a one-core figure (`conv_compare.py` does).
"""

import argparse
import statistics
import time

import jax
import jax.numpy as jnp
from jax import lax

# (name, input NHWC, kernel HWIO, feature groups): the same list as conv.rs's LAYERS.
LAYERS = [
    ("unet_down1a", (4, 32, 32, 1), (3, 3, 1, 8), 1),
    ("unet_down1b", (4, 32, 32, 8), (3, 3, 8, 8), 1),
    ("unet_down2", (4, 16, 16, 8), (3, 3, 8, 16), 1),
    ("unet_bottleneck", (4, 8, 8, 16), (3, 3, 16, 16), 1),
    ("unet_up2", (4, 16, 16, 16), (3, 3, 16, 16), 1),
    ("unet_merge2", (4, 16, 16, 32), (3, 3, 32, 16), 1),
    ("unet_up1", (4, 32, 32, 16), (3, 3, 16, 8), 1),
    ("unet_merge1", (4, 32, 32, 16), (3, 3, 16, 8), 1),
    ("unet_out1x1", (4, 32, 32, 8), (1, 1, 8, 1), 1),
    ("resnet3x3_8x32x32x64", (8, 32, 32, 64), (3, 3, 64, 64), 1),
    ("depthwise3x3_8x32x32x64", (8, 32, 32, 64), (3, 3, 1, 64), 64),
]


def timed(f, args, seconds):
    """The median time per call of `f(*args)` in microseconds."""
    jax.block_until_ready(f(*args))
    start = time.perf_counter()
    jax.block_until_ready(f(*args))
    once = max(time.perf_counter() - start, 1e-6)
    calls = max(1, int(0.02 / once))
    batches = []
    deadline = time.perf_counter() + seconds
    while time.perf_counter() < deadline or len(batches) < 5:
        start = time.perf_counter()
        for _ in range(calls):
            out = f(*args)
        jax.block_until_ready(out)
        batches.append((time.perf_counter() - start) / calls)
    return statistics.median(batches) * 1e6


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--seconds", type=float, default=1.0)
    args = parser.parse_args()
    key = jax.random.PRNGKey(0)
    for name, x_shape, k_shape, groups in LAYERS:
        def conv(x, k, groups=groups):
            return lax.conv_general_dilated(
                x, k, (1, 1), "SAME",
                dimension_numbers=("NHWC", "HWIO", "NHWC"),
                feature_group_count=groups)
        kx, kk, kd, key = jax.random.split(key, 4)
        x = jax.random.uniform(kx, x_shape, jnp.float32, -1.0, 1.0)
        k = jax.random.uniform(kk, k_shape, jnp.float32, -1.0, 1.0)
        dy = jax.random.uniform(kd, conv(x, k).shape, jnp.float32, -1.0, 1.0)
        passes = [
            ("forward", jax.jit(conv), (x, k)),
            ("input_grad",
             jax.jit(lambda x, k, dy, c=conv: jax.vjp(lambda x: c(x, k), x)[1](dy)[0]),
             (x, k, dy)),
            ("kernel_grad",
             jax.jit(lambda x, k, dy, c=conv: jax.vjp(lambda k: c(x, k), k)[1](dy)[0]),
             (x, k, dy)),
        ]
        for label, f, operands in passes:
            print(f"conv_passes/{name}/{label} {timed(f, operands, args.seconds):.2f}",
                  flush=True)


if __name__ == "__main__":
    main()
