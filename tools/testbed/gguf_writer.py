"""A small GGUF v3 writer (little-endian): metadata key/values, tensor infos, 32-byte aligned data.

Types as in ggml / kvpack (src/util/dtype.h, src/gguf/gguf.h). Tensor shapes are given in GGUF order
(ne0 first: the contiguous dimension), i.e. a torch Linear weight [out, in] is written as shape [in, out].
"""
import struct

import numpy as np

# metadata value types
U8, I8, U16, I16, U32, I32, F32, BOOL, STRING, ARRAY, U64, I64, F64 = range(13)
_SCALAR_FMT = {U8: "B", I8: "b", U16: "H", I16: "h", U32: "I", I32: "i", F32: "f", BOOL: "?", U64: "Q",
               I64: "q", F64: "d"}

# tensor types
GGML_F32, GGML_F16, GGML_BF16 = 0, 1, 30
ALIGNMENT = 32


def _str(s):
    b = s.encode("utf-8")
    return struct.pack("<Q", len(b)) + b


def _value(t, v):
    if t == STRING:
        return _str(v)
    return struct.pack("<" + _SCALAR_FMT[t], v)


class GGUFWriter:
    def __init__(self):
        self.kv = []  # (key, type, value, elem_type)
        self.tensors = []  # (name, shape, ggml_type, bytes)

    def add(self, key, t, value):
        self.kv.append((key, t, value, None))

    def add_u32(self, k, v): self.add(k, U32, int(v))
    def add_i32(self, k, v): self.add(k, I32, int(v))
    def add_f32(self, k, v): self.add(k, F32, float(v))
    def add_bool(self, k, v): self.add(k, BOOL, bool(v))
    def add_string(self, k, v): self.add(k, STRING, v)

    def add_array(self, key, elem_type, values):
        self.kv.append((key, ARRAY, list(values), elem_type))

    def add_tensor(self, name, array, ggml_type):
        """array: numpy array in torch layout ([out, in] for matrices, [n] for vectors)."""
        a = np.ascontiguousarray(array, dtype=np.float32)
        shape = list(reversed(a.shape))  # GGUF: ne0 = last (contiguous) torch dim
        if ggml_type == GGML_F32:
            data = a.astype("<f4").tobytes()
        elif ggml_type == GGML_F16:
            data = a.astype("<f2").tobytes()
        elif ggml_type == GGML_BF16:
            u = a.view(np.uint32).astype(np.uint64)
            # round to nearest even, as ggml's fp32 -> bf16 (NaN never occurs here)
            r = ((u + 0x7FFF + ((u >> 16) & 1)) >> 16).astype("<u2")
            data = r.tobytes()
        else:
            raise ValueError(f"unsupported tensor type {ggml_type}")
        self.tensors.append((name, shape, ggml_type, data))

    def write(self, path):
        out = bytearray()
        out += struct.pack("<IIQQ", 0x46554747, 3, len(self.tensors), len(self.kv))
        for key, t, v, et in self.kv:
            out += _str(key) + struct.pack("<I", t)
            if t == ARRAY:
                out += struct.pack("<IQ", et, len(v))
                for x in v:
                    out += _value(et, x)
            else:
                out += _value(t, v)
        offset = 0
        offsets = []
        for name, shape, gt, data in self.tensors:
            offsets.append(offset)
            out += _str(name) + struct.pack("<I", len(shape))
            for d in shape:
                out += struct.pack("<Q", d)
            out += struct.pack("<IQ", gt, offset)
            offset = (offset + len(data) + ALIGNMENT - 1) // ALIGNMENT * ALIGNMENT
        out += b"\0" * ((-len(out)) % ALIGNMENT)
        base = len(out)
        for (name, shape, gt, data), off in zip(self.tensors, offsets):
            out += b"\0" * (base + off - len(out))
            out += data
        with open(path, "wb") as f:
            f.write(out)
        return len(out)
