# One image for every power-aware-scheduler process: the extender (python -m extender), the
# energy adapter (python -m controllers.energy_adapter), the node power controller
# (python -m controllers.node_power) and the trainer CronJob
# (python -m training.collect / fit / publish).
#   docker build -t power-aware-scheduler:0.1.0 .
# (`make image` builds the same file with buildah; `make image-test` runs every process from it.)

# --- build: the locked dependencies and the project's wheel, installed into /opt/venv ---------
FROM debian:bookworm-slim AS build

# Optional, for a build machine whose package index is reached through its own CA or a mirror:
# a CA bundle path (mounted into the build) and an index URL. Unset, pip uses PyPI as usual.
ARG PIP_CERT
ARG PIP_INDEX_URL

RUN apt-get update \
    && DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends \
        python3 python3-venv \
    && rm -rf /var/lib/apt/lists/*

ENV PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1

# Dependencies first (their layer is reused while only the code changes), exactly the versions
# and files of requirements.lock (hash-checked), as wheels only: no compiler in either stage.
COPY requirements.lock /src/
RUN if [ -z "${PIP_CERT:-}" ]; then unset PIP_CERT; fi \
    && if [ -z "${PIP_INDEX_URL:-}" ]; then unset PIP_INDEX_URL; fi \
    && python3 -m venv /opt/venv \
    && /opt/venv/bin/pip install --quiet --require-hashes --only-binary=:all: \
        -r /src/requirements.lock

# The sources (.dockerignore lets in only pyproject.toml, README.md, the five packages and
# scripts/trim-venv), in one step: each layer is a full copy under some storage drivers.
COPY . /src/
# The project as a wheel (not editable: the shipped bundle and data files are package data),
# then scripts/trim-venv takes out what no process runs (pip, the packages' test suites, ...).
RUN if [ -z "${PIP_CERT:-}" ]; then unset PIP_CERT; fi \
    && if [ -z "${PIP_INDEX_URL:-}" ]; then unset PIP_INDEX_URL; fi \
    && /opt/venv/bin/pip wheel --quiet --no-deps --wheel-dir /tmp/wheels /src \
    && /opt/venv/bin/pip install --quiet --no-deps /tmp/wheels/*.whl \
    && /src/scripts/trim-venv /opt/venv \
    && /opt/venv/bin/python -c "import controllers, extender, livedata, predictor, training"

# --- runtime: Debian's Python 3.11 and the venv, nothing else ---------------------------------
FROM debian:bookworm-slim

# Python, and a fixed numeric non-root user, so that runAsNonRoot can verify it without a
# passwd lookup.
RUN apt-get update \
    && DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends python3 \
    && rm -rf /var/lib/apt/lists/* /var/cache/apt/* /var/log/apt /var/log/dpkg.log \
    && groupadd --gid 10001 pas \
    && useradd --uid 10001 --gid 10001 --no-create-home --home-dir /tmp \
        --shell /usr/sbin/nologin pas

COPY --from=build /opt/venv /opt/venv

# Read-only root filesystem: no bytecode written at run time (the venv ships its .pyc files),
# and whatever a library caches (matplotlib's font list) goes to /tmp, which the manifests
# mount as an emptyDir.
ENV PATH=/opt/venv/bin:/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin \
    PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    HOME=/tmp \
    MPLCONFIGDIR=/tmp/matplotlib

USER 10001:10001
WORKDIR /tmp

EXPOSE 8888
# Last, so that a new revision rebuilds no layer above.
ARG VERSION=0.1.0
ARG REVISION=unknown
ARG SOURCE=
LABEL org.opencontainers.image.title="power-aware-scheduler" \
      org.opencontainers.image.description="A kube-scheduler extender that places each pod where it costs the least power, its controllers and its trainer" \
      org.opencontainers.image.source="${SOURCE}" \
      org.opencontainers.image.version="${VERSION}" \
      org.opencontainers.image.revision="${REVISION}"
CMD ["python", "-m", "extender", "--host", "0.0.0.0"]
