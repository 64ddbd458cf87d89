"""Grid files in YAML 1.2: only true/false are booleans (PyYAML's 1.1 rules read the key ``on``
as True), a key given twice is an error, and PyYAML's errors come out on one line with the line
and column of the problem.
"""

from __future__ import annotations

import re
from typing import Any

import yaml


class YAML12Loader(yaml.SafeLoader):
    """YAML with YAML 1.2's booleans: only true/false. PyYAML's 1.1 rules read the key ``on``
    (``probe_options: {ablation: {on: all}}``) as True, and ``no`` as False. A key given twice
    in one mapping is an error (PyYAML keeps the last one silently)."""

    def construct_mapping(self, node, deep=False):
        seen: dict[Any, int] = {}
        for key_node, _ in node.value:
            if key_node.tag == "tag:yaml.org,2002:merge":
                continue
            key = self.construct_object(key_node, deep=deep)
            try:
                if key in seen:
                    raise yaml.constructor.ConstructorError(
                        None,
                        None,
                        f"duplicate key {key!r} (first given on line {seen[key] + 1})",
                        key_node.start_mark,
                    )
                seen[key] = key_node.start_mark.line
            except TypeError:  # an unhashable key: PyYAML's own error follows
                break
        return super().construct_mapping(node, deep=deep)


YAML12Loader.yaml_implicit_resolvers = {
    first: [(tag, rx) for tag, rx in resolvers if tag != "tag:yaml.org,2002:bool"]
    for first, resolvers in yaml.SafeLoader.yaml_implicit_resolvers.items()
}
YAML12Loader.add_implicit_resolver(
    "tag:yaml.org,2002:bool", re.compile(r"^(?:true|True|TRUE|false|False|FALSE)$"), list("tTfF")
)


def yaml_error(err: yaml.YAMLError) -> str:
    """PyYAML's error on one line, with the line and column of the problem (its marks are 0-based)."""
    problem = getattr(err, "problem", None) or str(err).splitlines()[0]
    mark = getattr(err, "problem_mark", None)
    where = f"line {mark.line + 1}, column {mark.column + 1}: " if mark is not None else ""
    context, cmark = getattr(err, "context", None), getattr(err, "context_mark", None)
    extra = (
        f" ({context} that starts on line {cmark.line + 1})"
        if context and cmark is not None and mark is not None and cmark.line != mark.line
        else ""
    )
    return f"invalid YAML at {where}{problem}{extra}"
