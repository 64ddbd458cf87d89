"""Regenerate ``smoke_summary.json`` from a smoke reproduction, when a change is meant to move
numbers (commit it on its own, saying why)::

    OMP_NUM_THREADS=1 .venv/bin/pe-interp reproduce --preset smoke --out /tmp/golden
    .venv/bin/python tests/golden/update.py /tmp/golden/summary.json
"""

import json
import sys
from pathlib import Path

summary = json.loads(Path(sys.argv[1]).read_text())
summary.pop("out_dir")  # names the machine's directory
golden = Path(__file__).with_name("smoke_summary.json")
golden.write_text(json.dumps(summary, indent=1, ensure_ascii=False) + "\n")
print(f"wrote {golden}")
