"""Window statistics: one registry (:mod:`.registry`), fleet kernels (:mod:`.fleet`), per-series walks (:mod:`.series`)."""
