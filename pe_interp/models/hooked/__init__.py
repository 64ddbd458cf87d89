"""Our hooked transformer: the model (:mod:`~pe_interp.models.hooked.model`), its blocks and their
seams (:mod:`~pe_interp.models.hooked.blocks`), attention with every encoding's entry point
(:mod:`~pe_interp.models.hooked.attention`) and the attention routes (eager, SDPA, Triton;
:mod:`~pe_interp.models.hooked.attn_routes`)."""
