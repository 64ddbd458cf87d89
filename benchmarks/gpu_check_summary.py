#!/usr/bin/env python
"""The summary table of benchmarks/gpu_check.sh, from its stages.tsv and the result files in OUT.

    python benchmarks/gpu_check_summary.py STAGES_TSV OUT_DIR

Standard library only (it also runs when torch does not import). Every part is guarded: a
missing or broken result file shows as a note, never as a crash.
"""

from __future__ import annotations

import json
import re
import sys
from pathlib import Path


def load(path: Path):
    try:
        return json.loads(path.read_text())
    except Exception:
        return None


def note_install(out: Path, log: str) -> str:
    failed = re.findall(r"^\s+(\S+)\s+IMPORT FAILED", log, re.M)
    if failed:
        return "import failed: " + ", ".join(failed)
    n = len(re.findall(r"\.whl$", log, re.M))
    return f"{n} wheels" if n else ""


def note_env(out: Path, log: str) -> str:
    text = (out / "env.txt").read_text() if (out / "env.txt").exists() else ""
    parts = []
    for pat in (
        r"^device: ([^,]+, capability [\d.]+)",
        r"^torch (\S+)",
        r"^triton (\S+)",
        r"^python (\S+)",
    ):
        m = re.search(pat, text, re.M)
        if m:
            parts.append(
                m.group(1)
                if pat.startswith("^device")
                else pat[1:].split(" ")[0] + " " + m.group(1)
            )
    if "cuda available: False" in text:
        parts.append("NO CUDA")
    return ", ".join(parts)


def note_kernel_tests(out: Path, log: str) -> str:
    text = (out / "kernel_tests.txt").read_text() if (out / "kernel_tests.txt").exists() else log
    lines = [
        ln
        for ln in text.splitlines()
        if re.search(r"\d+ (passed|failed|error|skipped)|no tests ran", ln)
    ]
    if lines:
        return lines[-1].strip(" =")
    progress = "".join(
        ln.split(" [")[0] for ln in text.splitlines() if re.fullmatch(r"[.FEsx]+( \[.*\])?", ln)
    )
    if progress:  # stopped before pytest's closing line
        return f"stopped after {len(progress)} tests: {progress.count('.')} passed, {progress.count('F')} failed"
    last = [ln.strip() for ln in text.splitlines() if ln.strip()]
    return last[-1][:100] if last else ""


def note_attention(out: Path, name: str) -> str:
    data = load(out / name)
    if not data:
        return "no JSON (see logs.tar.gz)"
    rows = data.get("results", [])
    bad = [r for r in rows if "error" in r or "err_error" in r]
    return f"{len(rows)} rows, {len(bad)} with errors"


def note_model_step(out: Path) -> str:
    data = load(out / "model_step_gpu.json")
    if not data:
        return "no JSON"
    res = data.get("results", {})
    parts = [f"{k} {v['s_per_step'] * 1e3:.1f} ms" for k, v in res.items()]
    if data.get("errors"):
        parts.append("failed: " + ", ".join(data["errors"]))
    return "/step: " + ", ".join(parts)


def note_train(out: Path) -> str:
    data = load(out / "train_rope.json")
    if not data:
        return "no JSON"
    m = data.get("metrics") or []
    if not m:
        return "no epoch finished"
    spe = data.get("seconds_per_epoch") or []
    tail = spe[1:] or spe  # the first epoch includes compiles
    per = f", {sum(tail) / len(tail):.1f} s/epoch" if tail else ""
    return f"{len(m)} epochs{per}, test_acc {m[-1].get('test_acc', float('nan')):.3f}"


def attention_table(out: Path) -> list[str]:
    rows = []
    for name in ("attention_gpu.json", "attention_flex.json"):
        data = load(out / name)
        if data:
            rows += data.get("results", [])
    if not rows:
        return []
    cont = sorted({r["contender"] for r in rows}, key=lambda c: (c != "triton", c))
    keys = []
    for r in rows:
        k = (r["shape"], r["encoding"], r["mode"])
        if k not in keys:
            keys.append(k)
    cell = {(r["shape"], r["encoding"], r["mode"], r["contender"]): r for r in rows}
    lines = [
        "",
        "attention (bf16, causal): median ms (TFLOP/s); triton's speed-up over the best other",
        f"{'shape':<6}{'enc':<6}{'mode':<8}"
        + "".join(f"{c:>18}" for c in cont)
        + f"{'triton vs best':>16}",
    ]
    for k in keys:
        parts, others = [], []
        for c in cont:
            r = cell.get((*k, c))
            if r is None:
                parts.append(f"{'-':>18}")
            elif "ms" not in r:
                parts.append(f"{'ERROR':>18}")
            else:
                parts.append(f"{r['ms']:>9.3f} ({r['tflops']:>5.1f})")
                if c != "triton":
                    others.append(r["ms"])
        t = cell.get((*k, "triton"), {})
        sp = f"{min(others) / t['ms']:.2f}x" if others and "ms" in t else "-"
        lines.append(f"{k[0]:<6}{k[1]:<6}{k[2]:<8}" + "".join(parts) + f"{sp:>16}")
    errs = [
        (r["shape"], r["encoding"], r["mode"], r["contender"], r["err"])
        for r in rows
        if r.get("err") and r["contender"] == "triton"
    ]
    if errs:
        worst = max(max(e[4].values()) for e in errs)
        lines.append(f"triton max abs error vs float64 over all rows: {worst:.3g}")
    return lines


def model_step_table(out: Path) -> list[str]:
    data = load(out / "model_step_gpu.json")
    if not data or not data.get("results"):
        return []
    peaks = data.get("matmul_gflops", {})  # {precision: GFLOP/s}
    precision, peak = next(iter(peaks.items()), ("", 0.0))
    base = (data.get("baselines") or ["baseline"])[0]
    lines = [
        "",
        f"training step ({data.get('device', '?')}, bf16 autocast {data.get('amp_bf16')}, "
        f"batch {data['config'].get('batch')} x {data['config'].get('n_ctx')}, "
        f"{data.get('train_gflop_per_step', 0):.0f} GFLOP/step; {precision} matmul peak "
        f"{peak / 1e3:.0f} TFLOP/s)",
        f"{'contender':<10}{'ms/step':>10}{'TFLOP/s':>10}{'of peak':>9}{'vs ' + base:>14}",
    ]
    for k, v in data["results"].items():
        lines.append(
            f"{k:<10}{v['s_per_step'] * 1e3:>10.2f}{v['gflops'] / 1e3:>10.1f}"
            f"{v['fraction_of_matmul_peak'][precision]:>9.1%}{v['speed_vs'][base]:>13.2f}x"
        )
    return lines


def main(argv: list[str]) -> int:
    stages_tsv, out = Path(argv[1]), Path(argv[2])
    work_logs = stages_tsv.parent / "logs"
    stages = []
    for line in stages_tsv.read_text().splitlines() if stages_tsv.exists() else []:
        parts = line.split("\t")
        if len(parts) >= 3:
            stages.append(parts + [""] * (4 - len(parts)))
    lines = ["gpu_check summary", f"{'stage':<16}{'status':<12}{'seconds':>8}  note"]
    for name, status, secs, limit in stages:
        log_path = work_logs / f"{name}.log"
        log = log_path.read_text(errors="replace") if log_path.exists() else ""
        notes = {
            "install": lambda log=log: note_install(out, log),
            "env": lambda log=log: note_env(out, log),
            "kernel_tests": lambda log=log: note_kernel_tests(out, log),
            "attention": lambda: note_attention(out, "attention_gpu.json"),
            "attention_flex": lambda: note_attention(out, "attention_flex.json"),
            "model_step": lambda: note_model_step(out),
            "train": lambda: note_train(out),
        }
        try:
            note = notes.get(name, lambda: "")()
        except Exception as e:  # a summary never fails the check
            note = f"(summary: {type(e).__name__}: {e})"
        if status == "SKIP":
            note = limit
        lines.append(f"{name:<16}{status:<12}{secs:>8}  {note}")
    total = sum(int(s[2]) for s in stages if s[2].isdigit())
    lines.append(f"{'total':<16}{'':<12}{total:>8}")
    for part in (attention_table, model_step_table):
        try:
            lines += part(out)
        except Exception as e:
            lines.append(f"({part.__name__}: {type(e).__name__}: {e})")
    print("\n".join(lines))
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv))
