"""The pure pipeline and its vocabulary: targets → fleet data → statistics → results.

Nothing here imports :mod:`kvwatch.alerting`, :mod:`kvwatch.service` or the tools;
Prometheus is reached only through the injected :class:`~kvwatch.core.promclient.QueryClient`.
See ``docs/architecture.md``.
"""
