package dedup

import (
	"context"
	"fmt"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/idemgate/idemgate/pkg/dedup/internal/jsbackend"
	"github.com/idemgate/idemgate/pkg/intent"
)

// DefaultTTL is BucketConfig.TTL's default.
const DefaultTTL = 24 * time.Hour

// defaultBucket is BucketConfig.Bucket's default.
const defaultBucket = "IDEM_LEDGER"

// BucketConfig describes the ledger's KV bucket. The zero value is valid and
// means every default.
type BucketConfig struct {
	// Bucket is the KV bucket name. Default: "IDEM_LEDGER".
	Bucket string
	// Replicas is the number of copies of the bucket in a cluster (1, 3 or 5
	// are usual). Default: 1.
	Replicas int
	// TTL is how long a final record (completed, failed, denied) is kept
	// after it was written: the retention of answers, not a lease. Each final
	// write carries it as its per-message TTL; unresolved records (pending,
	// approved, awaiting approval, uncertain) never expire — expiring one
	// would let a retry fire an operation nobody decided. A ledger opened on
	// the bucket (Open) writes with it, whether it set the bucket up or
	// bound it. Default: 24h (DefaultTTL).
	TTL time.Duration
	// Storage is where the bucket is kept. Default: jetstream.FileStorage.
	Storage jetstream.StorageType
	// AtomicPublish lets the bucket's stream take atomic batches, which a
	// ledger with WithBatching sends (JetStream 2.12 or later). Open turns it
	// on with WithBatching, and never turns it off once on, so a writer without batching does not undo
	// it for one with. Default: false.
	AtomicPublish bool
	// MaxConsumers bounds the consumers on the bucket's stream. Every Wait
	// and every client's watch of a key is one while it lasts, and the server
	// caps a stream left unlimited at 1000 consumers, too few for a busy
	// ledger. Default: 65536.
	MaxConsumers int
	// Partitions is the ledger's partition count, a power of two fixed when
	// the ledger is created (see Open). Default: 0, the count
	// recorded on an existing ledger, 1 for a new one.
	Partitions int
	// Layout is the ledger's key layout (intent.LedgerKey: how its KV keys
	// are made from operation keys), fixed when the ledger is created and
	// recorded like the partition count (see Open). Default: 0,
	// the layout recorded on an
	// existing ledger (intent.LayoutFull for one that records none),
	// intent.DefaultLayout (compact keys) for a new one.
	Layout int
}

// defaultMaxConsumers is BucketConfig.MaxConsumers's default.
const defaultMaxConsumers = 65536

func (c BucketConfig) withDefaults() BucketConfig {
	if c.Bucket == "" {
		c.Bucket = defaultBucket
	}
	if c.Replicas == 0 {
		c.Replicas = 1
	}
	if c.TTL == 0 {
		c.TTL = DefaultTTL
	}
	if c.MaxConsumers == 0 {
		c.MaxConsumers = defaultMaxConsumers
	}
	return c
}

func (c BucketConfig) validate() error {
	if !validBucketName(c.Bucket) {
		return fmt.Errorf("%w: bucket name %q: use letters, digits, '-' and '_' only", ErrInvalid, c.Bucket)
	}
	if c.Replicas < 1 || c.Replicas > 5 {
		return fmt.Errorf("%w: replicas %d: set 1 to 5 (3 for a 3-node cluster), or 0 for the default 1", ErrInvalid, c.Replicas)
	}
	if c.TTL < 0 {
		return fmt.Errorf("%w: ttl %s: set a positive duration longer than any retry horizon, or 0 for the default %s", ErrInvalid, c.TTL, DefaultTTL)
	}
	if c.MaxConsumers < 1 {
		return fmt.Errorf("%w: max consumers %d: set a positive limit, or 0 for the default %d", ErrInvalid, c.MaxConsumers, defaultMaxConsumers)
	}
	if err := validPartitionsConfig(c.Partitions); err != nil {
		return err
	}
	if c.Layout != 0 && !intent.ValidLedgerLayout(c.Layout) {
		return fmt.Errorf("%w: layout %d: use %d (compact keys) or %d (keys as they are), or 0 for the layout recorded on the ledger (%d for a new one)",
			ErrInvalid, c.Layout, intent.LayoutCompact, intent.LayoutFull, intent.DefaultLayout)
	}
	if c.Storage != jetstream.FileStorage && c.Storage != jetstream.MemoryStorage {
		return fmt.Errorf("%w: storage %d: use jetstream.FileStorage (default) or jetstream.MemoryStorage", ErrInvalid, c.Storage)
	}
	return nil
}

func validBucketName(s string) bool {
	if s == "" {
		return false
	}
	for _, r := range s {
		switch {
		case r >= 'a' && r <= 'z', r >= 'A' && r <= 'Z', r >= '0' && r <= '9', r == '-', r == '_':
		default:
			return false
		}
	}
	return true
}

// ensureBucket creates the ledger bucket described by cfg, or updates an
// existing one to match it, recording metadata on its stream (the ledger's
// other idemgate.* entries there stay), and returns it. An invalid cfg gives
// an error matching ErrInvalid.
func ensureBucket(ctx context.Context, js jetstream.JetStream, cfg BucketConfig, metadata map[string]string) (jetstream.KeyValue, error) {
	cfg = cfg.withDefaults()
	if err := cfg.validate(); err != nil {
		return nil, fmt.Errorf("ensure bucket: %w", err)
	}
	return jsbackend.Ensure(ctx, js, cfg.settings(metadata))
}

// createBucket creates the ledger bucket described by cfg (with its
// defaults, valid) with metadata on its stream, and returns it; one there
// with exactly this configuration is returned, one with another gives an
// error matching jetstream.ErrBucketExists.
func createBucket(ctx context.Context, js jetstream.JetStream, cfg BucketConfig, metadata map[string]string) (jetstream.KeyValue, error) {
	return jsbackend.Create(ctx, js, cfg.settings(metadata))
}

// settings are the bucket settings of c (with its defaults) and metadata.
func (c BucketConfig) settings(metadata map[string]string) jsbackend.Settings {
	return jsbackend.Settings{Name: c.Bucket, Replicas: c.Replicas, Storage: c.Storage,
		AtomicPublish: c.AtomicPublish, MaxConsumers: c.MaxConsumers, Metadata: metadata}
}
