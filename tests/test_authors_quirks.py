"""The authors' code, one switch at a time (paper digest §3, §4, §9): data, optimiser, evaluation.

The forward pass in authors' mode is held against an independent restatement of their model in
``tests/test_authors_fidelity.py``; this file checks every other switch against a naive
restatement of what their code does.
"""

from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F

from pe_interp import HookedPETransformer, ModelConfig, load_run, train
from pe_interp.config.model import TrainConfig
from pe_interp.config.presets import AUTHORS_QUIRKS, authors_encoding, build_run_configs
from pe_interp.tasks import CountTask, DistanceTask, row_hashes
from pe_interp.training.trainer import evaluate


# ---- the whole mode ---------------------------------------------------------------------------
def test_authors_mode_sets_every_switch_and_each_can_be_undone_alone():
    model, task, tr = build_run_configs(
        "distance", "sinusoidal+rope", "smoke", 0, authors_quirks=True
    )
    for name, value in AUTHORS_QUIRKS["model"].items():
        assert getattr(model, name) == value, name
    for name, value in AUTHORS_QUIRKS["train"].items():
        assert getattr(tr, name) == (tuple(value) if isinstance(value, tuple) else value), name
    assert task.fillers_include_triggers and task.distinct_fillers and task.dedup
    assert tr.n_test == round(tr.n_train * 3 / 7)  # their 70/30 split
    assert model.encoding_name == "sinusoidal(layout=concat)+rope"
    # One switch back to the textbook value, everything else still the authors'.
    undone, _, _ = build_run_configs(
        "distance", "rope", "smoke", 0, authors_quirks=True, init_mode="normal"
    )
    assert undone.init_mode == "normal" and undone.kv_source == "embed" and not undone.final_norm
    textbook, task_tb, tr_tb = build_run_configs("distance", "rope", "smoke", 0)
    assert textbook.init_mode == "normal" and textbook.mask_padding and tr_tb.grad_clip == 1.0
    assert not task_tb.distinct_fillers and not task_tb.dedup


def test_authors_mode_on_task_2_ignores_count_zero():
    _, task, tr = build_run_configs("count", "rope", "smoke", 0, authors_quirks=True)
    assert tr.ignore_index == 0 and not task.ignore_zero and task.count_to_class(0) == 0


@pytest.mark.parametrize(
    "given, expected",
    [
        ("absolute", "sinusoidal"),
        ("random", "learned"),
        ("relative", "t5"),
        ("alibi", "alibi(slopes=authors)"),
        ("sinusoidal+rope", "sinusoidal(layout=concat)+rope"),
        ("rope", "rope"),  # pure RoPE: their partialrope.py
        ("sinusoidal", "sinusoidal"),  # their "absolute": interleaved
        ([{"name": "alibi", "slopes": "standard"}], "alibi"),  # explicit choices are kept
    ],
)
def test_authors_encoding_names(given, expected):
    assert "+".join(str(s) for s in authors_encoding(given)) == expected


# ---- data -------------------------------------------------------------------------------------
def _segments(
    task: DistanceTask, row: torch.Tensor, length: int
) -> tuple[list[int], list[int], list[int]]:
    t1, t2 = task.triggers
    first = next(i for i, t in enumerate(row.tolist()) if t == t1)  # fillers never hold t1 here
    second = next(i for i in range(first + 1, length) if row[i] == t2)
    r = row[:length].tolist()
    return r[:first], r[first + 1 : second], r[second + 1 :]


def test_distinct_fillers_never_repeat_inside_a_segment():
    task = DistanceTask(
        d_vocab=40, max_between=20, max_side=6, max_len=34, distinct_fillers=True, seed=3
    )
    batch = task.sample(400, seed=1)
    repeats = 0
    for row, pad, label in zip(batch.tokens, batch.pad_mask, batch.labels):
        left, middle, right = _segments(task, row, int(pad.sum()))
        assert len(middle) == int(label) + 1  # distance = between + 1, class = distance - 2
        for seg in (left, middle, right):
            assert len(set(seg)) == len(seg)
            assert all(0 < t < task.d_vocab and t not in task.triggers for t in seg)
        repeats += len(left + middle + right) - len(set(left + middle + right))
    assert repeats > 0  # segments are drawn independently, so ids do repeat across them
    # With replacement (the default), a 20-token middle from 37 ids repeats almost always.
    plain = DistanceTask(d_vocab=40, max_between=20, max_side=6, max_len=34, seed=3).sample(
        400, seed=1
    )
    assert any(
        len(set(m)) < len(m)
        for m in (_segments(task, r, int(p.sum()))[1] for r, p in zip(plain.tokens, plain.pad_mask))
    )


def test_distinct_fillers_are_uniform_over_the_pool():
    task = DistanceTask(
        d_vocab=12, max_between=6, max_side=3, max_len=14, distinct_fillers=True, seed=0
    )
    batch = task.sample(20_000, seed=2)
    t1, t2 = task.triggers
    fillers = batch.tokens[batch.pad_mask & (batch.tokens != t1) & (batch.tokens != t2)]
    counts = torch.bincount(fillers, minlength=12).double()
    pool = [i for i in range(1, 12) if i not in (t1, t2)]
    freq = counts[pool] / counts[pool].sum()
    expected = 1 / len(pool)
    sd = math.sqrt(expected * (1 - expected) / counts[pool].sum().item())
    assert (freq - expected).abs().max() < 5 * sd
    assert counts[[0, t1, t2]].sum() == 0


def test_distinct_fillers_need_a_large_enough_vocabulary():
    with pytest.raises(ValueError, match="DistanceTask.distinct_fillers"):
        DistanceTask(d_vocab=10, max_between=12, max_side=3, max_len=30, distinct_fillers=True)


@pytest.mark.parametrize(
    "cls, kwargs, n",
    [
        # 4^3 + 4^4 = 320 possible sequences; 64 for the count task.
        (
            DistanceTask,
            dict(d_vocab=5, max_between=2, max_side=1, max_len=6, fillers_include_triggers=True),
            150,
        ),
        (CountTask, dict(d_vocab=5, n_triggers=2, max_count=3, length=3), 40),
    ],
)
def test_dedup_removes_repeated_training_rows_and_keeps_the_size(cls, kwargs, n):
    plain_train, _ = cls(**kwargs).splits(n, 10, seed=0)
    keys = row_hashes(plain_train.tokens)
    assert len(torch.unique(keys)) < len(keys)  # a tiny space: the plain split repeats rows
    task = cls(dedup=True, **kwargs)
    train, test = task.splits(n, 10, seed=0)
    keys = row_hashes(train.tokens)
    assert len(train) == n and len(torch.unique(keys)) == n
    assert not torch.isin(row_hashes(test.tokens), keys).any()
    # The first occurrences are kept, so a split is still a pure function of its arguments.
    first = plain_train.tokens[0]
    assert torch.equal(train.tokens[0], first)
    again, _ = task.splits(n, 10, seed=0)
    assert torch.equal(again.tokens, train.tokens)


def test_dedup_without_duplicates_is_the_plain_split():
    task = DistanceTask(d_vocab=128, max_between=30, max_side=8, max_len=48, seed=1)
    a, _ = task.splits(2000, 100, seed=4)
    b, _ = DistanceTask(
        d_vocab=128, max_between=30, max_side=8, max_len=48, dedup=True, seed=1
    ).splits(2000, 100, seed=4)
    assert torch.equal(a.tokens, b.tokens)


# ---- optimiser ----------------------------------------------------------------------------------
def test_authors_lr_schedule_matches_their_lambda_lr():
    """Their get_cosine_schedule_with_warmup, stepped once per batch after optimizer.step()."""
    cfg = TrainConfig(
        n_train=1000, batch_size=10, epochs=3, lr=1e-4, warmup_frac=0.06, lr_schedule="authors"
    )
    total, warm = cfg.total_steps, int(0.06 * cfg.total_steps)

    def lr_lambda(step):  # restated from dis_gen/trans.py
        if step < warm:
            return step / max(1, warm)
        return 0.5 * (1.0 + math.cos(math.pi * (step - warm) / max(1, total - warm)))

    p = torch.nn.Parameter(torch.zeros(1))
    opt = torch.optim.AdamW([p], lr=1e-4)
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lr_lambda)
    theirs = []
    for _ in range(total):
        theirs.append(opt.param_groups[0]["lr"])
        opt.step()
        sched.step()
    ours = [cfg.lr_at(s) for s in range(total)]
    assert ours == pytest.approx(theirs, rel=1e-12, abs=1e-18)
    assert ours[0] == 0.0 and ours != [
        TrainConfig(**{**cfg.to_dict(), "lr_schedule": "warmup_cosine"}).lr_at(s)
        for s in range(total)
    ]


def test_ignore_index_drops_the_class_from_loss_and_accuracy(tmp_path):
    result = train(
        task="count",
        encoding="nope",
        preset="smoke",
        seed=0,
        out=tmp_path / "r",
        progress=False,
        ignore_index=0,
        epochs=1,
    )
    run = load_run(tmp_path / "r")
    test = run.examples("test")
    assert len(test) and (test.labels != 0).all()
    _, full = run.task.splits(run.train_cfg.n_train, run.train_cfg.n_test, seed=run.train_cfg.seed)
    assert (full.labels == 0).any()  # count 0 is in the data ...
    with torch.no_grad():
        logits = run.model(full.tokens, full.pad_mask)
    keep = full.labels != 0  # ... and out of the score, as CrossEntropyLoss(ignore_index=0)
    expect_acc = (logits.argmax(-1)[keep] == full.labels[keep]).double().mean().item()
    expect_loss = F.cross_entropy(logits, full.labels, ignore_index=0).item()
    got = evaluate(run.model, full, ignore_index=0)
    assert got["acc"] == pytest.approx(expect_acc, abs=1e-12)
    assert got["loss"] == pytest.approx(expect_loss, rel=1e-5)
    assert result.final["test_acc"] == pytest.approx(expect_acc, abs=1e-12)
    plain = evaluate(run.model, full)
    assert plain["acc"] != got["acc"] or plain["loss"] != got["loss"]


def test_eval_on_all_is_train_plus_test(tmp_path):
    train(
        task="distance",
        encoding="rope",
        preset="smoke",
        seed=0,
        out=tmp_path / "r",
        progress=False,
        epochs=1,
    )
    run = load_run(tmp_path / "r")
    tr, te = run.task.splits(run.train_cfg.n_train, run.train_cfg.n_test, seed=run.train_cfg.seed)
    every = run.examples("all")
    assert len(every) == len(tr) + len(te)
    assert torch.equal(every.tokens, torch.cat([tr.tokens, te.tokens]))
    assert torch.equal(run.examples("test", 10).tokens, te.tokens[:10])
    with pytest.raises(ValueError, match="on must be one of"):
        run.examples("train+test")


# ---- initialisation ---------------------------------------------------------------------------
def test_normal_init_is_unchanged():
    """The default scheme, restated: W_* ~ N(0, 0.02) in parameter order from one generator."""
    cfg = ModelConfig(
        n_layers=2, d_model=16, n_heads=2, d_mlp=32, n_ctx=12, d_vocab=20, n_classes=5, seed=7
    )
    model = HookedPETransformer(cfg)
    gen = torch.Generator().manual_seed(7)
    for name, p in model.named_parameters():
        leaf = name.rsplit(".", 1)[-1]
        if leaf.startswith("W_"):
            assert torch.equal(p, torch.randn(p.shape, generator=gen) * 0.02), name
        else:
            assert torch.equal(p, torch.ones_like(p) if leaf == "w" else torch.zeros_like(p)), name


def test_torch_init_bounds_follow_fan_in():
    cfg = ModelConfig(
        n_layers=1,
        d_model=64,
        n_heads=4,
        d_head=8,
        d_mlp=200,
        n_ctx=12,
        d_vocab=300,
        n_classes=5,
        init_mode="torch",
        encoding="learned",
    )
    model = HookedPETransformer(cfg)
    fan = {
        "W_Q": 64,
        "b_Q": 64,
        "W_O": 32,
        "b_O": 32,
        "W_in": 64,
        "b_in": 64,
        "W_out": 200,
        "b_out": 200,
        "W_U": 64,
    }
    params = dict(model.named_parameters())
    for name, p in params.items():
        leaf = name.rsplit(".", 1)[-1]
        if leaf in fan:
            bound = 1 / math.sqrt(fan[leaf])
            assert p.abs().max() <= bound and p.abs().max() > 0.9 * bound, name
    assert params["W_E"].std().item() == pytest.approx(1.0, abs=0.02)
    assert params["encoding.W_pos"].std().item() == pytest.approx(1.0, abs=0.1)
    assert (params["blocks.0.ln1.w"] == 1).all() and (params["blocks.0.ln1.b"] == 0).all()
