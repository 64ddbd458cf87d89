"""Head ablation sweeps: knock out one attention head (or a set of heads) at a time and measure
how much a metric suffers: the measurement behind the paper's "single-head deposit pattern"
(paper digest §6).

:func:`ablate_heads` is the one entry (:mod:`probes.ablation.entry`). Its path goes down and never
back:

1. :mod:`probes.ablation.plan` checks every argument once (:func:`~probes.ablation.plan.check_request`)
   and makes an :class:`~probes.ablation.request.AblationRequest`;
2. the engine it names runs it (:mod:`probes.ablation.engines`: objects that hold their own
   options, strings as shorthand): :mod:`probes.ablation.exact` (every head on every example; how
   it is fast without approximating anything), :mod:`probes.ablation.sampled` or
   :mod:`probes.ablation.attribution` (each ending in exact ablation of the heads it ranks first);
3. below them, :mod:`probes.ablation.sweeps` (the exact sweeps), :mod:`probes.ablation.replace`
   (the request's replacement, through :mod:`probes.common.replace`) and :mod:`probes.ablation.result`
   (the result, which saves and loads itself).
"""

from probes.ablation.attribution import Attribution
from probes.ablation.engines import AblationEngine, as_engine
from probes.ablation.entry import ablate_heads, ablate_heads_naive
from probes.ablation.exact import Exact, Naive
from probes.ablation.plan import keep_only
from probes.ablation.replace import head_means
from probes.ablation.request import default_batch_size
from probes.ablation.result import METHODS, AblationResult, Head
from probes.ablation.sampled import Sampled
from probes.common.metrics import resample_sources
from probes.common.options import ENGINES

__all__ = [
    "ENGINES",
    "METHODS",
    "AblationEngine",
    "AblationResult",
    "Attribution",
    "Exact",
    "Head",
    "Naive",
    "Sampled",
    "ablate_heads",
    "ablate_heads_naive",
    "as_engine",
    "default_batch_size",
    "head_means",
    "keep_only",
    "resample_sources",
]
