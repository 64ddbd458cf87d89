"""A Hugging Face causal LM seen through a TransformerLens 4 bridge: the model view
(:mod:`~pe_interp.models.bridge.model`), its positions read from its hooks
(:mod:`~pe_interp.models.bridge.encoding`, :mod:`~pe_interp.models.bridge.alibi`), checks on the
bridge itself (:mod:`~pe_interp.models.bridge.check`, :mod:`~pe_interp.models.bridge.forward`), and
our configs built as Hugging Face architectures (:mod:`~pe_interp.models.bridge.hf_arch`)."""
