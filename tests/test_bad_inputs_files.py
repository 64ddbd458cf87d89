"""Result files, ``save()`` paths, grids, resuming and the command line refuse bad input with one
clear line (issue 21, item 4), and good input still gives the right result.

- ``API_CASES``: a ValueError whose message is one line and matches;
- ``CLI_CASES``: ``pe-interp`` exits with status 2, one matching line on stderr, no traceback;
- the ``test_ok_*`` tests: inputs next to the refused ones that must keep working, and give the
  same numbers as the canonical form.

The world and the helpers are in ``tests/bad_input_env.py``; the probes' own inputs are in
``tests/bad_probe_cases.py``. ``ISSUE_CASES`` are the cases the issue names.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pytest
import torch
from bad_input_env import NO_BOOT, TINY, Env, expect_cli_refusal, expect_value_error, not_kind
from bad_probe_cases import CASES as PROBE_CASES

import pe_interp
from pe_interp.cli import main
from pe_interp.sweep.probing import AttentionRecord
from probes import (
    AblationResult,
    AttentionPatterns,
    Attribution,
    Circuit,
    CoherenceResult,
    DepositReport,
    PatchResult,
    PathPatch,
    PositionalScores,
    ablate_heads,
    attention_patterns,
    find_deposits,
    load_coherence,
)
from probes.circuits.route import HeadRoute


def _load_grid(path: str):
    from pe_interp.sweep import load_grid

    return load_grid(path)


# (id, call(env), message pattern): a ValueError with one matching line.
API_CASES: list[tuple[str, Callable[[Env], object], str]] = [
    # -- result files ---------------------------------------------------------------------------
    (
        "AblationResult.load(a deposit file)",
        lambda e: AblationResult.load(e.file("deposit")),
        not_kind("deposit", "ablation", "DepositReport.load"),
    ),
    (
        "AblationResult.load(a JSON list)",
        lambda e: AblationResult.load(e.write("[1, 2]")),
        r"f\.json is a JSON list, not an ablation result$",
    ),
    (
        "AblationResult.load(a JSON string)",
        lambda e: AblationResult.load(e.write('"ablation"')),
        r"is a JSON string, not an ablation result$",
    ),
    (
        "AblationResult.load(a truncated file)",
        lambda e: AblationResult.load(e.write(e.file("ablation").read_text()[:120])),
        r"f\.json: invalid JSON \(.* at line \d+\); the file is truncated or damaged, not a readable ablation result: run the probe again$",
    ),
    (
        "AblationResult.load(an empty file)",
        lambda e: AblationResult.load(e.write("")),
        r"invalid JSON .*not a readable ablation result",
    ),
    (
        "AblationResult.load(a binary file)",
        lambda e: AblationResult.load(e.write(b"\x89PNG\r\n\x1a\n\xff")),
        r"f\.json: not a JSON text file \(byte \d is not UTF-8\); the file is truncated or damaged",
    ),
    (
        "AblationResult.load(a directory)",
        lambda e: AblationResult.load(e.tmp),
        r"is a directory, not an ablation result file$",
    ),
    (
        "AblationResult.load(an untagged deposit file)",
        lambda e: AblationResult.load(e.edited("deposit", lambda d: d.pop("kind"))),
        not_kind("deposit", "ablation", "DepositReport.load"),
    ),
    (
        "AblationResult.load(a file without 'drops')",
        lambda e: AblationResult.load(e.edited("ablation", lambda d: d.pop("drops"))),
        r"edited_ablation\.json: a damaged ablation result \(no 'drops' key\)$",
    ),
    (
        "AblationResult.load(an untagged file without 'drops')",
        lambda e: AblationResult.load(
            e.edited("ablation", lambda d: (d.pop("drops"), d.pop("kind")))
        ),
        r"edited_ablation\.json is not an ablation result \(it has no 'drops' key\)$",
    ),
    (
        "AblationResult.load('values' as text)",
        lambda e: AblationResult.load(e.edited("ablation", lambda d: d.update(values="abc"))),
        r"edited_ablation\.json: a damaged ablation result \(could not convert string to float: 'abc'\)$",
    ),
    (
        "DepositReport.load(an ablation file)",
        lambda e: DepositReport.load(e.file("ablation")),
        not_kind("ablation", "deposit", "AblationResult.load"),
    ),
    (
        "PatchResult.load(an ablation file)",
        lambda e: PatchResult.load(e.file("ablation")),
        not_kind("ablation", "patching", "AblationResult.load"),
    ),
    (
        "PatchResult.load(an untagged ablation file)",
        lambda e: PatchResult.load(e.edited("ablation", lambda d: d.pop("kind"))),
        not_kind("ablation", "patching", "AblationResult.load"),
    ),
    (
        "Attribution.load(a patching file)",
        lambda e: Attribution.load(e.file("patching")),
        not_kind("patching", "attribution", "PatchResult.load"),
    ),
    (
        "PathPatch.load(an attribution file)",
        lambda e: PathPatch.load(e.file("attribution")),
        not_kind("attribution", "path patching", "Attribution.load"),
    ),
    (
        "AttentionPatterns.load(a JSON list)",
        lambda e: AttentionPatterns.load(e.write("[]")),
        r"is a JSON list, not an attention patterns result$",
    ),
    (
        "PositionalScores.load(an untagged attribution file)",
        lambda e: PositionalScores.load(e.edited("attribution", lambda d: d.pop("kind"))),
        not_kind("attribution", "positional scores", "Attribution.load"),
    ),
    (
        "Circuit.load(an ablation file)",
        lambda e: Circuit.load(e.file("ablation")),
        not_kind("ablation", "circuit", "AblationResult.load"),
    ),
    (
        "CoherenceResult.load(a JSON number)",
        lambda e: CoherenceResult.load(e.write("3")),
        r"is a JSON number, not a gradient coherence result$",
    ),
    (
        "HeadRoute.load(a circuit file)",
        lambda e: HeadRoute.load(e.file("circuit")),
        not_kind("circuit", "head route", "Circuit.load"),
    ),
    (
        "load_coherence(a coherence result)",
        lambda e: load_coherence(e.file("gradient coherence")),
        not_kind("gradient coherence", "gradient coherence set", "CoherenceResult.load"),
    ),
    (
        "AttentionRecord.load(an ablation file)",
        lambda e: AttentionRecord.load(e.file("ablation")),
        not_kind("ablation", "attention record", "AblationResult.load"),
    ),
    # -- save() ---------------------------------------------------------------------------------
    (
        "AblationResult.save(under a file)",
        lambda e: AblationResult.load(e.file("ablation")).save(e.a_file() / "x.json"),
        r"^cannot write .*a-file/x\.json: .*a-file is a file, not a directory; choose another path$",
    ),
    (
        "AblationResult.save(a directory)",
        lambda e: AblationResult.load(e.file("ablation")).save(e.tmp),
        r"is a directory; give a file path inside it, such as .*/result\.json$",
    ),
    (
        "DepositReport.save(a directory)",
        lambda e: DepositReport.load(e.file("deposit")).save(e.tmp),
        r"is a directory; give a file path",
    ),
    (
        "PatchResult.save(two levels under a file)",
        lambda e: PatchResult.load(e.file("patching")).save(e.a_file() / "a" / "b.json"),
        r"a-file is a file, not a directory",
    ),
    # -- grids (YAML, TOML) -----------------------------------------------------------------------
    (
        "load_grid: a YAML syntax error",
        lambda e: _load_grid(e.grid("name: g\nbase: {preset: smoke\naxes: {encoding: [rope]}\n")),
        r"grid\.yaml: invalid YAML at line 3, column 5: expected ',' or '\}', but got ':' \(while parsing a flow mapping that starts on line 2\)$",
    ),
    (
        "load_grid: a tab",
        lambda e: _load_grid(e.grid("name: g\n\tbase: {}\n")),
        r"grid\.yaml: invalid YAML at line 2, column 1: found character '\\t' that cannot start any token$",
    ),
    (
        "load_grid: a key given twice",
        lambda e: _load_grid(e.grid("name: g\nbase: {preset: smoke}\nbase: {preset: quick}\n")),
        r"grid\.yaml: invalid YAML at line 3, column 1: duplicate key 'base' \(first given on line 2\)$",
    ),
    (
        "load_grid: a TOML syntax error",
        lambda e: _load_grid(e.grid('name = "g"\nbase = {preset = \n', "grid.toml")),
        r"grid\.toml: invalid TOML: .*\(at line 2, column \d+\)$",
    ),
    # -- resuming ---------------------------------------------------------------------------------
    (
        "train(resume=True): a train_state missing an optimizer tensor",
        lambda e: pe_interp.train(out=e.damaged_state_run(), resume=True, progress=False, **TINY),
        r"train_state\.safetensors: optimizer tensor 'optim\.3\.exp_avg' \(of blocks\.0\.ln1\.w\) is missing; the file is damaged: restore it from a copy, or train again into a new --out$",
    ),
]

RESUME = [
    "--preset",
    "smoke",
    "--seed",
    "0",
    "--n-train",
    "128",
    "--n-test",
    "64",
    "--epochs",
    "1",
    "--no-progress",
]

# (id, argv(env), stderr pattern): exit status 2, one line, no traceback.
CLI_CASES: list[tuple[str, Callable[[Env], list[str]], str]] = [
    (
        "sweep: a YAML syntax error",
        lambda e: [
            "sweep",
            e.grid("name: g\nbase: {preset: smoke\naxes: {encoding: [rope]}\n"),
            "--dry-run",
        ],
        r"^pe-interp sweep: error: .*grid\.yaml: invalid YAML at line 3, column 5: expected ',' or '\}', but got ':'",
    ),
    (
        "sweep: a key given twice",
        lambda e: [
            "sweep",
            e.grid("name: g\naxes: {encoding: [rope]}\naxes: {encoding: [nope]}\n"),
            "--dry-run",
        ],
        r"grid\.yaml: invalid YAML at line 3, column 1: duplicate key 'axes' \(first given on line 2\)$",
    ),
    (
        "sweep: a TOML syntax error",
        lambda e: ["sweep", e.grid("name = 'g'\n[base\n", "grid.toml"), "--dry-run"],
        r"grid\.toml: invalid TOML: .*\(at line 2, column \d+\)$",
    ),
    (
        "train --resume: a train_state missing an optimizer tensor",
        lambda e: ["train", *RESUME, "--out", str(e.damaged_state_run()), "--resume"],
        r"^pe-interp train: error: .*train_state\.safetensors: optimizer tensor 'optim\.3\.exp_avg' \(of blocks\.0\.ln1\.w\) is missing",
    ),
    (
        "show: deposits.json holds an ablation result",
        lambda e: ["show", str(e.run_with("deposits.json", e.file("ablation")))],
        r"^pe-interp show: error: .*deposits\.json "
        + not_kind("ablation", "deposit", "AblationResult.load"),
    ),
    (
        "show: a truncated deposits.json",
        lambda e: ["show", str(e.run_with("deposits.json", '{"deposits": ['))],
        r"deposits\.json: invalid JSON \(.*\); the file is truncated or damaged, not a readable deposit result: run the probe again$",
    ),
    (
        "report: ablation.json is a JSON list",
        lambda e: ["report", str(e.run_with("ablation.json", "[1, 2]"))],
        r"^pe-interp report: error: .*ablation\.json is a JSON list, not an ablation result$",
    ),
    (
        "report: patching.json is an attribution result",
        lambda e: ["report", str(e.run_with("patching.json", e.file("attribution")))],
        r"patching\.json " + not_kind("attribution", "patching", "Attribution.load"),
    ),
    (
        "eval: NaN weights in model.safetensors",
        lambda e: ["eval", str(e.nan_weights_run())],
        r"model\.safetensors: tensor 'blocks\.0\.attn\.W_Q' contains non-finite values$",
    ),
    (
        "ablate --min-share 0",
        lambda e: ["ablate", str(e.w.run), "--min-share", "0"],
        r"--min-share must be a number in \(0, 1\], got 0\.0$",
    ),
    (
        "ablate --min-drop inf",
        lambda e: ["ablate", str(e.w.run), "--min-drop", "inf"],
        r"--min-drop must be a finite number >= 0, got inf$",
    ),
    (
        "ablate --min-drop nan",
        lambda e: ["ablate", str(e.w.run), "--min-drop", "nan"],
        r"--min-drop must be a finite number >= 0, got nan$",
    ),
    (
        "ablate --layers 7",
        lambda e: ["ablate", str(e.w.run), "--layers", "7", "--no-figures"],
        r"^pe-interp ablate: error: ablate_heads: layer 7 is out of range: the model has 2 layers \(0\.\.1\)$",
    ),
    (
        "ablate --layers -1",
        lambda e: ["ablate", str(e.w.run), "--layers", "-1", "--no-figures"],
        r"ablate_heads: layer -1 is out of range",
    ),
    (
        "ablate --batch-size 0",
        lambda e: ["ablate", str(e.w.run), "--batch-size", "0"],
        r"batch_size must be a positive integer, got 0$",
    ),
    (
        "patch --layers 9",
        lambda e: ["patch", str(e.w.run), "--layers", "9", "--n", "4", "--no-figures"],
        r"^pe-interp patch: error: patch: layer 9 is out of range: the model has 2 layers \(0\.\.1\)$",
    ),
    (
        "patch --batch-size 0",
        lambda e: ["patch", str(e.w.run), "--batch-size", "0", "--n", "4", "--no-figures"],
        r"patch: batch_size must be a positive whole number >= 1, got 0$",
    ),
    (
        "decompose --head 9",
        lambda e: ["decompose", str(e.w.run), "--head", "9", "--no-figures"],
        r"--head must be in 0\.\.3, got 9$",
    ),
    (
        "decompose --layer -1",
        lambda e: ["decompose", str(e.w.run), "--layer", "-1", "--no-figures"],
        r"--layer must be in 0\.\.1, got -1$",
    ),
]

# The cases the issue names (its hostile pass), in the order it lists them.
ISSUE_CASES = (
    "ablate_heads: labels out of range (accuracy)",
    "ablate_heads: NaN weights",
    "ablate_heads: inf weights",
    "evaluate: NaN weights (a NaN loss)",
    "ablate_heads: float labels",
    "ablate_heads: a pad mask of another batch",
    "ablate_heads(n_bootstrap=-5)",
    "find_deposits(min_share=5)",
    "ablate_heads: labels out of range (loss)",
    "ablate_heads: labels out of range (logit)",
    "patch: clean labels out of range",
    "evaluate: labels out of range",
    "attribute: labels out of range",
    "attention_patterns: a head out of range",
    "attention_patterns: an example out of range",
    "find_deposits(layers=[7])",
    "AblationResult.load(a deposit file)",
    "DepositReport.load(an ablation file)",
    "AblationResult.load(a JSON list)",
    "ablate_heads: numpy tokens",
    "train(resume=True): a train_state missing an optimizer tensor",
    "train --resume: a train_state missing an optimizer tensor",
    "AblationResult.save(under a file)",
    "AblationResult.save(a directory)",
    "ablate_heads: int8 tokens",
    "load_grid: a YAML syntax error",
    "sweep: a YAML syntax error",
    "AblationResult.load(a truncated file)",
)


@pytest.mark.parametrize("case", API_CASES, ids=[c[0] for c in API_CASES])
def test_api_bad_input(case, probe_world, tmp_path):
    _, call, pattern = case
    expect_value_error(lambda: call(Env(probe_world, tmp_path)), pattern)


@pytest.mark.parametrize("case", CLI_CASES, ids=[c[0] for c in CLI_CASES])
def test_cli_bad_input(case, probe_world, tmp_path, capsys):
    _, argv, pattern = case
    expect_cli_refusal(argv(Env(probe_world, tmp_path)), pattern, capsys)


# ---- good inputs next to the refused ones: they keep working, with the same numbers ----------
def _drops(model, tokens, labels, pad_mask=None) -> np.ndarray:
    return ablate_heads(model, tokens, labels, pad_mask=pad_mask, **NO_BOOT).drops


def test_ok_labels_and_tokens_in_other_forms(probe_world):
    """A list or a numpy array of integer labels, int32 or uint8 tokens and ``pad_mask=None``
    give exactly the numbers of the canonical int64 tensors with the batch's own mask."""
    m, b = probe_world.model, probe_world.batch
    want = _drops(m, b.tokens, b.labels, b.pad_mask)
    assert np.isfinite(want).all()
    for tokens, labels, mask in (
        (b.tokens, b.labels.tolist(), b.pad_mask),
        (b.tokens.int(), b.labels.numpy(), None),
        (b.tokens.to(torch.uint8), b.labels.int(), b.pad_mask),
    ):
        np.testing.assert_array_equal(_drops(m, tokens, labels, mask), want)


def test_ok_pads_attended_with_the_batchs_own_mask(probe_world):
    """With ``mask_padding=False`` the batch's own mask (and None) still work and agree."""
    e = Env(probe_world, Path("."))
    m, b = e.unmasked(), probe_world.batch
    np.testing.assert_array_equal(
        _drops(m, b.tokens, b.labels, b.pad_mask), _drops(m, b.tokens, b.labels)
    )


def test_ok_saved_files_are_tagged_and_old_files_still_load(probe_world, tmp_path):
    """``save()`` writes ``"kind"`` first; a file from before the tag (no ``kind``) loads to the
    same result, and so does every other kind's file with its own ``load``."""
    path = probe_world.files["ablation"]
    data = json.loads(path.read_text())
    assert next(iter(data)) == "kind" and data["kind"] == "ablation"
    tagged = AblationResult.load(path)
    data.pop("kind")
    old = tmp_path / "old.json"
    old.write_text(json.dumps(data))
    untagged = AblationResult.load(old)
    np.testing.assert_array_equal(untagged.drops, tagged.drops)
    assert untagged.baseline == tagged.baseline and untagged.meta == tagged.meta
    loaders = {
        "deposit": DepositReport,
        "patching": PatchResult,
        "attribution": Attribution,
        "path patching": PathPatch,
        "attention patterns": AttentionPatterns,
        "positional scores": PositionalScores,
        "circuit": Circuit,
        "head route": HeadRoute,
        "gradient coherence": CoherenceResult,
    }
    for kind, cls in loaders.items():
        stored = json.loads(probe_world.files[kind].read_text())
        assert stored["kind"] == kind
        loaded = cls.load(probe_world.files[kind])
        assert json.dumps(loaded.to_dict(), sort_keys=True) == json.dumps(
            cls.from_dict(stored).to_dict(), sort_keys=True
        )
        assert "kind" not in getattr(loaded, "extra", {})  # PatchResult keeps unknown keys in extra


def test_ok_find_deposits_at_the_bounds(probe_world):
    """``min_share=1`` and ``min_drop=0`` are in range, and the report records them."""
    report = find_deposits(
        AblationResult.load(probe_world.files["ablation"]), min_share=1.0, min_drop=0.0, layers=[1]
    )
    assert (report.min_share, report.min_drop) == (1.0, 0.0)
    assert [s.layer for s in report.layers] == [1]


def test_ok_tensor_indices(probe_world):
    """0-d integer tensors are indices like ints (layer, head, example)."""
    m, b = probe_world.model, probe_world.batch
    got = attention_patterns(
        m,
        b.tokens,
        [(torch.tensor(1), torch.tensor(2))],
        example=torch.tensor(3),
        pad_mask=b.pad_mask,
    )
    want = attention_patterns(m, b.tokens, [(1, 2)], example=3, pad_mask=b.pad_mask)
    assert got.heads == ((1, 2),) and got.example == 3
    np.testing.assert_array_equal(got.pattern, want.pattern)


def test_ok_evaluate_is_unchanged(probe_world):
    """``evaluate`` on a valid batch: the accuracy and mean cross-entropy, counted by hand."""
    m, b = probe_world.model, probe_world.batch
    got = pe_interp.evaluate(m, b)
    with torch.no_grad():
        logits = m(b.tokens, b.pad_mask)
    assert got["acc"] == int((logits.argmax(-1) == b.labels).sum()) / len(b)
    assert abs(got["loss"] - float(torch.nn.functional.cross_entropy(logits, b.labels))) < 1e-5


def test_ok_the_shipped_grids_still_parse():
    """The grids in grids/ have no duplicate keys: the stricter YAML reads them all."""
    from pe_interp.sweep import load_grid

    grids = sorted(Path(__file__).resolve().parents[1].joinpath("grids").glob("*.yaml"))
    assert grids
    for path in grids:
        assert load_grid(path).cells


def test_cli_an_internal_error_is_one_line(probe_world, monkeypatch, capsys):
    """A bug (not a bad input) still reaches the user as one line, status 1, no traceback;
    ``PE_INTERP_TRACEBACK=1`` shows the traceback."""
    from pe_interp.commands import show

    def boom(args):
        raise KeyError("exp_avg")

    monkeypatch.setattr(show, "run", boom)
    assert main(["show", str(probe_world.run)]) == 1
    err = capsys.readouterr().err.strip()
    assert err == (
        "pe-interp show: internal error: KeyError: 'exp_avg' (a bug, please report it; "
        "PE_INTERP_TRACEBACK=1 shows the traceback)"
    )
    monkeypatch.setenv("PE_INTERP_TRACEBACK", "1")
    with pytest.raises(KeyError):
        main(["show", str(probe_world.run)])


def test_the_tables_cover_the_issue():
    """Every bad input the issue lists (this engineer's share) is a case of these tables."""
    ids = {c[0] for c in PROBE_CASES} | {c[0] for c in API_CASES} | {c[0] for c in CLI_CASES}
    missing = [name for name in ISSUE_CASES if name not in ids]
    assert not missing, missing
