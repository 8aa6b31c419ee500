#!/usr/bin/env bash
# Prefill work of a vLLM prefill/decode split driven by the edges, against
# the same servers aggregated and the proxy's emulated disaggregation
# (BENCHMARKS.md, "Prefill/decode disaggregation: prefill work"). Each run
# starts a fresh stand-in deployment of deploy/vllm-pd/edge.yaml
# (test/engines/pdstack/cmd/pdstack) and replays the traces against its
# three edges with tether bench replay --mode e2e --engine-metrics.
#
#   test/engines/pdstack/bench.sh [TRACES]
#   SEEDS="1 2 3 4 5" ARGS="--half validation --smallest 10 --time-scale 0.02" GPU_BLOCKS=65536
set -euo pipefail
cd "$(dirname "$0")/../../.."
TRACES=${1:-../shared/traces/kv-cache-tester}
SEEDS=${SEEDS:-1 2 3 4 5}
ARGS=${ARGS:---half validation --smallest 10 --time-scale 0.02}
GPU_BLOCKS=${GPU_BLOCKS:-65536}
mkdir -p bin
go build -o bin/tether ./cmd/tether
go build -o bin/pdstack ./test/engines/pdstack/cmd/pdstack
out=()
for setup in split aggregated emulated; do
	for seed in $SEEDS; do
		env=$(mktemp -u)
		./bin/pdstack -setup "$setup" -gpu-blocks "$GPU_BLOCKS" -env "$env" >/dev/null 2>bin/pdbench-$setup-$seed.log &
		pid=$!
		until [ -f "$env" ]; do
			kill -0 "$pid" 2>/dev/null || { cat bin/pdbench-$setup-$seed.log; exit 1; }
			sleep 0.2
		done
		# shellcheck disable=SC1090
		. "$env"
		# shellcheck disable=SC2086
		./bin/tether bench replay --mode e2e --traces "$TRACES" $ARGS --seed "$seed" --policies tether \
			--edge-urls "$EDGE_URLS" --engine-metrics "$ENGINE_METRICS" --model "$MODEL" --json >bin/pdbench-$setup-$seed.json
		kill "$pid"
		wait "$pid" || true
		rm -f "$env"
		out+=("bin/pdbench-$setup-$seed.json")
		echo "$setup seed $seed done" >&2
	done
done
./bin/pdstack -summarize "${out[@]}"
