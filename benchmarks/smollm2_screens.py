"""Benchmark: how good must a screen be for an attribution-screened exact ablation engine to find
the exhaustive grid's top 10 heads (recall >= 0.9) at >= 10x less time on SmolLM2-135M (issue 47,
item 6b)? Skips with one line where SmolLM2 is not installed (``make smollm2``, or ``--model``).

One run, one process, metric ``loss`` on ``--n`` induction prompts (seed 0, as
``benchmarks/smollm2.py --part attribution``):

1. The exhaustive exact grid (all 270 heads), timed: the baseline of every ratio.
2. The floor: the grid's own top 10 ablated exactly (what a perfect screen would verify), timed,
   plus the cheapest screen's time (the derivative at the clean point). No screen-then-verify
   engine can beat this ratio.
3. Each screen's ranking of the grid's top 10, signed (the harm it estimates) and by magnitude:
   the k that recall 0.9 needs, and the time of that engine (the screen plus its top k ablated
   exactly, measured where k <= ``--max-verify``):

   - ``clean``: attribution patching (AtP), the derivative with every head live
     (``rank_heads(path="clean")``);
   - ``joint``: integrated gradients, one node, every head scaled at once (``path="joint"``);
   - ``clean+qk``: AtP with the downstream attention patterns recomputed exactly along each
     head's direct path (AtP*'s "QK fix", Kramar et al. 2024, carried from query/key nodes to
     head outputs): for head h and every later layer l', the clean pattern gradient times
     (the pattern with h's output taken out of l''s input, exactly, minus the same change
     linearised by a central difference). The patterns are recomputed by the Hugging Face Llama
     layers in float64, every difference taken from that recomputation, checked against the
     bridge's ``hook_pattern`` first (a model whose
     recomputation differs by more than 1e-4 stops the run). A diagnostic, written plainly:
     its time is reported, not optimised (``--no-qk`` skips it);
   - ``hvp, P probes``: the clean point's second-order estimate (``rank_heads(path="hvp",
     steps=P)``, ``--probes``: AtP plus half the Hessian's diagonal in each head's scale, from P
     Hessian-vector products of random-sign probes, after Zhang & Wang 2026, arXiv 2606.09899);
     ``hvp, diagonal`` (``--diagonal``, slow: one probe a head): the exact diagonal, what any
     number of probes tends to.

4. Screen-Flag-Fix (``Attribution(path="hvp", verify_top=k, verify_flagged=f)``): each hvp
   screen's top k and up to f of the heads it flags (second-order term above the first) verified
   exactly: recall of the grid's top 10 and time (the screen's plus the verification's); then what
   each made of the top-10 heads AtP signs the wrong way (estimate, reliability, flag).

    python benchmarks/smollm2_screens.py [--n 16] [--threads 2] [--max-verify 60] [--probes 1]
        [--diagonal] [--no-qk]
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))

import numpy as np  # noqa: E402
import torch  # noqa: E402
from smollm2 import cpu_name, find_smollm2  # noqa: E402


def timed(fn, repeats: int = 1):
    ts, out = [], None
    for _ in range(repeats):
        t0 = time.perf_counter()
        out = fn()
        ts.append(time.perf_counter() - t0)
    return out, statistics.median(ts)


def ranks_of(est: np.ndarray, top: list[int]) -> list[int]:
    """Where a screen (larger = more harm) puts each of ``top`` (flat indices), sorted."""
    rank = np.empty(est.size, dtype=int)
    rank[np.argsort(-est, axis=None, kind="stable")] = np.arange(est.size)
    return sorted(int(rank[i]) for i in top)


def clean_pass(model, tokens, labels, pad_mask):
    """The clean forward and backward of the per-example log-probability: each layer's input,
    ``z``, and pattern with its gradient (float64)."""
    from functools import partial

    from probes.ablation.ranking import _per_example

    L = model.cfg.n_layers
    got: dict[str, torch.Tensor] = {}

    def keep(x, hook, name, grad=False):
        if grad:
            x.retain_grad()
        got[name] = x
        return x

    hooks = []
    for layer in range(L):
        for name, grad in (
            (f"blocks.{layer}.hook_resid_pre", False),
            (f"blocks.{layer}.attn.hook_z", False),
            (f"blocks.{layer}.attn.hook_pattern", True),
        ):
            hooks.append((name, partial(keep, name=name, grad=grad)))
    with torch.enable_grad():
        out = model.run_with_hooks(tokens, pad_mask, fwd_hooks=hooks)
        _per_example("loss", out, labels).sum().backward()

    def read(kind):
        return [got[f"blocks.{layer}.{kind}"].detach().double() for layer in range(L)]

    grads = [got[f"blocks.{layer}.attn.hook_pattern"].grad.double() for layer in range(L)]
    return read("hook_resid_pre"), read("attn.hook_z"), read("attn.hook_pattern"), grads


def qk_fix(path: Path, model, tokens, labels, pad_mask) -> np.ndarray:
    """The change of each head's AtP estimate of the loss drop when every later layer's pattern
    moves exactly (direct path) instead of linearly (module docstring), ``[L, H]``."""
    from transformers import AutoModelForCausalLM
    from transformers.models.llama.modeling_llama import apply_rotary_pos_emb, repeat_kv

    if not bool(pad_mask.all()):
        raise SystemExit("qk fix: the prompts must be unpadded")
    X, Z, A0, G = clean_pass(model, tokens, labels, pad_mask)
    hf = AutoModelForCausalLM.from_pretrained(path, torch_dtype=torch.float64).eval()
    cfg = hf.config
    H, Hkv, d = cfg.num_attention_heads, cfg.num_key_value_heads, cfg.head_dim
    n, p = tokens.shape
    L = model.cfg.n_layers
    causal = torch.full((p, p), float("-inf"), dtype=torch.float64).triu(1)
    positions = torch.arange(p)[None]

    def pattern(layer: int, x: torch.Tensor) -> torch.Tensor:  # x [..., n, p, d_model]
        lead = x.shape[:-3]
        x = x.reshape(-1, p, x.shape[-1])
        blk = hf.model.layers[layer]
        h = blk.input_layernorm(x)
        q = blk.self_attn.q_proj(h).view(len(x), p, H, d).transpose(1, 2)
        k = blk.self_attn.k_proj(h).view(len(x), p, Hkv, d).transpose(1, 2)
        cos, sin = hf.model.rotary_emb(h, positions.expand(len(x), -1))
        q, k = apply_rotary_pos_emb(q, k, cos, sin)
        s = q @ repeat_kv(k, H // Hkv).transpose(-1, -2) * blk.self_attn.scaling + causal
        return s.softmax(-1).reshape(*lead, n, H, p, p)

    corr = np.zeros((L, H))
    with torch.no_grad():
        # the float64 recomputation is the baseline of every difference: the bridge's own float32
        # pattern differs from it by ~1e-6, which a difference quotient would amplify
        base = [pattern(layer, X[layer]) for layer in range(L)]
        gap = max(float((base[layer] - A0[layer]).abs().max()) for layer in range(L))
        if gap > 1e-4:
            raise SystemExit(
                f"qk fix: the recomputed patterns differ from hook_pattern by {gap:.1e}"
            )
        eps = 1e-4
        for later in range(1, L):
            srcs = [(layer, h) for layer in range(later) for h in range(H)]
            for c0 in range(0, len(srcs), 32):
                part = srcs[c0 : c0 + 32]
                out = torch.stack(
                    [
                        Z[layer][:, :, h]
                        @ hf.model.layers[layer].self_attn.o_proj.weight[:, h * d : (h + 1) * d].T
                        for layer, h in part
                    ]
                )  # each head's direct write into the residual, [S, n, p, d_model]
                exact = pattern(later, X[later][None] - out) - base[later]
                linear = (
                    pattern(later, X[later][None] - eps * out)
                    - pattern(later, X[later][None] + eps * out)
                ) / (2 * eps)  # a central difference, in float64 throughout
                moved = ((exact - linear) * G[later][None]).sum((2, 3, 4)).sum(1) / n
                for (layer, h), c in zip(part, moved.tolist()):
                    corr[layer, h] += c
    return -corr  # a rise of the log-probability is a fall of the loss


def hvp_screens(model, tokens, labels, pad_mask, args) -> dict[str, tuple[dict, float]]:
    """``rank_heads(path="hvp")`` with each ``--probes`` count (and one head a probe with
    ``--diagonal``): its result and time (median of ``--repeats``; the diagonal once)."""
    from probes.ablation.ranking import rank_heads

    n_heads = model.cfg.n_layers * model.cfg.n_heads
    counts = [int(p) for p in args.probes.split(",") if p] + ([n_heads] if args.diagonal else [])
    out = {}
    for p in counts:
        name = "hvp, diagonal" if p == n_heads else f"hvp, {p} probe{'s' * (p > 1)}"
        rows = 32 if p == n_heads else None  # rows a pass: 32 probes of one example (memory)
        out[name] = timed(
            lambda p=p, rows=rows: rank_heads(
                model,
                tokens,
                labels,
                pad_mask,
                surrogate="loss",
                steps=p,
                path="hvp",
                batch_size=rows,
            ),
            1 if p == n_heads else args.repeats,
        )
    return out


def flag_fix_rows(hvp, verify, t_grid, top_heads, drops, clean, H) -> None:
    """Screen-Flag-Fix (module docstring, 4.): each "hvp" screen's top k and flagged heads
    verified exactly, for k and the flagged heads' cap f; then what it made of the heads AtP signs
    the wrong way among the grid's top 10."""
    from probes.ablation.attribution import screen_flag_fix

    units = [((layer, h),) for layer in range(drops.shape[0]) for h in range(H)]
    print(
        "| screen | screen time | flagged (of the top 10) | k | f | verified | recall of the top 10 "
        "| engine time | less time |"
    )
    print("|---|---|---|---|---|---|---|---|---|")
    for name, (est, t_screen) in hvp.items():
        flagged = est["flagged"]
        n_top = sum(bool(flagged[h]) for h in top_heads)
        for k, f in ((10, 0), (10, 5), (10, 10), (5, 5), (5, 10)):
            order, _ = screen_flag_fix(units, est, k, f)
            _, t_v = timed(lambda o=order: verify(o))
            t = t_screen + t_v
            recall = len(set(order) & set(top_heads)) / 10
            print(
                f"| {name} | {t_screen:.1f} s | {int(flagged.sum())} ({n_top}) | {k} | {f} | "
                f"{len(order)} | {recall:.1f} | {t:.1f} s | {t_grid / t:.1f}x |",
                flush=True,
            )
    wrong = [h for h in top_heads if clean[h] < 0]
    for name, (est, _) in hvp.items():
        for h in wrong:
            print(
                f"{name}: {h} exact {drops[h]:+.2f}, AtP {est['first_order'][h]:+.2f}, second-order "
                f"{est['estimate'][h]:+.2f}, reliability {est['reliability'][h]:.1f}, flagged "
                f"{bool(est['flagged'][h])}, rank of its second-order term "
                f"{int((np.abs(est['second_order']) > abs(est['second_order'][h])).sum())}"
            )


def screen_rows(screens, times, verify, t_grid, top, H, max_verify) -> None:
    """Each screen's ranks of the grid's top 10, signed and by magnitude, and the engine that
    verifies its top k for recall 0.9 (module docstring, 3.)."""
    print(
        "| screen | screen time | ranking | ranks of the top 10 | k for 0.9 | time at that k | less time |"
    )
    print("|---|---|---|---|---|---|---|")
    for name, est in screens.items():
        for how, key in (("signed", est), ("magnitude", np.abs(est))):
            r = ranks_of(key, top)
            k = r[8] + 1
            if k <= max_verify:
                order = [divmod(int(i), H) for i in np.argsort(-key, axis=None, kind="stable")[:k]]
                _, t_k = timed(lambda o=order: verify(o))
                t = times[name] + t_k
                cell, ratio = f"{t:.1f} s", f"{t_grid / t:.1f}x"
            else:
                cell, ratio = f"(k > {max_verify}: not run)", "-"
            print(
                f"| {name} | {times[name]:.1f} s | {how} | {' '.join(map(str, r))} | {k} | {cell} | {ratio} |",
                flush=True,
            )


def parse_args() -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", default=None, help="a converted SmolLM2 directory")
    ap.add_argument("--n", type=int, default=16)
    ap.add_argument("--repeats", type=int, default=3, help="timings of the screens and the floor")
    ap.add_argument("--max-verify", type=int, default=60)
    ap.add_argument("--threads", type=int, default=None)
    ap.add_argument("--probes", default="1", help="the hvp screens' probe counts (comma list)")
    ap.add_argument("--diagonal", action="store_true", help="also one head a probe (slow)")
    ap.add_argument("--no-qk", action="store_true", help="skip the QK fix (a slow diagnostic)")
    return ap.parse_args()


def load(path: Path, n: int):
    """The bridged model and ``n`` induction prompts (seed 0), checked; the machine line printed."""
    from pe_interp.models.bridge.hf_arch import boot_bridge
    from pe_interp.models.bridge.model import BridgedModel
    from pe_interp.prompts import make_family
    from pe_interp.util.hardware import cpu_has_bf16
    from probes.common.inputs import check_examples

    bridge = boot_bridge(path)
    ps = make_family("induction", bridge.tokenizer).sample(n, seed=0)
    model = BridgedModel(bridge, pad_id=ps.pad_id)
    tokens, labels, pad_mask = check_examples(model, ps.tokens, ps.labels, ps.pad_mask, who="bench")
    print(
        f"SmolLM2-135M ({path}); {cpu_name()}, {torch.get_num_threads()} threads, avx512_bf16 "
        f"{cpu_has_bf16()}, load {os.getloadavg()[0]:.1f}; float32; {n} induction prompts of "
        f"{tokens.shape[1]} tokens; metric loss"
    )
    return model, ps, tokens, labels, pad_mask


def main() -> None:
    args = parse_args()
    path = find_smollm2(args.model)
    if path is None:
        print(
            "smollm2_screens: SmolLM2-135M is not installed (make smollm2, or --model DIR): skipped"
        )
        return
    if args.threads:
        torch.set_num_threads(args.threads)
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    from probes import ablate_heads
    from probes.ablation.ranking import rank_heads

    model, ps, tokens, labels, pad_mask = load(path, args.n)
    H = model.cfg.n_heads
    kw = dict(pad_mask=ps.pad_mask, metric="loss", n_bootstrap=0)

    def verify(heads: list[tuple[int, int]]):
        return ablate_heads(model, ps.tokens, ps.labels, head_sets=[[h] for h in heads], **kw)

    grid, t_grid = timed(lambda: ablate_heads(model, ps.tokens, ps.labels, **kw))
    drops = np.asarray(grid.drops)
    top = [int(i) for i in np.argsort(-drops, axis=None, kind="stable")[:10]]
    top_heads = [divmod(i, H) for i in top]
    print(
        f"exhaustive grid: {t_grid:.1f} s (load {os.getloadavg()[0]:.1f}); its top 10 {top_heads}"
    )

    screens: dict[str, np.ndarray] = {}
    times: dict[str, float] = {}
    for name, path_, steps in (("clean", "clean", 1), ("joint", "joint", 1)):
        est, times[name] = timed(
            lambda p=path_, s=steps: rank_heads(
                model, tokens, labels, pad_mask, surrogate="loss", steps=s, path=p
            )["estimate"],
            args.repeats,
        )
        screens[name] = np.asarray(est)
    if not args.no_qk:
        fix, t_fix = timed(lambda: qk_fix(path, model, tokens, labels, pad_mask))
        screens["clean+qk"], times["clean+qk"] = screens["clean"] + fix, times["clean"] + t_fix
    hvp = hvp_screens(model, tokens, labels, pad_mask, args)
    for name, (est, t) in hvp.items():
        screens[name], times[name] = np.asarray(est["estimate"]), t

    oracle, t_oracle = timed(lambda: verify(top_heads), args.repeats)
    same = np.allclose(np.asarray(oracle.drops), drops.flat[top], atol=1e-5)
    floor = t_grid / (times["clean"] + t_oracle)
    print(
        f"floor: the grid's top 10 ablated exactly {t_oracle:.1f} s (equal to the grid's: {same}); "
        f"with the cheapest screen ({times['clean']:.1f} s) {floor:.1f}x less time than the grid: "
        "no screen-then-verify engine does better"
    )
    screen_rows(screens, times, verify, t_grid, top, H, args.max_verify)
    flag_fix_rows(hvp, verify, t_grid, top_heads, drops, screens["clean"], H)
    print(
        f"load at the end {os.getloadavg()[0]:.1f} (the grid's time is the baseline of every ratio)"
    )


if __name__ == "__main__":
    main()
