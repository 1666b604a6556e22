# Two commands do all the set-up on a fresh machine with Python 3.11+:
#   make run    serve the shipped model bundle on the built-in demo cluster (http://127.0.0.1:8888)
#   make test   lint and run the whole test suite (installs Prometheus and etcd through apt-get
#               when root, and unpacks the Kubernetes binaries of ../shared/k8s into .kube-assets/)
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed

.PHONY: run test e2e lint models clean

$(STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip
	$(BIN)/python -m pip install --quiet -e '.[dev]'
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

lint: $(STAMP)
	$(BIN)/python -m ruff check .
	$(BIN)/python -m ruff format --check .

clean:
	rm -rf $(VENV) .pytest_cache .ruff_cache
