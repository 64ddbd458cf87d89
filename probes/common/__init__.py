"""What every probe shares: input checks at the door (:mod:`~probes.common.inputs`), option types
(:mod:`~probes.common.options`), metrics and intervals (:mod:`~probes.common.metrics`), progress
bars with an ETA (:mod:`~probes.common.progress`), the one replacement seam
(:mod:`~probes.common.replace`), figures (:mod:`~probes.common.figures`) and offline HTML
(:mod:`~probes.common.html`)."""
