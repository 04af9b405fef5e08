"""Reads back what gguf_writer.py writes (GGUF v3, little-endian): metadata and F32 / F16 / BF16 tensors, so a
run can start from an exported model (train_testbed.py --init-gguf: fine-tuning the embedded testbed model)."""
import struct

import numpy as np

from . import gguf_writer as gw

_SCALAR = {gw.U8: "B", gw.I8: "b", gw.U16: "H", gw.I16: "h", gw.U32: "I", gw.I32: "i", gw.F32: "f", gw.BOOL: "?",
           gw.U64: "Q", gw.I64: "q", gw.F64: "d"}


def read_gguf(path):
    """-> (metadata dict, {tensor name: fp32 numpy array in torch layout}). Raises ValueError on a file it cannot read."""
    with open(path, "rb") as f:
        d = f.read()
    o = 0

    def rd(fmt):
        nonlocal o
        v = struct.unpack_from("<" + fmt, d, o)[0]
        o += struct.calcsize("<" + fmt)
        return v

    def rstr():
        nonlocal o
        n = rd("Q")
        s = d[o:o + n].decode("utf-8")
        o += n
        return s

    def rval(t):
        if t == gw.STRING:
            return rstr()
        if t == gw.ARRAY:
            et, n = rd("I"), rd("Q")
            return [rval(et) for _ in range(n)]
        if t not in _SCALAR:
            raise ValueError(f"{path}: metadata value type {t} unknown")
        return rd(_SCALAR[t])

    if d[:4] != b"GGUF":
        raise ValueError(f"{path}: not a GGUF file")
    o = 4
    if rd("I") != 3:
        raise ValueError(f"{path}: GGUF version other than 3")
    n_tensors, n_kv = rd("Q"), rd("Q")
    meta = {}
    for _ in range(n_kv):
        k = rstr()
        meta[k] = rval(rd("I"))
    infos = []
    for _ in range(n_tensors):
        name = rstr()
        shape = [rd("Q") for _ in range(rd("I"))]
        infos.append((name, shape, rd("I"), rd("Q")))
    align = int(meta.get("general.alignment", gw.ALIGNMENT))
    base = (o + align - 1) // align * align
    tensors = {}
    for name, shape, t, off in infos:
        n = int(np.prod(shape))
        start = base + off
        if t == gw.GGML_F32:
            a = np.frombuffer(d, dtype="<f4", count=n, offset=start).astype(np.float32)
        elif t == gw.GGML_F16:
            a = np.frombuffer(d, dtype="<f2", count=n, offset=start).astype(np.float32)
        elif t == gw.GGML_BF16:
            a = (np.frombuffer(d, dtype="<u2", count=n, offset=start).astype(np.uint32) << 16).view(np.float32)
        else:
            raise ValueError(f"{path}: tensor {name} has type {t} (only F32 / F16 / BF16 are read)")
        tensors[name] = a.reshape(list(reversed(shape)))  # GGUF ne0 first -> torch layout
    return meta, tensors
