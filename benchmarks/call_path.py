"""The path one ``ablate_heads`` call takes through the library's files (issue 39's measure).

Traces every Python call into ``probes/`` and ``pe_interp/`` during one ablation of a tiny model,
leaves out the model's own forward (``model.py``, ``blocks.py``, ``attention.py``,
``attn_routes.py``, ``encodings/``, ``kernels/``: the layer below the probes), and prints the
files in the order entered and how many times the path comes back (goal: at most 4): into one of
its own rooms after leaving it, or up into a file that called it. :func:`measure` defines the
counts; the strict count (every re-entry, shared tools included) is printed beside it.

    python benchmarks/call_path.py [--engine exact|sampled|attribution]
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import torch

import pe_interp
from probes import ablate_heads
from probes.ablation import Attribution, Exact, Sampled

ROOT = Path(pe_interp.__file__).resolve().parents[1]
BELOW = (
    "pe_interp/models/hooked/model.py",
    "pe_interp/models/hooked/blocks.py",
    "pe_interp/models/hooked/attention.py",
    "pe_interp/models/hooked/attn_routes.py",
    "pe_interp/encodings/",
    "pe_interp/kernels/",
    "pe_interp/util/modes.py",
)


# the path's stages: the entry, its one check, the engine rooms; what they call below them (the
# replacements, the result, the probes' shared inputs and metrics, core) are tools
ROOMS = tuple(
    f"probes/ablation/{s}.py" for s in ("entry", "plan", "exact", "sampled", "attribution")
)


def _rel(frame) -> str | None:
    try:
        rel = Path(frame.f_code.co_filename).resolve().relative_to(ROOT).as_posix()
    except ValueError:
        return None
    return rel if rel.startswith(("probes/", "pe_interp/")) else None


def trace(engine: str) -> list[tuple[str, tuple[str, ...]]]:
    """Each call into a library file outside the model, with the library files on the stack
    below it (innermost first). Calls the model's own code makes (its input check, its config)
    belong to the layer below and are left out; hooks it calls back are the caller's own work."""
    cfg = pe_interp.ModelConfig(
        n_layers=2, d_model=16, n_heads=2, d_mlp=32, n_ctx=12, d_vocab=20, n_classes=5
    )
    model = pe_interp.HookedPETransformer(cfg).eval()
    tokens = torch.randint(1, 20, (16, 12), generator=torch.Generator().manual_seed(0))
    labels = torch.randint(0, 5, (16,), generator=torch.Generator().manual_seed(1))
    calls: list[tuple[str, tuple[str, ...]]] = []

    def profile(frame, event, arg):
        if event != "call":
            return
        rel = _rel(frame)
        if rel is None or rel.startswith(BELOW):
            return
        stack, f = [], frame.f_back
        while f is not None:
            r = _rel(f)
            if r is not None:
                stack.append(r)
            f = f.f_back
        if stack and stack[0].startswith(BELOW) and not rel.startswith(ROOMS):
            return  # the model's own business
        calls.append((rel, tuple(s for s in stack if not s.startswith(BELOW))))

    chosen = {"exact": Exact(), "sampled": Sampled(verify_top=1)}.get(
        engine, Attribution(verify_top=1)
    )  # made before the trace: the path starts at the entry
    sys.setprofile(profile)
    try:
        ablate_heads(model, tokens, labels, n_bootstrap=10, engine=chosen)
    finally:
        sys.setprofile(None)
    return calls


def measure(calls: list[tuple[str, tuple[str, ...]]]) -> dict[str, object]:
    """Three counts over the call sequence:

    - ``strict``: every time the sequence of files (consecutive calls collapsed) enters a file
      it had entered before (the issue's first count; calling a shared tool twice counts);
    - ``returns``: entries into one of the path's stages (:data:`ROOMS`) after every
      frame of it had returned ("re-enters a file it left"), plus every call back up into a file
      that still has a frame lower on the stack (a callback against the layers);
    - ``tool_calls``: re-entries into tools below the stages (the replacements, the result,
      inputs, metrics, checks, config, hardware): calling down repeatedly, not counted as returns.
    """
    seq: list[str] = []
    seen: set[str] = set()
    strict = returns = tools = 0
    up: list[str] = []
    for rel, stack in calls:
        if not seq or seq[-1] != rel:
            strict += rel in seen
            seq.append(rel)
        caller = stack[0] if stack else None
        if rel != caller and rel in stack:
            returns += 1
            up.append(f"{caller} -> {rel}")
        elif rel != caller and rel in seen:
            if rel.startswith(ROOMS):
                returns += 1
                up.append(f"{caller} -> {rel} (re-entered)")
            else:
                tools += 1
        seen.add(rel)
    rooms = [f for i, f in enumerate(seq) if f.startswith(ROOMS) and (i == 0 or seq[i - 1] != f)]
    return {
        "files": seq,
        "rooms": list(dict.fromkeys(rooms)),
        "strict": strict,
        "returns": returns,
        "tool_calls": tools,
        "why": up,
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--engine", default="exact", choices=("exact", "sampled", "attribution"))
    args = ap.parse_args()
    m = measure(trace(args.engine))
    print(" -> ".join(m["files"]))
    print(f"rooms, in order: {' -> '.join(m['rooms'])}")
    for w in m["why"]:
        print(f"  return: {w}")
    print(
        f"engine={args.engine}: {len(set(m['files']))} files entered; {m['returns']} returns to a file it had left "
        f"or that called it (goal <= 4); {m['tool_calls']} further calls down into shared tools; "
        f"{m['strict']} re-entries counting every call"
    )


if __name__ == "__main__":
    main()
