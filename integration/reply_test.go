package integration

import (
	"context"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/stretchr/testify/require"

	"github.com/idemgate/idemgate/pkg/intent"
)

// An Idem-Reply-To naming the ledger's KV subject of another operation, or
// the intent stream, is never answered on: the worker writes with its own
// permissions, so a forged reply subject would overwrite a record.
func TestForgedReplySubjectsAreRefused(t *testing.T) {
	t.Parallel()
	url := jetStream(t)
	hook := newSink(t, nil)
	startWorker(t, "w1", url, writeTools(t, webhookTools(hook.URL, "30s")))
	victim := submit(t, url, "--tool", "send_email", "--args", `{"to":"victim@example.com"}`, "--wait", "30s")
	require.Equal(t, 0, victim.code, victim.stderr)

	nc := connect(t, url)
	js, err := jetstreamFor(nc)
	require.NoError(t, err)
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	kv, err := js.KeyValue(ctx, "IDEM_LEDGER")
	require.NoError(t, err)
	victimKV := storedKey(t, js, victim.res.Key)
	before, err := kv.Get(ctx, victimKV)
	require.NoError(t, err)
	stream, err := js.Stream(ctx, "IDEM_INTENTS")
	require.NoError(t, err)

	for i, forged := range []string{"$KV.IDEM_LEDGER." + victimKV, "idem.intents.send_email", "_INBOX.>", "$JS.API.STREAM.DELETE.IDEM_INTENTS"} {
		msg := nats.NewMsg("idem.intents.send_email")
		msg.Data = []byte(`{"tool":"send_email","args":{"attacker":` + string(rune('0'+i)) + `}}`)
		msg.Header.Set(intent.HeaderReplyTo, forged)
		_, err := js.PublishMsg(ctx, msg)
		require.NoError(t, err)
	}
	// All four fire (they are new operations); none is answered on the
	// forged subject.
	require.Eventually(t, func() bool { return hook.count() == 5 }, 15*time.Second, 20*time.Millisecond)
	require.Eventually(t, func() bool {
		info, err := stream.Info(ctx)
		return err == nil && info.State.Msgs == 0
	}, 10*time.Second, 20*time.Millisecond)

	after, err := kv.Get(ctx, victimKV)
	require.NoError(t, err)
	require.Equal(t, before.Revision(), after.Revision(), "the victim's record was not written")
	require.Equal(t, before.Value(), after.Value())
	info, err := stream.Info(ctx)
	require.NoError(t, err)
	require.EqualValues(t, 5, info.State.LastSeq, "no answer was stored in the intent stream")
	_, err = js.Stream(ctx, "IDEM_INTENTS")
	require.NoError(t, err, "the stream still exists")
}
