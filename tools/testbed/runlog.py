"""Run bookkeeping of tools/train_testbed.py: signal-safe stopping, the text log, the CSV logs (train_log.csv,
eval_log.csv) and the plot drawn from them at the end of a run."""
import csv
import os
import signal
import time

TRAIN_COLS = ["step", "elapsed_s", "progress", "ctx", "batch", "lr", "tokens", "loss", "text_loss", "answer_loss", "copy_loss",
              "tf_needle", "tf_vartrack", "tf_pointer", "tf_walk", "tok_per_s", "data_s"]
EVAL_COLS = ["step", "elapsed_s", "tokens", "ctx", "val_text_loss", "needle", "vartrack", "pointer", "walk", "n"]


class StopOnSignal:
    """While active, SIGTERM and SIGINT only record the signal (the training loop saves a checkpoint and returns),
    so an interrupted run loses nothing and continues with --resume. Main thread only (Python signal rule)."""

    def __enter__(self):
        self.signal = None
        self.old = {sig: signal.signal(sig, self._handle) for sig in (signal.SIGTERM, signal.SIGINT)}
        return self

    def _handle(self, signum, frame):
        self.signal = signum

    def __exit__(self, *exc):
        for sig, h in self.old.items():
            signal.signal(sig, h)
        return False


class Logger:
    def __init__(self, path):
        self.f = open(path, "a")

    def __call__(self, msg):
        line = time.strftime("%H:%M:%S ") + msg
        print(line, flush=True)
        self.f.write(line + "\n")
        self.f.flush()


def csv_append(path, cols, row):
    new = not os.path.exists(path)
    with open(path, "a", newline="") as f:
        w = csv.writer(f)
        if new:
            w.writerow(cols)
        w.writerow([row.get(c, "") for c in cols])


def csv_truncate(path, max_step):
    """On resume: drop rows logged after the checkpoint."""
    if not os.path.exists(path):
        return
    with open(path) as f:
        rows = list(csv.reader(f))
    keep = [rows[0]] + [r for r in rows[1:] if int(r[0]) <= max_step]
    with open(path, "w", newline="") as f:
        csv.writer(f).writerows(keep)


def fresh_acc():
    """Train-log accumulators, reset after every logged row."""
    return {"loss": 0.0, "n": 0, "text": [0.0, 0], "ans": [0.0, 0], "copy": [0.0, 0], "tok": 0, "time": 0.0, "data": 0.0}


def plot_training(out, tasks, title, log):
    """OUT/training.png: losses against training tokens, held-out exact match per task and context, stage
    boundaries. `title`: the figure's title; without matplotlib only a note in the log."""
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        log("plot: matplotlib missing (apt-get install python3-matplotlib)")
        return
    def read(p):
        p = os.path.join(out, p)
        if not os.path.exists(p):
            return []
        with open(p) as f:
            return list(csv.DictReader(f))
    tr, ev = read("train_log.csv"), read("eval_log.csv")
    if not tr:
        return
    fig, ax = plt.subplots(1, 2, figsize=(12, 4.5))
    mt = lambda r, k: [float(x[k]) / 1e6 for x in r if x[k] != ""]
    for k, lab in (("loss", "weighted loss"), ("text_loss", "Austen text"), ("answer_loss", "answer tokens"),
                   ("copy_loss", "copy rows (repeats)")):
        rows = [x for x in tr if x.get(k, "") != ""]
        ax[0].plot([float(x["tokens"]) / 1e6 for x in rows], [float(x[k]) for x in rows], label=lab)
    ax[0].set_xlabel("training tokens (M)")
    ax[0].set_ylabel("cross-entropy (nats/token)")
    ax[0].set_yscale("log")
    ax[0].legend()
    ax[0].grid(alpha=0.3)
    styles = ["-", "--", "-.", ":", (0, (1, 3)), (0, (5, 5))]
    for i, row_ctx in enumerate(sorted({int(x["ctx"]) for x in ev})):
        rows = [x for x in ev if int(x["ctx"]) == row_ctx]
        for t, col in zip(tasks, ("tab:blue", "tab:orange", "tab:green", "tab:red")):
            ax[1].plot([float(x["tokens"]) / 1e6 for x in rows], [float(x[t]) * 100 for x in rows],
                       linestyle=styles[i % len(styles)], color=col, marker="o", ms=3, label=f"{t} @ {row_ctx}")
    ax[1].set_xlabel("training tokens (M)")
    ax[1].set_ylabel("held-out exact match (%), teacher-forced")
    ax[1].set_ylim(-2, 102)
    ax[1].legend(fontsize=7, ncol=2)
    ax[1].grid(alpha=0.3)
    # stage boundaries
    prev = None
    for x in tr:
        if prev is not None and x["ctx"] != prev:
            for axx in ax:
                axx.axvline(float(x["tokens"]) / 1e6, color="gray", lw=0.6, ls=":")
        prev = x["ctx"]
    fig.suptitle(title)
    fig.tight_layout()
    path = os.path.join(out, "training.png")
    fig.savefig(path, dpi=110)
    log(f"plot: {path}")
