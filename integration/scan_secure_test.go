package integration

import (
	"fmt"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// The worker's ledger scan (counting unresolved records, giving old ones
// their TTL, probing uncertain ones) reads the ledger through a consumer of
// its own under the shipped worker user: the scan completes, and NATS
// refuses it nothing.
func TestSecureWorkerScansLedger(t *testing.T) {
	t.Parallel()
	s := startSecure(t, "users.conf")
	admin := fmt.Sprintf("127.0.0.1:%d", freePort(t))
	w := launchWorker(t, "worker", []string{
		"--tools", writeTools(t, "tools:\n  echo:\n    effect: noop\n    key_args: all\n"), "--holder", "worker",
		"--ledger-scan", "1s", "--admin-addr", admin,
		"--nats-url", s.url, "--nats-tls-ca", s.ca.certPEM, "--nats-user", "worker", "--nats-inbox-prefix", "_INBOX.worker",
	}, []string{"IDEMGATE_NATS_PASSWORD=" + s.password(t, "worker")})
	w.waitLog(t, "worker consuming", 20*time.Second)
	submitAs(t, s.connect(t, "agent-1"), `{"n":1}`)

	// Until a scan completes or NATS refuses the worker something.
	for scrape(t, admin)["idemgate_ledger_scans_total"] < 1 {
		require.Empty(t, s.violations(), "the worker's ledger scan was refused")
		select {
		case <-t.Context().Done():
			t.Fatal("no ledger scan completed")
		case <-time.After(100 * time.Millisecond):
		}
	}
	require.Empty(t, s.violations(), "the worker was refused nothing")
}
