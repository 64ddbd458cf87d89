"""Benchmark: ``pe-interp circuit SmolLM2.gguf --task induction ...`` (or the survey's circuit step,
``pe-interp survey ... --steps circuit``) as the command runs it (issue 55, items 3 and 5), with the
forwards of each phase counted: rows through each block's first norm
(a forward pre-hook; a skipped block runs none), a row that runs with gradients counted three
times (its backward as two), in layer-weighted forwards of the ``--n`` pairs (rows through every
block / (L x n)). Phases: the edge scores (``family_attributions``), the faithfulness search
(``minimal_circuit`` or the curve), the head whose route is read (``top_head``) and the route
(``head_route``). Prints each phase's forwards and seconds, the peak RSS, the threads and the load.

    python benchmarks/smollm2_circuit.py [--json OUT.json] -- circuit GGUF --task induction --faithful 0.9 ...
    python benchmarks/smollm2_circuit.py [--json OUT.json] -- survey GGUF --out findings/smollm2 --steps circuit

Everything after ``--`` is the command line of ``pe-interp``; its model must exist (else: skipped).
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import torch  # noqa: E402
from smollm2 import Counter as BlockRows  # noqa: E402  (benchmarks/, the script's own directory)

PHASES = (
    ("edge scores", "probes", "family_attributions"),
    ("faithfulness", "probes.circuits", "minimal_circuit"),
    ("faithfulness", "probes.circuits", "faithfulness_curve"),
    ("top head", "pe_interp.commands.circuit", "top_head"),
    ("route", "probes.circuits.route", "head_route"),
)


class Counter(BlockRows):
    """Rows through every block's first norm (:class:`smollm2.Counter`); with gradients on, three
    per row (the backward as two)."""

    def _count(self, i):
        def hook(mod, args):
            x = args[0]
            grad = torch.is_grad_enabled() and x.requires_grad
            self.rows[i] += int(x.shape[0]) * (3 if grad else 1)

        return hook

    def weighted(self) -> float:
        return sum(self.rows) / len(self.rows)


def instrument(n: int, record: dict) -> None:
    """Wrap ``circuit_run`` (to count on its model's bridge) and each phase (to read the count)."""
    import importlib

    import pe_interp.commands.circuit as cmd

    state: dict = {}
    run = cmd.circuit_run

    def counted_run(model, *a, **k):
        state["counter"] = Counter(model.bridge)
        try:
            return run(model, *a, **k)
        finally:
            state["counter"].close()

    cmd.circuit_run = counted_run
    for phase, module, name in PHASES:
        mod = importlib.import_module(module)
        fn = getattr(mod, name)

        def wrapped(*a, _fn=fn, _phase=phase, **k):
            c = state["counter"]
            before, t0 = c.weighted(), time.perf_counter()
            try:
                return _fn(*a, **k)
            finally:
                got = record.setdefault(_phase, {"forwards": 0.0, "seconds": 0.0})
                got["forwards"] += (c.weighted() - before) / n
                got["seconds"] += time.perf_counter() - t0

        setattr(mod, name, wrapped)
    # each family's edge scores, in the order circuit_run scores them (position, content[, both])
    families = importlib.import_module("probes.circuits.families")
    attribute = families.attribute

    def per_family(*a, **k):
        c = state["counter"]
        before = c.weighted()
        try:
            return attribute(*a, **k)
        finally:
            record.setdefault("edge scores by family", []).append((c.weighted() - before) / n)

    families.attribute = per_family


def main() -> None:
    argv = sys.argv[1:]
    rest = argv[argv.index("--") + 1 :] if "--" in argv else []
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--json", default=None, help="write the counts and timings here")
    args = ap.parse_args(argv[: argv.index("--")] if "--" in argv else argv)
    if len(rest) < 2 or rest[0] not in ("circuit", "survey"):
        ap.error("give the command after --: circuit MODEL ... or survey MODEL ... --steps circuit")
    if not Path(rest[1]).exists():
        print(f"smollm2_circuit: {rest[1]} does not exist: skipped")
        return
    default_n = 128 if rest[0] == "circuit" else 64
    n = int(rest[rest.index("--n") + 1]) if "--n" in rest else default_n
    record: dict = {}
    instrument(n, record)
    from pe_interp.cli import main as cli

    t0 = time.perf_counter()
    code = cli(rest)
    wall = time.perf_counter() - t0
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20  # KiB -> GiB
    by_family = record.pop("edge scores by family", [])
    total = sum(p["forwards"] for p in record.values())
    print(
        f"\n{' '.join(rest)}: exit {code}, {wall:.0f} s, peak RSS {peak:.2f} GiB, "
        f"{torch.get_num_threads()} threads, load {os.getloadavg()[0]:.1f}"
    )
    for phase, p in record.items():
        print(
            f"  {phase}: {p['forwards']:.1f} layer-weighted forwards of {n} pairs, {p['seconds']:.0f} s"
        )
    print(f"  total: {total:.1f} layer-weighted forwards")
    discovery = _discovery(rest, by_family, record)
    if discovery is not None:
        print(
            f"  discovery (the ranking family's edge scores {discovery[0]:.1f} and every "
            f"faithfulness evaluation {discovery[1]:.1f}): {sum(discovery):.1f} forwards of {n} pairs"
        )
    if args.json:
        out = {"argv": rest, "exit": code, "seconds": wall, "peak_rss_gib": peak, "n": n}
        out["edge_scores_by_family"] = by_family
        out |= {"threads": torch.get_num_threads(), "load": os.getloadavg()[0], "phases": record}
        Path(args.json).write_text(json.dumps(out, indent=1) + "\n")


def _discovery(rest: list[str], by_family: list[float], record: dict) -> tuple[float, float] | None:
    """``(the ranking family's edge scores, the faithfulness search)`` in forwards: what finding
    the circuit costs, without the other family's scores (shown beside each edge), the top head
    and its route. None where the run scored no families (the survey's step reads its own)."""
    if rest[0] != "circuit" or not by_family:
        return None
    by = rest[rest.index("--counterfactual") + 1] if "--counterfactual" in rest else "position"
    kinds = ["position", "content"] + ([by] if by == "both" else [])
    return by_family[kinds.index(by) if by != "both" else 2], record["faithfulness"]["forwards"]


if __name__ == "__main__":
    main()
