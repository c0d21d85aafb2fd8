# kvwatch container image: the service (`kvwatch run`) by default; every other
# sub-command works too (`docker run IMAGE once --prometheus-url ...`).
# Two stages: build a wheel (rules and dashboards are bundled into it), then
# install only the wheel into a slim runtime as a non-root user.

FROM python:3.11.11-slim-bookworm AS build
WORKDIR /src
ENV PIP_NO_CACHE_DIR=1 PIP_DISABLE_PIP_VERSION_CHECK=1
COPY pyproject.toml README.md ./
COPY kvwatch ./kvwatch
COPY rules ./rules
COPY dashboards ./dashboards
RUN pip wheel --no-deps --wheel-dir /wheels .

FROM python:3.11.11-slim-bookworm
ENV PIP_NO_CACHE_DIR=1 PIP_DISABLE_PIP_VERSION_CHECK=1 \
    PYTHONUNBUFFERED=1 PYTHONDONTWRITEBYTECODE=1 \
    KVWATCH_STATE_PATH=/var/lib/kvwatch/state.db
COPY --from=build /wheels /wheels
RUN pip install /wheels/*.whl && rm -rf /wheels \
 && groupadd --system --gid 10001 kvwatch \
 && useradd --system --uid 10001 --gid kvwatch --home-dir /var/lib/kvwatch --shell /usr/sbin/nologin kvwatch \
 && mkdir -p /var/lib/kvwatch /etc/kvwatch \
 && chown kvwatch:kvwatch /var/lib/kvwatch
# alert lifecycle state (SQLite) survives restarts on this volume
VOLUME ["/var/lib/kvwatch"]
USER 10001:10001
WORKDIR /var/lib/kvwatch
EXPOSE 9877
# slim images have no curl: probe /healthz with the interpreter that is already there
HEALTHCHECK --interval=30s --timeout=5s --start-period=20s --retries=3 \
  CMD ["python", "-c", "import sys, urllib.request; sys.exit(0 if urllib.request.urlopen('http://127.0.0.1:9877/healthz', timeout=4).status == 200 else 1)"]
ENTRYPOINT ["kvwatch"]
CMD ["run", "--config", "/etc/kvwatch/config.yaml"]
