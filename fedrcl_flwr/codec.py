"""Model weights on the wire: NumPy's ``.npy`` bytes, as Flower's ``ndarrays_to_parameters``
writes them, with fewer copies (no Flower here).

Flower's ``ndarrays_to_parameters`` saves each array into a ``BytesIO`` and copies its
value out (two copies of the model), ``parameters_to_ndarrays`` reads it back into a new
array through a ``BytesIO`` (two more). For a ResNet-18 that is 45 MB per copy on every
client message and every result the server reads. Here:

* :func:`encode_arrays` writes each array's ``.npy`` header and data into one ``bytes``
  (one copy); the bytes are those ``np.save`` writes for a C-contiguous array;
* :func:`decode_arrays` parses the header and returns a read-only view of the data
  (no copy): the receiver loads it into its model (one copy) or averages it, and never
  writes into what it received (an attempt fails loudly instead of changing a message).

Both refuse object arrays (no pickle, as ``allow_pickle=False``). Any ``.npy`` bytes
Flower's own functions write decode here, and the other way round.
"""

from __future__ import annotations

import io
from collections.abc import Sequence

import numpy as np
from numpy.lib import format as npy_format

TENSOR_TYPE = "numpy.ndarray"  # Flower's ``Parameters.tensor_type`` of ``.npy`` bytes


def encode_array(array) -> bytes:
    """One array as ``.npy`` bytes (C order)."""
    a = np.asarray(array)
    if not a.flags.c_contiguous:
        a = a.copy(order="C")
    if a.dtype.hasobject:
        raise ValueError("object arrays cannot be sent (they would need pickle)")
    head = io.BytesIO()
    npy_format.write_array_header_1_0(head, npy_format.header_data_from_array_1_0(a))
    return b"".join((head.getbuffer(), a.data if a.size else b""))


def encode_arrays(arrays: Sequence) -> list[bytes]:
    return [encode_array(a) for a in arrays]


def decode_array(data: bytes) -> np.ndarray:
    """A read-only array viewing ``data`` (``.npy`` bytes, format 1.0 to 3.0)."""
    fh = io.BytesIO(data)
    try:
        major, minor = npy_format.read_magic(fh)
        if (major, minor) == (1, 0):
            shape, fortran, dtype = npy_format.read_array_header_1_0(fh)
        else:
            shape, fortran, dtype = npy_format.read_array_header_2_0(fh)
    except ValueError as exc:
        raise ValueError(f"not .npy bytes: {exc}") from None
    if dtype.hasobject:
        raise ValueError("object arrays cannot be received (they would need pickle)")
    count = int(np.prod(shape, dtype=np.int64))
    if fh.tell() + count * dtype.itemsize != len(data):
        raise ValueError(
            f".npy bytes of {len(data)} bytes do not hold a {dtype} array of shape {shape}"
        )
    flat = np.frombuffer(data, dtype=dtype, count=count, offset=fh.tell())
    if fortran:
        return flat.reshape(shape[::-1]).transpose()
    return flat.reshape(shape)


def decode_arrays(tensors: Sequence[bytes]) -> list[np.ndarray]:
    return [decode_array(t) for t in tensors]
