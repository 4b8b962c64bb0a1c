# syntax=docker/dockerfile:1
# tokenstamp: the streaming proxy that stamps every LLM token.
#
#   docker build -t tokenstamp:0.1.0 .
#   docker run --rm -p 8080:8080 -p 9464:9464 tokenstamp:0.1.0 --upstream http://model-server:8000
#
# Stage one builds the project's wheel; stage two installs that wheel (and its
# dependencies, all published as wheels) into a clean slim Python, so no
# compiler, source tree or build backend reaches the final image.
# tests/helm/test_dockerfile.py runs this file's wheel build on the same files.
#
# The wheel is the compiled build (setup.py: the per-token modules through mypyc,
# about a tenth less CPU per token and per request in docs/benchmark.md), so the
# build stage is the full Python image of the same Debian release and Python
# version, which has the C compiler. The pure-Python wheel, what pip installs
# from the source, is one build argument away:
#   docker build --build-arg TOKENSTAMP_COMPILE=0 -t tokenstamp:0.1.0-pure .

ARG PYTHON_IMAGE=python:3.11-slim-bookworm
ARG BUILD_IMAGE=python:3.11-bookworm

FROM ${BUILD_IMAGE} AS build
# 1: compile the per-token modules with mypyc; 0: the pure-Python wheel. Read by setup.py.
ARG TOKENSTAMP_COMPILE=1
ENV PIP_DISABLE_PIP_VERSION_CHECK=1 \
    PIP_NO_CACHE_DIR=1
WORKDIR /src
COPY pyproject.toml README.md setup.py ./
# mypyc type-checks what it compiles, so it needs the dependencies (for their types)
# and the mypy the project is checked with, in the environment that builds the wheel.
RUN python -c "import tomllib; print(*tomllib.load(open('pyproject.toml', 'rb'))['project']['dependencies'], sep='\\n')" > /tmp/requirements.txt \
    && python -m pip install -r /tmp/requirements.txt "setuptools>=68" wheel mypy==2.4.1
COPY proxy/ proxy/
COPY exporters/ exporters/
COPY simulator/ simulator/
COPY bench/ bench/
COPY demo/ demo/
RUN python -m pip wheel --no-deps --no-build-isolation --wheel-dir /wheels .

FROM ${PYTHON_IMAGE} AS runtime
ENV PIP_DISABLE_PIP_VERSION_CHECK=1 \
    PIP_NO_CACHE_DIR=1 \
    PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    TOKENSTAMP_LISTEN=0.0.0.0:8080 \
    TOKENSTAMP_ADMIN=0.0.0.0:9464
# Install the wheel, then drop the packaging tools; the bind mount keeps the
# wheel itself out of the image's layers.
RUN --mount=type=bind,from=build,source=/wheels,target=/wheels \
    python -m pip install /wheels/tokenstamp-*.whl \
    && python -c "import proxy; print('tokenstamp hot path:', proxy.hot_path_build())" \
    && python -m pip uninstall --yes setuptools wheel pip \
    && groupadd --system --gid 10001 tokenstamp \
    && useradd --system --uid 10001 --gid 10001 --no-create-home \
       --home-dir /nonexistent --shell /usr/sbin/nologin tokenstamp
# Numeric, so Kubernetes' runAsNonRoot can verify it without /etc/passwd.
USER 10001:10001
# 8080: client traffic (TOKENSTAMP_LISTEN); 9464: /metrics, /healthz, /readyz (TOKENSTAMP_ADMIN).
EXPOSE 8080 9464
# The proxy drains open streams on SIGTERM (--drain-timeout), then exits.
STOPSIGNAL SIGTERM
ENTRYPOINT ["tokenstamp", "serve"]
