package worker

import (
	"bytes"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"go.uber.org/zap"
	"go.uber.org/zap/zaptest/observer"

	"github.com/idemgate/idemgate/internal/natsrv"
	"github.com/idemgate/idemgate/pkg/effects/toolsfile"
)

// cmdSettings are Settings as cmd/worker's flag defaults give them.
func cmdSettings() Settings {
	return Settings{
		Config: Config{
			LedgerScan:  DefaultLedgerScan,
			AnswerCache: DefaultAnswerCache,
			LedgerBatch: DefaultLedgerBatch,
		},
		AsyncIntents:  true,
		ReplyPrefixes: DefaultReplyPrefix,
		Embedded:      natsrv.Config{StoreDir: "data/jetstream", Listen: "127.0.0.1:4222", Sync: natsrv.SyncAlways},
	}
}

// TestResolve: each rule of Settings.Resolve, from cmd/worker's defaults.
func TestResolve(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name   string
		change func(*Settings)
		check  func(*testing.T, Plan)
	}{
		{"defaults", func(*Settings) {}, func(t *testing.T, p Plan) {
			require.Equal(t, DefaultLedgerScan, p.Config.LedgerScan)
			require.Equal(t, DefaultAnswerCache, p.Config.AnswerCache)
			require.Equal(t, DefaultLedgerBatch, p.Config.LedgerBatch, "an embedded store at sync always batches")
			require.False(t, p.Config.SyncIntents)
			require.Equal(t, filepath.Join("data", "audit.key"), p.Config.AuditKey)
			require.Equal(t, []string{DefaultReplyPrefix}, p.Config.ReplyPrefixes)
			require.Empty(t, p.WebhookAllow)
			require.Equal(t, &natsrv.Config{StoreDir: "data/jetstream", Listen: "127.0.0.1:4222", Sync: natsrv.SyncAlways}, p.Embedded)
		}},
		{"zero ledger scan is off", func(s *Settings) { s.Config.LedgerScan = 0 }, func(t *testing.T, p Plan) {
			require.Equal(t, time.Duration(NoLedgerScan), p.Config.LedgerScan)
		}},
		{"zero answer cache is off", func(s *Settings) { s.Config.AnswerCache = 0 }, func(t *testing.T, p Plan) {
			require.Equal(t, time.Duration(NoAnswerCache), p.Config.AnswerCache)
		}},
		{"zero ledger batch is off", func(s *Settings) { s.Config.LedgerBatch, s.LedgerBatchGiven = 0, true }, func(t *testing.T, p Plan) {
			require.Equal(t, NoLedgerBatch, p.Config.LedgerBatch)
		}},
		{"lazy embedded store: batch off", func(s *Settings) { s.Embedded.Sync = natsrv.SyncLazy }, func(t *testing.T, p Plan) {
			require.Equal(t, NoLedgerBatch, p.Config.LedgerBatch)
		}},
		{"interval embedded store: batch off", func(s *Settings) { s.Embedded.Sync = "100ms" }, func(t *testing.T, p Plan) {
			require.Equal(t, NoLedgerBatch, p.Config.LedgerBatch)
		}},
		{"lazy embedded store, batch given: kept", func(s *Settings) {
			s.Embedded.Sync, s.Config.LedgerBatch, s.LedgerBatchGiven = natsrv.SyncLazy, 100, true
		}, func(t *testing.T, p Plan) {
			require.Equal(t, 100, p.Config.LedgerBatch)
		}},
		{"external server: batch kept, no embedded server", func(s *Settings) {
			s.NATSURL, s.Embedded.Sync = "nats://a:4222", natsrv.SyncLazy
		}, func(t *testing.T, p Plan) {
			require.Equal(t, DefaultLedgerBatch, p.Config.LedgerBatch)
			require.Nil(t, p.Embedded)
			require.Equal(t, filepath.Join("data", "audit.key"), p.Config.AuditKey, "beside the store, embedded or not")
		}},
		{"sync intents", func(s *Settings) { s.AsyncIntents = false }, func(t *testing.T, p Plan) {
			require.True(t, p.Config.SyncIntents)
		}},
		{"audit key given", func(s *Settings) { s.AuditKey = "/keys/w.key" }, func(t *testing.T, p Plan) {
			require.Equal(t, "/keys/w.key", p.Config.AuditKey)
		}},
		{"audit key beside a store with a trailing slash", func(s *Settings) { s.Embedded.StoreDir = "/var/idem/js/" }, func(t *testing.T, p Plan) {
			require.Equal(t, "/var/idem/audit.key", p.Config.AuditKey)
		}},
		{"reply prefixes split and trimmed", func(s *Settings) { s.ReplyPrefixes = " _INBOX. , ,svc.replies.," }, func(t *testing.T, p Plan) {
			require.Equal(t, []string{"_INBOX.", "svc.replies."}, p.Config.ReplyPrefixes)
		}},
		{"webhook allow parsed", func(s *Settings) { s.WebhookAllow = "127.0.0.0/8, 10.1.0.0/16" }, func(t *testing.T, p Plan) {
			require.Equal(t, []netip.Prefix{netip.MustParsePrefix("127.0.0.0/8"), netip.MustParsePrefix("10.1.0.0/16")}, p.WebhookAllow)
		}},
		{"other fields untouched", func(s *Settings) { s.Config.Concurrency, s.Config.Prefix = 7, "X" }, func(t *testing.T, p Plan) {
			require.Equal(t, 7, p.Config.Concurrency)
			require.Equal(t, "X", p.Config.Prefix)
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			s := cmdSettings()
			tc.change(&s)
			p, err := s.Resolve()
			require.NoError(t, err)
			tc.check(t, p)
		})
	}
}

// TestResolveWebhookAllowError: a CIDR that does not parse names the flag.
func TestResolveWebhookAllowError(t *testing.T) {
	t.Parallel()
	s := cmdSettings()
	s.WebhookAllow = "127.0.0.0/8,nonsense"
	_, err := s.Resolve()
	require.ErrorContains(t, err, "--webhook-allow: ")
	require.ErrorContains(t, err, "nonsense")
}

// TestExplainEmbedded: the errors of an embedded server's start say how to
// get past them, and keep their cause.
func TestExplainEmbedded(t *testing.T) {
	t.Parallel()
	other := errors.New("boom")
	for _, tc := range []struct {
		err  error
		want string
	}{
		{fmt.Errorf("%w: 127.0.0.1:4222: another process listens on it", natsrv.ErrAddrInUse), " (is another worker or nats-server running? stop it, or listen elsewhere with --listen, e.g. --listen 127.0.0.1:4223; make run takes NATS_PORT=4223)"},
		{fmt.Errorf("%w: data is in use by 12", natsrv.ErrStoreLocked), ": two servers on one store would corrupt it (stop the other worker, or give this one its own --store-dir)"},
		{other, ""},
	} {
		got := explainEmbedded(tc.err)
		require.ErrorIs(t, got, tc.err)
		require.Equal(t, tc.err.Error()+tc.want, got.Error())
	}
}

// TestStartEmbedded: the server starts and its start is logged; a taken
// address is explained.
func TestStartEmbedded(t *testing.T) {
	t.Parallel()
	core, logs := observer.New(zap.InfoLevel)
	dir := t.TempDir()
	srv, err := StartEmbedded(natsrv.Config{StoreDir: dir, Listen: "127.0.0.1:0", Sync: natsrv.SyncLazy}, zap.New(core))
	require.NoError(t, err)
	t.Cleanup(func() { srv.Shutdown(); srv.WaitForShutdown() })
	entries := logs.FilterMessage("embedded JetStream").All()
	require.Len(t, entries, 1)
	fields := entries[0].ContextMap()
	require.Equal(t, map[string]any{"url": srv.ClientURL(), "store_dir": dir, "sync": natsrv.SyncLazy}, fields)

	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	t.Cleanup(func() { _ = ln.Close() })
	_, err = StartEmbedded(natsrv.Config{StoreDir: t.TempDir(), Listen: ln.Addr().String()}, zap.NewNop())
	require.ErrorIs(t, err, natsrv.ErrAddrInUse)
	require.ErrorContains(t, err, "listen elsewhere with --listen")
}

// TestCheckTools: warnings first, then the count, and the allowed private
// prefixes silence the warning they cover.
func TestCheckTools(t *testing.T) {
	t.Parallel()
	file := filepath.Join(t.TempDir(), "tools.yaml")
	require.NoError(t, os.WriteFile(file, []byte(`tools:
  create_ticket:
    effect: webhook
    key_args: [title]
    webhook: {url: "http://127.0.0.1:8787/tickets"}
`), 0o600))
	var out bytes.Buffer
	require.NoError(t, CheckTools(&out, file))
	require.Regexp(t, `^warning: .*tools\.yaml:5: create_ticket\.webhook\.url: .*loopback.*\n`+
		`.*tools\.yaml: 1 tools, ok \(1 warnings\)\n$`, out.String())

	out.Reset()
	require.NoError(t, CheckTools(&out, file, toolsfile.WithAllowPrivate(netip.MustParsePrefix("127.0.0.0/8"))))
	require.Equal(t, file+": 1 tools, ok\n", out.String())

	require.Error(t, CheckTools(&out, filepath.Join(t.TempDir(), "missing.yaml")))
}
