package toolsfile

import (
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/idemgate/idemgate/pkg/effects"
	"github.com/idemgate/idemgate/pkg/intent"
)

func TestPolicyParse(t *testing.T) {
	t.Parallel()
	reg, err := Parse([]byte(`tools:
  lookup: {effect: noop, class: read}
  set_status: {effect: noop, class: idempotent}
  set_flag: {effect: noop, class: idempotent, ledger: false}
  plain: {effect: noop, key_args: [id]}
  charge: {effect: noop, class: unsafe, key_args: [order], approval: required, approval_ttl: 15m, on_abandoned: hold, max_in_flight: 4}
  rerun: {effect: noop, key_args: [id], on_failure: retry, on_complete: reject}
`))
	require.NoError(t, err)
	want := map[string]effects.Policy{
		"lookup": {Class: intent.ClassRead, Ledger: false, ApprovalTTL: effects.DefaultApprovalTTL, OnAbandoned: intent.AbandonRetry,
			OnFailure: intent.OnFailureReplay, OnComplete: intent.OnCompleteReplay},
		"set_status": {Class: intent.ClassIdempotent, Ledger: true, ApprovalTTL: effects.DefaultApprovalTTL, OnAbandoned: intent.AbandonRetry,
			OnFailure: intent.OnFailureReplay, OnComplete: intent.OnCompleteReplay},
		"set_flag": {Class: intent.ClassIdempotent, Ledger: false, ApprovalTTL: effects.DefaultApprovalTTL, OnAbandoned: intent.AbandonRetry,
			OnFailure: intent.OnFailureReplay, OnComplete: intent.OnCompleteReplay},
		"plain": effects.DefaultPolicy(),
		"charge": {Class: intent.ClassUnsafe, Ledger: true, Approval: true, ApprovalTTL: 15 * time.Minute, OnAbandoned: intent.AbandonHold, MaxInFlight: 4,
			OnFailure: intent.OnFailureReplay, OnComplete: intent.OnCompleteReplay},
		"rerun": {Class: intent.ClassUnsafe, Ledger: true, ApprovalTTL: effects.DefaultApprovalTTL, OnAbandoned: intent.AbandonRetry,
			OnFailure: intent.OnFailureRetry, OnComplete: intent.OnCompleteReject},
	}
	for name, p := range want {
		tool, ok := reg.Lookup(name)
		require.True(t, ok, name)
		require.Equal(t, p, tool.Policy, name)
	}
	lookup, _ := reg.Lookup("lookup")
	require.True(t, lookup.Policy.SafeToRetry())
	plain, _ := reg.Lookup("plain")
	require.False(t, plain.Policy.SafeToRetry())
}

func TestPolicyErrors(t *testing.T) {
	t.Parallel()
	cases := []struct{ name, tool, want string }{
		{"class", `{effect: noop, class: write}`, `tools.yaml:2: t.class: unknown class "write" (use read, idempotent or unsafe)`},
		{"unsafe without ledger", `{effect: noop, ledger: false}`, `tools.yaml:2: t.ledger: an unsafe tool needs the ledger`},
		{"read with ledger", `{effect: noop, class: read, ledger: true}`, `tools.yaml:2: t.ledger: a read never uses the ledger`},
		{"approval value", `{effect: noop, approval: maybe}`, `tools.yaml:2: t.approval: unknown approval "maybe" (use required or none)`},
		{"approval ttl alone", `{effect: noop, approval_ttl: 1h}`, `tools.yaml:2: t.approval_ttl: is set but approval is not required`},
		{"approval on a read", `{effect: noop, class: read, approval: required}`, `tools.yaml:2: t.approval: an approval needs the ledger`},
		{"on_abandoned", `{effect: noop, on_abandoned: ask}`, `tools.yaml:2: t.on_abandoned: unknown policy "ask" (use retry or hold)`},
		{"hold without ledger", `{effect: noop, class: read, on_abandoned: hold}`, `tools.yaml:2: t.on_abandoned: hold needs the ledger`},
		{"max_in_flight", `{effect: noop, max_in_flight: 0}`, `tools.yaml:2: t.max_in_flight: must be at least 1`},
		{"on_failure", `{effect: noop, on_failure: again}`, `tools.yaml:2: t.on_failure: unknown policy "again" (use replay or retry)`},
		{"on_complete", `{effect: noop, on_complete: refuse}`, `tools.yaml:2: t.on_complete: unknown policy "refuse" (use replay or reject)`},
		{"on_complete without ledger", `{effect: noop, class: read, on_complete: reject}`, `tools.yaml:2: t.on_complete: a re-run policy needs the ledger`},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			_, err := Parse([]byte("tools:\n  t: " + c.tool + "\n"))
			require.ErrorContains(t, err, c.want)
		})
	}
}

func TestTooManyTools(t *testing.T) {
	t.Parallel()
	var b strings.Builder
	b.WriteString("tools:\n")
	for i := range MaxTools + 1 {
		fmt.Fprintf(&b, "  t%d: {effect: noop, key_args: [id]}\n", i)
	}
	_, err := Parse([]byte(b.String()))
	require.ErrorContains(t, err, fmt.Sprintf("tools.yaml:%d: tools: %d tools, more than the limit of %d", MaxTools+2, MaxTools+1, MaxTools))
}
