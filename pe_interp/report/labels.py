"""The reproduction's encodings by label (the order of its tables) and the paper's numbers.

Shared by the reproduction (which runs these encodings) and the report (which labels, orders and
compares them).
"""

from __future__ import annotations

from typing import Any

# (label, encoding spec) in the order the tables list them.
ENCODINGS: list[tuple[str, Any]] = [
    ("nope", "nope"),
    ("sinusoidal", "sinusoidal"),
    ("learned", "learned"),
    ("t5", "t5"),
    ("alibi", "alibi"),
    ("rope", "rope"),
    ("sinusoidal+rope", "sinusoidal+rope"),
    ("rope (1 head)", {"name": "rope", "heads": [0]}),
    ("rope (2 heads)", {"name": "rope", "heads": [0, 1]}),
    ("decoupled_rope", "decoupled_rope"),
]


def encoding_label(spec: Any) -> str:
    for label, s in ENCODINGS:
        if s == spec:
            return label
    return spec if isinstance(spec, str) else str(spec)


# label -> task -> what the summaries report (digest §5).
PAPER_ACC: dict[str, dict[str, str]] = {
    "rope": {"distance": "92.64", "count": "69.43"},
    "sinusoidal+rope": {
        "distance": "92.64 (if the paper's RoPE is the authors' APE+RoPE)",
        "count": "69.43 (same caveat)",
    },
    "decoupled_rope": {"distance": "88.34 (MLA)", "count": "97.41 (MLA)"},
    "nope": {"distance": "“fails” (qualitative)", "count": "77.69"},
    "sinusoidal": {
        "distance": "“second best” (qualitative, “Absolute”)",
        "count": "“moderate” (qualitative, “Absolute”)",
    },
    "learned": {
        "distance": "not reported (“Absolute” may mean this)",
        "count": "not reported (“Absolute” may mean this)",
    },
    "alibi": {"distance": "“fails” (qualitative)", "count": "“worst” (qualitative)"},
    "t5": {"distance": "not reported", "count": "not reported"},
    "rope (1 head)": {"distance": "≈90 (qualitative)", "count": "not reported"},
    "rope (2 heads)": {"distance": "≈90+ (qualitative)", "count": "not reported"},
}


def paper_acc(label: str, task: str) -> str:
    return PAPER_ACC.get(label.split(" [")[0], {}).get(task, "not reported")


__all__ = ["ENCODINGS", "PAPER_ACC", "encoding_label", "paper_acc"]
