"""One way to open any model: :func:`load` takes where a model comes from and returns the
:class:`~pe_interp.models.protocol.ProbeModel` that every probe accepts.

=========================  ==========================================  ===========================
source                     what it is                                  read by
=========================  ==========================================  ===========================
``runs/r0``                a run directory ``pe-interp train`` wrote   :func:`~pe_interp.runs.checkpoint.load_run`
``runs/r0@48``             that run's snapshot at step 48              :func:`~pe_interp.runs.checkpoint.load_run`
``models/llama``           a saved Hugging Face model directory        :func:`~pe_interp.runs.model_dirs.load_model_dir`
``SmolLM2.Q4_1.gguf``      a GGUF file (converted once, then cached)   :func:`~pe_interp.runs.model_dirs.load_model_dir`
``owner/name``             a model on the Hugging Face hub             :func:`~pe_interp.runs.model_dirs.load_model_dir`
=========================  ==========================================  ===========================

:func:`open_run` is the dispatch itself, returning the :class:`~pe_interp.runs.checkpoint.Run`
(model, task, configs, provenance) that the command line works on.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from pe_interp.models.protocol import ProbeModel
from pe_interp.runs.checkpoint import STEPS_DIR, CheckpointError, Run, load_run, split_step
from pe_interp.runs.gguf import CACHE_ENV, cache_root
from pe_interp.runs.gguf_file import is_gguf_file
from pe_interp.runs.model_dirs import is_hub_name, is_model_dir, load_model_dir


@dataclass(frozen=True)
class Origin:
    """Where a loaded model came from, as :func:`load` attaches it (``model.origin``)."""

    source: str
    """What the caller named: a run directory, ``RUN@STEP``, a model directory, a GGUF file or a hub name."""
    provenance: dict[str, Any] | None
    """The weights loaded (``sha256``, ``step``, ``source``): what every probe result records."""
    task: Any
    """The task or prompt family the model was loaded on (None: a pretrained model, whole vocabulary)."""
    tokenizer: Any
    """The model's own tokenizer (a pretrained model's), or None (a pe-interp run: tasks make ids)."""
    run: Run
    """The run as the command line reads it (model, task, configs, provenance)."""


def is_pretrained(source: str | Path) -> bool:
    """Whether ``source`` names a pretrained model (a model directory, a GGUF file, a hub name)
    rather than a pe-interp run."""
    path, _ = split_step(source)
    return is_model_dir(path) or is_gguf_file(path) or is_hub_name(str(source))


def writes_into(source: str | Path, out: str | Path | None = None) -> tuple[Path, str, str] | None:
    """Where a command's results of ``source`` go, known before anything loads: ``out`` where it
    is given; else the run directory (``RUN@S``: its ``steps/S/``), the model directory, the GGUF
    cache (where the file is converted and its results written). With what to call it and how
    to fix it when it cannot be written (:func:`check_destination`); None for a source that is
    no local path (a hub name, or a missing directory, which the loader names)."""
    if out is not None:
        return (
            Path(out),
            "output directory",
            "choose a directory you can write, or make it writable",
        )
    path, step = split_step(source)
    if is_gguf_file(path):
        return (
            cache_root(),
            f"{source}: the GGUF cache (where it is converted and its results go)",
            f"set {CACHE_ENV} to a directory you can write",
        )
    if not Path(path).exists():  # a hub name, or nothing: the loader says which
        return None
    hint = "make it writable, or copy the run (or model directory) where you can write"
    if step is None:
        return Path(path), "", hint
    return Path(path) / STEPS_DIR / str(step), f"{source}: its results go to", hint


def check_destination(source: str | Path, out: str | Path | None = None) -> None:
    """A one-line CheckpointError, before the weights load, when the directory a command writes
    the results of ``source`` into (:func:`writes_into`) cannot be written."""
    from pe_interp.util.io import check_writable_dir

    target = writes_into(source, out)
    if target is None:
        return
    try:
        check_writable_dir(*target)
    except ValueError as err:
        raise CheckpointError(str(err)) from None


def open_run(
    source: str | Path,
    task: str | None = None,
    *,
    preset: str = "quick",
    seed: int = 0,
    device: str = "cpu",
    revision: str | None = None,
    pretrained_ok: bool = True,
    whole_vocab: bool = False,
) -> Run:
    """The :class:`Run` at ``source`` (module table): a pe-interp run knows its task; a pretrained
    model is read as a run on ``task`` (a synthetic task or a prompt family, at ``preset`` and
    ``seed``); with ``whole_vocab`` and no ``task``, on its whole vocabulary (a label is a token id).
    Every refusal is one line (:class:`CheckpointError`), before the weights load."""
    path, step = split_step(source)
    gguf = is_gguf_file(path)
    named = task is not None or revision is not None or whole_vocab
    if is_model_dir(path) or gguf or (named and is_hub_name(str(source))):
        what = "a GGUF model file" if gguf else "a saved Hugging Face model"
        if not pretrained_ok:
            raise CheckpointError(
                f"{source}: {what}; this command reads pe-interp runs only (ablate, patch, "
                "routes and decompose read a model directory or a GGUF file with --task)"
            )
        if step is not None:
            raise CheckpointError(f"{source}: {what} has no snapshots; give it without @STEP")
        return load_model_dir(
            path, task, preset, seed=seed, device=device, revision=revision, whole_vocab=whole_vocab
        )
    if task is not None or revision is not None:
        raise CheckpointError(not_a_model(source, path))
    return load_run(source, device=device)


def not_a_model(source: str | Path, path: Path) -> str:
    """Why ``path``, given with ``--task`` or ``--revision``, is no saved Hugging Face model: what
    it is instead, and what would make it one."""
    path = Path(path)
    hf = (
        "a saved Hugging Face model (save_pretrained writes its config.json, weights and tokenizer)"
    )
    if not path.exists():
        return (
            f"{source}: no such directory or file; give {hf}, a GGUF file, or owner/name on the hub"
        )
    if not path.is_dir():
        return (
            f"{source}: a file, neither a GGUF file nor a model directory; give {hf} or a GGUF file"
        )
    config = path / "config.json"
    if not config.is_file():
        what = (
            "an empty directory" if not any(path.iterdir()) else "a directory without config.json"
        )
        return f"{source}: {what}, neither {hf} nor a pe-interp run"
    try:
        data = json.loads(config.read_text())
    except (OSError, UnicodeDecodeError, ValueError) as err:
        return (
            f"{config}: not valid JSON ({str(err).splitlines()[0]}); {hf[2:]} names its model_type "
            "there"
        )
    if isinstance(data, dict) and {"model", "task", "train"} <= set(data):
        return (
            f"{source}: --task and --revision are for a saved Hugging Face model (a directory, a "
            "GGUF file, or owner/name on the hub); a pe-interp run knows its task"
        )
    return f"{config}: no model_type, so not {hf}, nor the config of a pe-interp run"


def load(
    source: str | Path,
    task: str | None = None,
    *,
    preset: str = "quick",
    seed: int = 0,
    device: str = "cpu",
    revision: str | None = None,
) -> ProbeModel:
    """The model at ``source`` (a run directory, ``RUN@STEP``, a Hugging Face directory, a GGUF
    file or a hub name), in eval mode, as every probe takes it. ``model.origin``
    (:class:`Origin`) says where it came from: its provenance, task and tokenizer.

    A pretrained model opened without ``task`` reads the whole vocabulary (a label is a token id);
    with ``task`` (``"induction"``, ``"recall"``, ``"successor"``, a ``.jsonl`` prompts file, or a
    synthetic task) its classes are that task's answers, and ``model.origin.task`` holds the
    task's prompts (``.prompts``: tokens, labels, pad mask)::

        model = pe_interp.load("SmolLM2-135M-Instruct.Q4_1.gguf", task="induction")
        ps = model.origin.task.prompts
        probes.ablate_heads(model, ps.tokens, ps.labels, pad_mask=ps.pad_mask)
    """
    run = open_run(
        source, task, preset=preset, seed=seed, device=device, revision=revision, whole_vocab=True
    )
    model = run.model
    bridge = getattr(model, "bridge", None)
    model.origin = Origin(
        source=str(source),
        provenance=run.provenance,
        task=run.task,
        tokenizer=getattr(bridge, "tokenizer", None),
        run=run,
    )
    return model


__all__ = ["Origin", "check_destination", "is_pretrained", "load", "open_run", "writes_into"]
