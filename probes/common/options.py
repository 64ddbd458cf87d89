"""The probes' option strings, each a ``Literal`` type named for what it chooses, with the runtime
tuple that checks it derived from the type (``typing.get_args``), so that the two cannot drift.
One name means one thing: an ablation's replacement (:data:`AblationMethod`) is not an
attribution's estimator (:data:`AttributionMethod`) nor a faithfulness test's replacement
(:data:`FaithfulnessAblation`)."""

from __future__ import annotations

from typing import Literal, get_args

AblationMethod = Literal["zero", "mean", "resample"]  # what replaces an ablated head
Engine = Literal["exact", "sampled", "attribution"]  # how ablate_heads covers the grid
# attribution along the ablation path: all layers at once, or one; "clean": the derivative at the
# clean point only (attribution patching, AtP: every head live, one backward); "hvp": that plus
# the second-order term, from Hessian-vector products (one more backward)
IntegrationPath = Literal["joint", "layer", "clean", "hvp"]
AttributionMethod = Literal["atp", "atp*", "eap-ig", "hvp"]  # the attribution estimator
AttributionAblation = Literal["zero", "mean"]  # what attribution moves a unit towards
FaithfulnessAblation = Literal["corrupt", "resample", "mean"]  # what replaces what a circuit drops
# what a probes.common.replace.Replacement puts in: every one of the three above names one of these
ReplacementMethod = Literal["zero", "mean", "resample", "corrupt"]
Surrogate = Literal["accuracy", "loss", "logit", "margin", "logprob"]  # rank_heads' integrand
# the edge graph's k/v readers under grouped key/value heads: one per key/value head, or one per
# query head (EAP-IG's ungrouped view)
KVView = Literal["grouped", "ungrouped"]

ABLATION_METHODS: tuple[str, ...] = get_args(AblationMethod)
ENGINES: tuple[str, ...] = get_args(Engine)
INTEGRATION_PATHS: tuple[str, ...] = get_args(IntegrationPath)
ATTRIBUTION_METHODS: tuple[str, ...] = get_args(AttributionMethod)
ATTRIBUTION_ABLATIONS: tuple[str, ...] = get_args(AttributionAblation)
FAITHFULNESS_ABLATIONS: tuple[str, ...] = get_args(FaithfulnessAblation)
REPLACEMENT_METHODS: tuple[str, ...] = get_args(ReplacementMethod)
SURROGATES: tuple[str, ...] = get_args(Surrogate)
KV_VIEWS: tuple[str, ...] = get_args(KVView)

__all__ = [
    "ABLATION_METHODS",
    "ATTRIBUTION_ABLATIONS",
    "ATTRIBUTION_METHODS",
    "ENGINES",
    "FAITHFULNESS_ABLATIONS",
    "INTEGRATION_PATHS",
    "KV_VIEWS",
    "REPLACEMENT_METHODS",
    "SURROGATES",
    "AblationMethod",
    "AttributionAblation",
    "AttributionMethod",
    "Engine",
    "FaithfulnessAblation",
    "IntegrationPath",
    "KVView",
    "ReplacementMethod",
    "Surrogate",
]
