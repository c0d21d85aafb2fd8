"""``kvwatch backtest``: replay discover → collect → diagnose → lifecycle over Prometheus history.

One discovery and one range query per (signal, source) over ``[T0 − window, T1]``,
then every step is evaluated in memory on a window view (see ``docs/backtest.md``).
"""
