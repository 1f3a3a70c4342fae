# DSpark serving: `make serve` and `make test` work on a fresh clone.
PY ?= python3
VENV := .venv
VPY := $(VENV)/bin/python
PIP := $(VPY) -m pip
STAMP := $(VENV)/.installed
PROTOS := $(wildcard protos/dspark/v1/*.proto)
GEN := gen/dspark/v1/.stamp

.PHONY: setup venv stubs model native serve test test-unit test-e2e bench clean

setup: $(STAMP) $(GEN) model native

# The native CPU kernels (attention, fp32 linear): compiled once per machine into
# the cache; without a compiler the workers use the PyTorch path and oneDNN (a
# warning, not an error).
native: $(STAMP) $(GEN)
	$(VPY) -m dspark.worker.model.native_attention

venv: $(STAMP)

$(STAMP): pyproject.toml
	test -x $(VPY) || $(PY) -m venv $(VENV)
	$(PIP) install -q --upgrade pip
	# torch pinned: 2.13.0 is the CPU build on local disk.
	$(PIP) install -q torch==2.13.0
	$(PIP) install -q grpcio-tools
	$(MAKE) stubs
	$(PIP) install -q -e '.[test]'
	touch $(STAMP)

stubs: $(GEN)

$(GEN): $(PROTOS)
	@test -x $(VPY) || { echo "run 'make setup' first"; exit 1; }
	mkdir -p gen/dspark/v1
	$(VPY) -m grpc_tools.protoc -Iprotos --python_out=gen --pyi_out=gen --grpc_python_out=gen $(PROTOS)
	echo '"""DSpark serving: router, scheduler, worker (see README)."""' > gen/dspark/__init__.py
	echo '"""Generated protobuf/gRPC stubs (built from protos/, never edited)."""' > gen/dspark/v1/__init__.py
	touch $(GEN)

model: $(STAMP) $(GEN)
	$(VENV)/bin/dspark model prepare

serve: setup
	$(VENV)/bin/dspark serve

test: setup
	$(VPY) -m pytest -q -ra

test-unit: $(STAMP) $(GEN)
	$(VPY) -m pytest -q -ra -m "not e2e and not model"

bench: setup
	$(PIP) install -q -e '.[bench]'
	$(VENV)/bin/dspark bench --json bench-results/bench.json

clean:
	rm -rf gen build *.egg-info
