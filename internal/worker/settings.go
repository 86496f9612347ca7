package worker

import (
	"errors"
	"fmt"
	"io"
	"net/netip"
	"path/filepath"
	"strings"

	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"
	"go.uber.org/zap"

	"github.com/idemgate/idemgate/internal/natsrv"
	"github.com/idemgate/idemgate/pkg/effects/netguard"
	"github.com/idemgate/idemgate/pkg/effects/toolsfile"
)

// Settings are a worker process's settings as cmd/worker's flags, the
// environment and a config file give them, before the rules that join them
// (Resolve). A process is a Worker, the tools it fires and, with no NATS
// URL, its own embedded JetStream server.
type Settings struct {
	// Config is the worker's configuration as given. Unlike Config's own
	// zero values, a 0 here for LedgerScan, AnswerCache or LedgerBatch
	// means off (the operator wrote 0), not the default.
	Config Config

	// LedgerBatchGiven says the ledger batch was given explicitly (on the
	// command line, in the environment or the config file), not left at
	// its default.
	LedgerBatchGiven bool

	// AsyncIntents creates the work stream with asynchronous persistence
	// (Config.SyncIntents is its negation).
	AsyncIntents bool

	// AuditKey is the audit key file; empty: the default beside the store
	// directory (Resolve).
	AuditKey string

	// ReplyPrefixes and WebhookAllow are comma-separated lists: the
	// subject prefixes answers may go to, and the CIDRs every webhook and
	// mcp url upstream may reach besides public addresses.
	ReplyPrefixes, WebhookAllow string

	// NATSURL is the server to connect to; empty runs an embedded one.
	NATSURL string

	// Embedded is the embedded server's store, address, sync policy and
	// config file. Its store directory also places the default audit key,
	// embedded server or not.
	Embedded natsrv.Config
}

// Plan is what a worker process builds: Settings with their rules applied.
type Plan struct {
	// Config is the worker's configuration, for New.
	Config Config
	// Embedded is the JetStream server to start (StartEmbedded); nil:
	// connect to Settings.NATSURL.
	Embedded *natsrv.Config
	// WebhookAllow are the private prefixes the tools' webhook and mcp url
	// upstreams may reach (toolsfile.WithAllowPrivate).
	WebhookAllow []netip.Prefix
}

// Resolve applies the rules that join a process's settings:
//
//   - A LedgerScan, AnswerCache or LedgerBatch of 0 turns the feature off
//     (NoLedgerScan, NoAnswerCache, NoLedgerBatch): to an operator 0 is off,
//     to Config it is the default.
//   - With no AuditKey, the key is audit.key in the parent of the store
//     directory (data/jetstream: data/audit.key), embedded server or not.
//   - Intents are synced unless AsyncIntents (Config.SyncIntents).
//   - An embedded store that does not sync every write (Sync other than
//     natsrv.SyncAlways) turns the ledger's group commit off, unless the
//     batch was given (LedgerBatchGiven): its fixed cost per batch would
//     buy nothing there. With a NATSURL the batch stays as given.
//   - ReplyPrefixes and WebhookAllow are comma-separated; blanks around and
//     between items are dropped. A CIDR that does not parse is an error,
//     "--webhook-allow: ...".
//   - With no NATSURL the process runs the embedded server Embedded says.
//
// Config's own defaults and validation are New's: Resolve leaves the other
// fields as they are.
func (s Settings) Resolve() (Plan, error) {
	cfg := s.Config
	if cfg.LedgerScan == 0 {
		cfg.LedgerScan = NoLedgerScan
	}
	cfg.AuditKey = s.AuditKey
	if cfg.AuditKey == "" {
		cfg.AuditKey = filepath.Join(filepath.Dir(filepath.Clean(s.Embedded.StoreDir)), "audit.key")
	}
	if cfg.AnswerCache == 0 {
		cfg.AnswerCache = NoAnswerCache
	}
	cfg.SyncIntents = !s.AsyncIntents
	switch {
	case cfg.LedgerBatch == 0:
		cfg.LedgerBatch = NoLedgerBatch
	case !s.LedgerBatchGiven && s.NATSURL == "" && s.Embedded.Sync != natsrv.SyncAlways:
		cfg.LedgerBatch = NoLedgerBatch
	}
	for p := range strings.SplitSeq(s.ReplyPrefixes, ",") {
		if p = strings.TrimSpace(p); p != "" {
			cfg.ReplyPrefixes = append(cfg.ReplyPrefixes, p)
		}
	}
	allow, err := netguard.ParsePrefixes(strings.Split(s.WebhookAllow, ","))
	if err != nil {
		return Plan{}, fmt.Errorf("--webhook-allow: %w", err)
	}
	plan := Plan{Config: cfg, WebhookAllow: allow}
	if s.NATSURL == "" {
		embedded := s.Embedded
		plan.Embedded = &embedded
	}
	return plan, nil
}

// StartEmbedded starts the embedded JetStream server cfg describes and logs
// its client URL, store and sync policy ("embedded JetStream"). The errors
// say how to get past them: an address in use names --listen (and make
// run's NATS_PORT), a store another server holds names --store-dir.
func StartEmbedded(cfg natsrv.Config, log *zap.Logger) (*server.Server, error) {
	srv, err := natsrv.Start(cfg)
	if err != nil {
		return nil, explainEmbedded(err)
	}
	log.Info("embedded JetStream", zap.String("url", srv.ClientURL()), zap.String("store_dir", cfg.StoreDir), zap.String("sync", cfg.Sync))
	return srv, nil
}

// explainEmbedded adds to an error of natsrv.Start how to get past it.
func explainEmbedded(err error) error {
	switch {
	case errors.Is(err, natsrv.ErrAddrInUse):
		return fmt.Errorf("%w (is another worker or nats-server running? stop it, or listen elsewhere with --listen, e.g. --listen 127.0.0.1:4223; make run takes NATS_PORT=4223)", err)
	case errors.Is(err, natsrv.ErrStoreLocked):
		return fmt.Errorf("%w: two servers on one store would corrupt it (stop the other worker, or give this one its own --store-dir)", err)
	}
	return err
}

// CheckTools validates the tools file (cmd/worker --check-config): it
// prints each warning ("warning: ...") and then "<file>: N tools, ok",
// with " (N warnings)" when there are any, to out. The nats effect is
// built on a connection that is never opened.
func CheckTools(out io.Writer, file string, opts ...toolsfile.Option) error {
	tools, err := toolsfile.LoadFile(file, append([]toolsfile.Option{toolsfile.WithNATSConn(new(nats.Conn))}, opts...)...)
	if err != nil {
		return err
	}
	for _, w := range tools.Warnings() {
		fmt.Fprintf(out, "warning: %s\n", w)
	}
	fmt.Fprintf(out, "%s: %d tools, ok", file, len(tools.Names()))
	if n := len(tools.Warnings()); n > 0 {
		fmt.Fprintf(out, " (%d warnings)", n)
	}
	fmt.Fprintln(out)
	return tools.Close()
}
