package worker

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"time"

	"github.com/nats-io/nats.go"
	"go.uber.org/zap"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/idemgate/idemgate/pkg/audit"
	"github.com/idemgate/idemgate/pkg/dedup"
	"github.com/idemgate/idemgate/pkg/intent"
)

// defaultSetupRequest bounds each JetStream request of setup, and
// setupAttempt times it a whole attempt (what waits for a new stream's
// leader is not one request); firstSetupPause is the pause before its first
// retry (doubling up to maxSetupPause). A request left unanswered —
// JetStream electing a leader, or a server that is not there yet — costs
// one bound, then the whole setup runs again (every step of it is
// idempotent).
const (
	defaultSetupRequest = 2 * time.Second
	setupAttempt        = 5
	firstSetupPause     = 100 * time.Millisecond
	maxSetupPause       = 5 * time.Second
)

// setupRetrying runs setup until it succeeds, retrying while JetStream is
// unreachable or electing leaders (a worker started before its server, or
// during a restart), until ctx ends. Other errors — a bad configuration —
// return at once. lopts are the options the ledger is opened with.
func setupRetrying(ctx context.Context, js jetstream.JetStream, cfg Config, log *zap.Logger, lopts []dedup.Option) (*resources, error) {
	request, pause := cfg.setupRequest, cfg.setupPause
	if request == 0 {
		request = defaultSetupRequest
	}
	if pause == 0 {
		pause = firstSetupPause
	}
	for {
		actx, cancel := context.WithTimeout(ctx, setupAttempt*request)
		res, err := setup(actx, js, request, cfg, lopts)
		cancel()
		if err == nil || !unavailable(err) || ctx.Err() != nil {
			return res, err
		}
		// Jittered, so that workers that failed together retry apart.
		wait := pause/2 + rand.N(pause)
		log.Warn("JetStream not available yet; retrying", zap.Duration("in", wait), zap.Error(err))
		select {
		case <-time.After(wait):
			pause = min(2*pause, max(maxSetupPause, pause))
		case <-ctx.Done():
			return nil, fmt.Errorf("%w (last: %w)", ctx.Err(), err)
		}
	}
}

// boundedJS bounds each JetStream API request setup makes (directly or
// through the ledger's and the audit trail's setup) to bound; what it
// returns (streams, buckets) is the wrapped JetStream's, unbounded. It
// bounds only the requests made under setup's context (setupScope): the
// ledger setup opens keeps it for its own requests later, which it does not
// bound.
type boundedJS struct {
	jetstream.JetStream
	bound time.Duration
}

// setupScope marks the context of a setup attempt (see boundedJS).
type setupScope struct{}

// bounded is ctx bounded to n requests' time, when it is setup's.
func (b boundedJS) bounded(ctx context.Context, n time.Duration) (context.Context, context.CancelFunc) {
	if ctx.Value(setupScope{}) == nil {
		return ctx, func() {}
	}
	return context.WithTimeout(ctx, n*b.bound)
}

func (b boundedJS) Stream(ctx context.Context, name string) (jetstream.Stream, error) {
	ctx, cancel := b.bounded(ctx, 1)
	defer cancel()
	return b.JetStream.Stream(ctx, name)
}

func (b boundedJS) CreateStream(ctx context.Context, cfg jetstream.StreamConfig) (jetstream.Stream, error) {
	ctx, cancel := b.bounded(ctx, 1)
	defer cancel()
	return b.JetStream.CreateStream(ctx, cfg)
}

func (b boundedJS) UpdateStream(ctx context.Context, cfg jetstream.StreamConfig) (jetstream.Stream, error) {
	ctx, cancel := b.bounded(ctx, 1)
	defer cancel()
	return b.JetStream.UpdateStream(ctx, cfg)
}

// CreateOrUpdateStream is two requests (an update, then a create if there
// is nothing to update), each bounded.
func (b boundedJS) CreateOrUpdateStream(ctx context.Context, cfg jetstream.StreamConfig) (jetstream.Stream, error) {
	s, err := b.UpdateStream(ctx, cfg)
	if errors.Is(err, jetstream.ErrStreamNotFound) {
		return b.CreateStream(ctx, cfg)
	}
	return s, err
}

func (b boundedJS) AccountInfo(ctx context.Context) (*jetstream.AccountInfo, error) {
	ctx, cancel := b.bounded(ctx, 1)
	defer cancel()
	return b.JetStream.AccountInfo(ctx)
}

func (b boundedJS) KeyValue(ctx context.Context, bucket string) (jetstream.KeyValue, error) {
	ctx, cancel := b.bounded(ctx, 1)
	defer cancel()
	return b.JetStream.KeyValue(ctx, bucket)
}

// CreateKeyValue and CreateOrUpdateKeyValue are up to three requests:
// their bound is three requests'.
func (b boundedJS) CreateKeyValue(ctx context.Context, cfg jetstream.KeyValueConfig) (jetstream.KeyValue, error) {
	ctx, cancel := b.bounded(ctx, 3)
	defer cancel()
	return b.JetStream.CreateKeyValue(ctx, cfg)
}

func (b boundedJS) CreateOrUpdateKeyValue(ctx context.Context, cfg jetstream.KeyValueConfig) (jetstream.KeyValue, error) {
	ctx, cancel := b.bounded(ctx, 3)
	defer cancel()
	return b.JetStream.CreateOrUpdateKeyValue(ctx, cfg)
}

// unavailable reports whether err means JetStream could not be reached or
// answer yet, rather than that it refused the request.
func unavailable(err error) bool {
	for _, target := range []error{context.DeadlineExceeded, nats.ErrTimeout, nats.ErrNoResponders, jetstream.ErrNoStreamResponse,
		nats.ErrConnectionClosed, nats.ErrConnectionReconnecting, nats.ErrDisconnected, nats.ErrNoServers, jetstream.ErrJetStreamNotEnabled} {
		if errors.Is(err, target) {
			return true
		}
	}
	var apiErr *jetstream.APIError
	// 503: JetStream up but without a leader (an election is in progress).
	return errors.As(err, &apiErr) && apiErr.Code == 503
}

// resources are the JetStream resources a worker runs on.
type resources struct {
	names intent.Names
	// ledger is the ledger, opened once (with setup's options) and shared
	// by everything of the worker's.
	ledger   *dedup.Ledger
	js       jetstream.JetStream
	stream   jetstream.Stream
	dlq      jetstream.Stream
	consumer jetstream.Consumer
	// partitions is the ledger's partition count, as it records it.
	partitions int
	// persist is the work stream's persist mode; persistMismatch reports an
	// existing stream whose mode is not the configured one.
	persist         jetstream.PersistModeType
	persistMismatch bool
}

// setup creates or updates the intent stream, the shared durable consumer and
// the ledger bucket, each JetStream request bounded to bound, and opens the
// ledger with lopts. It is idempotent: every worker runs it at start.
//
// Each stream and bucket is created first, and looked up or updated only
// when it exists with another configuration: workers starting together on a
// cluster race to create them, and the server answers a create of an
// identical configuration even while another's is in flight, but leaves an
// info or update request on a stream that has not elected its first leader
// yet unanswered (each would cost a bound and a retry).
func setup(ctx context.Context, rawJS jetstream.JetStream, bound time.Duration, cfg Config, lopts []dedup.Option) (*resources, error) {
	names, err := intent.NewNames(cfg.Prefix)
	if err != nil {
		return nil, err
	}
	ctx = context.WithValue(ctx, setupScope{}, true)
	js := boundedJS{JetStream: rawJS, bound: bound}
	intents := jetstream.StreamConfig{
		Name:        names.Stream,
		Description: "idemgate tool intents",
		Subjects:    []string{names.Subjects, names.Control},
		Retention:   jetstream.WorkQueuePolicy,
		Storage:     jetstream.FileStorage,
		Replicas:    cfg.Replicas,
		Duplicates:  cfg.DuplicateWindow,
		PersistMode: cfg.intentsPersist(),
	}
	stream, err := js.CreateStream(ctx, intents)
	// The persist mode of a stream is fixed when it is created: an existing
	// work stream keeps its own (the worker says how to migrate it).
	persist, existing := intents.PersistMode, false
	if errors.Is(err, jetstream.ErrStreamNameAlreadyInUse) {
		switch s, ierr := js.Stream(ctx, names.Stream); {
		case ierr == nil:
			existing = true
			persist = s.CachedInfo().Config.PersistMode
		case !errors.Is(ierr, jetstream.ErrStreamNotFound):
			return nil, fmt.Errorf("stream %s: %w", names.Stream, ierr)
		}
		intents.PersistMode = persist
		stream, err = js.CreateOrUpdateStream(ctx, intents)
	}
	if err != nil {
		return nil, fmt.Errorf("stream %s: %w", names.Stream, err)
	}
	dlqCfg := jetstream.StreamConfig{
		Name:        names.DLQStream,
		Description: "idemgate dead letters: intents that could not be handled, with the reason",
		Subjects:    []string{names.DLQSubjects()},
		Retention:   jetstream.LimitsPolicy,
		Storage:     jetstream.FileStorage,
		Replicas:    cfg.Replicas,
		Duplicates:  cfg.DuplicateWindow,
	}
	dlq, err := js.CreateStream(ctx, dlqCfg)
	if errors.Is(err, jetstream.ErrStreamNameAlreadyInUse) {
		dlq, err = js.CreateOrUpdateStream(ctx, dlqCfg)
	}
	if err != nil {
		return nil, fmt.Errorf("stream %s: %w", names.DLQStream, err)
	}
	cctx, cancel := context.WithTimeout(ctx, bound)
	defer cancel()
	consumer, err := stream.CreateOrUpdateConsumer(cctx, jetstream.ConsumerConfig{
		Durable:     names.Consumer,
		Description: "idemgate workers",
		AckPolicy:   jetstream.AckExplicitPolicy,
		AckWait:     cfg.AckWait,
		// Unlimited: the worker gives up after cfg.MaxDeliver itself, and
		// dead-letters a delivery past it (its last holder died).
		MaxDeliver:    -1,
		MaxAckPending: cfg.MaxAckPending,
		Replicas:      cfg.Replicas,
	})
	if err != nil {
		return nil, fmt.Errorf("consumer %s: %w", names.Consumer, err)
	}
	if _, err := audit.EnsureStream(ctx, js, names, audit.StreamConfig{Replicas: cfg.Replicas, Retention: cfg.AuditRetention}); err != nil {
		return nil, err
	}
	ledger, err := dedup.Open(ctx, js, dedup.BucketConfig{
		Bucket:     names.Bucket,
		Partitions: cfg.LedgerPartitions,
		Layout:     cfg.LedgerLayout,
		Replicas:   cfg.Replicas,
		TTL:        cfg.LedgerTTL,
		// Atomic batches need the stream's consent; once given it stays.
		AtomicPublish: cfg.LedgerBatch != NoLedgerBatch,
	}, lopts...)
	if err != nil {
		return nil, err
	}
	return &resources{names: names, ledger: ledger, js: rawJS, stream: stream, dlq: dlq, consumer: consumer, partitions: ledger.Partitions(),
		persist: persist, persistMismatch: existing && persist != cfg.intentsPersist()}, nil
}

// intentsPersist is the persist mode the work stream is created with:
// asynchronous where JetStream allows it (file storage, one replica, no
// atomic publish) unless Config.SyncIntents, else the server's own.
func (c *Config) intentsPersist() jetstream.PersistModeType {
	if c.SyncIntents || c.Replicas > 1 {
		return jetstream.DefaultPersistMode
	}
	return jetstream.AsyncPersistMode
}

// migrateHint is the warning a worker logs when the work stream exists with
// another persist mode than the configuration asks for: the mode cannot be
// changed in place.
func migrateHint(res *resources) string {
	how := fmt.Sprintf("the mode of a stream cannot change in place; to migrate, stop the publishers, let the workers empty the stream "+
		"(its consumer's pending count reaches 0), stop them, delete the stream (nats stream rm %s) and start a worker, which creates it again. "+
		"The ledger is untouched: every recorded operation keeps its answer", res.names.Stream)
	if res.persist == jetstream.AsyncPersistMode {
		return fmt.Sprintf("the work stream %s persists asynchronously but the configuration asks it to persist as the server does "+
			"(--async-intents=false, docs/performance.md); %s", res.names.Stream, how)
	}
	return fmt.Sprintf("the work stream %s was created with the server's persistence but the configuration asks for asynchronous "+
		"persistence (the default, --async-intents; docs/performance.md): every accepted intent and ack is synced, at a fraction of the throughput; %s", res.names.Stream, how)
}
