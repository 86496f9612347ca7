package client

import (
	"context"
	"testing"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/stretchr/testify/require"
)

// inProcessJS answers the first busy publishes "duplicate message id is in
// process" (calling onBusy, when set, first), and then acknowledges.
type inProcessJS struct {
	jetstream.JetStream
	busy   int
	calls  int
	onBusy func()
}

func (f *inProcessJS) PublishMsg(context.Context, *nats.Msg, ...jetstream.PublishOpt) (*jetstream.PubAck, error) {
	f.calls++
	if f.calls <= f.busy {
		if f.onBusy != nil {
			f.onBusy()
		}
		return nil, &jetstream.APIError{Code: 503, ErrorCode: errCodeMsgIDInProcess, Description: "duplicate message id is in process"}
	}
	return &jetstream.PubAck{Stream: "S", Sequence: 7, Duplicate: true}, nil
}

// A publish answered "in process" is sent again, after a pause, until it is
// acknowledged.
func TestPublishRetriesWhileInProcess(t *testing.T) {
	t.Parallel()
	js := &inProcessJS{busy: 3}
	c := &Client{js: js}
	ack, err := c.publish(t.Context(), nats.NewMsg("x"))
	require.NoError(t, err)
	require.True(t, ack.Duplicate)
	require.Equal(t, 4, js.calls)
}

// A publish still in process when ctx ends gives the last refusal, and is
// not sent again.
func TestPublishInProcessEndsWithContext(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithCancel(t.Context())
	js := &inProcessJS{busy: 1 << 30, onBusy: cancel}
	c := &Client{js: js}
	ack, err := c.publish(ctx, nats.NewMsg("x"))
	require.Nil(t, ack)
	var apiErr *jetstream.APIError
	require.ErrorAs(t, err, &apiErr)
	require.Equal(t, errCodeMsgIDInProcess, int(apiErr.ErrorCode))
	require.Equal(t, 1, js.calls)
}
