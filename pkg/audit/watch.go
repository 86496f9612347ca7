package audit

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/idemgate/idemgate/pkg/intent"
)

// watchBuffer is how many events wait for Watch's reader.
const watchBuffer = 256

// Watch sends the events of every append written to the trail after the
// call, as the server pushes them (no polling), decoded but not checked:
// it tells a reader that an operation's history grew, not what it proves.
// Lines that are not entries are skipped. The channel is closed when ctx
// ends or the watch fails (the connection closed, the stream deleted).
func Watch(ctx context.Context, js jetstream.JetStream, names intent.Names) (<-chan Event, error) {
	s, err := js.Stream(ctx, names.AuditStream)
	if err != nil {
		return nil, fmt.Errorf("audit stream %s: %w", names.AuditStream, err)
	}
	info, err := s.Info(ctx)
	if err != nil {
		return nil, fmt.Errorf("audit stream %s: %w", names.AuditStream, err)
	}
	// From the sequence after the last: what was stored before the call is
	// not sent, whenever the consumer is made (or made again).
	c, err := s.OrderedConsumer(ctx, jetstream.OrderedConsumerConfig{
		FilterSubjects: []string{names.AuditSubjects()},
		DeliverPolicy:  jetstream.DeliverByStartSequencePolicy,
		OptStartSeq:    info.State.LastSeq + 1,
	})
	if err != nil {
		return nil, fmt.Errorf("watch audit stream %s: %w", names.AuditStream, err)
	}
	it, err := c.Messages()
	if err != nil {
		return nil, fmt.Errorf("watch audit stream %s: %w", names.AuditStream, err)
	}
	ch := make(chan Event, watchBuffer)
	stopped := make(chan struct{})
	go func() {
		select {
		case <-ctx.Done():
		case <-stopped:
		}
		it.Stop()
	}()
	go func() {
		defer close(ch)
		defer close(stopped)
		for {
			m, err := it.Next()
			if err != nil {
				return
			}
			for line := range bytes.SplitSeq(m.Data(), []byte{'\n'}) {
				var e struct {
					Event Event `json:"event"`
				}
				if len(bytes.TrimSpace(line)) == 0 || json.Unmarshal(line, &e) != nil {
					continue
				}
				select {
				case ch <- e.Event:
				case <-ctx.Done():
					return
				}
			}
		}
	}()
	return ch, nil
}
