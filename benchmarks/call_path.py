"""The path one ``ablate_heads`` call takes through the library's files (issue 39's measure).

Traces every Python call into ``probes/`` and ``pe_interp/`` during one exact ablation of a tiny
model, leaves out the model's own forward (``model.py``, ``blocks.py``, ``attention.py``,
``attn_routes.py``, ``encodings/``, ``kernels/``: the layer below the probes), collapses
consecutive calls in one file, and prints the files in the order entered and how many times the
path comes back to a file it had left (goal: at most 4).

    python benchmarks/call_path.py [--engine exact|sampled|attribution]
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import torch

import pe_interp
from probes import ablate_heads

ROOT = Path(pe_interp.__file__).resolve().parents[1]
BELOW = ("pe_interp/model.py", "pe_interp/blocks.py", "pe_interp/attention.py", "pe_interp/attn_routes.py",
         "pe_interp/encodings/", "pe_interp/kernels/", "pe_interp/modes.py")


def trace(engine: str) -> list[str]:
    cfg = pe_interp.ModelConfig(n_layers=2, d_model=16, n_heads=2, d_mlp=32, n_ctx=12, d_vocab=20, n_classes=5)
    model = pe_interp.HookedPETransformer(cfg).eval()
    tokens = torch.randint(1, 20, (16, 12), generator=torch.Generator().manual_seed(0))
    labels = torch.randint(0, 5, (16,), generator=torch.Generator().manual_seed(1))
    files: list[str] = []

    def profile(frame, event, arg):
        if event != "call":
            return
        path = Path(frame.f_code.co_filename)
        try:
            rel = path.resolve().relative_to(ROOT).as_posix()
        except ValueError:
            return
        if not rel.startswith(("probes/", "pe_interp/")) or rel.startswith(BELOW):
            return
        if not files or files[-1] != rel:
            files.append(rel)

    sys.setprofile(profile)
    try:
        ablate_heads(model, tokens, labels, n_bootstrap=10, engine=engine, verify_top=1)
    finally:
        sys.setprofile(None)
    return files


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--engine", default="exact", choices=("exact", "sampled", "attribution"))
    args = ap.parse_args()
    files = trace(args.engine)
    seen: set[str] = set()
    returns = 0
    for f in files:
        returns += f in seen
        seen.add(f)
    print(" -> ".join(files))
    print(f"engine={args.engine}: {len(seen)} files entered, {returns} returns to a file already left (goal <= 4)")


if __name__ == "__main__":
    main()
