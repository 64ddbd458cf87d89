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
from pe_interp.runs.checkpoint import CheckpointError, Run
from pe_interp.runs.gguf import (
    GIB,
    MEMORY_FACTOR,
    MEMORY_MARGIN,
    available_memory,
    convert_gguf,
    gguf_provenance,
    is_gguf_file,
)

WEIGHT_FILES = (
    "model.safetensors",
    "model.safetensors.index.json",
    "pytorch_model.bin",
    "pytorch_model.bin.index.json",
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


def check_weight_files(files: list[Path], where: Any) -> None:
    """A one-line CheckpointError, before the boot, for a weights file that is damaged: a
    safetensors file whose header does not parse or whose tensors the file does not hold
    (truncated), a ``.bin`` file that is empty, neither zip nor pickle, or a zip archive that is
    truncated or fails its checksums."""
    import zipfile

    from safetensors import SafetensorError, safe_open

    for f in files:
        try:
            if f.suffix == ".safetensors":
                with safe_open(str(f), framework="pt") as handle:
                    handle.keys()
            else:  # torch.save's zip archive, or its legacy pickle (not checked further)
                with open(f, "rb") as fh:
                    head = fh.read(4)
                if head.startswith(b"PK"):
                    with zipfile.ZipFile(f) as archive:  # BadZipFile: truncated
                        bad = archive.testzip()
                    if bad is not None:
                        raise ValueError(f"{bad} fails its checksum")
                elif not head.startswith(b"\x80"):
                    raise ValueError(
                        "neither a zip archive nor a pickle" if head else "it is empty"
                    )
        except (SafetensorError, OSError, ValueError, zipfile.BadZipFile, EOFError) as err:
            first = (str(err).strip().splitlines() or [type(err).__name__])[0]
            raise CheckpointError(
                f"{where}: the weights file {f.name} is damaged ({first[:160]}); save or "
                "download the model again"
            ) from None


def check_finite(bridge: Any, where: Any, fix: str = "save or download the model again") -> None:
    """A one-line CheckpointError, after the boot and before any forward, for a NaN or inf weight
    (named as the saved model names it): every probe would read it as a result (an accuracy of
    0, drops of NaN). ``fix``: what to do, as fits where the weights came from."""
    from pe_interp.util.checks import nonfinite_weight

    bad = nonfinite_weight(getattr(bridge, "original_model", None) or bridge)
    if bad is None:
        return
    name = bad[0].replace("._original_component", "")
    raise CheckpointError(
        f"{where}: the weights hold {bad[1]} (in {name}): the file is damaged or the model it "
        f"was saved from diverged; {fix}"
    )


CAUSAL_TOLERANCE = 1e-4  # of the logits' scale: a causal model's earlier rows move by rounding only
# A miniature of the model for the causality check: its attention as the config builds it, one
# layer, a small vocabulary and MLP (neither decides where attention looks).
MINIATURE = {"num_hidden_layers": 1, "vocab_size": 256}
MLP_WIDTHS = ("intermediate_size", "n_inner", "ffn_dim", "d_ff")
MINIATURE_FLAG = "_pe_interp_miniature"


def check_attends_causally(path: Path, where: Any, n_tokens: int = 8) -> None:
    """A one-line CheckpointError, before any forward of the model, unless it attends causally as
    ``transformers`` runs it, whatever its config claims (a ``LlamaForCausalLM`` saved with
    ``"is_causal": false`` attends both ways, and the bridge, which masks attention itself, would
    probe another model than the one saved). A miniature of the model is built from its config
    (:data:`MINIATURE`, random weights) and run on two rows of tokens that differ only in the
    last: the logits at every earlier position must not move. An architecture whose miniature
    cannot be built is left to :func:`check_causal` (its config's names)."""
    import copy

    from transformers import AutoConfig, AutoModelForCausalLM
    from transformers.utils import logging as hf_logging

    level = hf_logging.get_verbosity()
    hf_logging.set_verbosity_error()
    try:
        config = AutoConfig.from_pretrained(str(path))
        small = copy.deepcopy(config)
        for name, value in MINIATURE.items():
            setattr(small, name, min(value, getattr(config, name, value)))
        for name in MLP_WIDTHS:
            if isinstance(getattr(small, name, None), int):
                setattr(small, name, min(64, getattr(small, name)))
        if isinstance(getattr(small, "layer_types", None), list):
            small.layer_types = small.layer_types[:1]
        for name in ("pad_token_id", "bos_token_id", "eos_token_id"):
            if isinstance(getattr(small, name, None), int) and getattr(small, name) >= 256:
                setattr(small, name, None)
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(0)
            model = AutoModelForCausalLM.from_config(small).eval()
            setattr(model, MINIATURE_FLAG, True)  # its forward is a check's, not the model's
            with torch.no_grad():
                for p in model.parameters():
                    if p.dim() >= 2:
                        p.normal_(0.0, 0.5)
            vocab = int(small.vocab_size)
            n = max(2, min(n_tokens, int(getattr(small, "max_position_embeddings", n_tokens))))
            x = torch.randint(0, vocab, (1, n))
            y = x.clone()
            y[0, -1] = (x[0, -1] + 1) % vocab
            with torch.no_grad():
                logits = model(torch.cat([x, y])).logits.float()
    except Exception:  # noqa: BLE001 - a miniature this architecture cannot make: names only
        return
    finally:
        hf_logging.set_verbosity(level)
    moved = float((logits[0, :-1] - logits[1, :-1]).abs().max())
    scale = max(1.0, float(logits[:, :-1].abs().max()))
    if moved > CAUSAL_TOLERANCE * scale:
        claims = ", ".join(getattr(config, "architectures", None) or [config.model_type])
        causal = getattr(config, "is_causal", None)
        said = f", is_causal {causal}" if causal is not None else ""
        raise CheckpointError(
            f"{where}: its attention is not causal (a token moves the logits at the positions "
            f"before it) although its config names {claims}{said}; the probes read causal "
            "language models"
        )


def weight_files(weights: Path) -> list[Path]:
    """The files holding the weights: ``weights`` itself, or the shards a ``*.index.json`` maps
    (one-line CheckpointError for a shard that is missing or an index that is not one)."""
    if not weights.name.endswith(".index.json"):
        return [weights]
    try:
        names = sorted(set(json.loads(weights.read_text())["weight_map"].values()))
    except (ValueError, KeyError, TypeError, AttributeError):
        raise CheckpointError(f"{weights}: not a weights index (no weight_map)") from None
    missing = [n for n in names if not (weights.parent / n).is_file()]
    if missing or not names:
        raise CheckpointError(f"{weights}: the shard {missing[0] if missing else '?'} is missing")
    return [weights.parent / n for n in names]


def weights_sha256(files: list[Path]) -> str:
    """sha256 of the files' bytes in order, read in 16-MiB blocks."""
    h = hashlib.sha256()
    for f in files:
        with open(f, "rb") as fh:
            while block := fh.read(1 << 24):
                h.update(block)
    return h.hexdigest()


def weight_count(weights: Path) -> int | None:
    """Parameters in a ``.safetensors`` file, read from its header (8 bytes of length, then JSON
    naming each tensor's shape) without loading a tensor; None for any other file."""
    if weights.suffix != ".safetensors":
        return None
    with open(weights, "rb") as f:
        size = int.from_bytes(f.read(8), "little")
        header = json.loads(f.read(size))
    count = 0
    for name, entry in header.items():
        if name != "__metadata__":
            n = 1
            for dim in entry["shape"]:
                n *= int(dim)
            count += n
    return count


def check_memory(files: list[Path], where: Any) -> None:
    """A one-line CheckpointError, before the boot, when the model would not fit in memory: its
    weights in fp32 (the parameters of the safetensors headers, or a ``.bin`` file's own size)
    about twice over (the Hugging Face model and the bridge around it, as converting a GGUF
    needs), and Python, torch and transformers themselves (:data:`pe_interp.runs.gguf.MEMORY_MARGIN`)."""
    counts = [weight_count(f) for f in files]
    count = None if None in counts else sum(counts)
    fp32 = 4 * count if count is not None else sum(f.stat().st_size for f in files)
    need, free = MEMORY_FACTOR * fp32 + MEMORY_MARGIN, available_memory()
    if free is not None and need > free:
        what = f"{count / 1e6:.1f}M parameters" if count is not None else "its weight files"
        raise CheckpointError(
            f"{where}: booting it needs about {need / GIB:.1f} GiB of memory "
            f"({what} in fp32, {fp32 / GIB:.2f} GiB), and {free / GIB:.1f} GiB is available"
        )


def check_causal(path: Path, given: Any = None) -> None:
    """A one-line CheckpointError unless the saved model is a causal language model: its config
    names an architecture that ``transformers`` lists as causal for its model type, and it is no
    encoder-decoder (an encoder-only or masked model attends both ways, so no probe's reading of
    a last position means what it means in a causal model)."""
    from transformers.models.auto.modeling_auto import MODEL_FOR_CAUSAL_LM_MAPPING_NAMES

    config = json.loads((path / "config.json").read_text())
    where, names = given or path, config.get("architectures") or []
    causal = MODEL_FOR_CAUSAL_LM_MAPPING_NAMES.get(config.get("model_type"))
    if config.get("is_encoder_decoder"):
        raise CheckpointError(
            f"{where}: an encoder-decoder model ({', '.join(names) or config.get('model_type')}); "
            "the probes read causal language models"
        )
    if names and not any(n == causal or n.endswith("ForCausalLM") for n in names):
        raise CheckpointError(
            f"{where}: {', '.join(names)} is not a causal language model (an encoder-only or "
            "masked model attends both ways); the probes read causal language models"
        )


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
