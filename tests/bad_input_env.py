"""What the probe bad-input tables (``tests/bad_probe_cases.py``,
``tests/test_bad_inputs_files.py``) build their inputs from, and how they judge a case.

:func:`build_world` trains one tiny run and saves one result file of each kind (the
``probe_world`` fixture of ``conftest.py``, once per session); :class:`Env` gives a case that
world (never mutated: a case that breaks the model breaks a copy) and a scratch directory.
"""

from __future__ import annotations

import copy
import json
import re
import shutil
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import torch
from safetensors import safe_open
from safetensors.torch import load_file, save_file

import pe_interp
from pe_interp.cli import main
from pe_interp.runs.checkpoint import load_run
from pe_interp.tasks import Batch

TINY = dict(preset="smoke", n_train=128, n_test=64, epochs=1, seed=0)
NO_BOOT = dict(n_bootstrap=0)

# the messages several cases share (the world's model has 6 classes, 2 layers of 4 heads)
OOR = r"labels must be integers in 0\.\.5 \(the model's classes\), got 31 at index 4$"
NAN_WQ = (
    r"the model has non-finite weights \(NaN in blocks\.0\.attn\.W_Q\); its training diverged or the weights "
    r"were edited: reload the run \(load_run\) or retrain it$"
)
OVERFLOW = (
    r"the model's logits are not finite \(NaN or inf\) on these inputs although its weights are: an overflow; "
    r"check the inputs and the weights' scale$"
)
OTHER_MASK = (
    r"pad_mask does not fit the tokens: row \d+, position \d+ is marked (real, but it holds the pad id 0|"
    r"padding, but it holds token \d+) \(a pad mask of another batch\?\); pass the batch's own pad_mask, "
    r"or None to derive it$"
)
NUMPY = (
    r"tokens must be a torch tensor of token ids \[batch, pos\], got a numpy array \(int64\); convert it with "
    r"torch\.from_numpy\(\)$"
)
FLOAT_LABELS = (
    r"labels must be integer class indices in 0\.\.5, got torch\.float32 \(a float label would be "
    r"truncated\); pass labels\.long\(\) if they are whole numbers$"
)


def not_kind(kind: str, other: str, loader: str) -> str:
    """The message of a result file of ``kind`` loaded as ``other``."""
    a = "an" if kind[0] in "aeiou" else "a"
    b = "an" if other[0] in "aeiou" else "a"
    return rf"is {a} {kind} result, not {b} {other} result; load it with {re.escape(loader)}$"


@dataclass
class World:
    run: Path
    model: pe_interp.HookedPETransformer
    task: object
    batch: Batch  # 24 held-out examples
    other: Batch  # 24 more, of other lengths: its pad mask belongs to another batch
    pairs: object  # 12 counterfactual pairs
    files: dict[str, Path]  # one saved result file of each kind


def build_world(root: Path) -> World:
    from probes import (
        CoherenceResult,
        ablate_heads,
        attention_patterns,
        attribute,
        circuit,
        find_deposits,
        patch,
        path_patch,
        positional_scores,
    )
    from probes.circuits.route import HeadRoute

    pe_interp.train(out=root / "run", progress=False, **TINY)
    loaded = load_run(root / "run")
    model, task = loaded.model, loaded.task
    both = loaded.test_set(48)
    batch, other = both[:24], both[24:48]
    assert not torch.equal(batch.pad_mask, other.pad_mask)
    pairs = task.counterfactual_pairs(12, seed=1)
    abl = ablate_heads(model, batch.tokens, batch.labels, pad_mask=batch.pad_mask, n_bootstrap=20)
    attr = attribute(model, pairs, granularity="edge")
    results = {
        "ablation": abl,
        "deposit": find_deposits(abl),
        "patching": patch(
            model,
            pairs.clean.tokens,
            pairs.corrupt.tokens,
            clean_labels=pairs.clean.labels,
            corrupt_labels=pairs.corrupt.labels,
            pad_mask=pairs.clean.pad_mask,
            **NO_BOOT,
        ),
        "attribution": attr,
        "path patching": path_patch(model, pairs, senders=["embed"], receivers=["logits"]),
        "attention patterns": attention_patterns(
            model, batch.tokens, [(0, 0)], pad_mask=batch.pad_mask
        ),
        "positional scores": positional_scores(model, batch.tokens, pad_mask=batch.pad_mask),
        "circuit": circuit(attr, top_n=3),
        "head route": HeadRoute("L1H0", "logit_diff", 12, {"position": {"q": {"embed": 0.1}}}),
        "gradient coherence": CoherenceResult(
            torch.zeros(1, 2, 4), torch.zeros(1, 2, 4), torch.ones(1, 2, 4), (0,), "rope", 8
        ),
    }
    files = {
        kind: r.save(root / "files" / f"{kind.replace(' ', '_')}.json")
        for kind, r in results.items()
    }
    return World(root / "run", model, task, batch, other, pairs, files)


@dataclass
class Env:
    """What a case builds its input from: the shared world (never mutated) and a scratch dir."""

    w: World
    tmp: Path

    @property
    def m(self):
        return self.w.model

    @property
    def b(self) -> Batch:
        return self.w.batch

    def labels(self, i: int = 4, value: int = 31) -> torch.Tensor:
        out = self.b.labels.clone()
        out[i] = value
        return out

    def broken(self, name: str = "blocks.0.attn.W_Q", value: float = float("nan")):
        """A copy of the model with one weight set to ``value``."""
        model = copy.deepcopy(self.m)
        with torch.no_grad():
            dict(model.named_parameters())[name].view(-1)[0] = value
        return model

    def overflowing(self):
        """A copy whose weights are finite but whose logits overflow float32."""
        model = copy.deepcopy(self.m)
        with torch.no_grad():
            model.W_U.fill_(3e38)
        return model

    def unmasked(self):
        """The model with pads attended (``mask_padding=False``: it does not use the pad mask)."""
        model = pe_interp.HookedPETransformer(self.m.cfg.replace(mask_padding=False))
        model.load_state_dict(self.m.state_dict())
        return model

    def file(self, kind: str) -> Path:
        return self.w.files[kind]

    def write(self, text: str | bytes, name: str = "f.json") -> Path:
        path = self.tmp / name
        path.write_bytes(text if isinstance(text, bytes) else text.encode())
        return path

    def edited(self, kind: str, change: Callable[[dict], object]) -> Path:
        """A copy of the saved ``kind`` file, its JSON changed."""
        data = json.loads(self.file(kind).read_text())
        change(data)
        return self.write(json.dumps(data), f"edited_{kind.replace(' ', '_')}.json")

    def a_file(self) -> Path:
        return self.write("not a directory", "a-file")

    def run_copy(self) -> Path:
        dst = self.tmp / "run"
        shutil.copytree(self.w.run, dst)
        return dst

    def run_with(self, name: str, content: Path | str) -> Path:
        """A run copy whose file ``name`` is ``content`` (a file to copy, or text)."""
        d = self.run_copy()
        if isinstance(content, Path):
            shutil.copy(content, d / name)
        else:
            (d / name).write_text(content)
        return d

    def nan_weights_run(self) -> Path:
        d = self.run_copy()
        tensors = load_file(str(d / "model.safetensors"))
        tensors["blocks.0.attn.W_Q"].view(-1)[0] = float("nan")
        save_file(tensors, str(d / "model.safetensors"))
        return d

    def damaged_state_run(self) -> Path:
        """A run copy whose train_state misses one optimizer tensor, and resumes at step 1."""
        d = self.run_copy()
        path = str(d / "train_state.safetensors")
        with safe_open(path, framework="pt") as f:
            meta = f.metadata()
        tensors = load_file(path)
        del tensors["optim.3.exp_avg"]
        save_file(tensors, path, metadata={**meta, "step": "1"})
        return d

    def grid(self, text: str, name: str = "grid.yaml") -> str:
        return str(self.write(text, name))


def with_labels(batch: Batch, labels: torch.Tensor) -> Batch:
    return Batch(batch.tokens, labels, batch.pad_mask)


def expect_value_error(call: Callable[[], object], pattern: str) -> None:
    """``call()`` raises a ValueError whose message is one line matching ``pattern``."""
    try:
        call()
    except ValueError as err:
        message = str(err)
    except Exception as err:  # noqa: BLE001 - the point of the test
        raise AssertionError(f"{type(err).__name__} instead of a ValueError: {err!r}") from None
    else:
        raise AssertionError("no error")
    assert "\n" not in message, message
    assert re.search(pattern, message), message


def expect_cli_refusal(argv: list[str], pattern: str, capsys) -> None:
    """``pe-interp argv`` exits with status 2 and one matching line on stderr, no traceback."""
    try:
        code = main(argv)
    except SystemExit as exit_:  # argparse's usage errors
        code = exit_.code
    err = capsys.readouterr().err.strip()
    assert code == 2, f"exit status {code}; stderr: {err}"
    assert "Traceback" not in err
    lines = [ln for ln in err.splitlines() if ln.strip()]
    assert len(lines) == 1, f"more than one line: {err}"
    assert re.search(pattern, lines[0]), lines[0]
