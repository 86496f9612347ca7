// Command mcp is idemgate's MCP server: it serves the workers' tools to MCP
// clients (over stdio, or streamable HTTP with --http behind the bearer
// tokens of --tokens), each call going through the ledger at most once per
// operation. docs/mcp.md is its guide.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"log/slog"
	"net"
	"os"
	"os/signal"
	"syscall"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/idemgate/idemgate/internal/auth"
	"github.com/idemgate/idemgate/internal/envflag"
	"github.com/idemgate/idemgate/internal/mcpgate"
	"github.com/idemgate/idemgate/internal/natsconn"
	"github.com/idemgate/idemgate/pkg/intent"
)

func main() {
	if err := run(os.Args[1:]); err != nil {
		fmt.Fprintln(os.Stderr, "mcp:", err)
		os.Exit(1)
	}
}

func run(args []string) error {
	fs := flag.NewFlagSet("mcp", flag.ContinueOnError)
	var (
		cfg      mcpgate.Config
		natsAuth natsconn.ClientAuth
		natsURL  = fs.String("nats-url", nats.DefaultURL, "NATS server(s) of the workers, comma separated (env NATS_URL)")
		httpAddr = fs.String("http", "", "serve streamable HTTP on this address at "+mcpgate.HTTPPath+", e.g. 127.0.0.1:8081 (default: stdio); an address that is not loopback needs --tokens")
		tokens   = fs.String("tokens", "", "HTTP: the tokens file of the HTTP front door ('<sha256-hex> <agent|operator> <namespace> [name]' per line; gateway token makes one): every request needs Authorization: Bearer <token>, whose namespace scopes its sessions (default: none, loopback only)")
		logLevel = fs.String("log-level", "info", "log level (to stderr): debug, info, warn, error")
	)
	fs.StringVar(&cfg.Prefix, "prefix", intent.DefaultPrefix, "names prefix of the installation")
	fs.StringVar(&cfg.Session, "session", "", "session scoping the keys of calls that name none (no io.idemgate/session _meta, no Idem-Session header); default: one scope for all")
	fs.DurationVar(&cfg.Wait, "wait", mcpgate.DefaultWait, "how long a call waits for its operation before answering with a reference to check later")
	fs.StringVar(&cfg.Upstream, "upstream", "", "proxy mode: serve only the tools of this MCP server (a command, e.g. \"npx some-server\", or a streamable HTTP URL), which the workers' tools file lists under mcp_upstreams")
	fs.DurationVar(&cfg.Refresh, "refresh", mcpgate.DefaultRefresh, "how often the workers' tool catalogue is read again")
	fs.StringVar(&cfg.ResourceURL, "resource-url", "", "HTTP: the URL clients reach "+mcpgate.HTTPPath+" at (behind a proxy, e.g. https://mcp.example.com/mcp), named in 401 answers and the protected resource metadata (default: http://<Host>"+mcpgate.HTTPPath+")")
	fs.IntVar(&cfg.MaxSessions, "max-sessions", mcpgate.DefaultMaxSessions, "HTTP: MCP sessions open at once, all callers together (429 over it)")
	fs.IntVar(&cfg.MaxSessionsPerToken, "max-sessions-per-token", mcpgate.DefaultMaxSessionsPerToken, "HTTP: MCP sessions one token may have open (429 over it)")
	fs.IntVar(&cfg.MaxCalls, "max-calls", mcpgate.DefaultMaxCalls, "HTTP: calls in progress at once, all callers together (429 over it)")
	fs.IntVar(&cfg.MaxCallsPerToken, "max-calls-per-token", mcpgate.DefaultMaxCallsPerToken, "HTTP: calls one token may have in progress (429 over it)")
	fs.DurationVar(&cfg.SessionIdle, "session-idle", mcpgate.DefaultSessionIdle, "HTTP: an MCP session with no request for this long is closed")
	fs.StringVar(&natsAuth.Creds, "creds", "", "NATS credentials file (env NATS_CREDS)")
	fs.StringVar(&natsAuth.User, "nats-user", "", "NATS user; the password comes from the environment variable "+natsconn.PasswordEnv)
	fs.StringVar(&natsAuth.NkeySeed, "nkey", "", "file holding the NATS user's nkey seed")
	fs.StringVar(&natsAuth.TLSCA, "tls-ca", "", "PEM file of the CAs that sign the NATS server's certificate (turns TLS on)")
	fs.StringVar(&natsAuth.TLSCert, "tls-cert", "", "client certificate, for servers that verify clients (with --tls-key)")
	fs.StringVar(&natsAuth.TLSKey, "tls-key", "", "key of --tls-cert")
	fs.StringVar(&natsAuth.InboxPrefix, "inbox-prefix", "", "subject prefix of reply inboxes, as this user's permissions allow")
	if err := fs.Parse(args); err != nil {
		return err
	}
	if err := envflag.Apply(fs, "IDEMGATE", map[string]string{"nats-url": "NATS_URL", "creds": "NATS_CREDS"}); err != nil {
		return err
	}
	if fs.NArg() > 0 {
		return fmt.Errorf("unexpected argument %q (flags only; see -h)", fs.Arg(0))
	}
	if *tokens != "" {
		ts, err := auth.LoadTokens(*tokens)
		if err != nil {
			return err
		}
		cfg.Tokens = ts
	}
	if *httpAddr != "" {
		if err := mcpgate.CheckListen(*httpAddr, cfg.Tokens); err != nil {
			return fmt.Errorf("--http: %w", err)
		}
	} else if cfg.Tokens != nil {
		return errors.New("--tokens is for --http: stdio is a local transport of the parent process and takes no token")
	}
	var level slog.Level
	if err := level.UnmarshalText([]byte(*logLevel)); err != nil {
		return fmt.Errorf("--log-level: %w", err)
	}
	// stdout carries the protocol over stdio: the log goes to stderr.
	cfg.Logger = slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: level}))

	natsAuth.Password = os.Getenv(natsconn.PasswordEnv)
	nopts, err := natsAuth.Options()
	if err != nil {
		return err
	}
	nopts = append(nopts, nats.Name("idemgate-mcp"), nats.MaxReconnects(-1), nats.RetryOnFailedConnect(true), nats.ReconnectWait(250*time.Millisecond))
	nc, err := nats.Connect(*natsURL, nopts...)
	if err != nil {
		return fmt.Errorf("connect %s: %w", *natsURL, err)
	}
	defer nc.Close()
	g, err := mcpgate.New(nc, cfg)
	if err != nil {
		return err
	}

	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	lctx, cancel := context.WithTimeout(ctx, 15*time.Second)
	if err := g.Load(lctx); err != nil {
		cfg.Logger.Warn("no tool catalogue yet: serving without the workers' tools until it answers", "err", err)
	}
	cancel()
	cfg.Logger.Info("tools", "served", g.Tools())
	if *httpAddr == "" {
		return g.ServeStdio(ctx)
	}
	return g.ServeHTTP(ctx, *httpAddr, 10*time.Second, func(a net.Addr) {
		cfg.Logger.Info("mcp serving", "url", fmt.Sprintf("http://%s%s", a, mcpgate.HTTPPath), "tokens", cfg.Tokens.Len())
	})
}
