"""The probes refuse bad inputs with one clear line (issue 21, item 4): labels out of range or
not integers, non-finite weights or logits, pad masks of another batch, tokens the model cannot
read, negative bootstrap counts, layers, heads and examples out of range.

Every case requires a ValueError whose message is one line and matches its pattern, raised
before any work (the cases are in ``tests/bad_probe_cases.py``; the world, the inputs and the
helpers in ``tests/bad_input_env.py``; result files, grids, ``save()`` and the command line are in
``tests/test_bad_inputs_files.py``).
"""

from __future__ import annotations

import pytest
from bad_input_env import Env, expect_value_error
from bad_probe_cases import CASES


@pytest.mark.parametrize("case", CASES, ids=[c[0] for c in CASES])
def test_probe_bad_input(case, probe_world, tmp_path):
    _, call, pattern = case
    expect_value_error(lambda: call(Env(probe_world, tmp_path)), pattern)
