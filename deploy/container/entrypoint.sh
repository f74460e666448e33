#!/bin/sh
# mmgate's container entry point: prepare the default model if it is missing, then become
# `mmgate serve` with this script's arguments.
#
#   mmgate-entrypoint [SERVE FLAGS...]    e.g. --engine.max-num-seqs 8
#   mmgate-entrypoint COMMAND [ARGS...]   anything else, run as it is (mmgate stats, sh)
#
# The default model (SmolLM2-135M-Instruct) is prepared under MMGATE_MODEL_CACHE unless a model
# is named (MMGATE_ENGINE__MODEL or --engine.model): the image has it from its build, and an
# empty volume mounted over the cache gets it here, before the gRPC port opens; a prepared one
# returns at once. `exec` makes mmgate the process the container's SIGTERM reaches, so it drains
# (health NOT_SERVING, calls in progress finish) and exits 0. Settings are MMGATE_* variables;
# the health check reads MMGATE_HOST and MMGATE_PORT, so set the port there, not with --port.
set -eu

# all addresses: a container's loopback is its own
: "${MMGATE_HOST:=0.0.0.0}"
: "${MMGATE_METRICS__HOST:=0.0.0.0}"
export MMGATE_HOST MMGATE_METRICS__HOST

case "${1:-}" in
    "" | -*) ;;
    *) exec "$@" ;;
esac

model="${MMGATE_ENGINE__MODEL:-}"
cache="${MMGATE_MODEL_CACHE:-}"
help=""
previous=""
for arg in "$@"; do
    case "$previous" in
        --engine.model) model="$arg" ;;
        --model-cache) cache="$arg" ;;
    esac
    case "$arg" in
        --engine.model=*) model="${arg#*=}" ;;
        --model-cache=*) cache="${arg#*=}" ;;
        -h | --help) help=1 ;;
    esac
    previous="$arg"
done

if [ -z "$model" ] && [ -z "$help" ]; then
    if [ -n "$cache" ]; then
        mmgate models prepare --cache "$cache"
    else
        mmgate models prepare
    fi
fi

exec mmgate serve "$@"
