"""The files a sweep's probes write into a cell's run directory, by probe, and the encoding kinds
that count as rotary for the probes that only apply to them.
"""

from __future__ import annotations

__all__ = [
    "ABLATION",
    "ATTENTION",
    "DECOMPOSITION",
    "DEPOSITS",
    "GENERALIZATION",
    "LAYER_ABLATION",
    "PATCHING",
    "POSITIONAL",
    "ROTARY_KINDS",
    "ROUTES",
    "SNAPSHOT_DYNAMICS",
]


ABLATION, DEPOSITS, PATCHING, POSITIONAL, ATTENTION, LAYER_ABLATION, GENERALIZATION, ROUTES = (
    "ablation.json",
    "deposits.json",
    "patching.json",
    "positional.json",
    "attention.json",
    "layer_ablation.json",
    "generalization.json",
    "routes.json",
)
SNAPSHOT_DYNAMICS = "dynamics.json"  # what `pe-interp dynamics` writes too
ROTARY_KINDS = ("multiplicative", "hybrid")
DECOMPOSITION = "decomposition.json"
