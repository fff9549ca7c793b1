"""Writes reference_bf16.safetensors with Python's `safetensors` package, for the
`python_bf16_file_loads` test in gspmd-core/tests/dtypes.rs.

Run from this directory with a Python that has safetensors, numpy and ml_dtypes:
    python make_bf16.py

safetensors' numpy API has no BF16, so the tensors go through its low-level
`serialize_file` (a `TensorSpec` per tensor: dtype name, shape and the address of its
little-endian bytes, which the arrays below keep alive); ml_dtypes rounds to bf16.
"""

import ml_dtypes
import numpy as np
from safetensors import TensorSpec, serialize_file


def entry(array, dtype):
    assert array.flags["C_CONTIGUOUS"]
    return TensorSpec(
        dtype=dtype, shape=list(array.shape), data_ptr=array.ctypes.data, data_len=array.nbytes
    )


w = np.array([[1.0, -2.0, 0.5], [3.140625, -0.0078125, 65280.0]], dtype=ml_dtypes.bfloat16)
h = np.array([0.1, -1.5, 65504.0], dtype=np.float16)
f = np.array([1.25, -3.0], dtype=np.float32)
assert all(a.dtype.byteorder in "=<|" for a in (w, h, f))
serialize_file(
    {"w": entry(w, "bfloat16"), "h": entry(h, "float16"), "f": entry(f, "float32")},
    "reference_bf16.safetensors",
    metadata={"made_by": "make_bf16.py"},
)
