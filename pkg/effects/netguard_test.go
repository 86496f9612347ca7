package effects_test

import (
	"context"
	"errors"
	"io"
	"net/http"
	"net/netip"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/idemgate/idemgate/pkg/effects"
)

func TestNetGuardRefusesNonPublicAddresses(t *testing.T) {
	t.Parallel()
	g := effects.NewNetGuard()
	for _, tc := range []struct {
		addr, what string
	}{
		{"127.0.0.1", "loopback"},
		{"127.255.0.9", "loopback"},
		{"::1", "loopback"},
		{"::ffff:127.0.0.1", "loopback"},
		{"10.1.2.3", "private"},
		{"172.16.0.1", "private"},
		{"172.31.255.255", "private"},
		{"192.168.1.1", "private"},
		{"fd00:ec2::254", "private"},
		{"169.254.169.254", "link-local"},
		{"::ffff:169.254.169.254", "link-local"},
		{"fe80::1", "link-local"},
		{"0.0.0.0", "unspecified"},
		{"::", "unspecified"},
		{"0.1.2.3", "this-network"},
		{"224.0.0.1", "multicast"},
		{"239.1.1.1", "multicast"},
		{"ff02::1", "multicast"},
		{"100.64.0.1", "shared address space (CGNAT)"},
		{"100.100.100.200", "shared address space (CGNAT)"},
		{"192.0.0.192", "IETF protocol assignments"},
		{"255.255.255.255", "reserved or broadcast"},
		{"64:ff9b::a00:1", "NAT64 (reaches IPv4 addresses)"},
		{"64:ff9b::808:808", "NAT64 (reaches IPv4 addresses)"},
		{"64:ff9b:1::7f00:1", "local NAT64"},
		{"fec0::1", "site-local"},
		{"::7f00:1", "IPv4-compatible (reaches IPv4 addresses)"},
		{"::a9fe:a9fe", "IPv4-compatible (reaches IPv4 addresses)"},
		{"::ffff:0:7f00:1", "IPv4-translated, SIIT (reaches IPv4 addresses)"},
		{"::ffff:0:a9fe:a9fe", "IPv4-translated, SIIT (reaches IPv4 addresses)"},
		{"2002:7f00:1::1", "6to4 (reaches IPv4 addresses)"},
		{"2002:a9fe:a9fe::", "6to4 (reaches IPv4 addresses)"},
		{"2001:0:4136:e378:8000:63bf:80ff:fffe", "Teredo (reaches IPv4 addresses)"},
		{"100::1", "discard-only"},
		{"192.88.99.1", "6to4 relay anycast (reaches IPv6 through IPv4)"},
	} {
		err := g.Check(netip.MustParseAddr(tc.addr))
		require.ErrorIs(t, err, effects.ErrForbiddenDestination, tc.addr)
		var de *effects.DestinationError
		require.True(t, errors.As(err, &de), tc.addr)
		require.Equal(t, tc.what, de.What, tc.addr)
	}
	for _, ok := range []string{"93.184.215.14", "8.8.8.8", "172.32.0.1", "100.128.0.1", "2606:4700::1111", "::ffff:8.8.8.8",
		"2001:4860:4860::8888" /* not Teredo: 2001:0::/32 only */, "2003::1", "192.88.100.1"} {
		require.NoError(t, g.Check(netip.MustParseAddr(ok)), ok)
	}
}

func TestNetGuardAllowlist(t *testing.T) {
	t.Parallel()
	allow, err := effects.ParsePrefixes([]string{" 127.0.0.1 ", "10.0.0.0/8", "", "fd00::/8"})
	require.NoError(t, err)
	g := effects.NewNetGuard(allow...)
	for _, ok := range []string{"127.0.0.1", "::ffff:127.0.0.1", "10.200.3.4", "fd12::1"} {
		require.NoError(t, g.Check(netip.MustParseAddr(ok)), ok)
	}
	for _, no := range []string{"127.0.0.2", "192.168.0.1", "169.254.169.254", "fc00::1"} {
		require.ErrorIs(t, g.Check(netip.MustParseAddr(no)), effects.ErrForbiddenDestination, no)
	}
	// Control sees the dialled ip:port.
	require.NoError(t, g.Control("tcp4", "10.0.0.1:443", nil))
	require.ErrorIs(t, g.Control("tcp6", "[fe80::1%eth0]:80", nil), effects.ErrForbiddenDestination)
	require.ErrorIs(t, g.Control("tcp", "not-an-address", nil), effects.ErrForbiddenDestination)

	_, err = effects.ParsePrefixes([]string{"10.0.0.0/33", "localhost"})
	require.ErrorContains(t, err, `"10.0.0.0/33" is not a CIDR prefix`)
	require.ErrorContains(t, err, `"localhost" is not an IP address`)
}

// A webhook without an allowlist refuses loopback at dial time — even when
// the URL names a host ("localhost") that only resolves to loopback — and
// fails permanently without sending anything.
func TestWebhookRefusesLoopbackByDefault(t *testing.T) {
	t.Parallel()
	b := setupWebhook(t, status(http.StatusOK))
	port := b.srv.URL[strings.LastIndexByte(b.srv.URL, ':')+1:]
	for _, u := range []string{b.srv.URL + "/x?token=s3cret", "http://localhost:" + port + "/x"} {
		w, err := effects.NewWebhook(effects.WebhookConfig{URL: u})
		require.NoError(t, err)
		t.Cleanup(func() { _ = w.Close() })
		out, err := w.Fire(context.Background(), testCall)
		require.ErrorIs(t, err, effects.ErrPermanent, u)
		require.ErrorIs(t, err, effects.ErrForbiddenDestination, u)
		require.Equal(t, 1, out.Invocations, "refused once, not retried")
		pe, _ := effects.IsPermanent(err)
		require.Contains(t, pe.Message, "is loopback and not allowed")
		require.Contains(t, pe.Message, "allow_private")
		require.NotContains(t, pe.Message, "s3cret")
	}
	require.Empty(t, b.requests(), "nothing reached the server")

	// The same server, allowed explicitly.
	w, err := effects.NewWebhook(effects.WebhookConfig{URL: "http://localhost:" + port + "/x", AllowPrivate: []netip.Prefix{netip.MustParsePrefix("127.0.0.1/32"), netip.MustParsePrefix("::1/128")}})
	require.NoError(t, err)
	t.Cleanup(func() { _ = w.Close() })
	_, err = w.Fire(context.Background(), testCall)
	require.NoError(t, err)
	require.Len(t, b.requests(), 1)
}

// Secrets of the configuration never reach a message: not the URL's
// credentials or query, not a static header echoed back in an error body.
func TestWebhookErrorsHideSecrets(t *testing.T) {
	t.Parallel()
	b := setupWebhook(t, func(_ int, w http.ResponseWriter, r *http.Request) {
		w.WriteHeader(http.StatusUnauthorized)
		_, _ = io.WriteString(w, "bad credentials: "+r.Header.Get("Authorization")+" key="+r.Header.Get("X-Api-Key")+" q="+r.URL.RawQuery)
	})
	u := strings.Replace(b.srv.URL, "http://", "http://hookuser:pa55word@", 1) + "/hooks?sig=abcdef123"
	w := newWebhook(t, effects.WebhookConfig{URL: u, Headers: map[string]string{"Authorization": "Bearer tok-9f8e7d", "X-Api-Key": "k-123456"}})
	_, err := w.Fire(context.Background(), testCall)
	pe, ok := effects.IsPermanent(err)
	require.True(t, ok, "%v", err)
	msg := pe.IntentError().Message
	require.Contains(t, msg, "401 Unauthorized")
	require.Contains(t, msg, "[redacted]")
	for _, secret := range []string{"tok-9f8e7d", "k-123456", "pa55word", "abcdef123", "hookuser"} {
		require.NotContains(t, msg, secret)
		require.NotContains(t, err.Error(), secret)
	}

	// A connection error names the URL without credentials or query.
	dead := newWebhook(t, effects.WebhookConfig{URL: "http://user:pa55word@127.0.0.1:1/x?sig=abcdef123", Retry: effects.RetryPolicy{MaxAttempts: 1}})
	_, err = dead.Fire(context.Background(), testCall)
	require.Error(t, err)
	require.NotContains(t, err.Error(), "pa55word")
	require.NotContains(t, err.Error(), "abcdef123")
}

func TestErrorMessagesAreCapped(t *testing.T) {
	t.Parallel()
	long := strings.Repeat("é", 3000)
	e := effects.Permanent("", long).(*effects.PermanentError).IntentError()
	require.LessOrEqual(t, len(e.Message), effects.MaxErrorMessage)
	require.True(t, strings.HasSuffix(e.Message, "…"))
	require.Equal(t, "short", effects.TruncateMessage("short", 10))
	require.Equal(t, "ab…", effects.TruncateMessage("abcdef", 5))
	require.Equal(t, "\uFFFD", effects.TruncateMessage("\xff", 10))
}

func TestToolsFileAllowPrivate(t *testing.T) {
	t.Parallel()
	b := setupWebhook(t, status(http.StatusOK))
	file := func(allow string) []byte {
		return []byte("tools:\n  t:\n    effect: webhook\n    key_args: [id]\n    webhook:\n      url: " + b.srv.URL + "/x\n      retry: {max_attempts: 1}\n" + allow)
	}
	fire := func(t *testing.T, reg *effects.Registry) error {
		t.Helper()
		t.Cleanup(func() { _ = reg.Close() })
		tool, ok := reg.Lookup("t")
		require.True(t, ok)
		_, err := tool.Effect.Fire(context.Background(), testCall)
		return err
	}

	reg, err := effects.Parse(file(""))
	require.NoError(t, err, "a loopback URL parses: the check is at dial time")
	require.ErrorIs(t, fire(t, reg), effects.ErrForbiddenDestination)

	reg, err = effects.Parse(file("      allow_private: [127.0.0.1/32]\n"))
	require.NoError(t, err)
	require.NoError(t, fire(t, reg))

	// The worker-wide list (--webhook-allow) reaches every webhook.
	reg, err = effects.Parse(file(""), effects.WithAllowPrivate(netip.MustParsePrefix("127.0.0.0/8")))
	require.NoError(t, err)
	require.NoError(t, fire(t, reg))

	_, err = effects.Parse(file("      allow_private: [127.0.0.1/32, intranet]\n"))
	require.ErrorContains(t, err, `tools.yaml:8: t.webhook.allow_private[1]: "intranet" is not an IP address or CIDR prefix (write e.g. 127.0.0.1/32 or 10.0.0.0/8)`)
	_, err = effects.Parse(file("      allow_private: 10.0.0.0/8\n"))
	require.ErrorContains(t, err, "t.webhook.allow_private: is \"10.0.0.0/8\", want a list")
}
