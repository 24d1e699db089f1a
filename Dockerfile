# syntax=docker/dockerfile:1
#
# Two images from one file:
#   runtime   (default) the per-node daemon: `gpuscope serve`. No compilers, no torch, non-root.
#   calibrate the calibration Job: `gpuscope calibrate`, with PyTorch's CUDA build.
#
#   docker build -t gpuscope .                        # the daemon
#   docker build --target calibrate -t gpuscope-calibrate .
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

FROM build AS calibrate-build
# The default torch wheel for Linux x86_64 on PyPI is the CUDA build.
RUN /opt/gpuscope/bin/pip install ".[calibrate]"

FROM ${PYTHON_IMAGE} AS calibrate
ARG VERSION=0.1.0
LABEL org.opencontainers.image.title="gpuscope-calibrate" \
      org.opencontainers.image.description="Measures what each GPU type really achieves (PyTorch reference kernels)" \
      org.opencontainers.image.version="${VERSION}" \
      org.opencontainers.image.licenses="Apache-2.0" \
      org.opencontainers.image.source="https://github.com/gpuscope/gpuscope"
COPY --from=calibrate-build /opt/gpuscope /opt/gpuscope
ENV PATH=/opt/gpuscope/bin:$PATH \
    PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    NVIDIA_VISIBLE_DEVICES=all \
    NVIDIA_DRIVER_CAPABILITIES=compute,utility
USER 65532:65532
ENTRYPOINT ["gpuscope", "calibrate"]

# The daemon comes last: a plain `docker build` produces it.
FROM ${PYTHON_IMAGE} AS runtime
ARG VERSION=0.1.0
LABEL org.opencontainers.image.title="gpuscope" \
      org.opencontainers.image.description="GPU metrics for Prometheus, attributed to Kubernetes pods" \
      org.opencontainers.image.version="${VERSION}" \
      org.opencontainers.image.licenses="Apache-2.0" \
      org.opencontainers.image.source="https://github.com/gpuscope/gpuscope"
COPY --from=build /opt/gpuscope /opt/gpuscope
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
