"""Runs the language-model training step of `examples/train_transformer.rs` with gspmd
and with JAX (`lm_step.py`), alternating, and prints a table of the medians and their
ratio for each configuration.

Each configuration first runs the gspmd step once with `--dump` (initial parameters,
first batches and losses), which JAX then replays, so each JAX run also reports how
far its first losses are from gspmd's. Then `--rounds` rounds, each one gspmd process
and one JAX process in turn; a process reports the median ms/step of its timed steps,
the table shows the median over rounds of those, and the ratio is the median of the
per-round ratios gspmd/JAX (so a drift of the machine's speed cancels).

    python3 benches/jax/compare.py --python /path/to/venv/bin/python

Setup and the measured table: benches/README.md. Needs only the standard library; the
JAX side runs under `--python`.
"""

import argparse
import os
import re
import statistics
import subprocess
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
EXAMPLE = os.path.join(ROOT, "target", "release", "examples", "train_transformer")
MEDIAN = re.compile(r"median ([0-9.]+) ms/step")
LOSS_DIFF = re.compile(r"max relative difference ([0-9.e+-]+)")

# (name, --dims, --mesh, pinned to one core)
CONFIGS = [
    ("example LM, 2x4", "small", "2x4", False),
    ("example LM, 1 device", "small", "1x1", False),
    ("example LM, 2x1", "small", "2x1", False),
    ("example LM, 1x2", "small", "1x2", False),
    ("d_model 512, 1 device, one core", "512", "1x1", True),
    ("d_model 512, 1x2", "512", "1x2", False),
    ("d_model 512, 2x1", "512", "2x1", False),
]


def run(command, pinned):
    """Runs `command` (on CPU 0 only when `pinned`) and returns its standard output."""
    if pinned:
        command = ["taskset", "-c", "0", *command]
    done = subprocess.run(command, capture_output=True, text=True)
    if done.returncode != 0:
        sys.exit(f"{' '.join(command)} failed ({done.returncode}):\n{done.stdout}{done.stderr}")
    return done.stdout


def median_of(output):
    return float(MEDIAN.search(output).group(1))


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--python", default=os.environ.get("JAX_PYTHON", "python3"),
                        help="the Python that has JAX (default $JAX_PYTHON or python3)")
    parser.add_argument("--rounds", type=int, default=3, help="alternating rounds (default 3)")
    parser.add_argument("--steps", type=int, default=30, help="steps per process, example LM (default 30)")
    parser.add_argument("--steps-512", type=int, default=8, help="steps per process, d_model 512 (default 8)")
    parser.add_argument("--warmup", type=int, default=3, help="untimed steps per process (default 3)")
    parser.add_argument("--only", help="run only configurations whose name contains this")
    parser.add_argument("--no-build", action="store_true", help="skip `cargo build --release`")
    args = parser.parse_args()
    if not args.no_build:
        subprocess.run(["cargo", "build", "--release", "--example", "train_transformer"], cwd=ROOT, check=True)
    env_note = os.environ.get("XLA_FLAGS", "--xla_force_host_platform_device_count=8")
    print(f"JAX with XLA_FLAGS={env_note}; {args.rounds} alternating rounds; machine load {os.getloadavg()}")

    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        for name, dims, mesh, pinned in CONFIGS:
            if args.only and args.only not in name:
                continue
            steps = args.steps_512 if dims == "512" else args.steps
            dump = os.path.join(tmp, f"{dims}_{mesh}.safetensors")
            common = [str(steps), "--bench", "--dims", dims, "--mesh", mesh, "--warmup", str(args.warmup)]
            gspmd = [EXAMPLE, *common]
            jax = [args.python, os.path.join(HERE, "lm_step.py"), "--dump", dump, "--mesh", mesh,
                   "--steps", str(steps), "--warmup", str(args.warmup)]
            run([*gspmd, "--dump", dump], pinned)
            ours, theirs, diffs = [], [], []
            for _ in range(args.rounds):
                ours.append(median_of(run(gspmd, pinned)))
                output = run(jax, pinned)
                theirs.append(median_of(output))
                diffs.append(float(LOSS_DIFF.search(output).group(1)))
                print(f"  {name}: gspmd {ours[-1]:.2f} ms, JAX {theirs[-1]:.2f} ms", flush=True)
            ratio = statistics.median(a / b for a, b in zip(ours, theirs))
            rows.append((name, statistics.median(ours), statistics.median(theirs), ratio, max(diffs)))

    print()
    print("| configuration | gspmd ms/step | JAX ms/step | ratio | first losses, max rel. diff |")
    print("|---|---|---|---|---|")
    for name, ours, theirs, ratio, diff in rows:
        print(f"| {name} | {ours:.1f} | {theirs:.1f} | {ratio:.2f}x | {diff:.1e} |")
    print(f"\nmachine load after: {os.getloadavg()}")


if __name__ == "__main__":
    main()
