#!/usr/bin/env bash
# Node 22 and the official MCP tools for the MCP tests: installs, from npm,
# into target/mcp-node (the project's own folder, never the system's):
#
# - node@22: the MCP conformance suite and the Inspector need Node >= 22,
#   and the machine's may be older;
# - @modelcontextprotocol/conformance: the official conformance suite
#   (`.ci/conformance.sh`);
# - @modelcontextprotocol/inspector: its CLI's `tools/list` checks schema
#   portability (`integration/tests/mcp_schemas.rs`).
#
# Skips what is there at the pinned versions, and prints the folder of the
# binaries (node, conformance, mcp-inspector). Progress goes to stderr.
# Needs npm (any version: it only downloads); without one it installs
# Debian's.
set -euo pipefail
cd "$(dirname "$0")/.."

NODE_VERSION=22.23.3
CONFORMANCE_VERSION=0.1.16
INSPECTOR_VERSION=2.12.0
dir=target/mcp-node
bin="$PWD/$dir/node_modules/.bin"

installed() {
    # `npm ls` exits 0 only when every package is there at that version.
    [ -x "$bin/node" ] && [ "$("$bin/node" --version 2>/dev/null)" = "v$NODE_VERSION" ] &&
        (cd "$dir" && npm ls --depth=0 \
            "@modelcontextprotocol/conformance@$CONFORMANCE_VERSION" \
            "@modelcontextprotocol/inspector@$INSPECTOR_VERSION" >/dev/null 2>&1)
}

if ! command -v npm >/dev/null 2>&1; then
    echo "== apt-get install npm" >&2
    sudo=""
    if [ "$(id -u)" -ne 0 ]; then sudo="sudo"; fi
    $sudo apt-get update -qq >&2
    DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq npm >/dev/null
fi
mkdir -p "$dir"
if ! installed; then
    echo "== npm install node@$NODE_VERSION, the MCP conformance suite and Inspector ($dir)" >&2
    # A package.json of its own, so that npm installs here and not in a
    # parent folder's project.
    [ -f "$dir/package.json" ] || echo '{"name": "mcp-node", "private": true}' >"$dir/package.json"
    (cd "$dir" && npm install --no-audit --no-fund --loglevel=error \
        "node@$NODE_VERSION" \
        "@modelcontextprotocol/conformance@$CONFORMANCE_VERSION" \
        "@modelcontextprotocol/inspector@$INSPECTOR_VERSION" >&2)
fi
if ! "$bin/node" --version >/dev/null 2>&1; then
    echo "node@$NODE_VERSION did not install a working node in $dir" >&2
    exit 1
fi
echo "$bin"
