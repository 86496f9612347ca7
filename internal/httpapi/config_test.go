package httpapi

import (
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/idemgate/idemgate/internal/auth"
)

func TestConfigValidate(t *testing.T) {
	t.Parallel()
	ts, err := auth.ParseTokens(strings.NewReader(strings.Repeat("a", 64) + " agent a"))
	require.NoError(t, err)
	for _, c := range []struct {
		cfg  Config
		want string
	}{
		{Config{}, "no tokens"},
		{Config{Tokens: ts, Addr: "8080"}, "use host:port"},
		{Config{Tokens: ts, Addr: ":8080"}, "is not loopback"},
		{Config{Tokens: ts, Addr: "0.0.0.0:8080"}, "is not loopback"},
		{Config{Tokens: ts, Addr: "10.0.0.1:8080", TLSCert: "c.pem"}, "needs its key"},
		{Config{Tokens: ts, Burst: -1}, "burst -1"},
		{Config{Tokens: ts, DefaultWait: time.Hour}, "at most the max wait"},
	} {
		c.cfg.setDefaults()
		require.ErrorContains(t, c.cfg.validate(), c.want)
	}
	for _, ok := range []Config{
		{Tokens: ts},
		{Tokens: ts, Addr: "localhost:0"},
		{Tokens: ts, Addr: "[::1]:8080"},
		{Tokens: ts, Addr: "0.0.0.0:8080", InsecureListen: true},
		{Tokens: ts, Addr: "0.0.0.0:8443", TLSCert: "c.pem", TLSKey: "k.pem"},
	} {
		ok.setDefaults()
		require.NoError(t, ok.validate(), ok.Addr)
	}
}
