"""benchmarks/gpu_check.sh (run on a lent GPU machine, rehearsed with GPU_CHECK_REHEARSAL=1): the
parts CI can check without a GPU: the shell parses, and the summary table reads every result
file, including missing and partial ones."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

BENCH = Path(__file__).resolve().parents[1] / "benchmarks"


@pytest.mark.skipif(shutil.which("bash") is None, reason="needs bash")
@pytest.mark.parametrize("script", ["gpu_check.sh", "gpu_wheels.sh"])
def test_scripts_parse(script):
    res = subprocess.run(["bash", "-n", str(BENCH / script)], capture_output=True, text=True)
    assert res.returncode == 0, res.stderr


def _summary(tmp_path: Path, stages: list[tuple[str, str, int]]) -> str:
    work = tmp_path / "work"
    (work / "logs").mkdir(parents=True, exist_ok=True)
    tsv = work / "stages.tsv"
    tsv.write_text("".join(f"{n}\t{s}\t{t}\ttimeout 60s\n" for n, s, t in stages))
    res = subprocess.run(
        [sys.executable, str(BENCH / "gpu_check_summary.py"), str(tsv), str(tmp_path / "out")],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert res.returncode == 0, res.stderr
    return res.stdout


def test_summary_reads_results(tmp_path):
    out = tmp_path / "out"
    out.mkdir()
    (out / "env.txt").write_text(
        "torch 2.11.0+cu130 cuda 13.0\ntriton 3.6.0\n"
        "device: NVIDIA H200, capability 9.0, 132 SMs, 139.8 GiB\n"
    )
    (out / "kernel_tests.txt").write_text("....\n68 passed in 61.2s\n")
    row = dict(shape="paper", B=512, H=16, S=128, D=16, encoding="rope", mode="fwd", causal=True)
    (out / "attention_gpu.json").write_text(
        json.dumps(
            {
                "results": [
                    dict(row, contender="triton", ms=0.5, tflops=40.0, err={"out": 0.004}),
                    dict(row, contender="sdpa", ms=1.0, tflops=20.0),
                    dict(row, contender="eager", mode="fwd+bwd", error="RuntimeError: boom"),
                ]
            }
        )
    )
    (out / "model_step_gpu.json").write_text(
        json.dumps(
            {
                "device": "NVIDIA H200",
                "amp_bf16": True,
                "baseline": "baseline",
                "config": {"batch": 512, "n_ctx": 120},
                "train_gflop_per_step": 1296,
                "matmul_gflops": {"bf16": 780000},
                "baselines": ["baseline"],
                "results": {
                    "baseline": dict(
                        s_per_step=0.02,
                        gflops=64800,
                        fraction_of_matmul_peak={"bf16": 0.08},
                        speed_vs={"baseline": 1.0},
                    )
                },
            }
        )
    )
    (out / "train_rope.json").write_text(
        json.dumps(
            {
                "metrics": [{"test_acc": 0.1, "seconds": 9.0}, {"test_acc": 0.3, "seconds": 12.0}],
                "seconds_per_epoch": [9.0, 3.0],
            }
        )
    )
    text = _summary(
        tmp_path,
        [
            ("install", "ok", 5),
            ("env", "ok", 3),
            ("kernel_tests", "ok", 70),
            ("attention", "ok", 60),
            ("model_step", "ok", 30),
            ("train", "TIMEOUT", 150),
            ("attention_flex", "SKIP", 0),
        ],
    )
    assert "NVIDIA H200, capability 9.0" in text and "triton 3.6.0" in text
    assert "68 passed" in text
    assert "3 rows, 1 with errors" in text
    assert "2.00x" in text  # triton 0.5 ms against sdpa 1.0 ms
    assert "2 epochs, 3.0 s/epoch, test_acc 0.300" in text
    assert "baseline       20.00" in text


def test_summary_survives_missing_results(tmp_path):
    text = _summary(
        tmp_path,
        [
            ("install", "FAIL(1)", 5),
            ("kernel_tests", "TIMEOUT", 150),
            ("attention", "FAIL(1)", 2),
            ("train", "FAIL(2)", 3),
        ],
    )
    assert "FAIL(1)" in text and "TIMEOUT" in text and "no JSON" in text
