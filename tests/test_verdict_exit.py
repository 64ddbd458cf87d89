"""A verdict the intervals cannot decide says so, with the examples that would decide it, and a
command asked only for that verdict exits 3 (issue 39)."""

from __future__ import annotations

import numpy as np
import pytest

from pe_interp.cli import main
from probes.deposit import decision
from probes.deposit.positional import positional_dominance
from probes.routes.result import RouteShares


def _shares(
    top: tuple[float, float, float], other: tuple[float, float, float], n: int = 100
) -> RouteShares:
    shares = np.array([[top[0], other[0]]])
    low, high = np.array([[top[1], other[1]]]), np.array([[top[2], other[2]]])
    return RouteShares(
        shares=shares,
        ci_low=low,
        ci_high=high,
        routes=np.ones((1, 2), dtype=bool),
        embed=None,
        embed_ci=None,
        effect=2.0,
        effect_ci=(1.8, 2.2),
        counterfactual_effect=2.0,
        identity_gap=0.0,
        n_examples=n,
        n_bootstrap=100,
        ci=0.95,
        seed=0,
    )


def test_an_open_positional_verdict_says_how_many_pairs_would_decide_it():
    p = positional_dominance(_shares((0.6, 0.45, 0.75), (0.02, -0.01, 0.04)))
    assert p.verdict == "undecided"
    # the top route's interval (half-width 0.15 at n = 100) must clear 0.5 from 0.6: n (0.15 / 0.1)^2
    assert p.need == 225
    assert p.decided == "undecided (n = 100, need ≥ 225)" and p.decided in p.text()
    # a runner-up whose interval crosses +5% needs its own: n (0.07 / 0.01)^2 = 4,900 with share 0.04
    q = positional_dominance(_shares((0.9, 0.8, 0.95), (0.04, -0.03, 0.11)))
    assert q.verdict == "undecided" and q.need == 4900
    assert positional_dominance(_shares((0.9, 0.8, 0.95), (0.01, -0.02, 0.03))).decided == "yes"


def _planted(tmp_path):
    import shutil
    from pathlib import Path

    src = Path(__file__).parents[1] / "checkpoints" / "planted-one-route"
    shutil.copytree(src, tmp_path / "run")
    return str(tmp_path / "run")


def test_routes_prints_the_verdict_and_exits_0_when_decided(tmp_path, capsys):
    run = _planted(tmp_path)
    assert main(["routes", run, "--n", "64", "--n-bootstrap", "200"]) == 0
    out = capsys.readouterr().out
    assert "L0H3" in out and "positional deposit: yes" in out
    assert RouteShares.load(f"{run}/routes.json").n_examples == 64


def test_routes_exits_3_when_undecided(tmp_path, capsys, monkeypatch):
    import probes.deposit.positional as positional

    run = _planted(tmp_path)
    monkeypatch.setattr(
        positional,
        "positional_dominance",
        lambda r: positional_dominance(_shares((0.6, 0.45, 0.75), (0.02, -0.01, 0.04))),
    )
    assert main(["routes", run, "--n", "32", "--n-bootstrap", "50"]) == 3
    assert "undecided (n = 100, need ≥ 225)" in capsys.readouterr().out


@pytest.mark.parametrize("which", ["single", "layer0"])
def test_ablate_verdict_exits_3_when_undecided_and_0_when_decided(
    tmp_path, capsys, monkeypatch, which
):
    run = _planted(tmp_path)
    argv = [
        "ablate",
        run,
        "--n",
        "64",
        "--n-bootstrap",
        "100",
        "--no-figures",
        "--no-progress",
        "--verdict",
        which,
    ]
    assert main(argv) == 0
    assert (
        capsys.readouterr().out.strip().splitlines()[-1].split(": ", 1)[1].startswith(("yes", "no"))
    )
    open_ = decision.Decision(decision.UNDECIDED, "intervals reach across the bar", 64, 900)
    name = "decide_single" if which == "single" else "decide_concentration"
    monkeypatch.setattr(decision, name, lambda *a, **k: open_)
    import probes.deposit as deposit

    monkeypatch.setattr(deposit, name, lambda *a, **k: open_)
    assert main(argv) == 3
    assert (
        capsys.readouterr()
        .out.strip()
        .splitlines()[-1]
        .endswith("undecided (n = 64, need ≥ 900; intervals reach across the bar)")
    )


def test_ablate_verdict_refuses_what_cannot_decide_it(tmp_path, capsys):
    run = _planted(tmp_path)
    assert main(["ablate", run, "--verdict", "single", "--n-bootstrap", "0"]) == 2
    assert "--n-bootstrap must be >= 1" in capsys.readouterr().err
    assert main(["ablate", run, "--verdict", "layer0", "--metric", "loss"]) == 2
    assert "accuracy grid of every layer" in capsys.readouterr().err


def test_min_examples_is_the_exact_binomial_bound():
    """The fewest n with (1 - bar)^n <= 1 - ci, found here by counting up."""
    for ci, bar in [(0.95, 0.05), (0.9, 0.05), (0.95, 0.2), (0.99, 0.01)]:
        n = 1
        while (1 - bar) ** n > 1 - ci:
            n += 1
        assert decision.min_examples(ci, bar) == n
    assert decision.min_examples(0.95, 0.05) == 59


def test_ablate_on_one_example_says_undecided_not_no(tmp_path, capsys):
    """A bootstrap over one example gives [d, d]: no verdict can rest on it (issue 46)."""
    run = _planted(tmp_path)
    argv = ["ablate", run, "--n", "1", "--no-figures", "--no-progress", "--verdict", "single"]
    assert main(argv) == 3
    out = capsys.readouterr().out
    assert "single-head deposit: undecided (n = 1, need ≥ 59" in out
    assert "single-head deposit: no" not in out
    assert (
        out.strip()
        .splitlines()[-1]
        .endswith(
            "undecided (n = 1, need ≥ 59; a bootstrap over 1 example cannot bound a drop to 5 points "
            "at 95%)"
        )
    )


def test_route_shares_over_a_handful_of_pairs_are_undecided():
    few = positional_dominance(_shares((0.97, 0.96, 0.98), (0.0, 0.0, 0.0), n=10))
    assert few.verdict == "undecided" and few.need == 59 and "over 10 pairs" in few.why
    assert positional_dominance(_shares((0.97, 0.96, 0.98), (0.0, 0.0, 0.0), n=59)).verdict == "yes"


def test_routes_screen_measures_k_heads_and_says_so(tmp_path, capsys):
    """``--screen 2`` on the planted run with every head rotated (16 routes): two heads measured,
    their shares the exhaustive run's, the output and the verdict say how many were measured."""
    import json

    run = _planted(tmp_path)
    cfg = json.loads((tmp_path / "run" / "config.json").read_text())
    cfg["model"]["encoding"] = [{"name": "rope"}]
    (tmp_path / "run" / "config.json").write_text(json.dumps(cfg))
    main(["routes", run, "--n", "64", "--n-bootstrap", "200"])
    want = RouteShares.load(f"{run}/routes.json")
    capsys.readouterr()
    main(["routes", run, "--n", "64", "--n-bootstrap", "200", "--screen", "2"])
    out = capsys.readouterr().out
    got = RouteShares.load(f"{run}/routes.json")
    assert int(want.routes.sum()) == 16 and got.screened and got.measured.sum() == 2
    assert "2 of 16 routes measured exactly" in out
    k = got.measured
    np.testing.assert_allclose(got.shares[k], want.shares[k], atol=1e-5)
    assert main(["routes", run, "--screen", "0"]) != 0
    err = capsys.readouterr().err.strip().splitlines()
    assert err == ["pe-interp routes: error: --screen must be >= 1, got 0"]
