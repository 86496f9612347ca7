// Command worker consumes tool intents and fires each operation at most once
// per key. With no NATS URL it runs its own embedded JetStream server.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"maps"
	"net"
	"net/http"
	"os"
	"os/signal"
	"syscall"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"go.uber.org/zap"

	"github.com/idemgate/idemgate/internal/envflag"
	"github.com/idemgate/idemgate/internal/logging"
	"github.com/idemgate/idemgate/internal/natsconn"
	"github.com/idemgate/idemgate/internal/natsrv"
	"github.com/idemgate/idemgate/internal/tracing"
	"github.com/idemgate/idemgate/internal/worker"
	"github.com/idemgate/idemgate/pkg/audit"
	"github.com/idemgate/idemgate/pkg/effects/toolsfile"
	"github.com/idemgate/idemgate/pkg/intent"
)

func main() {
	err := run(os.Args[1:])
	switch {
	case errors.Is(err, flag.ErrHelp):
		// --help: the usage is printed, and asking for it is no error.
	case err != nil:
		fmt.Fprintln(os.Stderr, "worker:", err)
		os.Exit(1)
	}
}

const usageHead = `usage: worker [flags]

Consumes tool intents and fires each operation at most once per key. With no
--nats-url it runs its own embedded JetStream server (--listen, --store-dir).

Examples:
  worker --tools deployments/demo/tools.yaml                    embedded JetStream on 127.0.0.1:4222
  NATS_URL=nats://a:4222,nats://b:4222 worker --tools tools.yaml --replicas 3
  worker --check-config --tools tools.yaml                      validate a tools file (warnings too)

Exit status: 0 after a clean stop (SIGTERM/SIGINT drains first) or a valid
--check-config, 1 on any error (the message says which and how to fix it).

Every flag can also be set as IDEMGATE_<FLAG> in the environment (dashes as
underscores) or in a --config file.

Flags:
`

func run(args []string) error {
	fs := flag.NewFlagSet("worker", flag.ContinueOnError)
	fs.Usage = func() {
		fmt.Fprint(fs.Output(), usageHead)
		fs.PrintDefaults()
	}
	if asksHelp(args) {
		fs.SetOutput(os.Stdout) // asked for: the usage is the output, not an error
	}
	var cfg worker.Config
	var (
		toolsFile   = fs.String("tools", "tools.yaml", "tools file (YAML)")
		checkConfig = fs.Bool("check-config", false, "validate the tools file and exit")
		natsFlags   = natsconn.Register(fs, natsconn.Defaults{URLHelp: "; empty runs an embedded JetStream", Name: "idemgate-worker", Reconnect: true, OldTLSNames: true})
		logFlags    = logging.Register(fs, logging.Flags{})
		serverConf  = fs.String("server-config", "", "nats-server config file for the embedded server: accounts, users, TLS (see deployments/nats/secure); --listen, --store-dir and --sync override it")
		replyPrefix = fs.String("reply-prefixes", worker.DefaultReplyPrefix, "comma-separated subject prefixes an intent's Idem-Reply-To may name; answers are never published elsewhere")
		hookAllow   = fs.String("webhook-allow", "", "comma-separated CIDRs every webhook and mcp url upstream may reach besides public addresses, e.g. 127.0.0.0/8 (per tool or upstream: allow_private)")
		storeDir    = fs.String("store-dir", "data/jetstream", "embedded JetStream store directory")
		listen      = fs.String("listen", "127.0.0.1:4222", "embedded JetStream client address for other processes")
		syncPolicy  = fs.String("sync", natsrv.SyncAlways, "embedded store fsync: always (durable: sync before ack), lazy (server default, flush every 2m), or an interval like 100ms")
		drain       = fs.Duration("drain-timeout", worker.DefaultDrainTimeout, "on SIGTERM, how long effects in flight may run before they are cancelled")
		configFile  = fs.String("config", "", envflag.ConfigUsage)
		adminAddr   = fs.String("admin-addr", "", "serve /metrics, /healthz and /readyz on this address, e.g. 127.0.0.1:9464 (empty: off)")
		auditKey    = fs.String("audit-key", "", "file of the Ed25519 key (PKCS #8 PEM) this worker signs its audit trail and receipts with; made on first start when missing (default: audit.key beside --store-dir's directory, e.g. data/audit.key)")
		otlp        = fs.String("otlp-endpoint", "", "export spans to this OTLP/HTTP endpoint, e.g. http://collector:4318 (env OTEL_EXPORTER_OTLP_ENDPOINT; empty: trace context is propagated, no spans exported)")
	)
	fs.StringVar(&cfg.Prefix, "prefix", intent.DefaultPrefix, "names prefix: stream <P>_INTENTS on <p>.intents.>, consumer <P>_WORKERS, bucket <P>_LEDGER")
	fs.StringVar(&cfg.Holder, "holder", "", "this worker's name in ledger records (default <hostname>-<pid>)")
	fs.IntVar(&cfg.Concurrency, "concurrency", worker.DefaultConcurrency, "intents handled at once")
	fs.IntVar(&cfg.Limits.MaxBytes, "max-intent-bytes", intent.DefaultMaxBytes, "largest intent accepted; larger ones are answered too_large")
	fs.DurationVar(&cfg.AckWait, "ack-wait", worker.DefaultAckWait, "consumer ack wait: redelivery after a worker dies")
	fs.IntVar(&cfg.MaxDeliver, "max-deliver", worker.DefaultMaxDeliver, "deliveries before an intent whose effect keeps failing is recorded failed (back-pressure and ledger outages spend none)")
	fs.IntVar(&cfg.MaxAckPending, "max-ack-pending", worker.DefaultMaxAckPending, "intents in flight across all workers (queued intents of a capped tool among them)")
	fs.DurationVar(&cfg.DuplicateWindow, "dup-window", worker.DefaultDuplicateWindow, "publish-dedup window of the intent stream")
	fs.IntVar(&cfg.Replicas, "replicas", worker.DefaultReplicas, "replicas of the stream and ledger (1, 3 or 5; 3 on a cluster)")
	fs.DurationVar(&cfg.LedgerTTL, "ledger-ttl", worker.DefaultLedgerTTL, "how long a final record (completed, failed, denied) is kept; unresolved records never expire")
	fs.DurationVar(&cfg.RetryDelay, "retry-delay", worker.DefaultRetryDelay, "first redelivery delay after a transient failure (doubles per delivery)")
	fs.DurationVar(&cfg.MaxRetryDelay, "max-retry-delay", worker.DefaultMaxRetryDelay, "cap of the redelivery delay")
	fs.IntVar(&cfg.LedgerPartitions, "ledger-partitions", 0, "ledger partitions (buckets), a power of two fixed when the ledger is created (every worker must agree; docs/operations.md, sizing); 0: the count the ledger records, 1 for a new one")
	fs.IntVar(&cfg.LedgerLayout, "ledger-layout", 0, "ledger key layout, fixed when the ledger is created (every worker must agree; docs/protocol.md, 6.2): 2 stores a derived key with 22 characters of its digest instead of 64 (less server memory per key), 1 stores keys as they are; 0: the layout the ledger records, 2 for a new one")
	fs.IntVar(&cfg.LedgerBatch, "ledger-batch", worker.DefaultLedgerBatch, "group-commit ledger writes in atomic batches of up to N (1-1000; 0: off, every write on its own). One disk sync per batch instead of per write: what makes a server with sync_interval always (the durable setting) fast; on a server that syncs lazily it is slower than off, so set 0 there (an embedded store with --sync other than always turns it off unless this flag is given). Needs nats-server 2.12+")
	fs.IntVar(&cfg.LedgerBatchInFlight, "ledger-batch-inflight", 0, fmt.Sprintf("group-commit batches awaiting their acknowledgement at once (1-8; 0: %d at one replica, %d at more): fewer make bigger batches (more throughput at sync always) and a wider crash window (docs/performance.md)", worker.DefaultLedgerBatchInFlight, worker.DefaultReplicatedLedgerBatchInFlight))
	asyncIntents := fs.Bool("async-intents", true, "create the work stream with asynchronous persistence (R1 file stream; a replicated one always persists as the server does): at sync_interval always only the ledger syncs before acknowledging. A crash can lose an intent the server acknowledged, never an answered one: it was not claimed, and the caller's client publishes it again when the ledger shows no record (docs/protocol.md 7.2). false: sync every intent and ack too, at a fraction of the throughput. Fixed when the stream is created (docs/performance.md)")
	fs.DurationVar(&cfg.AnswerCache, "answer-cache", worker.DefaultAnswerCache, "how long a duplicate is answered from this worker's memory of a final record it wrote or read, without a ledger read (0: off); a record deleted from the ledger meanwhile is answered until then")
	fs.Float64Var(&cfg.SessionRate, "session-rate", 0, "intents per second one session may send to this worker; over it they are answered rate_limited (0: no limit)")
	fs.IntVar(&cfg.SessionBurst, "session-burst", 0, "intents a session may send at once above --session-rate (default: the rate, at least 1)")
	fs.DurationVar(&cfg.AuditRetention, "audit-retention", audit.DefaultRetention, "how long the audit stream keeps the trail (at least --ledger-ttl; docs/audit.md)")
	fs.DurationVar(&cfg.AuditCheckpoint, "audit-checkpoint", audit.DefaultCheckpointEvery, "how often to sign and store a checkpoint of every partition's audit chain (docs/audit.md)")
	fs.IntVar(&cfg.AuditQueue, "audit-queue", audit.DefaultQueue, "audit events held in memory while the trail is written or unreachable; beyond it they are dropped and the trail shows a gap")
	fs.DurationVar(&cfg.LedgerScan, "ledger-scan", worker.DefaultLedgerScan, "how often one worker reads the ledger's writes since its last round (the whole ledger the first time and hourly) to count its unresolved records (idemgate_ledger_unresolved_*) and give records written without a TTL theirs, and to probe uncertain records whose tool has a probe (0: off)")
	if err := fs.Parse(args); err != nil {
		return err
	}
	envAliases := maps.Clone(natsconn.EnvAliases)
	envAliases["otlp-endpoint"] = "OTEL_EXPORTER_OTLP_ENDPOINT"
	if err := envflag.Load(fs, configFile, envflag.Sources{Aliases: envAliases}); err != nil {
		return err
	}

	batchGiven := false
	fs.Visit(func(f *flag.Flag) { batchGiven = batchGiven || f.Name == "ledger-batch" })
	plan, err := worker.Settings{
		Config:           cfg,
		LedgerBatchGiven: batchGiven,
		AsyncIntents:     *asyncIntents,
		AuditKey:         *auditKey,
		ReplyPrefixes:    *replyPrefix,
		WebhookAllow:     *hookAllow,
		NATSURL:          natsFlags.URL,
		Embedded:         natsrv.Config{StoreDir: *storeDir, Listen: *listen, Sync: *syncPolicy, ConfigFile: *serverConf},
	}.Resolve()
	if err != nil {
		return err
	}
	cfg = plan.Config
	allowPrivate := toolsfile.WithAllowPrivate(plan.WebhookAllow...)

	if *checkConfig {
		return worker.CheckTools(os.Stdout, *toolsFile, allowPrivate)
	}
	log, err := logFlags.Logger()
	if err != nil {
		return err
	}
	if err := natsFlags.Validate(); err != nil {
		return err // before an embedded server starts
	}
	defer func() { _ = log.Sync() }()

	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()

	// A worker may start before its server: it connects in the background
	// (natsconn.Flags.Reconnect) and setup waits for JetStream.
	if plan.Embedded != nil {
		srv, err := worker.StartEmbedded(*plan.Embedded, log)
		if err != nil {
			return err
		}
		defer func() { srv.Shutdown(); srv.WaitForShutdown() }()
		// Over TCP loopback, not nats.InProcessServer: the in-process pipe
		// hands every message between goroutines, and the worker's seven
		// messages per intent went slower through it.
		natsFlags.URL = srv.ClientURL()
	}
	nc, err := natsFlags.Connect(log)
	if err != nil {
		return err
	}
	defer nc.Close()

	tools, err := toolsfile.LoadFile(*toolsFile, toolsfile.WithNATSConn(nc), allowPrivate)
	if err != nil {
		return err
	}
	defer func() { _ = tools.Close() }()
	for _, w := range tools.Warnings() {
		log.Warn("tools file", zap.String("warning", w.String()))
	}

	shutdownTracing, err := tracing.Setup(ctx, "idemgate-worker", *otlp)
	if err != nil {
		return err
	}
	defer func() {
		sctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		_ = shutdownTracing(sctx)
	}()

	reg := prometheus.NewRegistry()
	reg.MustRegister(collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
	cfg.Metrics = worker.NewMetrics(reg)
	w, err := worker.New(ctx, nc, tools, log, cfg)
	if err != nil {
		return err
	}
	if *adminAddr != "" {
		stopAdmin, err := serveAdmin(*adminAddr, w.AdminHandler(reg), log)
		if err != nil {
			return err
		}
		defer stopAdmin()
	}
	if err := w.Run(ctx, *drain); err != nil && !errors.Is(err, context.Canceled) {
		return err
	}
	// Send the last acks and answers before the connection closes.
	_ = nc.FlushTimeout(5 * time.Second)
	return nil
}

// asksHelp reports whether args ask for the usage (-h, -help, --help before
// any "--").
func asksHelp(args []string) bool {
	for _, a := range args {
		switch a {
		case "--":
			return false
		case "-h", "-help", "--help", "--h":
			return true
		}
	}
	return false
}

// serveAdmin serves h on addr until the returned function is called.
func serveAdmin(addr string, h http.Handler, log *zap.Logger) (stop func(), err error) {
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		return nil, fmt.Errorf("admin address %s: %w", addr, err)
	}
	srv := &http.Server{Handler: h, ReadHeaderTimeout: 5 * time.Second}
	go func() {
		if err := srv.Serve(ln); err != nil && !errors.Is(err, http.ErrServerClosed) {
			log.Error("admin server", zap.Error(err))
		}
	}()
	log.Info("admin endpoints", zap.String("addr", ln.Addr().String()))
	return func() {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		_ = srv.Shutdown(ctx)
	}, nil
}
