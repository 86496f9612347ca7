# idemgate — make run: a worker on an embedded JetStream; make test: every test.
GO      ?= go
BIN     := bin
STATICCHECK := honnef.co/go/tools/cmd/staticcheck@v0.8.2

.PHONY: all build run test test-short lint fuzz clean bench bench-short chaos

all: build

build:
	$(GO) build -o $(BIN)/ ./cmd/...

# A worker on an embedded JetStream (listening on 127.0.0.1:4222), with the
# demo tools file, a demo webhook sink on 127.0.0.1:8787, the HTTP front
# door on 127.0.0.1:8080 (its tokens: data/agent.token, data/operator.token)
# and the MCP server on http://127.0.0.1:8081/mcp. Submit from a second
# terminal (see README).
run: build
	@mkdir -p data
	@test -s data/agent.token || $(BIN)/gateway token --role agent --namespace demo --name demo-agent --tokens data/gateway.tokens > data/agent.token
	@test -s data/operator.token || $(BIN)/gateway token --role operator --namespace '*' --name demo-operator --tokens data/gateway.tokens > data/operator.token
	@$(BIN)/sink --listen 127.0.0.1:8787 --log data/sink.jsonl & sink=$$!; \
	$(BIN)/gateway --tokens data/gateway.tokens --listen 127.0.0.1:8080 --log-format console & gateway=$$!; \
	$(BIN)/mcp --http 127.0.0.1:8081 --nats-url nats://127.0.0.1:4222 & mcp=$$!; \
	trap 'kill $$sink $$gateway $$mcp 2>/dev/null' EXIT INT TERM; \
	$(BIN)/worker --tools deployments/demo/tools.yaml --store-dir data/jetstream --log-format console

# Every test, race detector on: unit, conformance (R1 and R3), fuzz seed
# corpora, and black-box tests of the built binaries.
test:
	$(GO) vet ./...
	$(GO) test -race -count=1 -timeout 12m ./...

lint:
	@out=$$(gofmt -l $$(git ls-files '*.go')); if [ -n "$$out" ]; then echo "gofmt would change:"; echo "$$out"; exit 1; fi
	$(GO) vet ./...
	$(GO) run $(STATICCHECK) ./...

# Fuzz the envelope decoder, the canonicalizer and key derivation (FUZZTIME each).
FUZZTIME ?= 2m
fuzz:
	$(GO) test -run='^$$' -fuzz='^FuzzCanonicalize$$' -fuzztime=$(FUZZTIME) ./pkg/intent/
	$(GO) test -run='^$$' -fuzz='^FuzzDecode$$' -fuzztime=$(FUZZTIME) ./pkg/intent/

# The full chaos runs (docs/reliability.md): CHAOS_INTENTS intents on one
# JetStream process, then on a 3-node cluster at R3, with every fault. Each
# prints its verdict; the target fails if either has a violation.
# CHAOS_FLAGS adds flags to both (e.g. --keep to keep stores and logs).
CHAOS_INTENTS ?= 100000
CHAOS_FLAGS   ?=
chaos: build
	$(GO) build -o $(BIN)/nats-server github.com/nats-io/nats-server/v2
	@status=0; \
	$(BIN)/chaos --intents $(CHAOS_INTENTS) --nats-server $(BIN)/nats-server $(CHAOS_FLAGS) || status=1; \
	$(BIN)/chaos --intents $(CHAOS_INTENTS) --nats-server $(BIN)/nats-server --cluster $(CHAOS_FLAGS) || status=1; \
	exit $$status

clean:
	rm -rf $(BIN) data

# Performance: one table of baseline, unique, duplicates, latency, fsync-always
# and memory, with each target met or not (docs/performance.md).
# BENCHFLAGS adds flags, e.g. BENCHFLAGS='-rounds 3 -cpuprofile /tmp/cpu'.
BENCHFLAGS ?=
bench:
	$(GO) run ./cmd/bench $(BENCHFLAGS)

# Every row in small runs, to check the bench works (its figures are not
# measurements); TestBenchShort runs the same under make test.
bench-short:
	$(GO) run ./cmd/bench -short
