#!/usr/bin/env bash
# Set up (scripts/install.sh), then lint, type-check and run the whole test suite.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/install.sh
. .venv/bin/activate
ruff check callgate tests benchmarks
ruff format --check callgate tests benchmarks
mypy --strict callgate
python -m pytest -q "$@"
