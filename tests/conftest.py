"""Shared fixtures for the model tests: a tiny-config factory, token batches, and the list of
encodings that model-level tests are parametrised over."""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest
import torch

ROOT = str(Path(__file__).resolve().parents[1])
if ROOT not in sys.path:  # so the tests run from any directory without installing the package
    sys.path.insert(0, ROOT)

# Where the fused-kernel tests (tests/test_kernels.py) run: PE_INTERP_TEST_DEVICE=cuda (an error
# without a CUDA device, so a GPU check never passes on CPU by accident), cpu (the Triton
# interpreter, also on a GPU machine), or auto (default: cuda when available, else cpu).
# The interpreter must be switched on here, before pe_interp is imported: Triton decorates its
# own library functions when triton is first imported, and importing pe_interp can import it
# (transformers -> torch._dynamo -> triton).
KERNEL_TEST_DEVICE = os.environ.get("PE_INTERP_TEST_DEVICE", "auto").strip().lower() or "auto"
if KERNEL_TEST_DEVICE not in ("auto", "cpu", "cuda"):
    raise pytest.UsageError(
        f"PE_INTERP_TEST_DEVICE must be auto, cpu or cuda, got {KERNEL_TEST_DEVICE!r}"
    )
if KERNEL_TEST_DEVICE == "cuda" and not torch.cuda.is_available():
    raise pytest.UsageError("PE_INTERP_TEST_DEVICE=cuda, but torch sees no CUDA device")
if KERNEL_TEST_DEVICE == "auto":
    KERNEL_TEST_DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
if KERNEL_TEST_DEVICE == "cpu":
    os.environ.setdefault("TRITON_INTERPRET", "1")

# Tests are exact in fp32 whatever the CPU: bf16 autocast (TrainConfig.amp) would switch on by
# itself on a CPU with native bf16 and change every number. Tests of the bf16 path set it to 1.
os.environ["PE_INTERP_CPU_BF16"] = "0"

from pe_interp import HookedPETransformer, ModelConfig  # noqa: E402

# The test shapes are tiny: one intra-op thread is fastest, and on a shared, loaded 2-core machine
# two OpenMP threads waiting on each other make every small op ~100x slower (measured).
torch.set_num_threads(1)

# Every built-in encoding in the configurations the tests care about (id -> ModelConfig.encoding).
ENCODINGS: dict[str, object] = {
    "nope": "nope",
    "sinusoidal": "sinusoidal",
    "learned": "learned",
    "t5": "t5",
    "t5-buckets8": {"name": "t5", "buckets": 8},
    "alibi": "alibi",
    "alibi-authors": {"name": "alibi", "slopes": "authors"},
    "rope": "rope",
    "rope-dim4": {"name": "rope", "rotary_dim": 4},
    "rope-head0": {"name": "rope", "heads": (0,)},
    "decoupled_rope": "decoupled_rope",
    "sinusoidal+rope": "sinusoidal+rope",
}

# Small enough that a forward + backward takes milliseconds; d_head = 8.
TINY = dict(n_layers=2, d_model=16, n_heads=2, d_mlp=32, n_ctx=12, d_vocab=20, n_classes=5)


@pytest.fixture(params=list(ENCODINGS), ids=list(ENCODINGS))
def encoding(request: pytest.FixtureRequest):
    """Each built-in encoding configuration in turn."""
    return ENCODINGS[request.param]


@pytest.fixture
def make_config():
    """``make_config(**overrides)``: a tiny valid ModelConfig."""

    def make(**overrides) -> ModelConfig:
        return ModelConfig(**{**TINY, **overrides})

    return make


def tiny_model(
    encoding=None, *, double: bool = False, training: bool = False, **overrides
) -> HookedPETransformer:
    """A tiny HookedPETransformer: ``ModelConfig(**TINY)`` with ``overrides`` (and ``encoding``
    when given; else the config's default), in float64 with ``double``, in eval mode unless
    ``training``. The model tests' factories are this with their own sizes, seeds and dtypes."""
    if encoding is not None:
        overrides["encoding"] = encoding
    model = HookedPETransformer(ModelConfig(**{**TINY, **overrides}))
    if double:
        model = model.double()
    return model if training else model.eval()


@pytest.fixture
def make_model():
    """``make_model(**overrides)``: :func:`tiny_model` as a fixture (float32, eval mode)."""
    return tiny_model


def smoke_trainer(crash_at: int | None = None, **overrides):
    """``run(out, resume=False) -> state dict`` for a smoke-size task-1 RoPE run (2 epochs,
    checkpoints every 3 steps); with ``crash_at`` the run is killed (KeyboardInterrupt) at that
    step, after its first checkpoint: for resume tests."""
    from pe_interp.config.presets import build_run_configs
    from pe_interp.training.callbacks import Callback
    from pe_interp.training.trainer import Trainer

    model_cfg, task, train_cfg = build_run_configs(
        "distance", "rope", "smoke", 0, epochs=2, checkpoint_every=3, **overrides
    )

    class Crash(Callback):
        def on_step(self, trainer, step, loss):
            if step == crash_at:
                raise KeyboardInterrupt

    def run(out, resume: bool = False, crash: bool = False) -> dict[str, torch.Tensor]:
        t = Trainer(
            model_cfg,
            task,
            train_cfg,
            run_dir=out,
            callbacks=[Crash()] if crash else [],
            progress=False,
        )
        t.fit(resume=resume)
        return {k: v.clone() for k, v in t.model.state_dict().items()}

    return run


def random_tokens(
    batch: int, n_pos: int, d_vocab: int = TINY["d_vocab"], seed: int = 0, lengths=None
) -> torch.Tensor:
    """Random real tokens in ``[1, d_vocab)``; row b right-padded with 0 after ``lengths[b]``."""
    gen = torch.Generator().manual_seed(seed)
    tokens = torch.randint(1, d_vocab, (batch, n_pos), generator=gen)
    for row, length in enumerate(lengths or []):
        tokens[row, length:] = 0
    return tokens


@pytest.fixture
def tokens_fn():
    """The :func:`random_tokens` helper, as a fixture."""
    return random_tokens


@pytest.fixture(scope="session")
def probe_world(tmp_path_factory):
    """A tiny trained run, its model, examples and counterfactual pairs, and one saved result
    file of each kind: what the probe bad-input tables build on (``tests/bad_input_env.py``)."""
    from bad_input_env import build_world

    return build_world(tmp_path_factory.mktemp("probe-inputs"))


def pytest_terminal_summary(terminalreporter, exitstatus, config):
    """A skipped browser test says so loudly at the end of the run, with how to run it."""
    skipped = terminalreporter.stats.get("skipped", [])
    browser = [r for r in skipped if "chromium" in str(getattr(r, "longrepr", "")).lower()]
    if browser:
        terminalreporter.write_sep(
            "!",
            f"{len(browser)} BROWSER TEST(S) SKIPPED: Chromium is not installed",
            red=True,
            bold=True,
        )
        for r in browser:
            terminalreporter.write_line(f"  skipped: {r.nodeid}")
        terminalreporter.write_line(
            "  The report's headless-Chromium checks (report.html renders, no errors, widgets drawn) did not run.\n"
            "  Install Chromium with `make setup-browser` (Debian/Ubuntu: apt-get install -y chromium; macOS: brew "
            "install --cask chromium), then run `make test` again. CI (.ci/run) installs it and fails instead of skipping.",
            red=True,
        )
