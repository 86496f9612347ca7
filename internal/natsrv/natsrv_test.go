package natsrv_test

import (
	"fmt"
	"net"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"
	"github.com/stretchr/testify/require"

	"github.com/idemgate/idemgate/internal/natsconn"
	"github.com/idemgate/idemgate/internal/natsrv"
)

// A config file brings users and permissions; Listen, StoreDir and Sync
// replace what it says about them.
func TestStartWithConfigFile(t *testing.T) {
	t.Parallel()
	conf := filepath.Join(t.TempDir(), "server.conf")
	require.NoError(t, os.WriteFile(conf, []byte(`
server_name: from-file
port: 4999
jetstream { store_dir: /nonexistent, sync_interval: 2m }
authorization { users: [{user: w, password: pw}] }
`), 0o600))
	store := t.TempDir()
	s, err := natsrv.Start(natsrv.Config{StoreDir: store, Listen: "127.0.0.1:0", Sync: natsrv.SyncLazy, ConfigFile: conf})
	require.NoError(t, err)
	t.Cleanup(func() { s.Shutdown(); s.WaitForShutdown() })
	require.Equal(t, "from-file", s.Name())
	require.NotContains(t, s.ClientURL(), ":4999")
	require.Equal(t, filepath.Join(store, "jetstream"), s.JetStreamConfig().StoreDir)
	require.False(t, s.JetStreamConfig().SyncAlways)

	_, err = nats.Connect(s.ClientURL())
	require.ErrorIs(t, err, nats.ErrAuthorization, "anonymous clients are refused")
	nc, err := (&natsconn.Flags{URL: s.ClientURL(), User: "w", Password: "pw", InboxPrefix: "_INBOX.w", Timeout: time.Second}).Connect(nil)
	require.NoError(t, err)
	nc.Close()

	_, err = natsrv.Start(natsrv.Config{StoreDir: store, Listen: "127.0.0.1:0", ConfigFile: filepath.Join(t.TempDir(), "missing.conf")})
	require.ErrorContains(t, err, "natsrv: server config")
}

// A taken client address fails at once, naming the address; nothing is
// left running.
func TestStartAddressInUse(t *testing.T) {
	t.Parallel()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	t.Cleanup(func() { _ = ln.Close() })
	start := time.Now()
	_, err = natsrv.Start(natsrv.Config{StoreDir: t.TempDir(), Listen: ln.Addr().String()})
	require.ErrorIs(t, err, natsrv.ErrAddrInUse)
	require.ErrorContains(t, err, ln.Addr().String())
	require.Less(t, time.Since(start), 5*time.Second, "at once, not after the 30s readiness wait")
}

// Two servers on one store directory: the second is refused, naming the
// first's process; once the first has shut down the store is free again.
func TestStartStoreLocked(t *testing.T) {
	t.Parallel()
	store := t.TempDir()
	first, err := natsrv.Start(natsrv.Config{StoreDir: store, Listen: "127.0.0.1:0"})
	require.NoError(t, err)
	_, err = natsrv.Start(natsrv.Config{StoreDir: store, Listen: "127.0.0.1:0"})
	require.ErrorIs(t, err, natsrv.ErrStoreLocked)
	require.ErrorContains(t, err, fmt.Sprintf("process %d", os.Getpid()))
	require.ErrorContains(t, err, store)

	first.Shutdown()
	first.WaitForShutdown()
	var again *server.Server
	require.Eventually(t, func() bool {
		again, err = natsrv.Start(natsrv.Config{StoreDir: store, Listen: "127.0.0.1:0"})
		return err == nil
	}, 10*time.Second, 20*time.Millisecond, "the store is released at shutdown: %v", err)
	again.Shutdown()
	again.WaitForShutdown()
}
