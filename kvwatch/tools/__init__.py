"""Offline tools on top of the core: capacity planning, backtests over history, generated dashboards.

Tools may use :mod:`kvwatch.core` and :mod:`kvwatch.alerting` (a backtest replays the
lifecycle), never :mod:`kvwatch.service`.
"""
