"""Sweeps: grid validation, local and Ray backends agree, resume, failures, lost workers."""

from __future__ import annotations

import json
import shutil
import textwrap

import pytest
import torch
from safetensors.torch import load_file

from pe_interp.sweep import (
    CHAOS_ENV,
    aggregate,
    collect,
    format_table,
    load_grid,
    parse_grid,
    run_sweep,
)

TINY = {
    "name": "tiny",
    "base": {"preset": "smoke", "task": "distance", "epochs": 1, "n_train": 128, "n_test": 64},
    "axes": {"encoding": ["rope", "alibi"]},
    "seeds": [0, 1],
}


def test_grid_expands_axes_times_seeds():
    grid = parse_grid(TINY)
    ids = [c.id for c in grid.cells()]
    assert len(ids) == 4 and len(set(ids)) == 4
    assert ids[0].startswith("encoding-rope") and ids[0].endswith("seed-0")


def test_grid_file_yaml_and_toml(tmp_path):
    y = tmp_path / "g.yaml"
    y.write_text(
        textwrap.dedent("""
        name: g
        base: {preset: smoke, epochs: 1}
        axes:
          encoding: [rope, {name: rope, heads: [0]}]
        seeds: 2
    """)
    )
    t = tmp_path / "g.toml"
    t.write_text(
        'name = "g"\nseeds = [0, 1]\n[base]\npreset = "smoke"\nepochs = 1\n[axes]\nencoding = ["rope", "nope"]\n'
    )
    assert len(load_grid(y).cells()) == 4 and len(load_grid(t).cells()) == 4
    assert "heads0" in load_grid(y).cells()[2].id


@pytest.mark.parametrize(
    "change, message",
    [
        ({"axis": {"encoding": ["rope"]}}, r"unknown key\(s\) \['axis'\]"),
        ({"axes": {"n_layer": [1, 2]}}, "axes.n_layer is not a setting; did you mean n_layers"),
        ({"axes": {"encoding": ["ropee"]}}, "cell encoding-ropee.*unknown name 'ropee'"),
        ({"axes": {"n_layers": [0]}}, "ModelConfig.n_layers must be an integer >= 1"),
        ({"axes": {"encoding": []}}, "axes.encoding must be a non-empty list"),
        ({"seeds": [-1]}, "seeds must be"),
        ({"probes": ["ablaton"]}, "unknown probe 'ablaton'"),
        ({"base": {"preset": "huge"}}, "preset must be one of"),
        ({"base": {"max_betwen": 3}}, "base.max_betwen is not a setting; did you mean max_between"),
        ({"variants": [{"seeds": []}]}, r"variants\[0\].seeds must be a non-empty list"),
        ({"variants": [{"seeds": [True]}]}, r"variants\[0\].seeds must be a non-empty list"),
        (
            {"probe_options": {"ablation": {"m": 3}}},
            r"probe_options.ablation: unknown option\(s\) \['m'\]",
        ),
        (
            {"probe_options": {"ablaton": {"n": 3}}},
            "probe_options.ablaton: not a probe with options",
        ),
        ({"probe_options": {"ablation": 5}}, "probe_options.ablation must be a mapping"),
    ],
)
def test_bad_grids_fail_with_a_clear_error(change, message):
    with pytest.raises(ValueError, match=message):
        parse_grid({**TINY, **change}, "bad.yaml")


def test_variant_seeds_replace_the_grid_seeds():
    grid = parse_grid({**TINY, "axes": {}, "variants": [{}, {"encoding": "alibi", "seeds": [4]}]})
    cells = [(c.kwargs.get("encoding", "rope"), c.seed) for c in grid.cells()]
    assert cells == [("rope", 0), ("rope", 1), ("alibi", 4)]
    assert grid.varying == ["encoding"]  # "seeds" is not a setting


def test_probe_options_reach_the_probes(tmp_path):
    grid = parse_grid(
        {
            **TINY,
            "axes": {},
            "seeds": [0],
            "probes": ["ablation", "dynamics"],
            "probe_options": {"ablation": {"n": 40}, "dynamics": {"points": 2, "n_probe": 16}},
        }
    )
    run_sweep(grid, tmp_path, backend="local", workers=1, progress=False)
    (result,), _ = collect(tmp_path)
    assert result["ablation"]["ablation"]["n_examples"] == 40
    assert set(result["seconds"]) == {"train", "ablation"}
    steps = {
        json.loads(line)["step"]
        for line in (tmp_path / "cells" / result["id"] / "run" / "deposit_dynamics.jsonl")
        .read_text()
        .splitlines()
    }
    assert steps == {0, 1, 2}  # every total_steps // 2 = 1 step of 2, plus the start


def test_progress_lines_count_cells_and_estimate_the_rest():
    from pe_interp.sweep.executors import Progress

    now = [100.0]
    progress = Progress(total=5, workers=2, enabled=True, clock=lambda: now[0], stream=None)
    now[0] += 600  # the first round of two cells finished after 10 minutes: 10 min per cell
    progress.done = 1
    progress.done += 1
    line = progress.line({"id": "c", "final": {"test_acc": 0.5}})
    # three cells left on 2 workers: two more rounds, 20 minutes (not 3 x 10 / 2 = 15)
    assert line.startswith(
        "[2/5] c: held-out acc 0.500; 10.0 min elapsed, 10.0 min/cell, ETA 20 min"
    )
    assert "FAILED: boom" in progress.line({"id": "d", "error": "boom"})


def test_progress_of_cells_that_start_together():
    """The demo: three cells on three workers. The first to finish says its round's time, not a
    third of it, and no 20-minute ETA for cells that end a few seconds later."""
    from pe_interp.sweep.executors import Progress

    now = [0.0]
    lines: list[str] = []

    class Stream:
        def write(self, text):
            lines.append(text)

        def flush(self):
            pass

    progress = Progress(
        total=3, workers=3, enabled=True, clock=lambda: now[0], stream=Stream(), heartbeat=120
    )
    now[0] = 100
    progress.tick()  # within the heartbeat: silent
    assert not lines
    now[0] = 130
    progress.tick()  # nothing done yet: a line that it is alive
    assert lines and lines[0].startswith("[0/3] 3 cell(s) running; 2.2 min elapsed")
    now[0] = 150
    progress.tick()  # within the heartbeat: silent
    assert len(lines) == 2  # the text and its newline
    now[0] = 600
    progress.update({"id": "a", "final": {"test_acc": 0.9}})
    assert "10.0 min elapsed, 10.0 min/cell, ETA soon" in lines[-2], lines
    now[0] = 610
    progress.update({"id": "b", "final": {"test_acc": 0.9}})
    now[0] = 620
    progress.update({"id": "c", "final": {"test_acc": 0.9}})
    assert "ETA" not in lines[-2] and lines[-2].startswith("[3/3] c:"), lines


def test_unparseable_file(tmp_path):
    f = tmp_path / "x.yaml"
    f.write_text("axes: [unclosed\n")
    with pytest.raises(
        ValueError,
        match=r"x.yaml: invalid YAML at line 2, column 1: expected ',' or '\]', but got "
        r"'<stream end>' \(while parsing a flow sequence that starts on line 1\)$",
    ):
        load_grid(f)


def _weights(sweep_dir):
    out = {}
    for cell in sorted((sweep_dir / "cells").iterdir()):
        out[cell.name] = load_file(str(cell / "run" / "model.safetensors"))
    return out


def test_resume_skips_finished_cells_and_failures_do_not_stop_others(tmp_path):
    grid = parse_grid({**TINY, "axes": {"encoding": ["rope", "alibi"], "lr": [1e-3]}})
    first = run_sweep(grid, tmp_path, backend="local", workers=1, progress=False)
    assert len(first.done) == 4 and not first.failed
    # simulate an interruption: one cell lost its result (killed before writing it)
    victim = sorted((tmp_path / "cells").iterdir())[1]
    before = load_file(str(victim / "run" / "model.safetensors"))
    (victim / "result.json").unlink()
    again = run_sweep(grid, tmp_path, backend="local", workers=1, progress=False)
    assert again.done == [victim.name] and len(again.skipped) == 3
    after = load_file(str(victim / "run" / "model.safetensors"))
    assert all(torch.equal(before[k], after[k]) for k in before)

    # a cell that raises is recorded and the rest go on (in a directory of its own: a sweep
    # directory belongs to one grid); its finished cell is skipped
    bad = parse_grid({**TINY, "axes": {"encoding": ["rope"], "lr": [1e-3]}, "seeds": [0, 5]})
    shutil.copytree(
        tmp_path / "cells" / bad.cells()[0].id, tmp_path / "bad" / "cells" / bad.cells()[0].id
    )
    (tmp_path / "bad" / "cells" / bad.cells()[1].id / "run").mkdir(parents=True)
    (
        tmp_path / "bad" / "cells" / bad.cells()[1].id / "run" / "train_state.safetensors"
    ).write_bytes(b"junk")
    out = run_sweep(bad, tmp_path / "bad", backend="local", workers=1, progress=False)
    assert (
        list(out.failed) == [bad.cells()[1].id]
        and "CheckpointError" in out.failed[bad.cells()[1].id]
    )
    assert out.done == [] and out.skipped == [bad.cells()[0].id]
    _, errors = collect(tmp_path / "bad")
    assert len(errors) == 1 and "traceback" in errors[0]
    results, _ = collect(tmp_path)
    rows = aggregate(results, ["encoding"])
    assert [(r["encoding"], r["n_seeds"]) for r in rows] == [("alibi", 2), ("rope", 2)]
    accs = [r["final"]["test_acc"] for r in results if r["params"]["encoding"] == "rope"]
    assert rows[1]["acc_mean"] == pytest.approx(sum(accs) / 2)
    assert format_table(rows).splitlines()[0] == "| encoding | n_seeds | acc % (mean ± std) |"


@pytest.mark.slow
def test_local_and_ray_give_identical_cells_and_ray_retries_a_killed_worker(tmp_path, monkeypatch):
    pytest.importorskip("ray")
    grid = parse_grid(TINY)
    local = run_sweep(grid, tmp_path / "local", backend="local", workers=2, progress=False)
    assert not local.failed
    marker = tmp_path / "killed-once"
    monkeypatch.setenv(CHAOS_ENV, str(marker))
    ray = run_sweep(grid, tmp_path / "ray", backend="ray", max_retries=2, progress=False)
    assert marker.exists(), "the fault injection did not fire"
    assert not ray.failed and sorted(ray.done) == sorted(local.done)
    wl, wr = _weights(tmp_path / "local"), _weights(tmp_path / "ray")
    assert wl.keys() == wr.keys()
    for cell in wl:
        for k in wl[cell]:
            assert torch.equal(wl[cell][k], wr[cell][k]), (cell, k)
    for cell in wl:
        rl = json.loads((tmp_path / "local" / "cells" / cell / "result.json").read_text())
        rr = json.loads((tmp_path / "ray" / "cells" / cell / "result.json").read_text())
        assert rl["final"]["test_acc"] == rr["final"]["test_acc"]
        lines = (
            (tmp_path / "ray" / "cells" / cell / "run" / "metrics.jsonl").read_text().splitlines()
        )
        assert len(lines) == len({json.loads(x)["step"] for x in lines})  # no duplicated records


def test_yaml_grids_read_on_and_no_as_words(tmp_path):
    """PyYAML's YAML 1.1 rules read the key ``on`` as True: ``on: all`` was 'unknown option(s) [True]'."""
    f = tmp_path / "g.yaml"
    f.write_text(
        "name: g\nbase: {preset: smoke}\naxes: {encoding: [rope]}\nprobes: [ablation]\n"
        "probe_options: {ablation: {on: all}}\n"
    )
    assert load_grid(f).probe_options == {"ablation": {"on": "all"}}
