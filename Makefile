# Two commands do all the setup on a fresh machine:
#   make run    start a local swarm on the embedded default model (no hub, no GPU)
#   make test   run the default test suite
# Each creates and fills its virtual environment on first use.
VENV ?= .venv
VLLM_VENV ?= .venv-vllm
PY := $(VENV)/bin/python
STEPS ?= 
ARGS ?=

.PHONY: run test test-slow test-vllm test-multihost docker-test gpu-resolve bench env env-vllm clean

env:
	@scripts/setup_env.sh $(VENV) dev

env-vllm:
	@scripts/setup_vllm_env.sh $(VLLM_VENV)

run: env
	$(VENV)/bin/swarm-node local $(ARGS)

test: env
	$(PY) -m pytest -q $(ARGS)

test-slow: env  # pytest exits 5 when no test is marked slow: that is not a failure
	$(PY) -m pytest -q -m slow $(ARGS) || [ $$? -eq 5 ]

test-vllm: env-vllm
	VLLM_ENABLE_V1_MULTIPROCESSING=0 VLLM_CPU_KVCACHE_SPACE=1 $(VLLM_VENV)/bin/python -m pytest -q -m vllm tests/vllm $(ARGS)

# The Docker image and the compose stack end to end (root; installs docker.io itself; skips with
# the reason where no engine can run), after checking that the GPU variant resolves as tested.
docker-test:
	scripts/docker_test.sh

gpu-resolve:
	scripts/docker_gpu_resolve.sh

test-multihost: env  # hosts as network namespaces (root; skips with its reason otherwise), ~10 min
	tests/multihost/setup.sh
	$(PY) -m pytest -q -s -m multihost tests/multihost $(ARGS)

# `make bench QUICK=1`: each at its --quick size (seconds each: tiny models built in code, no hub);
# BENCH_ARGS="..." passes other options to every one.
bench: BENCH_ARGS ?= $(if $(QUICK),--quick)
bench: env
	for b in wire objective swarm scale generation train_step; do $(PY) -m benchmarks.$$b $(BENCH_ARGS) || exit 1; done

clean:
	rm -rf $(VENV) $(VLLM_VENV)
