# syntax=docker/dockerfile:1
#
# Two images from one file:
#   daemon (default) the per-node daemon, `gpuscope serve`: the core install only (none of the
#                    jobs' libraries, no pip, no compilers), non-root. Every GPU node pulls it.
#   jobs             the calibration Job (`gpuscope calibrate`) and the rightsizing CronJob and
#                    report server (`gpuscope rightsize [serve]`): gpuscope[jobs], PyTorch's CUDA
#                    build among it. Its entrypoint is `gpuscope`; the chart names the command.
#
#   docker build -t gpuscope .                       # the daemon
#   docker build --target jobs -t gpuscope-jobs .
#   # the rightsizing job alone, without PyTorch (a few hundred MB instead of several GB):
#   docker build --target jobs --build-arg JOBS_EXTRAS=rightsize -t gpuscope-rightsize .
#
# PYTHON_IMAGE lets a build use a mirror or a vetted base; it must provide python3 with venv.
ARG PYTHON_IMAGE=python:3.11-slim-bookworm

FROM ${PYTHON_IMAGE} AS build
ENV PIP_DISABLE_PIP_VERSION_CHECK=1 PIP_NO_CACHE_DIR=1
WORKDIR /src
COPY pyproject.toml README.md ./
COPY exporter ./exporter
RUN python3 -m venv /opt/gpuscope \
    && /opt/gpuscope/bin/pip install . \
    && /opt/gpuscope/bin/python -c "import exporter.cli"

FROM build AS jobs-build
# Which extras the jobs' image holds: jobs (both), or rightsize or calibrate alone.
ARG JOBS_EXTRAS=jobs
# The default torch wheel for Linux x86_64 on PyPI is the CUDA build. pip and setuptools only
# install; the image runs without them.
RUN /opt/gpuscope/bin/pip install ".[${JOBS_EXTRAS}]" \
    && /opt/gpuscope/bin/pip uninstall --yes --quiet pip setuptools

FROM build AS daemon-build
RUN /opt/gpuscope/bin/pip uninstall --yes --quiet pip setuptools

FROM ${PYTHON_IMAGE} AS jobs
ARG VERSION=0.1.0
LABEL org.opencontainers.image.title="gpuscope-jobs" \
      org.opencontainers.image.description="gpuscope's jobs: calibration (PyTorch reference kernels) and rightsizing from Prometheus history" \
      org.opencontainers.image.version="${VERSION}" \
      org.opencontainers.image.licenses="Apache-2.0" \
      org.opencontainers.image.source="https://github.com/gpuscope/gpuscope"
COPY --from=jobs-build /opt/gpuscope /opt/gpuscope
# HOME: PyTorch and CUDA keep small caches there, and the root filesystem is read-only in the
# chart's Jobs (they mount an emptyDir on /tmp).
ENV PATH=/opt/gpuscope/bin:$PATH \
    HOME=/tmp \
    PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    NVIDIA_VISIBLE_DEVICES=all \
    NVIDIA_DRIVER_CAPABILITIES=compute,utility
USER 65532:65532
ENTRYPOINT ["gpuscope"]
CMD ["--help"]

# The daemon comes last: a plain `docker build` produces it.
FROM ${PYTHON_IMAGE} AS daemon
ARG VERSION=0.1.0
LABEL org.opencontainers.image.title="gpuscope" \
      org.opencontainers.image.description="GPU metrics for Prometheus, attributed to Kubernetes pods" \
      org.opencontainers.image.version="${VERSION}" \
      org.opencontainers.image.licenses="Apache-2.0" \
      org.opencontainers.image.source="https://github.com/gpuscope/gpuscope"
COPY --from=daemon-build /opt/gpuscope /opt/gpuscope
ENV PATH=/opt/gpuscope/bin:$PATH \
    PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    NVIDIA_VISIBLE_DEVICES=all \
    NVIDIA_DRIVER_CAPABILITIES=utility
# A numeric user, so Kubernetes can verify runAsNonRoot without a passwd entry.
USER 65532:65532
EXPOSE 9455
HEALTHCHECK --interval=30s --timeout=3s --start-period=10s \
    CMD ["python3", "-c", "import urllib.request; urllib.request.urlopen('http://127.0.0.1:9455/-/healthy', timeout=2)"]
ENTRYPOINT ["gpuscope", "serve"]
