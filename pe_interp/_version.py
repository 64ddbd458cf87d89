"""The package version (a module of its own, so that writing it into a run's config imports
nothing else)."""

__version__ = "0.1.0"
