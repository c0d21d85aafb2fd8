"""``kvwatch run``: the scheduled service (cycle, HTTP endpoints, signals) and ``once --notify``."""
