package worker

import (
	"context"
	"fmt"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/idemgate/idemgate/pkg/dedup"
	"github.com/idemgate/idemgate/pkg/intent"
)

// resources are the JetStream resources a worker runs on.
type resources struct {
	names    intent.Names
	js       jetstream.JetStream
	stream   jetstream.Stream
	dlq      jetstream.Stream
	consumer jetstream.Consumer
	kv       jetstream.KeyValue
}

// setup creates or updates the intent stream, the shared durable consumer and
// the ledger bucket. It is idempotent: every worker runs it at start.
func setup(ctx context.Context, js jetstream.JetStream, cfg Config) (*resources, error) {
	names, err := intent.NewNames(cfg.Prefix)
	if err != nil {
		return nil, err
	}
	stream, err := js.CreateOrUpdateStream(ctx, jetstream.StreamConfig{
		Name:        names.Stream,
		Description: "idemgate tool intents",
		Subjects:    []string{names.Subjects, names.Control},
		Retention:   jetstream.WorkQueuePolicy,
		Storage:     jetstream.FileStorage,
		Replicas:    cfg.Replicas,
		Duplicates:  cfg.DuplicateWindow,
	})
	if err != nil {
		return nil, fmt.Errorf("stream %s: %w", names.Stream, err)
	}
	dlq, err := js.CreateOrUpdateStream(ctx, jetstream.StreamConfig{
		Name:        names.DLQStream,
		Description: "idemgate dead letters: intents that could not be handled, with the reason",
		Subjects:    []string{names.DLQSubjects()},
		Retention:   jetstream.LimitsPolicy,
		Storage:     jetstream.FileStorage,
		Replicas:    cfg.Replicas,
		Duplicates:  cfg.DuplicateWindow,
	})
	if err != nil {
		return nil, fmt.Errorf("stream %s: %w", names.DLQStream, err)
	}
	consumer, err := stream.CreateOrUpdateConsumer(ctx, jetstream.ConsumerConfig{
		Durable:       names.Consumer,
		Description:   "idemgate workers",
		AckPolicy:     jetstream.AckExplicitPolicy,
		AckWait:       cfg.AckWait,
		MaxDeliver:    cfg.MaxDeliver,
		MaxAckPending: cfg.MaxAckPending,
		Replicas:      cfg.Replicas,
	})
	if err != nil {
		return nil, fmt.Errorf("consumer %s: %w", names.Consumer, err)
	}
	kv, err := dedup.EnsureBucket(ctx, js, dedup.BucketConfig{
		Bucket:   names.Bucket,
		Replicas: cfg.Replicas,
		TTL:      cfg.LedgerTTL,
		// Atomic batches need the stream's consent; once given it stays.
		AtomicPublish: cfg.LedgerBatch > 0,
	})
	if err != nil {
		return nil, err
	}
	return &resources{names: names, js: js, stream: stream, dlq: dlq, consumer: consumer, kv: kv}, nil
}
