# Two commands do all the set-up on a fresh machine with Python 3.11+:
#   make run    serve the shipped model bundle on the built-in demo cluster (http://127.0.0.1:8888)
#   make test   lint and run the whole test suite (installs Prometheus and etcd through apt-get
#               when root, and unpacks the Kubernetes binaries of ../shared/k8s into .kube-assets/)
# The container images: `make image` builds the runtime one (extender, controllers) with buildah,
# `make image-test` runs its processes from it; `make image-trainer` and `make image-trainer-test`
# do the same for the trainer's. manifests/image/kustomization.yaml names the same tags
# (tests/test_image.py checks).
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed
VERSION := $(shell sed -n 's/^version = "\(.*\)"/\1/p' pyproject.toml)
IMAGE ?= power-aware-scheduler:$(VERSION)
TRAINER_IMAGE ?= power-aware-scheduler-trainer:$(VERSION)
# The three locks are pip-compile's, with hashes: requirements.lock (the runtime image),
# requirements-train.lock (+ the train extra: the trainer image), held to the runtime one's
# versions, and requirements-dev.lock (+ the test tools), held to the train one's, so the tests
# run exactly what the images ship.
LOCK := CUSTOM_COMPILE_COMMAND="make lock" $(BIN)/pip-compile --quiet --generate-hashes \
	--allow-unsafe --strip-extras --no-emit-index-url --no-emit-find-links

.PHONY: run test e2e lint models lock image image-test image-trainer image-trainer-test clean

$(STAMP): pyproject.toml requirements.lock requirements-train.lock requirements-dev.lock
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet -r requirements-dev.lock
	$(BIN)/python -m pip install --quiet --no-deps -e .
	touch $(STAMP)

run: $(STAMP)
	$(BIN)/python -m extender

test: $(STAMP)
	scripts/ensure-prometheus
	scripts/ensure-kube-assets
	$(BIN)/python -m ruff check .
	$(BIN)/python -m pytest

# The end-to-end scenarios alone, on the real control plane (KUBEBUILDER_ASSETS names other
# binaries: a directory with etcd, kube-apiserver, kube-controller-manager, kube-scheduler, kubectl).
e2e: $(STAMP)
	scripts/ensure-prometheus
	scripts/ensure-kube-assets
	$(BIN)/python -m pytest tests/e2e tests/test_envtest.py

# Rebuild the shipped default bundle (extender/models/default, package data that the wheel
# and the image carry) from a synthetic 12-node fleet.
models: $(STAMP)
	$(BIN)/python -m training.synth --nodes 12 --hours 168 --step 60 --seed 7 \
		--out out/default-metrics.parquet --quiet
	$(BIN)/python -m training.fit --input out/default-metrics.parquet --out extender/models/default \
		--report-dir out/default-report --seed 7 --quiet

# Re-lock after changing pyproject.toml's dependencies; pins already in the locks are kept
# (make lock LOCK_FLAGS='--upgrade-package numpy' moves one).
lock: $(STAMP)
	$(LOCK) $(LOCK_FLAGS) --output-file requirements.lock pyproject.toml
	$(LOCK) $(LOCK_FLAGS) --extra train --constraint requirements.lock \
		--output-file requirements-train.lock pyproject.toml
	$(LOCK) $(LOCK_FLAGS) --extra train --extra dev --constraint requirements-train.lock \
		--output-file requirements-dev.lock pyproject.toml

image:
	scripts/build-image $(IMAGE) $(VERSION)

image-test:
	scripts/image-test $(IMAGE)

image-trainer:
	scripts/build-image $(TRAINER_IMAGE) $(VERSION) trainer

image-trainer-test:
	scripts/image-test --trainer $(TRAINER_IMAGE)

lint: $(STAMP)
	$(BIN)/python -m ruff check .
	$(BIN)/python -m ruff format --check .

clean:
	rm -rf $(VENV) .pytest_cache .ruff_cache
