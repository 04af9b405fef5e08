"""Model + tokenizer -> GGUF that kvpack (and llama.cpp's conventions) load: src/model/model_gguf.cpp."""
import numpy as np

from . import gguf_writer as gw
from .model import state_for_export

WEIGHT_TYPES = {"f32": gw.GGML_F32, "f16": gw.GGML_F16, "bf16": gw.GGML_BF16}
FILE_TYPES = {"f32": 0, "f16": 1, "bf16": 32}  # LLAMA_FTYPE_*


def round_weights(arr, wtype):
    """What the exported tensor holds, as fp32 (for checking the GGUF against torch)."""
    a = np.asarray(arr, dtype=np.float32)
    if wtype == "f16":
        return a.astype(np.float16).astype(np.float32)
    if wtype == "bf16":
        u = a.view(np.uint32).astype(np.uint64)
        r = (((u + 0x7FFF + ((u >> 16) & 1)) >> 16) << 16).astype(np.uint32)
        return r.view(np.float32)
    return a


def write_gguf(path, model, bpe, wtype="f16", name="kvpack testbed", extra=None, n_ctx=None):
    """n_ctx: the context_length to declare (default: the model's trained context)."""
    c = model.c
    a = c.arch
    w = gw.GGUFWriter()
    w.add_string("general.architecture", a)
    w.add_string("general.name", name)
    w.add_u32("general.file_type", FILE_TYPES[wtype])
    w.add_u32(a + ".context_length", n_ctx or c.n_ctx)
    w.add_u32(a + ".embedding_length", c.n_embd)
    w.add_u32(a + ".block_count", c.n_layer)
    w.add_u32(a + ".feed_forward_length", c.n_ff)
    w.add_u32(a + ".attention.head_count", c.n_head)
    w.add_u32(a + ".attention.head_count_kv", c.n_head_kv)
    w.add_u32(a + ".attention.key_length", c.head_dim)
    w.add_u32(a + ".attention.value_length", c.head_dim)
    w.add_f32(a + ".attention.layer_norm_rms_epsilon", c.rms_eps)
    w.add_f32(a + ".rope.freq_base", c.rope_theta)
    w.add_u32(a + ".rope.dimension_count", c.head_dim)
    w.add_u32(a + ".vocab_size", c.n_vocab)
    w.add_string("tokenizer.ggml.model", "gpt2")
    w.add_string("tokenizer.ggml.pre", bpe.pre)
    w.add_array("tokenizer.ggml.tokens", gw.STRING, bpe.tokens)
    types = [1] * bpe.n_normal + [3] * (bpe.n_vocab - bpe.n_normal)  # normal, control
    w.add_array("tokenizer.ggml.token_type", gw.I32, types)
    w.add_array("tokenizer.ggml.merges", gw.STRING, [l + " " + r for l, r in bpe.merges])
    w.add_u32("tokenizer.ggml.bos_token_id", bpe.bos)
    w.add_u32("tokenizer.ggml.eos_token_id", bpe.eos)
    w.add_u32("tokenizer.ggml.padding_token_id", bpe.eos)
    w.add_bool("tokenizer.ggml.add_bos_token", True)
    for k, v in (extra or {}).items():
        w.add_string("kvpack.testbed." + k, str(v))
    for n, arr in state_for_export(model).items():
        w.add_tensor(n, arr, gw.GGML_F32 if arr.ndim == 1 else WEIGHT_TYPES[wtype])
    return w.write(path)
