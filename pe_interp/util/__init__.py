"""Small leaves every layer uses: atomic file IO (:mod:`~pe_interp.util.io`), locks, input checks,
modes, hardware facts and interrupt handling."""
