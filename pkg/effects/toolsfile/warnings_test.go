package toolsfile_test

import (
	"net/netip"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/idemgate/idemgate/pkg/effects/toolsfile"
)

func TestRegistryWarnings(t *testing.T) {
	t.Parallel()
	r := parse(t, `tools:
  create_ticket:
    effect: noop
    key_args:
      - title
      - requested_at
  charge:
    effect: noop
    key_args: [customer, attempt, trace_id]
  book_table:
    effect: noop
    key_args: [date, party]
  local_hook:
    effect: webhook
    class: idempotent
    webhook: {url: "http://127.0.0.1:8787/x"}
  private_hook:
    effect: webhook
    class: idempotent
    webhook: {url: "https://10.1.2.3/x"}
  localhost_hook:
    effect: webhook
    class: idempotent
    webhook: {url: "http://localhost:9000/x"}
  allowed_hook:
    effect: webhook
    class: idempotent
    webhook: {url: "http://127.0.0.1:8787/x", allow_private: [127.0.0.1/32]}
  public_hook:
    effect: webhook
    class: idempotent
    webhook: {url: "https://hooks.example.com/x"}
`)
	var got []string
	for _, w := range r.Warnings() {
		got = append(got, w.String())
	}
	require.Len(t, got, 7, strings.Join(got, "\n"))
	require.Contains(t, got[0], `tools.yaml:6: create_ticket.key_args[1]: "requested_at" looks like a timestamp`)
	require.Contains(t, got[1], `tools.yaml:9: charge.key_args[1]: "attempt" looks like an attempt counter`)
	require.Contains(t, got[2], `tools.yaml:9: charge.key_args[2]: "trace_id" looks like a trace id`)
	require.Contains(t, got[3], `tools.yaml:12: book_table.key_args[0]: "date" looks like a timestamp`)
	require.Contains(t, got[3], "ignore this warning")
	require.Contains(t, got[4], `tools.yaml:16: local_hook.webhook.url: http://127.0.0.1:8787/x names 127.0.0.1, a loopback address`)
	require.Contains(t, got[4], "allow_private: [127.0.0.1/32]")
	require.Contains(t, got[5], `tools.yaml:20: private_hook.webhook.url:`)
	require.Contains(t, got[5], "a private address")
	require.Contains(t, got[6], `tools.yaml:24: localhost_hook.webhook.url:`)

	// The worker's --webhook-allow covers them: no webhook warning.
	r = parse(t, `tools:
  local_hook:
    effect: webhook
    class: idempotent
    webhook: {url: "http://127.0.0.1:8787/x"}
`, toolsfile.WithAllowPrivate(netip.MustParsePrefix("127.0.0.0/8")))
	require.Empty(t, r.Warnings())

	// Declared volatile, or not in the key: no warning.
	r = parse(t, `tools:
  create_ticket:
    effect: noop
    key_args: all
    volatile_args: [requested_at]
  send_email:
    effect: noop
    key_args: [to, subject]
    volatile_args: [sent_at]
`)
	require.Empty(t, r.Warnings())
}
