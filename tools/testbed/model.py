"""Llama / Qwen3-style decoder in torch, numerically the same function kvpack computes for the GGUF it exports.

- RMSNorm (eps from the config) before attention and FFN and at the end; residual stream in fp32.
- Attention: q/k/v/o without bias; qwen3 adds per-head RMSNorm of q and k (before RoPE); GQA with query head h
  reading KV head h // (n_head / n_kv_head); scale 1/sqrt(head_dim); causal.
- RoPE: angle = pos * theta^(-2i/head_dim) (computed in float64, like kvpack's rope_table), pairs
  (i, i + head_dim/2) for qwen2/qwen3 (NeoX) and (2i, 2i+1) for llama (interleaved).
- FFN: SwiGLU, down(silu(gate(x)) * up(x)).
- Output: tied to the token embedding.
- Optional factorised number embeddings (`digit_parts`, training only): the row of a token made of 1-3 digits is
  a free row plus one learned vector per (token length, digit position, digit). The 1000 three-digit tokens are
  rare (each ~100 answer occurrences in a CPU run) and a tiny model does not learn to copy them one by one; with
  the shared digit vectors, copying a number token is copying its digits, which it learns on frequent data.
  Export folds the sum into the plain embedding table, so the GGUF and kvpack know nothing of it.
"""
import math
from dataclasses import asdict, dataclass

import torch
import torch.nn as nn
import torch.nn.functional as F

ATTN_CHUNK = 256


@dataclass
class Config:
    arch: str = "qwen3"
    n_vocab: int = 4096
    n_embd: int = 256
    n_layer: int = 6
    n_head: int = 4
    n_head_kv: int = 2
    head_dim: int = 64
    n_ff: int = 768
    n_ctx: int = 2048
    rope_theta: float = 10000.0
    rms_eps: float = 1e-6

    def to_dict(self):
        return asdict(self)


class RMSNorm(nn.Module):
    def __init__(self, n, eps):
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(n))

    def forward(self, x):
        xf = x.float()
        return xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + self.eps) * self.weight


def rope_tables(n_pos, head_dim, theta):
    half = head_dim // 2
    i = torch.arange(half, dtype=torch.float64)
    freq = theta ** (-2.0 * i / head_dim)
    ang = torch.arange(n_pos, dtype=torch.float64)[:, None] * freq[None, :]
    return torch.cos(ang).float(), torch.sin(ang).float()  # [T, half]


def apply_rope(x, cos, sin, neox):
    """x: [B, H, T, hd] fp32; cos/sin: [T, hd/2]."""
    if neox:
        half = x.shape[-1] // 2
        a, b = x[..., :half], x[..., half:]
        return torch.cat((a * cos - b * sin, a * sin + b * cos), dim=-1)
    a, b = x[..., 0::2], x[..., 1::2]
    return torch.stack((a * cos - b * sin, a * sin + b * cos), dim=-1).flatten(-2)


class Block(nn.Module):
    def __init__(self, c: Config):
        super().__init__()
        self.c = c
        E, H, KV, D = c.n_embd, c.n_head, c.n_head_kv, c.head_dim
        self.attn_norm = RMSNorm(E, c.rms_eps)
        self.wq = nn.Linear(E, H * D, bias=False)
        self.wk = nn.Linear(E, KV * D, bias=False)
        self.wv = nn.Linear(E, KV * D, bias=False)
        self.wo = nn.Linear(H * D, E, bias=False)
        if c.arch == "qwen3":
            self.q_norm = RMSNorm(D, c.rms_eps)
            self.k_norm = RMSNorm(D, c.rms_eps)
        self.ffn_norm = RMSNorm(E, c.rms_eps)
        self.w_gate = nn.Linear(E, c.n_ff, bias=False)
        self.w_up = nn.Linear(E, c.n_ff, bias=False)
        self.w_down = nn.Linear(c.n_ff, E, bias=False)

    def forward(self, x, cos, sin, mask):
        c = self.c
        B, T, _ = x.shape
        H, KV, D = c.n_head, c.n_head_kv, c.head_dim
        h = self.attn_norm(x)
        q = self.wq(h).view(B, T, H, D).transpose(1, 2)
        k = self.wk(h).view(B, T, KV, D).transpose(1, 2)
        v = self.wv(h).view(B, T, KV, D).transpose(1, 2)
        if c.arch == "qwen3":
            q = self.q_norm(q)
            k = self.k_norm(k)
        neox = c.arch != "llama"
        q = apply_rope(q.float(), cos, sin, neox)
        k = apply_rope(k.float(), cos, sin, neox)
        G = H // KV
        q = q.view(B, KV, G, T, D) * (1.0 / math.sqrt(D))
        kt = k.unsqueeze(2).transpose(-1, -2)  # [B,KV,1,D,T]
        vv = v.unsqueeze(2)  # [B,KV,1,T,D]
        # Causal attention by query chunks: chunk [s, e) only needs keys [0, e). Under bf16 autocast the
        # scores and probabilities stay bf16 (softmax accumulates in fp32 internally): several times faster
        # on CPU than fp32 scores + additive mask, and it skips the masked upper blocks.
        outs = []
        for s in range(0, T, ATTN_CHUNK):
            e = min(T, s + ATTN_CHUNK)
            att = torch.matmul(q[..., s:e, :], kt[..., :e])  # [B,KV,G,e-s,e]
            att = torch.softmax(att.masked_fill(mask[s:e, :e], float("-inf")), dim=-1)
            outs.append(torch.matmul(att, vv[..., :e, :]))
        y = outs[0] if len(outs) == 1 else torch.cat(outs, dim=-2)  # [B,KV,G,T,D]
        y = y.reshape(B, H, T, D).transpose(1, 2).reshape(B, T, H * D)
        x = x + self.wo(y)
        h = self.ffn_norm(x)
        x = x + self.w_down(F.silu(self.w_gate(h)) * self.w_up(h))
        return x


DIGIT_SLOTS = {(1, 0): 0, (2, 0): 1, (2, 1): 2, (3, 0): 3, (3, 1): 4, (3, 2): 5}  # (token length, position)


def is_number_token(t):
    """A token of 1-3 ASCII digits (the byte-level form of a digit is the digit itself)."""
    return 1 <= len(t) <= 3 and all("0" <= ch <= "9" for ch in t)


def digit_parts_for(tokens):
    """[V, 3] int64: for a token of 1-3 ASCII digits, the rows (slot * 10 + digit) of its digit vectors; the pad
    row len(DIGIT_SLOTS) * 10 elsewhere."""
    pad = len(DIGIT_SLOTS) * 10
    parts = torch.full((len(tokens), 3), pad, dtype=torch.int64)
    for i, t in enumerate(tokens):
        if is_number_token(t):
            for j, ch in enumerate(t):
                parts[i, j] = DIGIT_SLOTS[(len(t), j)] * 10 + int(ch)
    return parts


class Model(nn.Module):
    def __init__(self, c: Config, digit_parts=None):
        super().__init__()
        self.c = c
        self.tok_embd = nn.Embedding(c.n_vocab, c.n_embd)
        self.digit_embd = None
        if digit_parts is not None:
            self.register_buffer("digit_parts", digit_parts.clone())
            self.digit_embd = nn.Parameter(torch.zeros(len(DIGIT_SLOTS) * 10, c.n_embd))
        self.layers = nn.ModuleList([Block(c) for _ in range(c.n_layer)])
        self.out_norm = RMSNorm(c.n_embd, c.rms_eps)
        self._tables = {}
        self.reset_parameters()

    def reset_parameters(self):
        std = 0.02
        for n, p in self.named_parameters():
            if p.dim() == 2:
                s = std / math.sqrt(2 * self.c.n_layer) if n.endswith(("wo.weight", "w_down.weight")) else std
                nn.init.normal_(p, 0.0, s)
        if self.digit_embd is not None:  # number rows start as the sum of their (up to 3) digit vectors
            with torch.no_grad():
                nn.init.normal_(self.digit_embd, 0.0, std / math.sqrt(3))
                self.tok_embd.weight[(self.digit_parts < len(DIGIT_SLOTS) * 10).any(1)] = 0.0

    def embedding_weight(self):
        """The [V, E] table used for input and (tied) output."""
        if self.digit_embd is None:
            return self.tok_embd.weight
        table = torch.cat((self.digit_embd, self.digit_embd.new_zeros(1, self.c.n_embd)))
        return self.tok_embd.weight + F.embedding(self.digit_parts, table).sum(1)

    def fold_digits(self):
        """Write the factorised rows into tok_embd and drop the factors (the function is unchanged)."""
        if self.digit_embd is not None:
            with torch.no_grad():
                self.tok_embd.weight.copy_(self.embedding_weight())
            self.digit_embd = None
            del self.digit_parts

    def n_params(self):
        return sum(p.numel() for p in self.parameters())

    def _rope_mask(self, T, device):
        key = (T, str(device))
        if key not in self._tables:
            cos, sin = rope_tables(T, self.c.head_dim, self.c.rope_theta)
            mask = torch.ones(T, T, dtype=torch.bool).triu(1)  # True: masked
            self._tables = {key: (cos.to(device), sin.to(device), mask.to(device))}
        return self._tables[key]

    def forward(self, idx):
        """idx: [B, T] int64 -> logits [B, T, V] (fp32 or bf16 under autocast)."""
        T = idx.shape[1]
        cos, sin, mask = self._rope_mask(T, idx.device)
        w = self.embedding_weight()
        x = F.embedding(idx, w).float()
        for layer in self.layers:
            x = layer(x, cos, sin, mask)
        x = self.out_norm(x)
        return F.linear(x, w)


# A block's parameter (layers.L.<ours>) -> its GGUF tensor (blk.L.<theirs>): export and import.
LAYER_TENSOR_NAMES = {"attn_norm.weight": "attn_norm.weight", "wq.weight": "attn_q.weight", "wk.weight": "attn_k.weight",
                      "wv.weight": "attn_v.weight", "wo.weight": "attn_output.weight",
                      "q_norm.weight": "attn_q_norm.weight", "k_norm.weight": "attn_k_norm.weight",
                      "ffn_norm.weight": "ffn_norm.weight", "w_gate.weight": "ffn_gate.weight",
                      "w_up.weight": "ffn_up.weight", "w_down.weight": "ffn_down.weight"}


def state_for_export(model):
    """GGUF tensor name -> numpy fp32 array (torch layout)."""
    c = model.c
    sd = {k: v.detach().float().cpu().numpy() for k, v in model.state_dict().items()}
    out = {"token_embd.weight": model.embedding_weight().detach().float().cpu().numpy()}
    for l in range(c.n_layer):
        for ours, theirs in LAYER_TENSOR_NAMES.items():
            k = f"layers.{l}.{ours}"
            if k in sd:
                out[f"blk.{l}.{theirs}"] = sd[k]
    out["output_norm.weight"] = sd["out_norm.weight"]
    return out


def load_exported(model, tensors):
    """The inverse of state_for_export: a model without digit factors takes an exported GGUF's tensors
    (gguf_reader.read_gguf) as its weights. Raises ValueError naming a missing, extra or mis-shaped tensor."""
    if model.digit_embd is not None:
        raise ValueError("a GGUF holds the folded embedding table: start without --digit-embd")
    with torch.no_grad():
        mine = {k: v for k, v in model.state_dict().items()}
        theirs = dict(tensors)
        def put(ours, name):
            if name not in theirs:
                raise ValueError(f"tensor {name} missing from the GGUF")
            src = torch.from_numpy(theirs.pop(name))
            if tuple(src.shape) != tuple(mine[ours].shape):
                raise ValueError(f"tensor {name}: shape {tuple(src.shape)}, the model has {tuple(mine[ours].shape)}")
            mine[ours].copy_(src)
        put("tok_embd.weight", "token_embd.weight")
        put("out_norm.weight", "output_norm.weight")
        for k in list(mine):
            if k.startswith("layers."):
                _, l, ours = k.split(".", 2)
                put(k, f"blk.{l}.{LAYER_TENSOR_NAMES[ours]}")
        if theirs:
            raise ValueError(f"GGUF tensors the model has no place for: {sorted(theirs)[:5]}")
