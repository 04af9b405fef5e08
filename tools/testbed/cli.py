"""Command line of tools/train_testbed.py: its flags and the curriculum stages (--stages) they describe."""
import argparse
import os

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))  # tools/testbed/cli.py -> the repo


def parse_args(argv=None, description=None):
    """The command line of tools/train_testbed.py (`description`: its --help text, the entry point's docstring)."""
    ap = argparse.ArgumentParser(description=description, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--corpus", required=True, help="plain English text (e.g. ../shared/corpora/austen.txt)")
    ap.add_argument("--out", required=True, help="run directory (checkpoints, logs, data cache, model.gguf)")
    ap.add_argument("--minutes", type=float, default=85.0, help="wall-clock budget of the training loop (all sessions)")
    ap.add_argument("--steps", type=int, default=0, help="train exactly this many steps instead (schedule by step)")
    ap.add_argument("--ctx", type=int, default=2048, help="trained (final) context length")
    ap.add_argument("--resume", action="store_true", help="continue the run in --out from its checkpoint")
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--device", default="cpu", help="torch device (cpu; 'cuda' is untested)")
    ap.add_argument("--seed", type=int, default=1234)
    ap.add_argument("--kvpack", default=os.path.join(REPO, "build-train", "kvpack"))
    # model
    ap.add_argument("--arch", default="qwen3", choices=["qwen3", "llama"])
    ap.add_argument("--layers", type=int, default=6)
    ap.add_argument("--embd", type=int, default=256)
    ap.add_argument("--heads", type=int, default=4)
    ap.add_argument("--kv-heads", type=int, default=2)
    ap.add_argument("--head-dim", type=int, default=64)
    ap.add_argument("--ff", type=int, default=512)
    ap.add_argument("--vocab", type=int, default=4096, help="BPE vocab: 256 bytes + merges (+676 A-Z pairs) + 1 special")
    ap.add_argument("--no-upper-pairs", action="store_true", help="no two-letter uppercase tokens")
    ap.add_argument("--pre", default="qwen2", choices=["qwen2", "llama-bpe"],
                    help="pre-tokenizer: qwen2 (one token per digit) or llama-bpe (up to 3 digits per pre-token)")
    ap.add_argument("--digit-tokens", type=int, nargs="?", const=3, default=0, choices=(0, 2, 3),
                    help="with --pre llama-bpe: every 2- and (with 3, the default) 3-digit string is a token, "
                         "no learned merge has a digit")
    ap.add_argument("--digit-embd", action="store_true",
                    help="number tokens' embeddings = a free row + shared per-(length, position, digit) vectors "
                         "(training only: the GGUF holds the folded table)")
    ap.add_argument("--rope-theta", type=float, default=10000.0)
    ap.add_argument("--init-gguf", default="",
                    help="start from this exported testbed GGUF (fine-tuning; same tokenizer flags and shape, no "
                         "--digit-embd: the file holds the folded table)")
    ap.add_argument("--wtype", default="f16", choices=["f16", "bf16", "f32"], help="GGUF weight type")
    # optimisation
    ap.add_argument("--lr", type=float, default=2e-3)
    ap.add_argument("--min-lr-frac", type=float, default=0.1)
    ap.add_argument("--warmup", type=float, default=0.02, help="fraction of the run")
    ap.add_argument("--wd", type=float, default=0.1)
    ap.add_argument("--tokens-per-step", type=int, default=8192)
    ap.add_argument("--fp32", action="store_true", help="no bf16 autocast (small models: fp32 is as fast on CPUs without AMX)")
    # data
    ap.add_argument("--stages", default="",
                    help="curriculum 'ctx:fraction,...' (default: 384:.3,768:.25,1280:.2,CTX:.25 for CTX=2048)")
    ap.add_argument("--task-frac", type=float, default=0.6, help="share of sequences that are task samples")
    ap.add_argument("--tasks", default="needle,vartrack,pointer",
                    help="task formats trained and evaluated (kvpack eval tasks names; walk: the decode regime, "
                         "docs/quality.md §2)")
    ap.add_argument("--task-weights", default="1,2,1", help="relative frequency of each of --tasks, in that order")
    ap.add_argument("--austen-filler-frac", type=float, default=0.3,
                    help="share of task samples whose filler is corpus sentences (the rest: built-in filler)")
    ap.add_argument("--answer-weight", type=float, default=5.0, help="loss weight of answer tokens")
    ap.add_argument("--number-weight", type=float, default=0.0,
                    help="loss weight of answer tokens that are numbers (1-3 digits); 0: --answer-weight")
    ap.add_argument("--copy-frac", type=float, default=0.0,
                    help="share of rows that are random-segment copy rows (induction warm-up), while progress < --copy-until")
    ap.add_argument("--copy-until", type=float, default=0.3, help="progress at which copy rows stop")
    ap.add_argument("--extra-questions", type=int, default=3,
                    help="more questions (same format, about the same prompt) appended to each training sample")
    ap.add_argument("--train-needles", type=int, default=4,
                    help="needles per training needle prompt (4-32; held-out prompts keep 4): more needles, more "
                         "extra questions per needle row")
    ap.add_argument("--train-chains", type=int, default=2,
                    help="variable chains per training vartrack prompt (2-8; held-out prompts keep 2): each extra chain "
                         "adds a 4-hop question the extra questions can ask")
    # evaluation / io
    ap.add_argument("--eval-every", type=float, default=10.0, help="minutes between held-out evaluations")
    ap.add_argument("--eval-n", type=int, default=20, help="held-out samples per task per evaluation")
    ap.add_argument("--eval-seed", type=int, default=1000, help="held-out seed (= kvpack eval tasks --seed)")
    ap.add_argument("--final-eval-n", type=int, default=50, help="kvpack eval tasks samples per task at the end (0: skip)")
    ap.add_argument("--ckpt-every", type=float, default=5.0, help="minutes between checkpoints")
    ap.add_argument("--log-every", type=float, default=30.0, help="seconds between train-log rows")
    ap.add_argument("--check-gguf", action="store_true", help="only: export the checkpoint and check the GGUF")
    ap.add_argument("--export-only", action="store_true", help="only: export the checkpoint to OUT/model.gguf")
    ap.add_argument("--export-ctx", type=int, default=0,
                    help="with --export-only: write OUT/model-ctxN.gguf whose context_length is N instead of the "
                         "trained context (to evaluate beyond it; kvpack refuses a context above the model's)")
    ap.add_argument("--skip-check", action="store_true",
                    help="no GGUF check / final kvpack eval (recipe exploration where the kvpack binary cannot run)")
    return ap.parse_args(argv)


def default_stages(ctx):
    cs = [c for c in (384, 768, 1280) if c < ctx] + [ctx]
    fr = {1: [1.0], 2: [0.5, 0.5], 3: [0.4, 0.3, 0.3], 4: [0.3, 0.25, 0.2, 0.25]}[len(cs)]
    return list(zip(cs, fr))


def parse_stages(s, ctx):
    if not s:
        return default_stages(ctx)
    st = [(int(a), float(b)) for a, b in (x.split(":") for x in s.split(","))]
    tot = sum(f for _, f in st)
    return [(c, f / tot) for c, f in st]
