package natsconn_test

import (
	"bytes"
	"flag"
	"io"
	"os"
	"path/filepath"
	"sort"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"go.uber.org/zap"
	"go.uber.org/zap/zapcore"

	"github.com/idemgate/idemgate/internal/envflag"
	"github.com/idemgate/idemgate/internal/natsconn"
	"github.com/idemgate/idemgate/internal/natstest"
)

func TestValidateSaysWhichFlagToFix(t *testing.T) {
	dir := t.TempDir()
	notPEM := filepath.Join(dir, "ca.pem")
	require.NoError(t, os.WriteFile(notPEM, []byte("not a certificate"), 0o600))
	missing := filepath.Join(dir, "missing")
	t.Setenv(natsconn.PasswordEnv, "")
	for _, tc := range []struct {
		flags natsconn.Flags
		want  string
	}{
		{natsconn.Flags{Creds: "a.creds", User: "u", Password: "p"}, "--nats-creds, --nats-nkey and --nats-user each say who connects: give one of them"},
		{natsconn.Flags{Password: "p"}, "give --nats-user too"},
		{natsconn.Flags{User: "u"}, "set " + natsconn.PasswordEnv},
		{natsconn.Flags{TLSCert: "c.pem"}, "give both --nats-tls-cert and --nats-tls-key"},
		{natsconn.Flags{}, "--nats-timeout 0s: give a positive duration"},
		{natsconn.Flags{InboxPrefix: "_INBOX.>"}, "--nats-inbox-prefix \"_INBOX.>\": give a subject without wildcards"},
		{natsconn.Flags{Creds: missing}, "--nats-creds: open " + missing},
		{natsconn.Flags{NkeySeed: missing}, "--nats-nkey: open " + missing},
		{natsconn.Flags{TLSCA: missing}, "--nats-tls-ca: open " + missing},
		{natsconn.Flags{TLSCA: notPEM}, "holds no PEM certificate"},
		{natsconn.Flags{TLSCert: missing, TLSKey: missing}, "--nats-tls-cert and --nats-tls-key: open " + missing},
	} {
		if tc.flags.Timeout == 0 && tc.want[:14] != "--nats-timeout" {
			tc.flags.Timeout = time.Second
		}
		err := tc.flags.Validate()
		require.ErrorIs(t, err, natsconn.ErrInvalid)
		require.ErrorContains(t, err, tc.want)
		_, err = tc.flags.Options(nil)
		require.ErrorContains(t, err, tc.want, "Options validates")
	}
}

func TestPasswordComesFromTheEnvironment(t *testing.T) {
	t.Setenv(natsconn.PasswordEnv, "secret")
	f := natsconn.Flags{User: "u", Timeout: time.Second}
	require.NoError(t, f.Validate())
	require.Equal(t, "secret", f.Password)
}

// registered parses args (and the environment, under prefix TEST) into the
// connection flags of a command, returning them and the warnings printed.
func registered(t *testing.T, d natsconn.Defaults, args ...string) (*natsconn.Flags, *flag.FlagSet, string) {
	t.Helper()
	fs := flag.NewFlagSet("x", flag.ContinueOnError)
	var out bytes.Buffer
	fs.SetOutput(&out)
	f := natsconn.Register(fs, d)
	require.NoError(t, fs.Parse(args))
	require.NoError(t, envflag.Apply(fs, "TEST", natsconn.EnvAliases))
	return f, fs, out.String()
}

func TestRegisterNamesEveryConnectionFlagOnce(t *testing.T) {
	_, fs, _ := registered(t, natsconn.Defaults{OldTLSNames: true})
	var current, deprecated []string
	fs.VisitAll(func(f *flag.Flag) {
		if name, ok := envflag.Deprecated(f); ok {
			deprecated = append(deprecated, f.Name+"→"+name)
			return
		}
		current = append(current, f.Name)
	})
	sort.Strings(deprecated)
	require.Equal(t, []string{"nats-creds", "nats-inbox-prefix", "nats-name", "nats-nkey", "nats-timeout", "nats-tls-ca", "nats-tls-cert", "nats-tls-key", "nats-url", "nats-user"}, current)
	require.Equal(t, []string{"creds→nats-creds", "inbox-prefix→nats-inbox-prefix", "nkey→nats-nkey", "tls-ca→nats-tls-ca", "tls-cert→nats-tls-cert", "tls-key→nats-tls-key"}, deprecated)

	// The gateway's --tls-cert and --tls-key serve HTTPS: no old TLS names.
	_, fs, _ = registered(t, natsconn.Defaults{})
	require.Nil(t, fs.Lookup("tls-ca"))
	require.NotNil(t, fs.Lookup("creds"))
}

func TestRegisterDefaultsAndOldNames(t *testing.T) {
	t.Setenv("NATS_CREDS", "ecosystem.creds")
	f, _, warnings := registered(t, natsconn.Defaults{URL: "nats://a:4222", Name: "idemgate-x", Reconnect: true, OldTLSNames: true},
		"--tls-ca", "ca.pem", "--inbox-prefix", "_INBOX.x")
	require.Equal(t, "nats://a:4222", f.URL)
	require.Equal(t, "idemgate-x", f.Name)
	require.Equal(t, 2*time.Second, f.Timeout, "nats.DefaultTimeout")
	require.True(t, f.Reconnect)
	require.Equal(t, "ca.pem", f.TLSCA, "--tls-ca sets --nats-tls-ca")
	require.Equal(t, "_INBOX.x", f.InboxPrefix, "--inbox-prefix sets --nats-inbox-prefix")
	require.Equal(t, "ecosystem.creds", f.Creds, "NATS_CREDS")
	require.Contains(t, warnings, "--tls-ca is deprecated and goes in the next release: use --nats-tls-ca")
	require.Contains(t, warnings, "--inbox-prefix is deprecated and goes in the next release: use --nats-inbox-prefix")

	t.Setenv("TEST_CREDS", "old.creds")
	f, _, warnings = registered(t, natsconn.Defaults{})
	require.Equal(t, "old.creds", f.Creds, "the old IDEMGATE_ name wins over the ecosystem's")
	require.Contains(t, warnings, "TEST_CREDS is deprecated and goes in the next release: use TEST_NATS_CREDS")
}

func TestConnect(t *testing.T) {
	srv := natstest.RunServer(t)
	f := natsconn.Flags{URL: srv.ClientURL(), Name: "idemgate-test", Timeout: time.Second}
	nc, err := f.Connect(nil)
	require.NoError(t, err)
	defer nc.Close()
	require.Equal(t, "idemgate-test", nc.Opts.Name)
	require.Equal(t, time.Second, nc.Opts.Timeout)
	require.False(t, nc.Opts.RetryOnFailedConnect, "without Reconnect a failed first connection is an error")

	f.URL = "nats://127.0.0.1:1"
	_, err = f.Connect(nil)
	require.ErrorContains(t, err, "connect nats://127.0.0.1:1")
}

func TestConnectionEventsAreLogged(t *testing.T) {
	srv := natstest.RunServer(t)
	entries := make(chan zapcore.Entry, 16)
	log := zap.New(zapcore.NewCore(zapcore.NewJSONEncoder(zap.NewProductionEncoderConfig()), zapcore.AddSync(io.Discard), zapcore.DebugLevel), zap.Hooks(func(e zapcore.Entry) error {
		entries <- e
		return nil
	}))
	f := natsconn.Flags{URL: srv.ClientURL(), Name: "idemgate-test", Timeout: time.Second, Reconnect: true}
	nc, err := f.Connect(log)
	require.NoError(t, err)
	defer nc.Close()
	require.Equal(t, "NATS connected", (<-entries).Message)
	require.Equal(t, -1, nc.Opts.MaxReconnect, "Reconnect: forever")
	require.True(t, nc.Opts.RetryOnFailedConnect)
	srv.Shutdown()
	e := <-entries
	require.Equal(t, "NATS connection lost: reconnecting", e.Message)
	require.Equal(t, zapcore.WarnLevel, e.Level)
}
