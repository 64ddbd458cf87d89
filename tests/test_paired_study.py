"""Two dynamics studies compared seed by seed (``pe-interp study TEST --paired REFERENCE``,
pe_interp.report.paired) on synthetic findings whose numbers are worked out by hand, and the exact
sign test behind it against a count of every outcome."""

from __future__ import annotations

import itertools
import json

import numpy as np
import pytest

from pe_interp.cli import main
from pe_interp.report.paired import paired_labels, paired_markdown, paired_rows, unpaired
from probes.common.metrics import sign_test

NO = {"single_head": "no", "layer0": "no", "positional": "no"}
YES0 = {**NO, "layer0": "yes"}


def _snap(step, layer0, verdicts):
    return {
        "step": step,
        "drops": [layer0, [0.0, 0.0]],
        "verdicts": {k: {"verdict": v} for k, v in verdicts.items()},
    }


def _finding(seed, snapshots, **params):
    return {
        "format": 1,
        "id": f"{seed}-{params}",
        "condition": "base",
        "seed": seed,
        "test_acc": 1.0,
        "params": {"lr": 0.003, **params},
        "snapshots": snapshots,
    }


# with decay (the reference): seed 0 holds a 50-point lead; seed 1 never concentrates
REFERENCE = [
    _finding(0, [_snap(0, [0, 0], NO), _snap(48, [0.5, 0.1], YES0), _snap(96, [0.45, 0.1], YES0)]),
    _finding(1, [_snap(0, [0, 0], NO), _snap(48, [0.3, 0.3], NO), _snap(96, [0.1, 0.1], NO)]),
    _finding(2, [_snap(0, [0, 0], NO), _snap(48, [0.2, 0.1], NO)]),  # no partner: left out
]
# without decay: seed 0's lead peaks lower and fades; seed 1 concentrates late
TEST = [
    _finding(
        0,
        [_snap(0, [0, 0], NO), _snap(48, [0.4, 0.1], NO), _snap(96, [0.2, 0.1], NO)],
        weight_decay=0.0,
    ),
    _finding(
        1,
        [_snap(0, [0, 0], NO), _snap(48, [0.1, 0.2], NO), _snap(96, [0.1, 0.35], YES0)],
        weight_decay=0.0,
    ),
]


def test_sign_test_against_every_outcome():
    for n in range(0, 9):
        outcomes = list(itertools.product((0, 1), repeat=n))
        for a in range(n + 1):
            b = n - a
            extreme = abs(a - b)
            naive = sum(abs(2 * sum(o) - n) >= extreme for o in outcomes) / len(outcomes)
            assert sign_test(a, b) == pytest.approx(naive, abs=1e-12)
    assert (
        sign_test(6, 0) == pytest.approx(2 / 64) == sign_test(np.int64(6), np.int64(0))
    )  # counts from numpy sums
    for bad in ((-1, 2), (1.5, 2), (True, 2)):
        with pytest.raises(ValueError, match="counts"):
            sign_test(*bad)


def test_pairs_by_seed_with_each_sides_lead_and_the_sign_test():
    rows = paired_rows(TEST, REFERENCE)
    assert [r["seed"] for r in rows] == [0, 1]
    assert paired_labels(rows) == ("weight_decay=0.0", "weight_decay (default)")
    r0, r1 = rows
    assert (
        r0["reference"]["l0_peak"]["drop"] == 0.5
        and r0["reference"]["l0_peak"]["lead_final"] == 0.45
    )
    assert r0["test"]["l0_peak"]["drop"] == 0.4 and r0["test"]["l0_peak"]["lead_final"] == 0.2
    assert r1["test"]["l0_peak"]["head"] == "L0H1" and r1["test"]["l0_peak"]["step"] == 96
    assert unpaired(TEST, REFERENCE) == ([], [2])
    md = paired_markdown(rows, "found/test", "found/ref", unpaired(TEST, REFERENCE))
    assert (
        "| 0 | 48–96 (2 of 3 snapshots) | 50.0 (L0H0, step 48) → 45.0 (L0H0) | never | "
        "40.0 (L0H0, step 48) → 20.0 (L0H0) |"
    ) in md
    assert (
        "| 1 | never | 30.0 (L0H0, step 48) → 10.0 (L0H0) | 96–96 (1 of 3 snapshots) | "
        "35.0 (L0H1, step 96) → 35.0 (L0H1) |"
    ) in md
    assert (
        "Paired by seed (2 seeds; the same data, initialisation and order on both sides; left out: seed(s) 2 run only "
        "with weight_decay (default)):" in md
    )
    # one seed each way: p = 1; the lead's paired differences -10 and +5 at the peak, -25 and +25 at the end
    assert (
        "layer-0 concentration at some snapshot in 1 of 2 seeds with weight_decay (default) and 1 of 2 with "
        "weight_decay=0.0 (1 only with the first, 1 only with the second; exact sign test p = 1)"
    ) in md
    assert (
        "at its peak median -2.5 (from -10.0 to +5.0) points, at the end median +0.0 (from -25.0 to +25.0)"
        in md
    )
    # falls from peak to end: reference 5 and 20, test 20 and 0 (seed 1's lead peaks at the end)
    assert (
        "the lead fell by a median of 12.5 points with weight_decay (default) and 10.0 with weight_decay=0.0 "
        "(paired difference median -2.5 (from -20.0 to +15.0); further with weight_decay=0.0 in 1 of 2 seeds)"
    ) in md


def test_what_does_not_pair_is_refused_in_one_line():
    with pytest.raises(
        ValueError, match=r"seed\(s\) \[0\] of condition 'base' found more than once"
    ):
        paired_rows([*TEST, TEST[0]], REFERENCE)
    shorter = [dict(TEST[0], snapshots=TEST[0]["snapshots"][:2]), TEST[1]]
    with pytest.raises(ValueError, match="seed 0: the two runs were probed at different steps"):
        paired_rows(shorter, REFERENCE)
    with pytest.raises(ValueError, match="no seed was run in both"):
        paired_rows([TEST[1]], [REFERENCE[0]])
    # list-valued settings name the difference (and pairs that differ in two ways are not one comparison)
    silent = [
        _finding(s, f["snapshots"], silent_heads=[[0, 1]])
        for s, f in ((0, REFERENCE[0]), (1, REFERENCE[1]))
    ]
    assert paired_labels(paired_rows(silent, REFERENCE)) == (
        "silent_heads=[[0, 1]]",
        "silent_heads (default)",
    )
    mixed = [silent[0], _finding(1, REFERENCE[1]["snapshots"], silent_heads=[[0, 2]])]
    with pytest.raises(ValueError, match="not one comparison"):
        paired_labels(paired_rows(mixed, REFERENCE))


def test_the_study_command_writes_the_paired_table_and_figure(tmp_path, capsys):
    for name, found in (("ref", REFERENCE), ("fade", TEST)):
        (tmp_path / name).mkdir()
        for i, f in enumerate(found):
            (tmp_path / name / f"{i}.json").write_text(json.dumps(f))
    readme = tmp_path / "findings" / "README.md"  # where the committed studies' blocks live
    readme.parent.mkdir()
    readme.write_text(
        "a\n<!-- study:fade-paired begin -->\nold\n<!-- study:fade-paired end -->\nb\n"
    )
    colon = tmp_path / "ref:1"  # a colon inside the path is the path's
    colon.mkdir()
    for i, f in enumerate(REFERENCE):
        (colon / f"{i}.json").write_text(json.dumps(f))
    assert (
        main(
            ["study", str(tmp_path / "fade"), "--paired", str(colon), "--out", str(tmp_path / "c")]
        )
        == 0
    )
    assert (
        main(
            [
                "study",
                str(tmp_path / "fade"),
                "--paired",
                f"{tmp_path / 'ref'}:base",
                "--readme",
                str(readme),
            ]
        )
        == 0
    )
    assert (
        "| 0 | 48–96 (2 of 3 snapshots) |" in readme.read_text() and "old" not in readme.read_text()
    )
    assert (tmp_path / "fade" / "study" / "paired.png").read_bytes()[:4] == b"\x89PNG"
    pairs = json.loads((tmp_path / "fade" / "study" / "paired.json").read_text())["pairs"]
    assert [p["seed"] for p in pairs] == [0, 1]
    capsys.readouterr()
    assert main(["study", str(tmp_path / "fade"), "--paired", f"{tmp_path / 'ref'}:other"]) == 2
    assert "no run of condition 'other'" in capsys.readouterr().err
