"""Two kinds of model behind one protocol (:mod:`~pe_interp.models.protocol`, ``ProbeModel``): our
own hooked transformer (:mod:`pe_interp.models.hooked`) and any Hugging Face causal language model
through a TransformerLens bridge (:mod:`pe_interp.models.bridge`), read from its config and hooks.
Probes are typed against the protocol and import neither implementation."""
