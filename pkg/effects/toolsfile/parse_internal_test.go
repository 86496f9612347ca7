package toolsfile

import (
	"context"
	"encoding/json"
	"errors"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/idemgate/idemgate/pkg/effects"
)

// The loader's seam for a kind (what the nats kind is added through).
func TestParseWithFactory(t *testing.T) {
	t.Parallel()
	var built []string
	read := func(s *section) (effects.Effect, error) {
		subject := s.String("subject", "")
		if subject == "" {
			s.Invalid("subject", "is missing", "write e.g. subject: svc.send")
		}
		built = append(built, subject)
		return effects.EffectFunc(func(context.Context, effects.Call) (effects.Outcome, error) {
			return effects.Outcome{Result: json.RawMessage(`"sent"`), Invocations: 1}, nil
		}), nil
	}
	r, err := Parse([]byte("tools:\n  t:\n    effect: queue\n    queue: {subject: svc.send}\n    key_args: [id]\n"), withKind("queue", read))
	require.NoError(t, err)
	t.Cleanup(func() { _ = r.Close() })
	tool, ok := r.Lookup("t")
	require.True(t, ok)
	require.Equal(t, "queue", tool.Kind)
	require.Equal(t, []string{"svc.send"}, built)

	_, err = Parse([]byte("tools:\n  t:\n    effect: queue\n    queue: {subjct: x}\n"),
		withKind("queue", read), WithFilename("conf/tools.yaml"))
	require.ErrorContains(t, err, "conf/tools.yaml:4: t.queue.subject: is missing (write e.g. subject: svc.send)")
	require.ErrorContains(t, err, "conf/tools.yaml:4: t.queue.subjct: unknown field (did you mean subject?)")

	_, err = Parse([]byte("tools:\n  t:\n    effect: queue\n"),
		withKind("queue", func(*section) (effects.Effect, error) { return nil, errors.New("no connection") }))
	require.ErrorContains(t, err, "tools.yaml:2: t.queue: no connection")

	_, err = Parse([]byte("tools:\n  t: {effect: noop}\n"), withKind("lease", read))
	require.ErrorContains(t, err, "tool field name")
	_, err = Parse([]byte("tools:\n  t: {effect: noop}\n"), withKind("Bad Kind", read))
	require.ErrorContains(t, err, "effect kind")
}
