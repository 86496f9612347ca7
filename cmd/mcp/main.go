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
	"net"
	"os"
	"os/signal"
	"strings"
	"syscall"
	"time"

	"github.com/nats-io/nats.go"
	"go.uber.org/zap"

	"github.com/idemgate/idemgate/internal/auth"
	"github.com/idemgate/idemgate/internal/envflag"
	"github.com/idemgate/idemgate/internal/httpdoor"
	"github.com/idemgate/idemgate/internal/logging"
	"github.com/idemgate/idemgate/internal/mcpgate"
	"github.com/idemgate/idemgate/internal/natsconn"
	"github.com/idemgate/idemgate/pkg/client"
	"github.com/idemgate/idemgate/pkg/intent"
)

func main() {
	if err := run(os.Args[1:]); err != nil && !errors.Is(err, flag.ErrHelp) {
		fmt.Fprintln(os.Stderr, "mcp:", err)
		os.Exit(1)
	}
}

func run(args []string) error {
	fs := flag.NewFlagSet("mcp", flag.ContinueOnError)
	var (
		cfg       mcpgate.Config
		natsFlags = natsconn.Register(fs, natsconn.Defaults{URL: nats.DefaultURL, Name: "idemgate-mcp", Reconnect: true, OldTLSNames: true})
		logFlags  = logging.Register(fs, logging.Flags{})
		httpAddr  = fs.String("http", "", "serve streamable HTTP on this address at "+mcpgate.HTTPPath+", e.g. 127.0.0.1:8081 (default: stdio); an address that is not loopback needs --tokens")
		tokens    = fs.String("tokens", "", "HTTP: the tokens file of the HTTP front door ('<sha256-hex> <agent|operator> <namespace> [name]' per line; gateway token makes one): every request needs Authorization: Bearer <token>, whose namespace scopes its sessions (default: none, loopback only)")
	)
	prefix := fs.String("prefix", intent.DefaultPrefix, "names prefix of the installation")
	drain := fs.Duration("drain-timeout", httpdoor.DefaultDrain, "HTTP: "+httpdoor.DrainUsage)
	configFile := fs.String("config", "", envflag.ConfigUsage)
	fs.StringVar(&cfg.Session, "session", "", "session scoping the keys of calls that name none (no io.idemgate/session _meta, no Idem-Session header); default: one scope for all")
	fs.DurationVar(&cfg.Wait, "wait", mcpgate.DefaultWait, "how long a call waits for its operation before answering with a reference to check later")
	fs.StringVar(&cfg.Upstream, "upstream", "", "proxy mode: serve only the tools of this MCP server (a command, e.g. \"npx some-server\", or a streamable HTTP URL), which the workers' tools file lists under mcp_upstreams")
	fs.DurationVar(&cfg.Refresh, "refresh", mcpgate.DefaultRefresh, "how often the workers' tool catalogue is read again")
	fs.StringVar(&cfg.ResourceURL, "resource-url", "", "HTTP: the URL clients reach "+mcpgate.HTTPPath+" at (behind a proxy, e.g. https://mcp.example.com/mcp), named in 401 answers and the protected resource metadata (default: http://<Host>"+mcpgate.HTTPPath+")")
	fs.IntVar(&cfg.MaxSessions, "max-sessions", mcpgate.DefaultMaxSessions, "HTTP: MCP sessions (protocol 2025-11-25 and earlier) open at once, all callers together; past it the biggest holder's least recently used idle session ends")
	fs.IntVar(&cfg.MaxSessionsPerToken, "max-sessions-per-token", mcpgate.DefaultMaxSessionsPerToken, "HTTP: MCP sessions one token may have open; past it its least recently used idle session ends")
	fs.IntVar(&cfg.MaxCalls, "max-calls", mcpgate.DefaultMaxCalls, "HTTP: calls in progress at once, all callers together (429 over it)")
	fs.IntVar(&cfg.MaxCallsPerToken, "max-calls-per-token", mcpgate.DefaultMaxCallsPerToken, "HTTP: calls one token may have in progress (429 over it)")
	fs.Func("allow-origin", "HTTP: an origin (scheme://host[:port]) besides the endpoint's own whose browser pages may call it; repeat or separate with commas (a request with another Origin is refused, 403)", func(v string) error {
		for o := range strings.SplitSeq(v, ",") {
			if o = strings.TrimSpace(o); o != "" {
				cfg.AllowOrigins = append(cfg.AllowOrigins, o)
			}
		}
		return nil
	})
	fs.DurationVar(&cfg.SessionIdle, "session-idle", mcpgate.DefaultSessionIdle, "HTTP: an MCP session with no request for this long is closed")
	if err := fs.Parse(args); err != nil {
		return err
	}
	if err := envflag.Load(fs, configFile, envflag.Sources{Aliases: natsconn.EnvAliases}); err != nil {
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
	g, err := mcpgate.New(nc, cl, log, cfg)
	if err != nil {
		return err
	}

	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	lctx, cancel := context.WithTimeout(ctx, 15*time.Second)
	if err := g.Load(lctx); err != nil {
		log.Warn("no tool catalogue yet: serving without the workers' tools until it answers", zap.Error(err))
	}
	cancel()
	log.Info("tools", zap.Strings("served", g.Tools()))
	if *httpAddr == "" {
		return g.ServeStdio(ctx)
	}
	return g.ServeHTTP(ctx, *httpAddr, *drain, func(a net.Addr) {
		log.Info("mcp serving", zap.String("url", fmt.Sprintf("http://%s%s", a, mcpgate.HTTPPath)), zap.Int("tokens", cfg.Tokens.Len()))
	})
}
