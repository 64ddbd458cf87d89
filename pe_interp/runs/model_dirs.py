"""A user's own checkpoint is a run: a saved Hugging Face causal language model (``save_pretrained``
with its tokenizer) probed on one of our tasks in language-model form.

The form: the task's ids are the model's input ids (``0`` is the pad), and class ``c`` is the
answer token ``task.d_vocab + c`` (:func:`answer_ids`), read at the last real position. The model's
vocabulary must hold both, and its context the task's longest input; otherwise one line says
which is too small. :func:`load_model_dir` gives back a :class:`~pe_interp.runs.checkpoint.Run` whose
model is a :class:`~pe_interp.models.bridge.model.BridgedModel` and whose splits are the preset's, so every
command that takes a run reads the directory (``pe-interp ablate DIR --task distance``).

A prompt family (``--task induction``, ``recall``, ``successor``) or a prompts file (``--task
my.jsonl``) reads the model on natural prompts in its own tokens instead
(:mod:`pe_interp.prompts.task`): classes are token ids, and the model's accuracy on the prompts is
printed first.

A GGUF file (``pe-interp ablate model.gguf --task distance``) is converted once into a saved
directory in the cache (:func:`pe_interp.runs.gguf.convert_gguf`) and read as that directory: its
results go there, and the run's source records the file's provenance (``config["model_dir"]
["gguf"]``: its name, sha256, size and quantisation types).
"""

from __future__ import annotations

import hashlib
import json
import os
import re
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

from pe_interp.prompts.task import (
    PROMPT_COUNTS,
    PromptSplits,
    PromptTask,
    is_prompt_task,
    load_prompt_task,
)
from pe_interp.runs.causal import (
    check_attends_causally,
    check_causal,
)
from pe_interp.runs.checkpoint import CheckpointError, Run
from pe_interp.runs.gguf import convert_gguf, gguf_provenance
from pe_interp.runs.gguf_file import is_gguf_file
from pe_interp.runs.weights import (
    WEIGHT_FILES,
    check_finite,
    check_memory,
    check_weight_files,
    weight_files,
    weights_sha256,
)

HUB_RUNS = (
    Path("runs") / "hub"
)  # where a hub model's results go: runs/hub/<owner>__<name>/<revision>/


def is_hub_name(text: str | Path) -> bool:
    """``owner/name`` that is no local path: a model on the Hugging Face hub."""
    return (
        bool(re.fullmatch(r"[A-Za-z0-9][\w.-]*/[A-Za-z0-9][\w.-]*", str(text)))
        and not Path(text).exists()
    )


def is_model_dir(path: str | Path) -> bool:
    """True when ``path`` holds a saved Hugging Face model (a ``config.json`` with a ``model_type``)."""
    config = Path(path) / "config.json"
    try:
        return config.is_file() and "model_type" in json.loads(config.read_text())
    except (OSError, ValueError, TypeError):
        return False


def answer_ids(task: Any) -> range:
    """The answer token of each class in language-model form: ``task.d_vocab + c``."""
    return range(task.d_vocab, task.d_vocab + task.n_classes)


def load_model_dir(
    path: str | Path,
    task: str | None,
    preset: str = "quick",
    seed: int = 0,
    device: str = "cpu",
    revision: str | None = None,
    whole_vocab: bool = False,
    accuracy: bool = True,
    check_prompts: Callable[[PromptTask, dict[str, Any]], None] | None = None,
) -> Run:
    """The saved model at ``path`` as a run on ``task`` (the ``preset``'s task and splits, ``seed``);
    ``path`` may be a GGUF file (converted once, :func:`pe_interp.runs.gguf.convert_gguf`) or a hub name
    (``owner/name``, at ``revision``) where the hub is reachable. With ``whole_vocab`` and no
    ``task``, the model reads its whole vocabulary (a label is a token id) and the run has no task.

    Damaged weights are refused in one line before any forward: a weights file that does not
    parse or does not hold what its header says (:func:`check_weight_files`), and a NaN or inf
    weight (:func:`check_finite`). On a prompt task the model's accuracy on the prompts is
    measured at once (its first forward); ``accuracy=False`` leaves that to
    :func:`with_accuracy`, so that a caller can refuse what cannot run before it;
    ``check_prompts(task, provenance)`` is called once the prompts are read, before the model is
    built around the bridge (which reads its encoding with one forward of a few tokens), so that
    a caller refuses what these prompts cannot serve before any forward."""
    bare = whole_vocab and task is None
    from pe_interp.models.bridge.hf_arch import boot_bridge

    hub = is_hub_name(path) and not is_gguf_file(path)
    if revision is not None and not hub:
        raise CheckpointError(
            f"{path}: --revision is for a model on the Hugging Face hub (owner/name)"
        )
    if hub:
        if task is None and not bare:
            raise CheckpointError(
                f"{path}: a model on the Hugging Face hub: say which task to probe it on with --task"
            )
        return _load_hub(
            str(path), task, preset, seed, device, revision, bare, accuracy, check_prompts
        )
    path = given = Path(path)
    if is_gguf_file(path):
        if task is None and not bare:
            raise CheckpointError(
                f"{path}: a GGUF model file, not a pe-interp run: say which task to probe it on "
                "with --task (and --preset for the task's size)"
            )
        if not bare:
            _check_task(path, task, preset, seed)  # a bad --task or --preset before converting
        path = convert_gguf(path)
    if not is_model_dir(path):
        raise CheckpointError(
            f"{path}: not a saved Hugging Face model (no config.json with a model_type)"
        )
    if task is None and not bare:
        raise CheckpointError(
            f"{path}: a saved Hugging Face model, not a pe-interp run: say which task to "
            "probe it on with --task (and --preset for the task's size)"
        )
    if not bare:
        _check_task(path, task, preset, seed)  # a bad --task or --preset before the boot
    check_causal(path, given)
    provenance, source = _weights_provenance(path, given)
    bridge = boot_bridge(path, device=device)
    check_finite(
        bridge,
        given,
        "download the GGUF file again" if "gguf" in source else "save or download the model again",
    )
    check_attends_causally(path, given)
    if bare:
        return _as_vocab_run(path, bridge, provenance, source)
    if is_prompt_task(task):
        return _as_prompt_run(path, bridge, task, preset, seed, provenance, accuracy, check_prompts)
    return _as_run(path, bridge, task, preset, seed, provenance, source)


def _weights_provenance(path: Path, given: Path) -> tuple[dict[str, Any], dict[str, Any]]:
    """The weights of the model directory ``path`` (``given``: what the user named, a GGUF file
    perhaps) checked whole and within memory, and what every result records of them: their
    hash, and where they came from."""
    weights = next((path / f for f in WEIGHT_FILES if (path / f).is_file()), None)
    if weights is None:
        raise CheckpointError(f"{path}: no weights ({' or '.join(WEIGHT_FILES)})")
    files = weight_files(weights)
    check_weight_files(files, given)
    check_memory(files, given or path)
    provenance = {"sha256": weights_sha256(files), "step": None}
    source: dict[str, Any] = {"weights": weights.name}
    gguf = gguf_provenance(path)  # a directory converted from a GGUF file: which file, how
    if gguf is not None:
        source["gguf"] = gguf
    if given != path:  # what the user named: the GGUF file, in messages
        source["file"] = str(given)
    provenance["source"] = source  # every result records where its weights came from
    return provenance, source


def task_choices() -> str:
    """Every ``--task`` a pretrained model takes, for messages."""
    from pe_interp.prompts.families import FAMILIES
    from pe_interp.tasks import TASKS

    return (
        f"{', '.join(TASKS)} (our tasks in language-model form), {', '.join(FAMILIES)} (prompt "
        "families in the model's own tokens) or FILE.jsonl (a prompts file)"
    )


def _check_task(where: Any, task: str, preset: str, seed: int) -> None:
    """A one-line error for a bad ``--task`` or ``--preset``, before any model is loaded."""
    from pe_interp.tasks import TASKS

    if not is_prompt_task(task) and task not in TASKS:
        raise CheckpointError(f"{where}: task must be one of {task_choices()}; got {task!r}")
    if not is_prompt_task(task):
        _task_configs(where, task, preset, seed)
    elif preset not in PROMPT_COUNTS:
        raise CheckpointError(
            f"{where}: --preset must be one of {', '.join(PROMPT_COUNTS)} for prompts; got {preset!r}"
        )
    elif str(task).endswith(".jsonl") and not Path(task).is_file():
        raise CheckpointError(f"{where}: --task {task}: no such prompts file")


def _as_prompt_run(
    run_dir: Path,
    bridge: Any,
    task: str,
    preset: str,
    seed: int,
    provenance: dict[str, Any],
    accuracy: bool = True,
    check_prompts: Callable[[PromptTask, dict[str, Any]], None] | None = None,
) -> Run:
    """A booted bridge as a run on natural prompts (:mod:`pe_interp.prompts.task`): classes are its
    token ids; the model's accuracy on the prompts is measured once and kept in the run's config
    (``config["accuracy"]``, :func:`with_accuracy`), which commands print first."""
    from pe_interp.models.bridge.model import BridgedModel

    source = provenance["source"]
    where = source.get("hub") or source.get("file") or run_dir
    try:
        prompt_task = load_prompt_task(task, bridge, preset, seed, where=where)
    except ValueError as err:
        raise CheckpointError(str(err)) from None
    if check_prompts is not None:
        check_prompts(prompt_task, provenance)
    model = BridgedModel(bridge, pad_id=prompt_task.pad_id).eval()
    config = {
        "model_dir": {"model_type": model.cfg.model_type, **source},
        "task": prompt_task.to_dict(),
        "preset": preset,
        "seed": seed,
    }
    splits = PromptSplits(n_test=len(prompt_task.prompts), seed=seed)
    run = Run(run_dir, model, prompt_task, splits, config, provenance)
    return with_accuracy(run) if accuracy else run


def with_accuracy(run: Run) -> Run:
    """A run on natural prompts with the model's accuracy on its prompts in its config
    (``config["accuracy"]``: counts and a summary line); measured here unless it is there."""
    import dataclasses

    from pe_interp.prompts import family_accuracy

    if "accuracy" in run.config or not isinstance(run.task, PromptTask):
        return run
    acc = family_accuracy(run.model, run.task.prompts)
    config = {**run.config, "accuracy": {**acc.to_dict(), "summary": acc.summary()}}
    return dataclasses.replace(run, config=config)


def _task_configs(where: Any, task: str, preset: str, seed: int) -> tuple[Any, Any]:
    from pe_interp.config.presets import build_run_configs

    try:
        _, task_obj, train_cfg = build_run_configs(task=task, preset=preset, seed=seed)
    except ValueError as err:
        raise CheckpointError(f"{where}: {err}") from None
    return task_obj, train_cfg


def _as_run(
    run_dir: Path,
    bridge: Any,
    task: str,
    preset: str,
    seed: int,
    provenance: dict[str, Any],
    source: dict[str, Any],
) -> Run:
    """A booted bridge as a run on ``task``: one line when its vocabulary or context is too small."""
    from pe_interp.models.bridge.model import BridgedModel
    from pe_interp.tasks.batch import PAD_ID

    task_obj, train_cfg = _task_configs(run_dir, task, preset, seed)
    c, where = bridge.cfg, source.get("hub") or source.get("file") or run_dir
    need = task_obj.d_vocab + task_obj.n_classes
    if c.d_vocab < need:
        raise CheckpointError(
            f"{where}: the model's vocabulary ({c.d_vocab}) is too small for task {task!r} at preset "
            f"{preset!r}: it needs {task_obj.d_vocab} input ids and {task_obj.n_classes} answer ids "
            f"({need})"
        )
    if c.n_ctx < task_obj.max_len:
        raise CheckpointError(
            f"{where}: the model's context ({c.n_ctx}) is shorter than task {task!r}'s longest "
            f"input at preset {preset!r} ({task_obj.max_len})"
        )
    model = BridgedModel(bridge, answers=answer_ids(task_obj), pad_id=PAD_ID)
    config = {
        "model_dir": {"model_type": model.cfg.model_type, **source},
        "task": task_obj.to_dict(),
        "preset": preset,
        "seed": seed,
    }
    return Run(run_dir, model.eval(), task_obj, train_cfg, config, provenance)


def _as_vocab_run(
    run_dir: Path, bridge: Any, provenance: dict[str, Any], source: dict[str, Any]
) -> Run:
    """A booted bridge on its whole vocabulary (a label is a token id), with no task."""
    from pe_interp.models.bridge.model import BridgedModel

    model = BridgedModel(bridge).eval()
    config = {"model_dir": {"model_type": model.cfg.model_type, **source}, "task": None}
    return Run(run_dir, model, None, None, config, provenance)


def _load_hub(
    name: str,
    task: str | None,
    preset: str,
    seed: int,
    device: str,
    revision: str | None,
    bare: bool = False,
    accuracy: bool = True,
    check_prompts: Callable[[PromptTask, dict[str, Any]], None] | None = None,
) -> Run:
    """A hub model as a run: fetched at ``revision`` (Pythia's training checkpoints are revisions
    ``step1000``, ...), its results under :data:`HUB_RUNS`."""
    at = f"{name}@{revision or 'main'}"
    if os.environ.get("HF_HUB_OFFLINE") == "1":
        raise CheckpointError(
            f"{at}: no local directory of that name, and the Hugging Face hub is off (HF_HUB_OFFLINE=1): "
            "fetch and save_pretrained it where the hub is reachable, then pass its directory"
        )
    import socket

    try:  # a quick look first: unreachable, the hub libraries would retry for a minute
        socket.create_connection(("huggingface.co", 443), timeout=5).close()
    except OSError as err:
        raise CheckpointError(
            f"{at}: no local directory of that name, and the Hugging Face hub is not reachable from "
            f"here ({err.strerror or err}): fetch and save_pretrained it where it is, then pass its "
            "directory"
        ) from None
    from transformer_lens.model_bridge import TransformerBridge
    from transformers import AutoTokenizer

    try:
        tokenizer = AutoTokenizer.from_pretrained(name, revision=revision)
        bridge = TransformerBridge.boot_transformers(
            name, tokenizer=tokenizer, revision=revision, device=device
        ).eval()
    except Exception as err:  # no network, no such model or revision: one line either way
        first = (str(err).splitlines() or [type(err).__name__])[0]
        raise CheckpointError(
            f"{at}: could not fetch it from the Hugging Face hub ({first[:200]})"
        ) from None
    out = HUB_RUNS / name.replace("/", "__") / (revision or "main")
    out.mkdir(parents=True, exist_ok=True)
    digest = hashlib.sha256()
    for value in bridge.original_model.state_dict().values():
        digest.update(
            value.detach().cpu().contiguous().view(-1).view(torch.uint8).numpy().tobytes()
        )
    source = {"hub": name, "revision": revision}
    provenance = {"sha256": digest.hexdigest(), "step": None, "source": source}
    check_finite(bridge, at, "fetch it again, or another revision")
    if bare:
        return _as_vocab_run(out, bridge, provenance, source)
    if is_prompt_task(task):
        return _as_prompt_run(out, bridge, task, preset, seed, provenance, accuracy, check_prompts)
    return _as_run(out, bridge, task, preset, seed, provenance, source)


__all__ = [
    "HUB_RUNS",
    "answer_ids",
    "check_attends_causally",
    "check_finite",
    "check_weight_files",
    "task_choices",
    "weights_sha256",
    "is_gguf_file",
    "is_hub_name",
    "is_model_dir",
    "load_model_dir",
    "with_accuracy",
]
