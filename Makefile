# tether — see README.md. Two commands do everything: `make run` and `make test`.
GO      ?= go
PKGS    ?= ./...
BIN     := bin/tether
# Each fuzz target runs this long under `make fuzz`.
FUZZTIME ?= 30s

.PHONY: all build build-static image run test test-short bench bench-report fuzz soak soak-race vet fmt lint clean

all: build

# -buildvcs=auto stamps the commit (`tether version`) even where GOFLAGS
# turns VCS stamping off; it is skipped when git is unavailable.
build:
	$(GO) build -buildvcs=auto -o $(BIN) ./cmd/tether

# The static Linux binary the Dockerfile copies: no cgo, so no libc (it runs
# on scratch). Its flags are what test/image checks.
build-static:
	CGO_ENABLED=0 GOOS=linux $(GO) build -trimpath -buildvcs=auto -ldflags '-s -w' -o bin/tether-static ./cmd/tether

# The container image (deploy/kubernetes names ghcr.io/tether-project/tether):
# the static binary on scratch; builds offline (docker build pulls nothing).
IMAGE ?= ghcr.io/tether-project/tether:dev
image: build-static
	docker build -t $(IMAGE) .

# The main job: a whole local deployment (3 edges, embedded NATS, simulated workers).
run: build
	./$(BIN) dev $(ARGS)

# Unit + integration tests, race detector on. Fuzz seed corpora run as ordinary tests.
test:
	$(GO) vet $(PKGS)
	$(GO) test -race -count=1 -timeout 20m $(PKGS)

test-short:
	$(GO) test -short -count=1 $(PKGS)

# Benchmarks only (no tests): figures recorded in BENCHMARKS.md.
bench:
	$(GO) test -run '^$$' -bench . -benchmem -count=1 -timeout 60m $(PKGS)

# Everything BENCHMARKS.md publishes: the micro-benchmarks (medians over
# BENCH_COUNT runs), the trace replay (every policy at 1, 3 and 5 edges,
# medians over 3 seeds), the sensitivity runs and the agent patterns. Rewrites
# the generated blocks of BENCHMARKS.md and the plots in docs/bench. The
# report is its own binary (cmd/tether-bench): it links the plotting
# libraries the production tether binary does not.
# The shared traces sit beside the checkout (../shared, as in CI); point
# TRACES elsewhere for another copy (make bench-report TRACES=/path/to/traces).
TRACES      ?= ../shared/traces/kv-cache-tester
BENCH_COUNT ?= 3
bench-report:
	@mkdir -p bin
	$(GO) build -o bin/tether-bench ./cmd/tether-bench
	$(GO) test -run '^$$' -bench . -benchmem -count=$(BENCH_COUNT) -timeout 60m $(PKGS) > bin/bench-micro.txt 2>&1 || { cat bin/bench-micro.txt; exit 1; }
	./bin/tether-bench report --traces $(TRACES) --markdown BENCHMARKS.md --plots docs/bench --micro bin/bench-micro.txt

# The trace replay alone (sim mode, virtual time): tables on stdout.
.PHONY: bench-sim
bench-sim: build
	./$(BIN) bench replay --traces $(TRACES) --stagger 10m --edges 1,3,5 --policies all

# Every fuzz target in the repository, each for FUZZTIME (seed corpora in
# testdata/fuzz are committed and already run as ordinary tests by `make test`).
fuzz:
	@set -e; for f in $$(grep -rl --include='*_test.go' '^func Fuzz' . | sort); do \
		d=$$(dirname $$f); \
		for t in $$(sed -n 's/^func \(Fuzz[A-Za-z0-9_]*\)(.*/\1/p' $$f); do \
			echo "== fuzz $$d $$t ($(FUZZTIME))"; \
			$(GO) test -run '^$$' -fuzz "^$$t$$" -fuzztime $(FUZZTIME) ./$$d; \
		done; \
	done

# Long reliability runs: >= 100 seeded schedules per fault type with the
# porcupine check, then the multi-process chaos and soak tests in long mode
# (among them 60 agents x 8 calls beside six busy loops, ten runs, and the
# short-session divergence run with leader cuts, both judged with zero
# margin), and the agent APIs across five edges under a nemesis
# (test/agentapi).
# SOAK_SEED replays a run (printed on failure); SOAK_RUNS overrides the count.
SOAK_SEED ?= 0
SOAK_RUNS ?= 0
SOAK_LOG  ?= /tmp/tether-soak.log
soak:
	@echo "soak: full log in $(SOAK_LOG)"
	@RELIABILITY_LONG=1 RELIABILITY_SEED=$(SOAK_SEED) RELIABILITY_RUNS=$(SOAK_RUNS) \
		$(GO) test -count=1 -timeout 180m -v -run 'Linearizability|Soak|Chaos|WorkerHTTPBadInput|AgentAPIsAcrossEdges' ./test/reliability/ ./test/agentapi/ $$(ls -d ./test/chaos 2>/dev/null) ./test/e2e/ >$(SOAK_LOG) 2>&1; \
		rc=$$?; grep -E 'FIGURES|^(--- |ok|FAIL)|replay' $(SOAK_LOG); exit $$rc

# The long soak under the race detector (about 5x slower: half an hour or
# more on a busy 2-core host); its figures are in RELIABILITY.md.
SOAK_RACE_LOG ?= /tmp/tether-soak-race.log
soak-race:
	@echo "soak-race: full log in $(SOAK_RACE_LOG)"
	@RELIABILITY_LONG=1 RELIABILITY_SEED=$(SOAK_SEED) \
		$(GO) test -race -count=1 -timeout 180m -v -run 'TestSoak' ./test/reliability/ >$(SOAK_RACE_LOG) 2>&1; \
		rc=$$?; grep -E 'FIGURES|^(--- |ok|FAIL)|replay|soak_test' $(SOAK_RACE_LOG); exit $$rc

fmt:
	gofmt -l -w .

vet:
	$(GO) vet $(PKGS)

clean:
	rm -rf bin
