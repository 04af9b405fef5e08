#!/usr/bin/env python3
"""Writes the small seed corpora in fuzz/corpus/<target>/ (a few KB each): minimal valid files built
here and a few texts (nothing copied from ../shared). Re-run it to regenerate them;
crash regressions live next to them as crash-*/regress-* files and are kept.

usage: fuzz/make_corpus.py SHARED_DIR"""
import json
import os
import struct
import sys

here = os.path.dirname(os.path.abspath(__file__))
shared = sys.argv[1] if len(sys.argv) > 1 else os.path.join(here, "..", "..", "shared")


def put(target, name, data):
    d = os.path.join(here, "corpus", target)
    os.makedirs(d, exist_ok=True)
    with open(os.path.join(d, name), "wb") as f:
        f.write(data if isinstance(data, bytes) else data.encode())


# --- GGUF ---------------------------------------------------------------------------------------
def gstr(s):
    b = s.encode()
    return struct.pack("<Q", len(b)) + b


def gkv(key, vtype, payload):
    return gstr(key) + struct.pack("<I", vtype) + payload


def garr(elem_type, items, pack):
    return struct.pack("<IQ", elem_type, len(items)) + b"".join(pack(x) for x in items)


def gguf(kvs, tensors=(), align=32):
    """tensors: (name, shape, ggml type, bytes)"""
    out = b"GGUF" + struct.pack("<IQQ", 3, len(tensors), len(kvs)) + b"".join(kvs)
    off, data = 0, b""
    for name, shape, ty, blob in tensors:
        out += gstr(name) + struct.pack("<I", len(shape)) + b"".join(struct.pack("<Q", d) for d in shape)
        out += struct.pack("<IQ", ty, off)
        pad = (-len(blob)) % align
        data += blob + b"\0" * pad
        off += len(blob) + pad
    out += b"\0" * ((-len(out)) % align)
    return out + data


tokens = ["<unk>", "<s>", "</s>"] + ["<0x%02X>" % b for b in range(4)] + ["\u2581a", "b", "\u2581ab", "<|im_start|>"]
vocab_kvs = [
    gkv("tokenizer.ggml.model", 8, gstr("llama")),
    gkv("tokenizer.ggml.tokens", 9, garr(8, tokens, gstr)),
    gkv("tokenizer.ggml.scores", 9, garr(6, [float(-i) for i in range(len(tokens))], lambda x: struct.pack("<f", x))),
    gkv("tokenizer.ggml.token_type", 9, garr(5, [2, 3, 3, 6, 6, 6, 6, 1, 1, 1, 3], lambda x: struct.pack("<i", x))),
    gkv("tokenizer.ggml.bos_token_id", 4, struct.pack("<I", 1)),
]
put("fuzz_gguf_reader", "spm_vocab.gguf", gguf(vocab_kvs))
bpe_kvs = [
    gkv("tokenizer.ggml.model", 8, gstr("gpt2")),
    gkv("tokenizer.ggml.pre", 8, gstr("qwen2")),
    gkv("tokenizer.ggml.tokens", 9, garr(8, ["a", "b", "ab", "\u0120", "<|endoftext|>"], gstr)),
    gkv("tokenizer.ggml.merges", 9, garr(8, ["a b"], gstr)),
    gkv("nested", 9, struct.pack("<IQ", 9, 1) + garr(0, [1, 2], lambda x: struct.pack("<B", x))),
]
put("fuzz_gguf_reader", "bpe_vocab.gguf", gguf(bpe_kvs))
put("fuzz_gguf_reader", "tensors.gguf",
    gguf([gkv("general.alignment", 4, struct.pack("<I", 64)), gkv("x.f", 6, struct.pack("<f", 1.5)),
          gkv("x.u64", 10, struct.pack("<Q", 1 << 40)), gkv("x.b", 7, b"\x01")],
         [("w", [4, 2], 0, struct.pack("<8f", *range(8))), ("q", [32], 8, b"\0" * 34)], align=64))

# --- llama2.c checkpoints -----------------------------------------------------------------------
def checkpoint(dim, ff, layers, heads, kv_heads, vocab, seq, v1=False, shared_cls=True):
    hd = dim // heads
    n = vocab * dim + layers * (2 * dim + 2 * dim * dim + 2 * dim * kv_heads * hd + 3 * dim * ff) + dim
    n += (0 if v1 else seq * hd) + (0 if shared_cls else vocab * dim)
    fields = struct.pack("<7i", dim, ff, layers, heads, kv_heads, vocab if (shared_cls or v1) else -vocab, seq)
    if v1:
        hdr = b"ak42" + struct.pack("<i", 1) + fields + bytes([1 if shared_cls else 0])
        hdr += b"\0" * (256 - len(hdr))
    else:
        hdr = fields
    return hdr + b"".join(struct.pack("<f", ((i * 37) % 17 - 8) / 16.0) for i in range(n))


put("fuzz_llama2c_checkpoint", "v0_tiny.bin", checkpoint(8, 8, 1, 2, 1, 4, 4))
put("fuzz_llama2c_checkpoint", "v0_unshared.bin", checkpoint(4, 4, 1, 1, 1, 3, 2, shared_cls=False))
put("fuzz_llama2c_checkpoint", "v1_tiny.bin", checkpoint(8, 4, 1, 2, 2, 4, 4, v1=True))
put("fuzz_llama2c_checkpoint", "gguf_magic.bin", b"GGUF" + struct.pack("<IQQ", 3, 0, 0))

# --- llama2.c tokenizer (2-byte vocab size the model would ask for, then the file) ---------------
def tokenizer_bin(pieces):
    out = struct.pack("<i", max(len(p) for p in pieces))
    for i, p in enumerate(pieces):
        out += struct.pack("<fi", -float(i), len(p)) + p
    return out


pieces = [b"<unk>", b"<s>", b"</s>"] + [b"<0x%02X>" % b for b in (0x41, 0xC3, 0xA9)] + [b" ", b"O", b"n", b"ce", b" Once", b"\xc3\xa9"]
put("fuzz_llama2c_tokenizer", "tiny.bin", struct.pack("<H", len(pieces)) + tokenizer_bin(pieces))

# --- texts ---------------------------------------------------------------------------------------
texts = ["Hello world", " leading space and  double", "caf\u00e9 na\u00efve \u65e5\u672c\u8a9e \U0001F600",
         "<|im_start|>user\nhi<|im_end|>", "123456789 3.14 don't I'LL", "\t\n\r\n  \u00a0x", "\xff\xfe invalid"]
for i, t in enumerate(texts):
    b = t.encode("utf-8", "surrogateescape") if "\xff" not in t else b"\xff\xfe invalid \xc3"
    put("fuzz_tokenizer_encode", "text%d" % i, bytes([i * 37 % 256]) + b)

templates = ["{% for m in messages %}<|im_start|>{{ m.role }}\n{{ m.content }}<|im_end|>{% endfor %}",
             "<|start_header_id|>{{ role }}<|end_header_id|>\n\n{{ content }}<|eot_id|>",
             "<start_of_turn>user\n{{ content }}<end_of_turn>"]
# first byte: format (bits 0-1) and tokenizer (bit 2); then the template / NUL-separated role, content pairs
for i, t in enumerate(templates):
    put("fuzz_chat_template", "template%d" % i, bytes([i + 1 + 4 * (i % 2)]) + t.encode())
put("fuzz_chat_template", "messages", b"\x05system\0be brief\0user\0hi <|im_end|>\0assistant\0ok\0tool\0{}")

bodies = [{"prompt": "Once upon a time", "max_tokens": 8, "temperature": 0, "stop": ["\n"], "seed": 1},
          {"prompt": [1, 2, 3], "stream": True, "stream_options": {"include_usage": True}, "top_k": 5},
          {"prompt": "x", "kv_policy": "triattention", "kv_budget": 64, "priority": 3, "cache_salt": "s"}]
for i, b in enumerate(bodies):
    put("fuzz_json_api", "completion%d" % i, b"\0" + json.dumps(b).encode())
chats = [{"messages": [{"role": "system", "content": "be brief"}, {"role": "user", "content": "hi"}], "max_completion_tokens": 4},
         {"messages": [{"role": "user", "content": [{"type": "text", "text": "hi"}]}], "top_p": 0.5, "min_p": 0.1}]
for i, b in enumerate(chats):
    put("fuzz_json_api", "chat%d" % i, bytes([1 + 2 * i]) + json.dumps(b).encode())

# --- HTTP requests: byte 0 = bytes per read (0: all at once), byte 1 bit 0 = tight limits -------------
body = json.dumps(bodies[0]).encode()
requests = {
    "post_length": b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer k\r\n"
                   b"Content-Type: application/json\r\nContent-Length: %d\r\n\r\n%s" % (len(body), body),
    "post_chunked": b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n"
                    b"5\r\nhello\r\n3;ext=1\r\n wo\r\n0\r\nTrailer: t\r\n\r\n",
    "pipelined": b"GET /health HTTP/1.1\r\nHost: x\r\n\r\nGET /metrics?x=1 HTTP/1.1\r\nHost: x\r\n\r\n"
                 b"GET /v1/models HTTP/1.0\r\n\r\n",
    "expect": b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nExpect: 100-continue\r\nContent-Length: 2\r\n\r\n{}",
    "http10_close": b"GET / HTTP/1.0\r\nConnection: close\r\n\r\n",
    "many_headers": b"GET /health HTTP/1.1\r\n" + b"".join(b"X-H%d: %s\r\n" % (i, b"v" * i) for i in range(8)) + b"\r\n",
    "absolute_target": b"GET http://x/health HTTP/1.1\r\nHost: x\r\n\r\n",
    "length_and_chunked": b"POST /v1/completions HTTP/1.1\r\nContent-Length: 3\r\nTransfer-Encoding: chunked\r\n\r\n0\r\n\r\n",
    "obs_fold": b"GET /health HTTP/1.1\r\nX: a\r\n b\r\n\r\n",
}
for i, (name, r) in enumerate(sorted(requests.items())):
    put("fuzz_http_request", name, bytes([(0, 1, 7, 64)[i % 4], i % 2]) + r)
