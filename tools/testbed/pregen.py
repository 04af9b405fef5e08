#!/usr/bin/python3
"""Pre-generates the task chunks a `--steps N` run of tools/train_testbed.py will read, in parallel, so that a
run on another machine (e.g. a GPU without the kvpack binary's libraries) or several recipe variants can start
from a filled OUT/data/ cache. Takes the trainer's own arguments (same --out, --seed, --stages, --steps,
--task-frac, --task-weights, --extra-questions, ...) plus --jobs and --margin (extra chunks per stream).

    /usr/bin/python3 tools/testbed/pregen.py --corpus ../shared/corpora/austen.txt --out build-train/x --steps 1500 --jobs 2
"""
import math
import os
import sys
from concurrent.futures import ThreadPoolExecutor

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
import train_testbed as tt  # noqa: E402
from testbed.data import HARNESS_CHAINS, HARNESS_NEEDLES, WALK_COUNT, chunk_size, gen_ctx, stable_seed  # noqa: E402


def main():
    argv = sys.argv[1:]
    jobs, margin = 2, 1
    for flag in ("--jobs", "--margin"):
        if flag in argv:
            i = argv.index(flag)
            v = int(argv[i + 1])
            del argv[i:i + 2]
            jobs, margin = (v, margin) if flag == "--jobs" else (jobs, v)
    a = tt.parse_args(argv)
    assert a.steps > 0, "--steps N is needed (the schedule by step)"
    run = tt.Run(a)
    run.setup_tokenizer()
    run.setup_model()
    run.setup_data()
    counts = {}
    for step in range(a.steps):
        run.step = step
        C = run.stage(run.progress())
        B = max(1, a.tokens_per_step // C)
        rng = np.random.default_rng([a.seed, step])
        for _ in range(B):  # the same draws as Run.batch
            if rng.random() < a.task_frac:
                task = run.task_list[rng.choice(len(run.task_list), p=run.task_w)]
                filler = rng.random() < a.austen_filler_frac
                counts[(task, C, filler)] = counts.get((task, C, filler), 0) + 1
            else:
                rng.integers(0, len(run.train_ids) - C)
    todo = []
    td = run.tasks
    for (task, C, filler), n in sorted(counts.items()):
        for k in range(math.ceil(n / chunk_size(task)) + margin):
            gseed = stable_seed("train", td.run_seed, task, C, int(filler), k)
            gctx = gen_ctx(task, C, td.n_extra)
            wc = WALK_COUNT if task == "walk" else 0
            tag = f"-w{wc}" if wc else ""
            name = f"train-{task}{tag}-c{gctx}-{'austen' if filler else 'builtin'}-{k}"
            todo.append((name, task, chunk_size(task), gctx, gseed, filler, HARNESS_NEEDLES, HARNESS_CHAINS, wc))
    run.log(f"pregen: {len(todo)} chunks for {sum(counts.values())} samples; {counts}")
    with ThreadPoolExecutor(jobs) as ex:
        list(ex.map(lambda t: td._load_or_gen(*t), todo))
    run.log("pregen: done")


if __name__ == "__main__":
    main()
