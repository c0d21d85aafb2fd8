"""From results to people: incident lifecycle (:mod:`.lifecycle`), durable state (:mod:`.state`)
and the sinks that deliver events (:mod:`.sinks`). Depends on :mod:`kvwatch.core` only."""
