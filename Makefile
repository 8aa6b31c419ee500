# tether — see README.md. Two commands do everything: `make run` and `make test`.
GO      ?= go
PKGS    ?= ./...
BIN     := bin/tether
# Each fuzz target runs this long under `make fuzz`.
FUZZTIME ?= 30s

.PHONY: all build run test test-short bench bench-report fuzz soak vet fmt lint clean

all: build

build:
	$(GO) build -o $(BIN) ./cmd/tether

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

fmt:
	gofmt -l -w .

vet:
	$(GO) vet $(PKGS)

clean:
	rm -rf bin
