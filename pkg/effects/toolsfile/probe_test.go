package toolsfile_test

import (
	"strings"
	"testing"

	"github.com/nats-io/nats.go"
	"github.com/stretchr/testify/require"

	"github.com/idemgate/idemgate/pkg/effects/natsservice"
	"github.com/idemgate/idemgate/pkg/effects/toolsfile"
	"github.com/idemgate/idemgate/pkg/effects/webhook"
)

func TestParseProbe(t *testing.T) {
	t.Parallel()
	r := parse(t, `tools:
  refund:
    effect: webhook
    key_args: [order]
    webhook: {url: https://api.example/refunds}
    probe:
      url: https://api.example/refunds?idempotency_key={key}
      timeout: 2s
      done: {status: [200, 201]}
      not_done: {status: 404}
  billing:
    effect: nats
    key_args: [order]
    nats: {subject: svc.billing}
    probe: {subject: svc.billing.probe, timeout: 2s}
  plain:
    effect: webhook
    key_args: [order]
    webhook: {url: https://api.example/x}
`, toolsfile.WithNATSConn(new(nats.Conn)))
	billing, _ := r.Lookup("billing")
	require.IsType(t, &natsservice.Prober{}, billing.Prober)
	refund, ok := r.Lookup("refund")
	require.True(t, ok)
	require.IsType(t, &webhook.Prober{}, refund.Prober)
	plain, _ := r.Lookup("plain")
	require.Nil(t, plain.Prober, "no probe unless the tool declares one")
}

func TestParseProbeErrors(t *testing.T) {
	t.Parallel()
	const head = "tools:\n  t:\n    effect: webhook\n    key_args: [a]\n    webhook: {url: https://h/x}\n"
	for _, tc := range []struct {
		name string
		file string
		want []string
	}{
		{"NoURL", head + "    probe:\n      timeout: 2s\n", []string{`tools.yaml:6: t.probe.url: is missing (write e.g. https://api.example/refunds?idempotency_key={key})`}},
		{"Empty", head + "    probe: {}\n", []string{`tools.yaml:6: t.probe: is empty`}},
		{"BadStatus", head + "    probe:\n      url: https://h/p/{key}\n      done: {status: ok}\n", []string{`tools.yaml:8: t.probe.done.status: "ok" is not an HTTP status (write e.g. done: {status: 200}`}},
		{"NoStatus", head + "    probe:\n      url: https://h/p/{key}\n      not_done: {code: 404}\n", []string{`tools.yaml:8: t.probe.not_done: has no status`, `tools.yaml:8: t.probe.not_done.code: unknown field`}},
		{"TwoMeanings", head + "    probe:\n      url: https://h/p/{key}\n      not_done: {status: 200}\n", []string{`tools.yaml:8: t.probe.not_done: status 200 also means done`}},
		{"KeyInHost", head + "    probe:\n      url: https://{key}.h/p\n", []string{`tools.yaml:7: t.probe.url: has {key} before its path`}},
		{"Typo", head + "    probe:\n      url: https://h/p/{key}\n      timout: 2s\n", []string{`tools.yaml:8: t.probe.timout: unknown field (did you mean timeout?)`}},
		{"ZeroTimeout", head + "    probe:\n      url: https://h/p/{key}\n      timeout: 0s\n", []string{`tools.yaml:8: t.probe.timeout: must be positive`}},
		{"NoLedger", "tools:\n  t:\n    effect: webhook\n    class: read\n    webhook: {url: https://h/x}\n    probe: {url: https://h/p}\n", []string{`tools.yaml:6: t.probe: a tool without the ledger is never taken over`}},
		{"NATSSubject", "tools:\n  t:\n    effect: nats\n    key_args: [a]\n    nats: {subject: svc.t}\n    probe:\n      subject: svc.>\n", []string{`tools.yaml:7: t.probe.subject: "svc.>" holds a wildcard`}},
		{"NotProbeable", "tools:\n  t:\n    effect: noop\n    key_args: [a]\n    probe:\n      url: https://h/p\n", []string{`tools.yaml:5: t.probe: the noop effect cannot be probed`}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			r, err := toolsfile.Parse([]byte(tc.file), toolsfile.WithNATSConn(new(nats.Conn)))
			require.Nil(t, r)
			require.ErrorIs(t, err, toolsfile.ErrConfig)
			lines := strings.Split(err.Error(), "\n")
			require.Len(t, lines, len(tc.want), "errors: %v", err)
			for i, want := range tc.want {
				require.True(t, strings.HasPrefix(lines[i], want), "error %d:\n got  %s\n want %s...", i, lines[i], want)
			}
		})
	}
}
