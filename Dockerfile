# Two images from one file, both on Debian's Python 3.11 with the project's wheel:
#   - the runtime image (the default target, `make image`): the extender (python -m extender),
#     the energy adapter (python -m controllers.energy_adapter) and the node power controller
#     (python -m controllers.node_power), with only the runtime dependencies (requirements.lock);
#       docker build -t power-aware-scheduler:0.1.0 .
#   - the trainer image (`make image-trainer`): the trainer CronJob and its Dask cluster
#     (python -m training.collect / fit / publish), with the `train` extra as well
#     (requirements-train.lock, held to the runtime lock's versions);
#       docker build --target trainer -t power-aware-scheduler-trainer:0.1.0 .
# (`make image-test` / `make image-trainer-test` run each image's processes from it.)

# --- deps: Debian's Python and an empty venv at /opt/venv --------------------------------------
FROM debian:bookworm-slim AS deps

# binutils: strip, for the extension modules' debug symbols (scripts/trim-venv).
RUN apt-get update \
    && DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends \
        python3 python3-venv binutils \
    && rm -rf /var/lib/apt/lists/* \
    && python3 -m venv /opt/venv

ENV PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1

# pip-build: the venv's pip, for a build machine whose package index is reached through its own
# CA or a mirror (the build args PIP_CERT, a CA bundle path mounted into the build, and
# PIP_INDEX_URL); unset or empty, pip uses PyPI as usual (an empty PIP_CERT would be a path).
RUN printf '%s\n' '#!/bin/sh' \
        '[ -n "${PIP_CERT:-}" ] || unset PIP_CERT' \
        '[ -n "${PIP_INDEX_URL:-}" ] || unset PIP_INDEX_URL' \
        'exec /opt/venv/bin/pip "$@"' > /usr/local/bin/pip-build \
    && chmod 755 /usr/local/bin/pip-build

# --- build: the runtime dependencies and the project's wheel -----------------------------------
FROM deps AS build
ARG PIP_CERT
ARG PIP_INDEX_URL
# Dependencies first (their layer is reused while only the code changes), exactly the versions
# and files of the lock (hash-checked), as wheels only: no compiler in any stage.
COPY requirements.lock /src/
RUN pip-build install --quiet --require-hashes --only-binary=:all: -r /src/requirements.lock
# The sources (.dockerignore lets in only pyproject.toml, README.md, the locks, the five
# packages and the two install scripts), in one step: each layer is a full copy under some
# storage drivers.
COPY . /src/
# The runtime processes' packages import here without the trainer's libraries.
RUN /src/scripts/install-project /opt/venv /src controllers.energy_adapter.cli \
        controllers.node_power.cli extender.app livedata predictor uvloop httptools yaml \
        cryptography.hazmat.primitives.ciphers pyghmi.ipmi.command sushy kubernetes.client \
        kubernetes.watch kubernetes.config

# --- build-trainer: the runtime and train dependencies and the project's wheel ----------------
FROM deps AS build-trainer
ARG PIP_CERT
ARG PIP_INDEX_URL
COPY requirements-train.lock /src/
RUN pip-build install --quiet --require-hashes --only-binary=:all: -r /src/requirements-train.lock
COPY . /src/
RUN /src/scripts/install-project /opt/venv /src controllers extender livedata predictor training

# --- base: Debian's Python 3.11 and the user, what both images run on -------------------------
FROM debian:bookworm-slim AS base

# Python, and a fixed numeric non-root user, so that runAsNonRoot can verify it without a
# passwd lookup.
RUN apt-get update \
    && DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends python3 \
    && rm -rf /var/lib/apt/lists/* /var/cache/apt/* /var/log/apt /var/log/dpkg.log \
    && groupadd --gid 10001 pas \
    && useradd --uid 10001 --gid 10001 --no-create-home --home-dir /tmp \
        --shell /usr/sbin/nologin pas

# Read-only root filesystem: no bytecode written at run time (the venv ships its .pyc files),
# and whatever a library caches (matplotlib's font list, in the trainer) goes to /tmp, which
# the manifests mount as an emptyDir.
ENV PATH=/opt/venv/bin:/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin \
    PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    HOME=/tmp \
    MPLCONFIGDIR=/tmp/matplotlib

USER 10001:10001
WORKDIR /tmp

# --- trainer: `docker build --target trainer` -------------------------------------------------
FROM base AS trainer
COPY --from=build-trainer /opt/venv /opt/venv
# Last, so that a new revision rebuilds no layer above.
ARG VERSION=0.1.0
ARG REVISION=unknown
ARG SOURCE=
LABEL org.opencontainers.image.title="power-aware-scheduler-trainer" \
      org.opencontainers.image.description="The power-aware-scheduler's trainer: collects the fleet's metrics from Prometheus, fits the power models and publishes them" \
      org.opencontainers.image.source="${SOURCE}" \
      org.opencontainers.image.version="${VERSION}" \
      org.opencontainers.image.revision="${REVISION}"
CMD ["python", "-m", "training.fit", "--help"]

# --- runtime: the default target --------------------------------------------------------------
FROM base AS runtime
COPY --from=build /opt/venv /opt/venv
EXPOSE 8888
ARG VERSION=0.1.0
ARG REVISION=unknown
ARG SOURCE=
LABEL org.opencontainers.image.title="power-aware-scheduler" \
      org.opencontainers.image.description="A kube-scheduler extender that places each pod where it costs the least power, and its controllers" \
      org.opencontainers.image.source="${SOURCE}" \
      org.opencontainers.image.version="${VERSION}" \
      org.opencontainers.image.revision="${REVISION}"
CMD ["python", "-m", "extender", "--host", "0.0.0.0"]
