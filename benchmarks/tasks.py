"""Benchmark: vectorised task generation vs a per-sample Python loop in the authors' style.

The authors' generators (paper digest §3) build each sample word by word in Python (a random
draw per word, per sample, then a join and a tokenizer). The loop baselines below keep that
structure (``random.choice`` per word, ``random.shuffle`` per sample for counting) but emit token
ids and a padded tensor, so both sides produce the same kind of output and the comparison is, if
anything, generous to the loop (no string joining, no tokenizer).

Run: ``python benchmarks/tasks.py``. Prints the median samples/s of each and the ratio.
"""

from __future__ import annotations

import argparse
import random
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import torch  # noqa: E402

from pe_interp.tasks import PAD_ID, CountTask, DistanceTask  # noqa: E402

N = 10_000
RUNS = 5


def loop_distance(task: DistanceTask, n: int, seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Task 1 the authors' way: per sample, per word ``random`` calls, then pad."""
    rng = random.Random(seed)
    fillers = task.filler_ids.tolist()
    t1, t2 = task.triggers
    rows, labels = [], []
    for _ in range(n):
        between = rng.randint(1, task.max_between)
        left = rng.randint(1, task.max_side)
        right = rng.randint(1, task.max_side)
        words = (
            [rng.choice(fillers) for _ in range(left)]
            + [t1]
            + [rng.choice(fillers) for _ in range(between)]
            + [t2]
            + [rng.choice(fillers) for _ in range(right)]
        )[: task.max_len]
        rows.append(words + [PAD_ID] * (task.max_len - len(words)))
        labels.append(between - 1)
    return torch.tensor(rows), torch.tensor(labels)


def loop_count(task: CountTask, n: int, seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Task 2 the authors' way: per word ``random.choice``, then ``random.shuffle`` per sample."""
    rng = random.Random(seed)
    triggers, fillers = list(task.triggers), task.filler_ids.tolist()
    rows, labels = [], []
    for _ in range(n):
        count = rng.randint(task.min_count, task.max_count)
        words = [rng.choice(triggers) for _ in range(count)]
        words += [rng.choice(fillers) for _ in range(task.length - count)]
        rng.shuffle(words)
        rows.append(words)
        labels.append(count - task.min_count)
    return torch.tensor(rows), torch.tensor(labels)


def median_seconds(fn: Callable[[int], object], runs: int) -> float:
    times = []
    for run in range(runs):
        start = time.perf_counter()
        fn(run)
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--threads",
        type=int,
        default=1,
        help="torch intra-op threads (default 1: a like-for-like single-core comparison with the "
        "loop, and immune to oversubscription on shared machines)",
    )
    torch.set_num_threads(parser.parse_args().threads)
    print(
        f"torch {torch.__version__}, {torch.get_num_threads()} thread(s); n = {N:,}, median of {RUNS} runs"
    )
    print(f"{'task':<10} {'loop samples/s':>16} {'vectorised samples/s':>22} {'speed-up':>10}")
    distance, count = DistanceTask(), CountTask()
    cases = [
        ("distance", lambda s: loop_distance(distance, N, s), lambda s: distance.sample(N, seed=s)),
        ("count", lambda s: loop_count(count, N, s), lambda s: count.sample(N, seed=s)),
    ]
    for name, loop, vectorised in cases:
        vectorised(0)  # warm-up (first-call allocation, cached trigger tables)
        t_loop = median_seconds(loop, RUNS)
        t_vec = median_seconds(vectorised, 2 * RUNS)
        print(f"{name:<10} {N / t_loop:>16,.0f} {N / t_vec:>22,.0f} {t_loop / t_vec:>9,.0f}x")


if __name__ == "__main__":
    main()
