"""Progress with an ETA for probes whose forwards cost unequal amounts: a bar advanced by each
forward's cost in layer-rows (rows times the layers it runs), so that its ETA holds while
forwards restarted at early layers cost more than late ones."""

from __future__ import annotations

__all__ = ["SweepProgress"]


class SweepProgress:
    """A tqdm bar over a sweep (``enabled``), advanced by each forward's cost in layer-rows (rows
    times the layers the forward runs), so that its ETA holds while forwards from early layers
    cost more than late ones; its postfix counts the units done (ablations, patches: each copy of
    a forward is ``rows / n_examples`` of one)."""

    def __init__(
        self,
        enabled: bool,
        desc: str,
        total: float,
        n_units: int,
        n_examples: int,
        unit: str = "ablations",
    ):
        self.bar = None
        self.done, self.n_units, self.n_examples, self.unit = 0.0, n_units, n_examples, unit
        if enabled:
            from tqdm.auto import tqdm

            self.bar = tqdm(
                total=total,
                desc=desc,
                bar_format="{desc}: {percentage:3.0f}%|{bar}| [{elapsed}<{remaining}{postfix}]",
            )
            self.bar.set_postfix_str(f"0/{n_units} {unit}", refresh=False)

    def update(self, cost: float, rows_of_units: float = 0.0) -> None:
        if self.bar is None:
            return
        self.done += rows_of_units / self.n_examples
        self.bar.set_postfix_str(
            f"{int(self.done + 1e-9)}/{self.n_units} {self.unit}", refresh=False
        )
        self.bar.update(cost)

    def close(self) -> None:
        if self.bar is not None:
            self.bar.close()
