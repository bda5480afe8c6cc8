#!/usr/bin/env bash
# The official Python MCP SDK for integration/tests/mcp.rs: creates the virtualenv
# .venv-mcp with a pinned `mcp` if it is missing (or holds another version),
# and prints the path of its python, for
#
#     export VT_MCP_PYTHON="$(bash .ci/python-mcp.sh)"
#
# Progress goes to stderr; stdout is the path alone.
set -euo pipefail
cd "$(dirname "$0")/.."

MCP_VERSION=2.3.0
venv=.venv-mcp
python=${PYTHON:-python3}

if [ ! -x "$venv/bin/python" ]; then
    echo "== python -m venv $venv" >&2
    "$python" -m venv "$venv" >&2
fi
if ! "$venv/bin/python" - "$MCP_VERSION" >/dev/null 2>&1 <<'PY'
import sys
from importlib.metadata import version
sys.exit(0 if version("mcp") == sys.argv[1] else 1)
PY
then
    echo "== pip install mcp==$MCP_VERSION" >&2
    "$venv/bin/python" -m pip install --quiet --disable-pip-version-check "mcp==$MCP_VERSION" >&2
fi
echo "$PWD/$venv/bin/python"
