"""The checks of a grid's parts that :func:`pe_interp.sweep.grid.parse_grid` calls: resources,
seeds, and each probe's options (with 'did you mean' hints); each mistake is a one-line
ValueError naming the key and the file.
"""

from __future__ import annotations

from typing import Any

from pe_interp.sweep.probing import PROBE_OPTIONS

__all__ = ["RESOURCE_KEYS"]


RESOURCE_KEYS = ("cpus", "gpus")


def check_resources(resources: Any, source: str) -> dict[str, float]:
    """``resources: {cpus: N, gpus: M}``: what one cell needs (numbers; cpus > 0, gpus >= 0)."""
    if resources is None:
        return {}
    if not isinstance(resources, dict):
        raise ValueError(
            f"{source}: resources must be a mapping such as {{cpus: 4, gpus: 1}}, got {resources!r}"
        )
    for key, value in resources.items():
        if key not in RESOURCE_KEYS:
            raise ValueError(
                f"{source}: resources.{key} is not a resource; allowed: {', '.join(RESOURCE_KEYS)}"
            )
        low_ok = value > 0 if key == "cpus" else value >= 0
        if isinstance(value, bool) or not isinstance(value, int | float) or not low_ok:
            bound = "> 0" if key == "cpus" else ">= 0"
            raise ValueError(f"{source}: resources.{key} must be a number {bound}, got {value!r}")
    return dict(resources)


def check_seeds(seeds: Any, where: str, allow_count: bool) -> list[int]:
    if allow_count and isinstance(seeds, int) and not isinstance(seeds, bool) and seeds > 0:
        return list(range(seeds))
    ok = (
        isinstance(seeds, list)
        and seeds
        and all(isinstance(s, int) and not isinstance(s, bool) and s >= 0 for s in seeds)
    )
    if not ok:
        what = "a count or a non-empty list" if allow_count else "a non-empty list"
        raise ValueError(f"{where} must be {what} of integers >= 0, got {seeds!r}")
    return list(seeds)


def check_probe_options(options: Any, source: str) -> dict[str, dict[str, Any]]:
    """``probe_options: {probe: {option: value}}``, each option a keyword of that probe."""
    if not isinstance(options, dict):
        raise ValueError(f"{source}: probe_options must be a mapping of probe name to options")
    for probe, opts in options.items():
        if probe not in PROBE_OPTIONS:
            raise ValueError(
                f"{source}: probe_options.{probe}: not a probe with options; allowed: {sorted(PROBE_OPTIONS)}"
            )
        if not isinstance(opts, dict):
            raise ValueError(f"{source}: probe_options.{probe} must be a mapping, got {opts!r}")
        bad = sorted(set(opts) - PROBE_OPTIONS[probe])
        if bad:
            raise ValueError(
                f"{source}: probe_options.{probe}: unknown option(s) {bad}; allowed: {sorted(PROBE_OPTIONS[probe])}"
            )
        for key, value in opts.items():  # checked here, not after every cell has trained
            what = _option_error(key, value)
            if what:
                raise ValueError(
                    f"{source}: probe_options.{probe}.{key} must be {what}, got {value!r}"
                )
    return {k: dict(v) for k, v in options.items()}


def _is_int(value: Any, low: int) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value >= low


def _option_error(key: str, value: Any) -> str | None:
    """What a probe option's value must be, or None when it is fine."""
    if key in ("n", "points", "n_probe"):
        return None if _is_int(value, 1) else "an integer >= 1"
    if key in ("example", "every"):
        return None if _is_int(value, 0) else "an integer >= 0"
    if key == "whole_layers":
        return None if isinstance(value, bool) else "true or false"
    if key == "on":
        return None if value in ("test", "all") else "'test' or 'all'"
    if key == "layers":
        ok = isinstance(value, list | tuple) and value and all(_is_int(v, 0) for v in value)
        return None if ok else "a non-empty list of layer indices >= 0"
    return None


def grid_distance(a: str, b: str) -> int:
    """Levenshtein distance, for 'did you mean' hints."""
    prev = list(range(len(b) + 1))
    for i, ca in enumerate(a, 1):
        cur = [i]
        for j, cb in enumerate(b, 1):
            cur.append(min(prev[j] + 1, cur[j - 1] + 1, prev[j - 1] + (ca != cb)))
        prev = cur
    return prev[-1]
