package integration

import (
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/stretchr/testify/require"

	"github.com/idemgate/idemgate/pkg/intent"
)

// The retry rule (docs/protocol.md 7.2) goes on until an answer: a
// submission whose publish is a duplicate of a message that left no record
// publishes again after the grace, then after twice the grace, and so on.
// Here every republished copy that arrives while the session is over its
// rate is answered rate_limited, and that answer is lost (the workers may
// answer no client inbox: --reply-prefixes names none), so nothing but a
// further republish can end the wait; once the session's rate allows it,
// a copy fires, by this call, and the ledger answers. Go (submit) and
// TypeScript alike.
func TestClientsRepublishUntilAnswered(t *testing.T) {
	t.Parallel()
	dir := tsClient(t)
	url := jetStream(t)
	hook := newSink(t, nil)
	startWorker(t, "w1", url, writeTools(t, tsTools(hook.URL)),
		"--session-rate", "0.1", "--reply-prefixes", "_INBOX.nobody.") // one intent per 10 s and session; no reply reaches a client
	nc := connect(t, url)
	js, err := jetstreamFor(nc)
	require.NoError(t, err)
	args := `{"to":"ada@example.com","subject":"Welcome"}`
	prepare := func(session string) {
		k := submit(t, url, "key", "-q", "--tool", "send_email", "--session", session, "--args", args)
		require.Equal(t, 0, k.code, k.stderr)
		// A malformed intent takes the key's Nats-Msg-Id and ends with no
		// record: the submission's own publish is a duplicate of it.
		m := nats.NewMsg("idem.intents.send_email")
		m.Data = fmt.Appendf(nil, `{"tool":"send_email","session":%q,"args":{},"priority":"high"}`, session)
		m.Header.Set(intent.HeaderMsgID, strings.TrimSpace(k.stdout))
		_, err := js.PublishMsg(t.Context(), m)
		require.NoError(t, err)
		// Another operation of the session spends its rate: the copies
		// republished in the next 10 s are rate_limited.
		m = nats.NewMsg("idem.intents.send_email")
		m.Data = fmt.Appendf(nil, `{"tool":"send_email","session":%q,"args":{"to":"bob@example.com","subject":"Welcome"}}`, session)
		_, err = js.PublishMsg(t.Context(), m)
		require.NoError(t, err)
		hook.waitHit(t, time.Minute)
	}
	prepare("go-run")
	prepare("ts-run")

	goDone, tsDone := make(chan submitted, 1), make(chan submitted, 1)
	go func() {
		goDone <- submit(t, url, "--tool", "send_email", "--session", "go-run", "--args", args, "--wait", "50s")
	}()
	go func() {
		tsDone <- tsSubmit(t, dir, url, "--tool", "send_email", "--session", "ts-run", "--args", args, "--wait", "50s")
	}()
	for who, s := range map[string]submitted{"go": <-goDone, "ts": <-tsDone} {
		require.Equal(t, 0, s.code, "%s: answered once a republished copy could fire: %s %s", who, s.stdout, s.stderr)
		require.Equal(t, intent.StatusCompleted, s.res.Status, who)
		require.False(t, s.res.Replayed, "%s: fired by this call's own republished copy", who)
	}
	require.Equal(t, 4, hook.count(), "each operation fired once")
}
