"""Does the exported GGUF compute what the torch model computes? Three checks against the kvpack binary:

1. tokenizer: `kvpack tokenize --ids --bos` on a text (corpus + task prompts) == the Python BPE;
2. teacher-forced logits, aggregated: `kvpack eval kld --json` (full KV, f32 KV cache) reports the perplexity of
   the real next tokens over its windows; torch computes the same windows (same tokenize_head / window rules) with
   the exported (rounded) weights in fp32: relative difference must be < 1e-4;
3. greedy decoding: `kvpack generate --temp 0` continuations of Austen and task prompts == torch greedy
   continuations (a divergence is tolerated only where torch's top-2 logits are within 1e-3: a numerical tie).
"""
import copy
import json
import math
import os
import subprocess

import numpy as np
import torch
import torch.nn.functional as F

from .export import round_weights


def reference_model(model, wtype):
    ref = copy.deepcopy(model).cpu().float().eval()
    ref.fold_digits()  # the GGUF holds the folded table, rounded as one tensor
    with torch.no_grad():
        for n, p in ref.named_parameters():
            if p.dim() == 2:
                p.copy_(torch.from_numpy(round_weights(p.detach().numpy(), wtype)))
    return ref


def tokenize_head(bpe, text, max_tokens):
    """eval::tokenize_head of src/eval/kld.cpp."""
    n = max(64, max_tokens) * 6
    while True:
        cut = min(n, len(text))
        if cut < len(text):
            ws = max(text.rfind(" ", 0, cut + 1), text.rfind("\n", 0, cut + 1))
            if ws > 0:
                cut = ws
        t = bpe.encode(text[:cut])
        if len(t) >= max_tokens or cut >= len(text):
            return t[:max_tokens]
        n *= 2


def _run(cmd):
    r = subprocess.run(cmd, capture_output=True, text=True)
    if r.returncode != 0:
        raise RuntimeError(f"{' '.join(cmd)} failed:\n{r.stderr[-3000:]}")
    return r.stdout


@torch.no_grad()
def greedy(ref, ids, n, eos):
    ids = list(ids)
    out, margins = [], []
    for _ in range(n):
        lg = ref(torch.tensor([ids]))[0, -1]
        top = torch.topk(lg, 2)
        t = int(top.indices[0])
        margins.append(float(top.values[0] - top.values[1]))
        if t == eos:
            break
        out.append(t)
        ids.append(t)
    return out, margins


def check_gguf(kvpack, gguf, model, bpe, wtype, text, task_prompts, workdir, threads=1, ctx=256, n_gen=24,
               log=print):
    os.makedirs(workdir, exist_ok=True)
    ref = reference_model(model, wtype)
    res = {"passed": True}

    # 1. tokenizer
    sample = text[:20000] + "\n" + "\n".join(task_prompts)
    path = os.path.join(workdir, "check_text.txt")
    with open(path, "w") as f:
        f.write(sample)
    k_ids = json.loads(_run([kvpack, "tokenize", "-m", gguf, "-f", path, "--ids", "--bos"]))
    p_ids = bpe.encode(sample, bos=True)
    res["tokenizer_tokens"] = len(p_ids)
    res["tokenizer_identical"] = k_ids == p_ids
    res["passed"] &= res["tokenizer_identical"]
    log(f"check: tokenizer {'identical' if k_ids == p_ids else 'DIFFERENT'} on {len(p_ids)} tokens")

    # 2. perplexity of the same windows
    windows = 2
    path = os.path.join(workdir, "check_kld.txt")
    with open(path, "w") as f:
        f.write(text[:200000])
    j = json.loads(_run([kvpack, "eval", "kld", "-m", gguf, "--text", path, "--ctx", str(ctx), "--chunks",
                         str(windows), "--kv-type", "f32", "-t", str(threads), "--json", "-q"]))
    per = ctx - 1
    toks = tokenize_head(bpe, text[:200000], per * windows)
    nll, cnt = 0.0, 0
    with torch.no_grad():
        for w in range(len(toks) // per):
            seq = torch.tensor([[bpe.bos] + toks[w * per:(w + 1) * per]])
            lp = F.log_softmax(ref(seq)[0].double(), dim=-1)
            nll -= lp[:-1].gather(1, seq[0, 1:, None]).sum().item()
            cnt += seq.shape[1] - 1
    ppl_t = math.exp(nll / cnt)
    rel = abs(ppl_t - j["ppl_full"]) / ppl_t
    res.update(ppl_kvpack=j["ppl_full"], ppl_torch=ppl_t, ppl_rel_diff=rel, ppl_positions=cnt,
               kld_positions=j["positions"])
    ok = rel < 1e-4 and cnt == j["positions"]
    res["passed"] &= ok
    log(f"check: perplexity kvpack {j['ppl_full']:.5f} torch {ppl_t:.5f} (rel diff {rel:.2e}, {cnt} positions) "
        f"{'ok' if ok else 'FAILED'}")

    # 3. greedy continuations
    prompts = [text[1000:1400], text[50000:50300]] + list(task_prompts)
    gen = []
    for i, p in enumerate(prompts):
        path = os.path.join(workdir, f"check_prompt{i}.txt")
        with open(path, "w") as f:
            f.write(p)
        p_ids = bpe.encode(p, bos=True)
        n = min(n_gen, model.c.n_ctx - len(p_ids))  # kvpack stops at the model's context
        out = _run([kvpack, "generate", "-m", gguf, "-f", path, "-n", str(n), "--temp", "0", "--kv-type", "f32",
                    "-t", str(threads), "-q"])
        if out.endswith("\n"):
            out = out[:-1]  # kvpack generate ends its output with a newline of its own
        k_text = out[len(p):] if out.startswith(p) else out
        t_ids, margins = greedy(ref, p_ids, n, bpe.eos)
        t_text = bpe.decode(t_ids)
        same = k_text == t_text
        tie = False
        if not same:
            # first differing token of torch's continuation: a numerical tie there is tolerated
            k_ids2 = bpe.encode(p + k_text, bos=True)[len(p_ids):]
            d = next((i for i, (a, b) in enumerate(zip(k_ids2, t_ids)) if a != b), min(len(k_ids2), len(t_ids)))
            tie = d < len(margins) and margins[d] < 1e-3
        gen.append({"prompt_chars": len(p), "kvpack": k_text, "torch": t_text, "identical": same, "tie": tie})
        res["passed"] &= same or tie
        log(f"check: greedy {i}: {'identical' if same else ('tie' if tie else 'DIFFERENT')}: {t_text[:60]!r}"
            + ("" if same else f" vs kvpack {k_text[:60]!r}"))
    res["greedy"] = gen
    with open(os.path.join(workdir, "check_gguf.json"), "w") as f:
        json.dump(res, f, indent=2)
    log(f"check: {'PASSED' if res['passed'] else 'FAILED'}")
    return res
