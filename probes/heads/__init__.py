"""Heads by what they attend to: head types scored on prompts (:mod:`~probes.heads.types`), the
patterns of chosen heads (:mod:`~probes.heads.patterns`), and their views (:mod:`~probes.heads.view`)."""
