# v2proxy image.  docker build -t v2proxy:0.1.0 .
# CUDA shared memory (cupy-cuda12x):  docker build --build-arg EXTRAS=cuda -t v2proxy:0.1.0-cuda .
# The install steps are deploy/install_image.sh's, which tests/deploy also runs into a venv.

ARG PYTHON_IMAGE=python:3.11-slim-bookworm
# the wheel holds one small C module (v2proxy.shm._guard): it is built where a compiler is, in the
# full image of the same Python and Debian release; the final image stays slim, with no compiler
ARG BUILD_IMAGE=python:3.11-bookworm

FROM ${BUILD_IMAGE} AS build
ARG EXTRAS=""
ENV PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1
WORKDIR /src
COPY pyproject.toml setup.py constraints.txt README.md ./
COPY src ./src
COPY deploy/install_image.sh /usr/local/bin/install_image.sh
RUN install_image.sh wheel /src /wheels \
    && install_image.sh venv /opt/v2proxy /wheels/v2proxy-*.whl /src/constraints.txt "${EXTRAS}"

# The final image: the base Python and the venv, no compiler, no pip, no sources.
FROM ${PYTHON_IMAGE}
LABEL org.opencontainers.image.title="v2proxy" \
      org.opencontainers.image.description="KServe v2 / Open Inference Protocol transcoding proxy" \
      org.opencontainers.image.licenses="Apache-2.0"
RUN groupadd --system --gid 10001 v2proxy \
    && useradd --system --uid 10001 --gid 10001 --no-create-home --home-dir /nonexistent \
       --shell /usr/sbin/nologin v2proxy
COPY --from=build /opt/v2proxy /opt/v2proxy
ENV PATH=/opt/v2proxy/bin:$PATH \
    PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1
WORKDIR /tmp
USER 10001:10001
EXPOSE 9000 9001
# the proxy's own liveness (never the backend's), with the image's Python: no curl needed
HEALTHCHECK --interval=10s --timeout=3s --start-period=5s --retries=3 \
    CMD ["python", "-c", "import os, urllib.request; urllib.request.urlopen('http://127.0.0.1:%s/v2/health/live' % os.environ.get('V2PROXY_HTTP_PORT', '9000'), timeout=2)"]
ENTRYPOINT ["v2proxy"]
CMD ["serve"]
