#!/usr/bin/env bash
# Drive gpuproxy's plain JSON-RPC MCP endpoint (POST /api/v1/mcp) with curl.
#
#   scripts/test-mcp.sh METHOD [TOOL|URI] [ARGS_JSON]
#
#   scripts/test-mcp.sh tools/list
#   scripts/test-mcp.sh tools/call get_spending_info
#   scripts/test-mcp.sh tools/call check_spending_limit '{"estimated_cost": 2.5}'
#   scripts/test-mcp.sh tools/call list_gpu_instances '{"provider":"all","max_price":1,"limit":5}'
#   scripts/test-mcp.sh resources/list
#   scripts/test-mcp.sh resources/read spending://current
#   scripts/test-mcp.sh initialize
#   scripts/test-mcp.sh ping
#
# Shorthands: list = tools/list, call = tools/call, read = resources/read.
# For any other method, the second argument is its params object (JSON).
#
# Environment: GPUPROXY_API_KEY; GPUPROXY_URL (default: the running
# sandbox's URL, from its state file beside DATABASE_URL's SQLite file or
# ./data/sandbox.db, as the CLI finds it; else http://127.0.0.1:8080).
# Exit status: 0 on success, 1 on a JSON-RPC error or a tool result with
# isError, 2 on usage or transport errors.
set -euo pipefail

usage() { sed -n '2,22p' "$0" | sed 's/^# \{0,1\}//' >&2; exit 2; }

# sandbox_url prints the URL of the sandbox running on the SQLite database
# of DATABASE_URL (default ./data/sandbox.db), if its process is alive.
sandbox_url() {
  local db="${DATABASE_URL:-}" state pid
  case "$db" in
    '') db=data/sandbox.db ;;
    sqlite:*) db="${db#sqlite:}"; db="${db#//}" ;;
    *) return 0 ;;
  esac
  state="$db-sandbox.json"
  [ -r "$state" ] || return 0
  pid=$(sed -n 's/^ *"pid": *\([0-9]*\).*/\1/p' "$state")
  [ -n "$pid" ] && kill -0 "$pid" 2>/dev/null || return 0
  sed -n 's/^ *"url": *"\([^"]*\)".*/\1/p' "$state"
}

[ $# -ge 1 ] || usage
case "$1" in -h|--help) usage ;; esac
url="${GPUPROXY_URL:-}"
[ -n "$url" ] || url="$(sandbox_url)"
[ -n "$url" ] || url=http://127.0.0.1:8080
key="${GPUPROXY_API_KEY:-}"
[ -n "$key" ] || { echo "test-mcp: set GPUPROXY_API_KEY" >&2; exit 2; }

method="$1"
case "$method" in
  list) method=tools/list ;;
  call) method=tools/call ;;
  read) method=resources/read ;;
esac

# name must be a plain identifier or URI, so it can go into JSON unquoted.
check_name() {
  [[ "$1" =~ ^[A-Za-z0-9_.:/+-]+$ ]] || { echo "test-mcp: bad name or URI: $1" >&2; exit 2; }
}

check_name "$method"
case "$method" in
  tools/call)
    [ $# -ge 2 ] || { echo "test-mcp: tools/call needs a tool name" >&2; exit 2; }
    check_name "$2"
    args="${3:-}"
    [ -n "$args" ] || args='{}'
    params="{\"name\":\"$2\",\"arguments\":$args}"
    ;;
  resources/read|resources/subscribe)
    [ $# -ge 2 ] || { echo "test-mcp: $method needs a resource URI" >&2; exit 2; }
    check_name "$2"
    params="{\"uri\":\"$2\"}"
    ;;
  initialize)
    params='{"protocolVersion":"2025-11-25","capabilities":{},"clientInfo":{"name":"test-mcp.sh","version":"1"}}'
    [ $# -lt 2 ] || params="$2"
    ;;
  *)
    params="${2:-}"
    ;;
esac

if [ -n "$params" ]; then
  body="{\"jsonrpc\":\"2.0\",\"id\":1,\"method\":\"$method\",\"params\":$params}"
else
  body="{\"jsonrpc\":\"2.0\",\"id\":1,\"method\":\"$method\"}"
fi

if ! out=$(curl -sS -X POST "${url%/}/api/v1/mcp" -H "X-API-Key: $key" \
    -H 'Content-Type: application/json' --data-binary "$body"); then
  echo "test-mcp: request to ${url%/}/api/v1/mcp failed" >&2
  exit 2
fi

if command -v jq >/dev/null 2>&1; then
  printf '%s\n' "$out" | jq . 2>/dev/null || printf '%s\n' "$out"
elif command -v python3 >/dev/null 2>&1; then
  printf '%s\n' "$out" | python3 -m json.tool 2>/dev/null || printf '%s\n' "$out"
else
  printf '%s\n' "$out"
fi

# A JSON-RPC error answers the request's id; a tool's failure is isError.
# (Not any "error":{ — a tool's output schema has fields named error.)
case "$out" in
  *'"id":1,"error":{'*|*'"isError":true'*) exit 1 ;;
esac
