#!/usr/bin/env bash
# Set up (scripts/install.sh), then serve the embedded model on 127.0.0.1:8000.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/install.sh
exec .venv/bin/callgate serve "$@"
