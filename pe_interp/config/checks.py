"""The checks both configs share: device strings, and a config read from a mapping.

A config only checks a device's spelling (:data:`DEVICE_FORMS`; a grid for a GPU can be validated
on a laptop); :func:`check_device` checks that this machine has it, where tensors are put on it.
"""

from __future__ import annotations

from typing import Any

import torch

__all__ = ["DEVICE_FORMS", "check_device", "default_device"]


DEVICE_FORMS = "'cpu', 'cuda', 'cuda:N' or 'mps'"


def device_syntax_ok(device: Any) -> bool:
    if not isinstance(device, str):
        return False
    kind, _, index = device.partition(":")
    if kind == "cuda" and index:
        return index.isdigit()
    return device in ("cpu", "cuda", "mps")


def check_device(device: Any, owner: str = "device") -> str:
    """``device`` if this machine has it, else a one-line ValueError naming ``owner`` (a flag
    or a field) that says what is available. A config only checks the spelling (a grid for a
    GPU can be validated on a laptop); whatever puts tensors on the device checks it here."""
    if not device_syntax_ok(device):
        raise ValueError(f"{owner} must be {DEVICE_FORMS}, got {device!r}")
    kind, _, index = device.partition(":")
    if kind == "cuda":
        if not torch.cuda.is_available():
            build = (
                "a CPU-only build of torch"
                if torch.version.cuda is None
                else "no CUDA device visible"
            )
            raise ValueError(
                f"{owner} is {device!r} but CUDA is not available ({build}); use 'cpu'"
            )
        if index and int(index) >= torch.cuda.device_count():
            raise ValueError(
                f"{owner} is {device!r} but only {torch.cuda.device_count()} CUDA device(s) are visible"
            )
    if kind == "mps" and not (
        getattr(torch.backends, "mps", None) and torch.backends.mps.is_available()
    ):
        raise ValueError(f"{owner} is 'mps' but MPS is not available on this machine; use 'cpu'")
    return device


def default_device() -> str:
    """``cuda`` when available, else ``cpu``."""
    return "cuda" if torch.cuda.is_available() else "cpu"


def check_mapping(owner: str, data: Any) -> None:
    if not isinstance(data, dict):
        raise ValueError(
            f"{owner}: expected a mapping of field names to values, got {type(data).__name__} {data!r:.60}"
        )
