# idemgate — make run: a worker on an embedded JetStream; make test-short: the
# fast tests, while editing; make test: every test, before landing.
GO      ?= go
BIN     ?= bin
STATICCHECK := honnef.co/go/tools/cmd/staticcheck@v0.8.2

.PHONY: all build run test test-short lint fuzz clean bench bench-short bench-ledger-size bench-ledger-expiry bench-postgres bench-river chaos

all: build

build:
	$(GO) build -o $(BIN)/ ./cmd/...

# make run: a worker on an embedded JetStream (127.0.0.1:$(NATS_PORT)) with
# the demo tools file, a demo webhook sink on 127.0.0.1:$(SINK_PORT), the HTTP
# front door on 127.0.0.1:$(GATEWAY_PORT) and the MCP server on
# http://127.0.0.1:$(MCP_PORT)/mcp, both behind the tokens of
# data/gateway.tokens (data/agent.token: an agent of namespace demo;
# data/operator.token: an operator of every namespace), and the operator
# console at http://127.0.0.1:$(GATEWAY_PORT)/console/, charting the worker's
# metrics from 127.0.0.1:$(ADMIN_PORT). Submit from a second terminal (see
# README). A second installation beside the first: NATS_PORT=4223
# SINK_PORT=8788 GATEWAY_PORT=8090 MCP_PORT=8091 ADMIN_PORT=9465 make run (its
# store and logs are then data/*-4223, data/*-8788). A taken port fails at
# once, naming it.
NATS_PORT    ?= 4222
SINK_PORT    ?= 8787
GATEWAY_PORT ?= 8080
MCP_PORT     ?= 8081
ADMIN_PORT   ?= 9464
DATA      ?= data
STORE_DIR ?= $(DATA)/jetstream$(if $(filter 4222,$(NATS_PORT)),,-$(NATS_PORT))
SINK_LOG  ?= $(DATA)/sink$(if $(filter 8787,$(SINK_PORT)),,-$(SINK_PORT)).jsonl
RUN_TOOLS := $(DATA)/demo-tools-$(SINK_PORT).yaml
SINK_READY := $(DATA)/sink-$(SINK_PORT).ready
run: build
	@mkdir -p $(DATA)
	@test -s $(DATA)/agent.token || $(BIN)/gateway token --role agent --namespace demo --name demo-agent --tokens $(DATA)/gateway.tokens > $(DATA)/agent.token
	@test -s $(DATA)/operator.token || $(BIN)/gateway token --role operator --namespace '*' --name demo-operator --tokens $(DATA)/gateway.tokens > $(DATA)/operator.token
	@sed 's|127\.0\.0\.1:8787|127.0.0.1:$(SINK_PORT)|g' deployments/demo/tools.yaml > $(RUN_TOOLS)
	@rm -f $(SINK_READY); \
	$(BIN)/sink --listen 127.0.0.1:$(SINK_PORT) --log $(SINK_LOG) --ready-file $(SINK_READY) & sink=$$!; \
	trap 'kill $$sink $$gateway $$mcp 2>/dev/null; rm -f $(SINK_READY)' EXIT INT TERM; \
	while [ ! -s $(SINK_READY) ]; do kill -0 $$sink 2>/dev/null || exit 1; sleep 0.05; done; \
	$(BIN)/gateway --tokens $(DATA)/gateway.tokens --listen 127.0.0.1:$(GATEWAY_PORT) --nats-url nats://127.0.0.1:$(NATS_PORT) --worker-metrics http://127.0.0.1:$(ADMIN_PORT)/metrics --log-format console & gateway=$$!; \
	$(BIN)/mcp --http 127.0.0.1:$(MCP_PORT) --tokens $(DATA)/gateway.tokens --nats-url nats://127.0.0.1:$(NATS_PORT) --log-format console & mcp=$$!; \
	echo "operator console: http://127.0.0.1:$(GATEWAY_PORT)/console/ (log in with the token in $(DATA)/operator.token)"; \
	$(BIN)/worker --tools $(RUN_TOOLS) --store-dir $(STORE_DIR) --listen 127.0.0.1:$(NATS_PORT) --admin-addr 127.0.0.1:$(ADMIN_PORT) --log-format console

# Every test, race detector on: unit, conformance (R1 and R3), fuzz seed
# corpora, and black-box tests of the built binaries.
test:
	$(GO) vet ./...
	$(GO) test -race -count=1 -timeout 12m ./...

# The edit-test loop: vet, then go test -short, which skips the tests that take
# ten seconds or more (README, Development); no race detector.
test-short:
	$(GO) vet ./...
	$(GO) test -short -count=1 -timeout 6m ./...

lint:
	@out=$$(gofmt -l $$(git ls-files '*.go')); if [ -n "$$out" ]; then echo "gofmt would change:"; echo "$$out"; exit 1; fi
	$(GO) vet ./...
	$(GO) run $(STATICCHECK) ./...

# Fuzz the envelope decoder, the canonicalizer, its quick check of
# canonical data and key derivation, the audit trail's verifier, its fast
# reading of a line and its events' canonical form (FUZZTIME each).
FUZZTIME ?= 2m
fuzz:
	$(GO) test -run='^$$' -fuzz='^FuzzCanonicalize$$' -fuzztime=$(FUZZTIME) ./pkg/intent/
	$(GO) test -run='^$$' -fuzz='^FuzzIsCanonical$$' -fuzztime=$(FUZZTIME) ./pkg/intent/
	$(GO) test -run='^$$' -fuzz='^FuzzDecode$$' -fuzztime=$(FUZZTIME) ./pkg/intent/
	$(GO) test -run='^$$' -fuzz='^FuzzVerify$$' -fuzztime=$(FUZZTIME) ./pkg/audit/
	$(GO) test -run='^$$' -fuzz='^FuzzQuickLine$$' -fuzztime=$(FUZZTIME) ./pkg/audit/
	$(GO) test -run='^$$' -fuzz='^FuzzCanonicalAgree$$' -fuzztime=$(FUZZTIME) ./pkg/audit/
	$(GO) test -run='^$$' -fuzz='^FuzzQuickWithout$$' -fuzztime=$(FUZZTIME) ./pkg/audit/

# The full chaos runs (docs/reliability.md): CHAOS_INTENTS intents on one
# JetStream process, then on a 3-node cluster at R3, on the shipped defaults
# (no durability flag), with every fault and a power loss. Each prints its
# verdict; the target fails if either has a violation. CHAOS_FLAGS adds
# flags to both (e.g. --keep to keep stores and logs, --synced for a work
# stream that syncs every intent).
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

# The ledger's cost per key (docs/operations.md, sizing): fill a ledger on a
# nats-server process to LEDGER_KEYS keys, LEDGER_STEP at a time, printing
# create rate, server heap/RSS/disk per key and read latency at each step.
# LEDGERFLAGS adds flags, e.g. LEDGERFLAGS='-partitions 4' (or '-layout 1': keys stored as they are).
LEDGER_KEYS ?= 4000000
LEDGER_STEP ?= 1000000
LEDGERFLAGS ?=
bench-ledger-size:
	$(GO) build -o $(BIN)/nats-server github.com/nats-io/nats-server/v2
	$(GO) run ./cmd/bench ledger-size -nats-server $(BIN)/nats-server -keys $(LEDGER_KEYS) -step $(LEDGER_STEP) $(LEDGERFLAGS)

# A Postgres ledger table (claim by INSERT ... ON CONFLICT DO NOTHING, complete
# by UPDATE) with fsync on and off, on a throwaway cluster: the yardstick of
# the durable rows (docs/performance.md). Needs PostgreSQL's server binaries.
bench-postgres:
	deployments/bench/pgledger.sh

# River (the Postgres job queue) tuned for throughput: unique jobs, batched
# inserts, a noop worker, fsync off, on a throwaway cluster: the yardstick of
# the unique row (docs/performance.md). Needs PostgreSQL's server binaries.
bench-river:
	GO=$(GO) deployments/bench/river.sh

# Expiry at scale (docs/operations.md, sizing): fill a ledger with
# EXPIRY_KEYS keys of retention EXPIRY_TTL, then offer EXPIRY_RATE new keys/s
# while the first wave expires, printing per interval messages, rate,
# latency and server memory, and a verdict: stall or not. The retention must
# outlast the fill (1 M keys took 200 s on a 2-core machine).
# EXPIRYFLAGS adds flags, e.g. EXPIRYFLAGS='-partitions 4'.
EXPIRY_KEYS ?= 1000000
EXPIRY_TTL  ?= 300s
EXPIRY_RATE ?= 1000
EXPIRYFLAGS ?=
bench-ledger-expiry:
	$(GO) build -o $(BIN)/nats-server github.com/nats-io/nats-server/v2
	$(GO) run ./cmd/bench ledger-expiry -nats-server $(BIN)/nats-server -keys $(EXPIRY_KEYS) -ttl $(EXPIRY_TTL) -rate $(EXPIRY_RATE) $(EXPIRYFLAGS)
