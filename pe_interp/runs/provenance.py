"""Which weights a probe result came from, and whether they are still the run's.

:func:`save_result` records in each result the sha256 and step of the run's ``model.safetensors``
(:func:`weights_provenance`, cached per file identity); :func:`weights_status` compares a result's
record with the weights now: current, stale (computed from other weights) or unrecorded.
"""

from __future__ import annotations

import hashlib
import json
import os
import sys
from pathlib import Path
from typing import Any

from pe_interp.runs.files import WEIGHTS, CheckpointError, read_json
from pe_interp.util.io import atomic_write_json, write_result

__all__ = [
    "CURRENT",
    "STALE",
    "UNRECORDED",
    "WEIGHTS_KEY",
    "save_result",
    "weights_provenance",
    "weights_status",
]


# The key under which a probe result records the weights it was computed from.
WEIGHTS_KEY = "weights"
CURRENT, STALE, UNRECORDED = "current", "stale", "unrecorded"


def provenance_of(path: Path, data: bytes) -> dict[str, Any]:
    """``{"sha256", "step"}`` of a weights file's bytes (the step from its metadata; None if absent)."""
    try:
        n = int.from_bytes(data[:8], "little")
        meta = json.loads(data[8 : 8 + n]).get("__metadata__") or {}
        step = int(meta["step"]) if "step" in meta else None
    except (ValueError, TypeError, AttributeError, UnicodeDecodeError):
        raise CheckpointError(
            f"{path}: corrupt or truncated safetensors file (bad header)"
        ) from None
    return {"sha256": hashlib.sha256(data).hexdigest(), "step": step}


_PROVENANCE: dict[tuple, dict[str, Any]] = {}  # (path, size, mtime, inode) -> provenance


def weights_provenance(run_dir: str | Path) -> dict[str, Any]:
    """The run's weights now: ``{"sha256": ..., "step": ...}`` of ``model.safetensors``
    (cached by the file's size, mtime and inode); a CheckpointError if it is missing."""
    path = Path(run_dir) / WEIGHTS
    try:
        st = path.stat()
    except OSError:
        raise CheckpointError(f"{path}: file not found") from None
    key = (str(path.resolve()), st.st_size, st.st_mtime_ns, st.st_ino)
    if key not in _PROVENANCE:
        _PROVENANCE[key] = provenance_of(path, path.read_bytes())
    return dict(_PROVENANCE[key])


def save_result(
    path: str | Path,
    result: Any,
    weights: dict[str, Any] | None,
    *,
    indent: int | None = 1,
    kind: str | None = None,
    **to_dict: Any,
) -> Path:
    """Write a probe result (a dict, or an object with ``to_dict(**to_dict)``) with the weights
    it was computed from under :data:`WEIGHTS_KEY` (``Run.provenance``; None records none), and
    its kind tag (:func:`pe_interp.util.io.write_result`; for an object, its module's
    ``RESULT_KIND`` unless ``kind`` is given). Every probe result written into a run directory
    goes through here."""
    data = dict(result) if isinstance(result, dict) else result.to_dict(**to_dict)
    if kind is None and not isinstance(result, dict):
        kind = getattr(sys.modules.get(type(result).__module__), "RESULT_KIND", None)
    if weights is not None:
        data[WEIGHTS_KEY] = {"sha256": str(weights["sha256"]), "step": weights.get("step")}
        if weights.get("source"):  # a pretrained model's origin: the GGUF file, the hub name
            data[WEIGHTS_KEY]["source"] = weights["source"]
    if kind is not None:
        return write_result(path, kind, data, indent=indent, sort_keys=False)
    return atomic_write_json(path, data, indent=indent, sort_keys=False)


def weights_status(run_dir: str | Path, result: Any, step: int | None = None) -> tuple[str, str]:
    """The one check of a stored probe result against its run: ``(CURRENT, "")`` when the
    result records the run's weights now, ``(STALE, why)`` when it records other weights,
    ``(UNRECORDED, why)`` when it records none (written before results did). ``result`` is the
    stored dict or the path of its JSON file; ``step``: against that snapshot's weights (a result
    of ``RUN@S``, kept in ``steps/S/``)."""
    if isinstance(result, str | os.PathLike):
        result = read_json(Path(result))
    rec = result.get(WEIGHTS_KEY) if isinstance(result, dict) else None
    if not isinstance(rec, dict) or not isinstance(rec.get("sha256"), str):
        return UNRECORDED, "records no weights (written before results recorded them)"
    if step is not None:
        from pe_interp.runs.snapshots import read_manifest

        kept = {e["step"]: e["sha256"] for e in read_manifest(run_dir)}
        if rec["sha256"] == kept.get(step):
            return CURRENT, ""
        return (
            STALE,
            f"computed from other weights (sha256 {rec['sha256'][:12]}) than the snapshot of step {step}",
        )
    now = weights_provenance(run_dir)
    if rec["sha256"] == now["sha256"]:
        return CURRENT, ""
    return STALE, (
        f"computed from other weights (step {rec.get('step')}, sha256 {rec['sha256'][:12]}) than the "
        f"run's model.safetensors (step {now['step']}, sha256 {now['sha256'][:12]})"
    )
