// Command gateway is idemgate's HTTP front door: tool calls with
// Idempotency-Key semantics, the ledger's records and an operator API, for
// callers without a NATS client (docs/http.md), and the operator console
// at /console/ (docs/console.md).
//
//	gateway --tokens tokens.txt [--listen 127.0.0.1:8080] [--nats-url URL]
//	gateway token --role agent|operator --namespace NS [--name N] [--tokens FILE]
//	                 print a new token; its line goes to FILE (or stderr)
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"os/signal"
	"strings"
	"syscall"

	"github.com/nats-io/nats.go"
	"go.uber.org/zap"

	"github.com/idemgate/idemgate/internal/auth"
	"github.com/idemgate/idemgate/internal/console"
	"github.com/idemgate/idemgate/internal/envflag"
	"github.com/idemgate/idemgate/internal/httpapi"
	"github.com/idemgate/idemgate/internal/httpdoor"
	"github.com/idemgate/idemgate/internal/logging"
	"github.com/idemgate/idemgate/internal/natsconn"
	"github.com/idemgate/idemgate/pkg/client"
	"github.com/idemgate/idemgate/pkg/intent"
)

func main() {
	var err error
	if len(os.Args) > 1 && os.Args[1] == "token" {
		err = token(os.Args[2:], os.Stdout, os.Stderr)
	} else {
		err = run(os.Args[1:])
	}
	if err != nil && !errors.Is(err, flag.ErrHelp) {
		fmt.Fprintln(os.Stderr, "gateway:", err)
		os.Exit(1)
	}
}

func run(args []string) error {
	fs := flag.NewFlagSet("gateway", flag.ContinueOnError)
	var cfg httpapi.Config
	fs.StringVar(&cfg.Addr, "listen", httpapi.DefaultAddr, "HTTP listen address; one that is not loopback needs --tls-cert and --tls-key, or --insecure-listen")
	fs.StringVar(&cfg.TLSCert, "tls-cert", "", "PEM certificate to serve HTTPS with (with --tls-key)")
	fs.StringVar(&cfg.TLSKey, "tls-key", "", "key of --tls-cert")
	fs.BoolVar(&cfg.InsecureListen, "insecure-listen", false, "allow plain HTTP on an address that is not loopback (a proxy on this host terminates TLS)")
	tokens := fs.String("tokens", "", "tokens file: one '<sha256-hex> <agent|operator> <namespace> [name]' per line (gateway token makes one)")
	fs.IntVar(&cfg.MaxBodyBytes, "max-body", intent.DefaultMaxBytes, "largest request body, bytes (413 over it)")
	fs.Float64Var(&cfg.Rate, "rate", httpapi.DefaultRate, "requests per second per token (429 over it)")
	fs.IntVar(&cfg.Burst, "burst", httpapi.DefaultBurst, "requests a token may make at once above --rate")
	fs.IntVar(&cfg.MaxInFlight, "max-in-flight", httpapi.DefaultMaxInFlight, "requests in progress per token (429 over it)")
	fs.DurationVar(&cfg.ReadHeaderTimeout, "read-header-timeout", httpapi.DefaultReadHeaderTimeout, "time a client has to send a request's headers")
	fs.DurationVar(&cfg.BodyTimeout, "body-timeout", httpapi.DefaultBodyTimeout, "time a client has to send a request's body (408 over it)")
	fs.DurationVar(&cfg.IdleTimeout, "idle-timeout", httpapi.DefaultIdleTimeout, "an idle keep-alive connection is closed after this")
	fs.DurationVar(&cfg.DefaultWait, "wait", httpapi.DefaultWait, "how long a tool call waits for its answer without Prefer: wait=N")
	fs.DurationVar(&cfg.MaxWait, "max-wait", httpapi.DefaultMaxWait, "the longest wait a request may ask for")
	fs.IntVar(&cfg.ListMaxScan, "list-max-scan", httpapi.DefaultListMaxScan, "records one listing request reads at most")
	workerMetrics := fs.String("worker-metrics", "", "comma-separated /metrics URLs of the workers (their --admin-addr), read for the console's rates; empty: no rates")
	fs.DurationVar(&cfg.WorkerMetricsEvery, "worker-metrics-every", httpapi.DefaultWorkerMetricsEvery, "how often the console reads --worker-metrics (a chart bar's width)")
	natsFlags := natsconn.Register(fs, natsconn.Defaults{URL: nats.DefaultURL, Name: "idemgate-gateway", Reconnect: true})
	logFlags := logging.Register(fs, logging.Flags{})
	prefix := fs.String("prefix", intent.DefaultPrefix, "names prefix of the installation")
	drain := fs.Duration("drain-timeout", httpdoor.DefaultDrain, httpdoor.DrainUsage)
	configFile := fs.String("config", "", envflag.ConfigUsage)
	if err := fs.Parse(args); err != nil {
		return err
	}
	if fs.NArg() > 0 {
		return fmt.Errorf("unexpected argument %q (subcommand: token)", fs.Arg(0))
	}
	if err := envflag.Load(fs, configFile, envflag.Sources{Aliases: natsconn.EnvAliases, OldPrefix: "IDEMGATE_GATEWAY"}); err != nil {
		return err
	}
	if *tokens == "" {
		return errors.New("--tokens is required: every caller needs a bearer token (gateway token --role agent --namespace NS --tokens FILE makes one)")
	}
	ts, err := auth.LoadTokens(*tokens)
	if err != nil {
		return err
	}
	cfg.Tokens = ts
	for u := range strings.SplitSeq(*workerMetrics, ",") {
		if u = strings.TrimSpace(u); u != "" {
			cfg.WorkerMetrics = append(cfg.WorkerMetrics, u)
		}
	}
	log, err := logFlags.Logger()
	if err != nil {
		return err
	}
	defer func() { _ = log.Sync() }()

	nc, err := natsFlags.Connect(log)
	if err != nil {
		return err
	}
	defer nc.Close()
	cl, err := client.New(nc, client.WithPrefix(*prefix))
	if err != nil {
		return err
	}
	srv, err := httpapi.New(nc, cl, log, cfg)
	if err != nil {
		return err
	}
	ln, err := srv.Listen()
	if err != nil {
		return err
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	log.Info("gateway listening", zap.String("url", srv.Scheme()+"://"+ln.Addr().String()),
		zap.String("nats", natsFlags.URL), zap.Int("tokens", ts.Len()))
	log.Info("operator console", zap.String("url", srv.Scheme()+"://"+ln.Addr().String()+console.Path),
		zap.String("login", "paste an operator token"))
	if err := srv.Serve(ctx, ln, *drain); err != nil {
		return err
	}
	log.Info("gateway stopped")
	return nil
}

// token prints a new token and writes its line to the tokens file.
func token(args []string, stdout, stderr io.Writer) error {
	fs := flag.NewFlagSet("gateway token", flag.ContinueOnError)
	fs.SetOutput(stderr)
	role := fs.String("role", auth.RoleAgent, "agent or operator")
	namespace := fs.String("namespace", "", "the sessions the token reaches: a name, or * (operators) for all")
	name := fs.String("name", "", "the caller's name in logs and decisions (default token-<hash prefix>)")
	file := fs.String("tokens", "", "append the token's line to this tokens file (created mode 0600); without it the line goes to stderr")
	if err := fs.Parse(args); err != nil {
		return err
	}
	if *namespace == "" {
		return errors.New("--namespace is required: the agent's own name, or * for an operator of every session")
	}
	secret, line, err := auth.NewToken(*role, *namespace, *name)
	if err != nil {
		return err
	}
	if *file == "" {
		fmt.Fprintln(stderr, line)
	} else {
		f, err := os.OpenFile(*file, os.O_APPEND|os.O_CREATE|os.O_WRONLY, 0o600)
		if err != nil {
			return err
		}
		if _, err := fmt.Fprintln(f, line); err != nil {
			_ = f.Close()
			return err
		}
		if err := f.Close(); err != nil {
			return err
		}
		if _, err := auth.LoadTokens(*file); err != nil {
			return fmt.Errorf("the tokens file no longer reads: %w", err)
		}
	}
	_, err = fmt.Fprintln(stdout, secret)
	return err
}
