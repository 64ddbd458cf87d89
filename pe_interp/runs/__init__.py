"""Where a model comes from: run directories and ``RUN@STEP`` snapshots
(:mod:`~pe_interp.runs.checkpoint`, :mod:`~pe_interp.runs.snapshots`), Hugging Face directories and
hub names (:mod:`~pe_interp.runs.model_dirs`), GGUF files (:mod:`~pe_interp.runs.gguf`), runs of
other architectures (:mod:`~pe_interp.runs.arch`), and the provenance every result records
(:mod:`~pe_interp.runs.provenance`, :mod:`~pe_interp.runs.files`)."""
