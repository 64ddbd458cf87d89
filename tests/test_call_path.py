"""The ablation path goes down the layers (issue 39): ``benchmarks/call_path.py`` traced on each engine."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest

SPEC = importlib.util.spec_from_file_location(
    "call_path", Path(__file__).parents[1] / "benchmarks" / "call_path.py"
)
call_path = importlib.util.module_from_spec(SPEC)
SPEC.loader.exec_module(call_path)


@pytest.mark.parametrize("engine,most", [("exact", 0), ("sampled", 1), ("attribution", 0)])
def test_the_ablation_path_never_comes_back(engine, most):
    m = call_path.measure(call_path.trace(engine))
    assert m["returns"] <= most, m["why"]
    assert m["rooms"][:2] == [
        "probes/ablation/entry.py",
        "probes/ablation/plan.py",
    ]  # one entry, then the one check
    assert f"probes/ablation/{engine}.py" in m["rooms"]


def test_measure_counts_a_callback_and_a_reentry():
    # a stage re-entered after it had returned, and a tool calling back up into its caller
    calls = [
        ("probes/ablation/entry.py", ()),
        ("probes/ablation/plan.py", ("probes/ablation/entry.py",)),
        ("probes/ablation/exact.py", ("probes/ablation/entry.py",)),
        ("probes/ablation/plan.py", ("probes/ablation/entry.py",)),
        ("probes/common/metrics.py", ("probes/ablation/exact.py", "probes/ablation/entry.py")),
        (
            "probes/ablation/exact.py",
            ("probes/common/metrics.py", "probes/ablation/exact.py", "probes/ablation/entry.py"),
        ),
        ("probes/common/metrics.py", ("probes/ablation/exact.py", "probes/ablation/entry.py")),
    ]
    m = call_path.measure(calls)
    assert m["returns"] == 2 and m["tool_calls"] == 1
    assert m["strict"] == 3
