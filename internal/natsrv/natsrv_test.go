package natsrv_test

import (
	"os"
	"path/filepath"
	"testing"

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
	opts, err := natsconn.ClientAuth{User: "w", Password: "pw", InboxPrefix: "_INBOX.w"}.Options()
	require.NoError(t, err)
	nc, err := nats.Connect(s.ClientURL(), opts...)
	require.NoError(t, err)
	nc.Close()

	_, err = natsrv.Start(natsrv.Config{StoreDir: store, Listen: "127.0.0.1:0", ConfigFile: filepath.Join(t.TempDir(), "missing.conf")})
	require.ErrorContains(t, err, "natsrv: server config")
}
