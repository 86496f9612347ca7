package worker

import (
	"errors"
	"fmt"
	"os"
	"strings"
	"time"

	"github.com/idemgate/idemgate/pkg/audit"
	"github.com/idemgate/idemgate/pkg/dedup"
	"github.com/idemgate/idemgate/pkg/intent"
)

// Defaults of Config's fields (the flags of cmd/worker use them too).
const (
	DefaultConcurrency     = 256
	DefaultAckWait         = 30 * time.Second
	DefaultMaxDeliver      = 10
	DefaultMaxAckPending   = 4096
	DefaultDuplicateWindow = 2 * time.Minute
	DefaultReplicas        = 1
	DefaultLedgerTTL       = 24 * time.Hour
	DefaultRetryDelay      = time.Second
	DefaultMaxRetryDelay   = time.Minute
	DefaultLedgerBatch     = 500
	// DefaultLedgerBatchInFlight is Config.LedgerBatchInFlight's default at
	// one replica: the ledger's stream stages and syncs each batch on its
	// own, so the fewest batches carry the most writes per sync.
	DefaultLedgerBatchInFlight = 1
	// DefaultReplicatedLedgerBatchInFlight is Config.LedgerBatchInFlight's
	// default at more than one replica, the ledger's own default.
	DefaultReplicatedLedgerBatchInFlight = dedup.DefaultBatchInFlight

	DefaultAnswerCache      = 10 * time.Second
	DefaultAnswerCacheBytes = 32 << 20
	DefaultReplyPrefix      = "_INBOX."
	DefaultLedgerScan       = time.Minute
	// DefaultDrainTimeout is the drain a worker gives its effects in flight
	// when it stops (Run's drain, cmd/worker's --drain-timeout).
	DefaultDrainTimeout = 30 * time.Second
)

// Values that turn a feature off.
const (
	// NoLedgerBatch turns the group commit off (Config.LedgerBatch).
	NoLedgerBatch = -1
	// NoAnswerCache turns the answer cache off (Config.AnswerCache).
	NoAnswerCache = -1
	// NoLedgerScan turns the ledger scan off (Config.LedgerScan).
	NoLedgerScan = -1
)

// Config is the behaviour of a Worker. The zero value of every field means
// its documented default.
type Config struct {
	// Prefix names the stream, consumer, subjects and bucket together.
	// Default: "IDEM" (stream IDEM_INTENTS on idem.intents.>, consumer
	// IDEM_WORKERS, bucket IDEM_LEDGER).
	Prefix string

	// Holder identifies this worker in ledger records it claims.
	// Default: "<hostname>-<pid>".
	Holder string

	// Concurrency is how many intents one worker handles at once (and how
	// many it buffers from the consumer). Default: 256 (DefaultConcurrency).
	Concurrency int

	// Limits bound what an intent may be (size, nesting). Default:
	// intent.DefaultMaxBytes (256 KiB) and intent.DefaultMaxDepth.
	Limits intent.Limits

	// AckWait is the consumer's redelivery timer; a worker that dies holding an
	// intent gives it up after this long. Default: 30s (DefaultAckWait).
	AckWait time.Duration

	// MaxDeliver is how many times an intent is delivered before the worker
	// gives up on it: a try that fails at or past this delivery is its last
	// (recorded failed, or dead-lettered and answered dead_lettered when
	// nothing could be recorded). A delivery spent waiting — under a tool's
	// max_in_flight, for another holder, through a ledger outage, or on a
	// worker that stopped meanwhile — tries nothing and ends nothing; an
	// intent is dead-lettered untried only past ten times this many
	// deliveries (every worker that had it died). Default: 10
	// (DefaultMaxDeliver).
	MaxDeliver int

	// MaxAckPending bounds the intents delivered and not yet settled across all
	// workers of the consumer. Default: 4096 (DefaultMaxAckPending).
	MaxAckPending int

	// DuplicateWindow is the stream's publish-dedup window. Default: 2m
	// (DefaultDuplicateWindow).
	DuplicateWindow time.Duration

	// Replicas of the stream and the ledger bucket. Default: 1
	// (DefaultReplicas).
	Replicas int

	// LedgerTTL is how long a final record (completed, failed, denied) is
	// kept: its per-message TTL. Unresolved records never expire. Default:
	// 24h (DefaultLedgerTTL).
	LedgerTTL time.Duration

	// LedgerPartitions is the ledger's partition count, a power of two fixed
	// when the ledger is created (dedup.Open): every worker of an
	// installation must agree, and one started with another count than the
	// ledger records refuses to start. Default: 0, the recorded count (1 for
	// a new ledger).
	LedgerPartitions int

	// LedgerLayout is the ledger's key layout (intent.LedgerKey), fixed when
	// the ledger is created and recorded like the partition count: one
	// started with another layout than the ledger records refuses to start.
	// Default: 0, the recorded layout (intent.DefaultLayout, compact keys,
	// for a new ledger).
	LedgerLayout int

	// RetryDelay is the first delay before an intent whose effect failed
	// transiently is delivered again; it doubles with each delivery up to
	// MaxRetryDelay. Default: 1s (DefaultRetryDelay).
	RetryDelay time.Duration

	// MaxRetryDelay caps RetryDelay's growth. Default: 1m
	// (DefaultMaxRetryDelay).
	MaxRetryDelay time.Duration

	// LedgerBatch group-commits the ledger's writes from all intents in
	// flight into atomic batches of up to this many (at most 1000): one disk
	// sync per batch instead of per write, which is what makes a server that
	// syncs every write before acknowledging it (sync_interval: always, the
	// durable setting) fast. At a lazy sync it changes little (docs/
	// performance.md). Needs nats-server 2.12 or later; an older server's
	// refusal makes every write go out on its own. Default: 500
	// (DefaultLedgerBatch); NoLedgerBatch (-1) writes every write on its own.
	LedgerBatch int

	// LedgerBatchInFlight is how many of the group commit's batches may
	// await their acknowledgement at once (1-8). Fewer make bigger batches
	// (one disk sync each, so more throughput at sync always) and keep a
	// completion waiting longer for its batch: a wider crash window, in which
	// a worker that dies after the effect and before its record lands lets
	// the operation be fired again (docs/performance.md weighs the two).
	// Default: 0, which is 1 at one replica (DefaultLedgerBatchInFlight) and
	// 4 at more (DefaultReplicatedLedgerBatchInFlight).
	LedgerBatchInFlight int

	// SyncIntents creates the work stream (the intents and the consumer's
	// acks) persisting as the server does. Without it the work stream is
	// created with asynchronous persistence where JetStream allows it (file
	// storage, one replica): a server with sync_interval always then syncs
	// only the ledger and the dead-letter stream before their
	// acknowledgements, not every accepted intent and ack, for several times
	// the durable throughput. What a crash can take is an intent the server
	// acknowledged but had not yet written or synced: it was never claimed,
	// so nothing fired, and the caller, who has no answer, publishes it
	// again under a fresh message id once the ledger shows no record after
	// its reply grace (pkg/client, docs/protocol.md 7.2); a lost ack only
	// delivers an intent again, which the ledger answers. Every answer a
	// caller gets was recorded in the synced ledger first. A replicated work
	// stream always persists as the server does (JetStream refuses
	// asynchronous persistence there). The mode is fixed when the stream is
	// created: an existing stream keeps its own, and the worker logs how to
	// migrate it. Default: false (asynchronous at one replica).
	SyncIntents bool

	// OnStages, when set, is called after each intent's answer with the
	// times it reached each stage of its handling (see Stages), from the
	// handler's goroutine: it must be quick. Default: nil (no times taken).
	OnStages func(Stages)

	// AnswerCache is how long this worker answers a duplicate from a final
	// record (completed, failed, denied) it wrote or read, without asking the
	// ledger: a record removed from the ledger meanwhile (an operator letting
	// an operation run again) is answered from the cache until then. Negative
	// (NoAnswerCache): every duplicate reads the ledger. Default: 10s
	// (DefaultAnswerCache).
	AnswerCache time.Duration

	// AnswerCacheBytes bounds the answer cache's memory; the least recently
	// used entries go first, and records over 64 KiB are never cached.
	// Default: 32 MiB (DefaultAnswerCacheBytes).
	AnswerCacheBytes int

	// ReplyPrefixes are the subject prefixes an intent's Idem-Reply-To may
	// name; an answer is never published elsewhere — not on the ledger's KV
	// subjects, the intent stream or any $-subject — whatever the header says.
	// Clients' inboxes (nc.NewRespInbox, with or without a custom inbox
	// prefix) start with "_INBOX". Default: [DefaultReplyPrefix].
	ReplyPrefixes []string

	// SessionRate limits the intents of one session (the key's tenant scope)
	// this worker accepts per second; those over it are answered rejected with
	// error code rate_limited. Default: 0, no limit.
	SessionRate float64

	// SessionBurst is how many intents a session may send at once above
	// SessionRate. Default: SessionRate rounded down, at least 1.
	SessionBurst int

	// Metrics receive the worker's counters and histograms. Default: metrics
	// registered nowhere.
	Metrics *Metrics

	// MaxWait caps how long a duplicate waits for an in-flight holder before it
	// is delivered again later. Default: AckWait.
	MaxWait time.Duration

	// AuditKey is the file of the Ed25519 private key the worker signs its
	// audit trail and receipts with (PKCS #8 PEM); a missing file is made,
	// with a new key. Default: "", a new key each start, kept in memory
	// only (cmd/worker keeps one beside its store).
	AuditKey string

	// AuditRetention is how long the audit stream keeps the trail; at least
	// LedgerTTL, so that the history of every record still answered is
	// there. Default: 30 days (audit.DefaultRetention).
	AuditRetention time.Duration

	// AuditQueue bounds the audit events a worker holds in memory while
	// the trail is written, or cannot be; beyond it events are dropped,
	// counted, and shown as a gap in the trail. Default: 65536
	// (audit.DefaultQueue).
	AuditQueue int

	// AuditCheckpoint is how often the worker signs and stores a
	// checkpoint of every partition's chain (audit.Checkpoint; it also
	// makes them on request). Default: 1m (audit.DefaultCheckpointEvery).
	AuditCheckpoint time.Duration

	// DisableAudit turns the audit off: no trail is written, and answers
	// carry no receipt. DisableTrail turns only the trail off: answers
	// carry their receipts, but no events are made or written. Both exist
	// to measure what the trail and the receipts cost (cmd/bench's audit
	// scenario); an installation leaves both false (the default).
	DisableAudit, DisableTrail bool

	// LedgerScan is how often the ledger is scanned, by one worker a
	// round: it counts the unresolved records by state and age (the
	// idemgate_ledger_unresolved_* metrics) and gives final records written
	// without a TTL (by an earlier version) theirs. A round reads what was
	// written since the worker's last one (dedup.Tracker); its first round,
	// and one at least every hour, reads every record. Negative
	// (NoLedgerScan): off. Default: 1m (DefaultLedgerScan).
	LedgerScan time.Duration

	// setupRequest bounds each JetStream request of the setup at start, and
	// setupPause is the first pause before it runs again; 0:
	// defaultSetupRequest, firstSetupPause. Tests set them.
	setupRequest, setupPause time.Duration
}

func (c *Config) setDefaults() {
	if c.Prefix == "" {
		c.Prefix = intent.DefaultPrefix
	}
	if c.Holder == "" {
		host, _ := os.Hostname()
		c.Holder = fmt.Sprintf("%s-%d", host, os.Getpid())
	}
	if c.Concurrency == 0 {
		c.Concurrency = DefaultConcurrency
	}
	if c.AckWait == 0 {
		c.AckWait = DefaultAckWait
	}
	if c.MaxDeliver == 0 {
		c.MaxDeliver = DefaultMaxDeliver
	}
	if c.MaxAckPending == 0 {
		c.MaxAckPending = DefaultMaxAckPending
	}
	if c.DuplicateWindow == 0 {
		c.DuplicateWindow = DefaultDuplicateWindow
	}
	if c.Replicas == 0 {
		c.Replicas = DefaultReplicas
	}
	if c.LedgerTTL == 0 {
		c.LedgerTTL = DefaultLedgerTTL
	}
	if c.RetryDelay == 0 {
		c.RetryDelay = DefaultRetryDelay
	}
	if c.MaxRetryDelay == 0 {
		c.MaxRetryDelay = DefaultMaxRetryDelay
	}
	if c.MaxWait == 0 {
		c.MaxWait = c.AckWait
	}
	if c.LedgerBatch == 0 {
		c.LedgerBatch = DefaultLedgerBatch
	}
	if c.LedgerBatchInFlight == 0 {
		c.LedgerBatchInFlight = LedgerBatchInFlightFor(c.Replicas)
	}
	if c.AnswerCache == 0 {
		c.AnswerCache = DefaultAnswerCache
	}
	if c.LedgerScan == 0 {
		c.LedgerScan = DefaultLedgerScan
	}
	if c.AuditRetention == 0 {
		c.AuditRetention = audit.DefaultRetention
	}
	if c.AuditCheckpoint == 0 {
		c.AuditCheckpoint = audit.DefaultCheckpointEvery
	}
	if c.AuditQueue == 0 {
		c.AuditQueue = audit.DefaultQueue
	}
	if c.AnswerCacheBytes == 0 {
		c.AnswerCacheBytes = DefaultAnswerCacheBytes
	}
	if len(c.ReplyPrefixes) == 0 {
		c.ReplyPrefixes = []string{DefaultReplyPrefix}
	}
	if c.Metrics == nil {
		c.Metrics = NewMetrics(nil)
	}
}

func (c *Config) validate() error {
	var errs []error
	if c.Concurrency < 1 {
		errs = append(errs, fmt.Errorf("concurrency %d: must be at least 1", c.Concurrency))
	}
	if c.AckWait < time.Second {
		errs = append(errs, fmt.Errorf("ack wait %s: must be at least 1s", c.AckWait))
	}
	if c.MaxDeliver < 2 {
		errs = append(errs, fmt.Errorf("max deliver %d: must be at least 2 (one try and one retry)", c.MaxDeliver))
	}
	if c.MaxAckPending < c.Concurrency {
		errs = append(errs, fmt.Errorf("max ack pending %d: must be at least the concurrency (%d)", c.MaxAckPending, c.Concurrency))
	}
	if c.Replicas != 1 && c.Replicas != 3 && c.Replicas != 5 {
		errs = append(errs, fmt.Errorf("replicas %d: use 1, 3 or 5", c.Replicas))
	}
	if c.LedgerTTL < c.DuplicateWindow {
		errs = append(errs, fmt.Errorf("ledger TTL %s: must be at least the duplicate window (%s)", c.LedgerTTL, c.DuplicateWindow))
	}
	for _, p := range c.ReplyPrefixes {
		if p == "" || strings.HasPrefix(p, "$") || strings.ContainsAny(p, "*> \t") {
			errs = append(errs, fmt.Errorf("reply prefix %q: use a literal subject prefix such as _INBOX. (no wildcards, not a $-subject)", p))
		}
	}
	if c.LedgerPartitions != 0 && !intent.ValidPartitions(c.LedgerPartitions) {
		errs = append(errs, fmt.Errorf("ledger partitions %d: use a power of two from 1 to %d, or 0 for the ledger's recorded count", c.LedgerPartitions, intent.MaxPartitions))
	}
	if c.LedgerLayout != 0 && !intent.ValidLedgerLayout(c.LedgerLayout) {
		errs = append(errs, fmt.Errorf("ledger layout %d: use %d (compact keys) or %d (keys as they are), or 0 for the ledger's recorded layout (%d for a new one)",
			c.LedgerLayout, intent.LayoutCompact, intent.LayoutFull, intent.DefaultLayout))
	}
	if c.LedgerBatch < NoLedgerBatch || c.LedgerBatch > dedup.MaxBatch {
		errs = append(errs, fmt.Errorf("ledger batch %d: use 1-%d, or %d (off)", c.LedgerBatch, dedup.MaxBatch, NoLedgerBatch))
	}
	if c.LedgerBatchInFlight < 1 || c.LedgerBatchInFlight > dedup.MaxBatchInFlight {
		errs = append(errs, fmt.Errorf("ledger batches in flight %d: use 1-%d", c.LedgerBatchInFlight, dedup.MaxBatchInFlight))
	}
	if c.AnswerCache > c.LedgerTTL {
		errs = append(errs, fmt.Errorf("answer cache %s: must not exceed the ledger TTL (%s): a cached answer would outlive its record", c.AnswerCache, c.LedgerTTL))
	}
	if c.LedgerScan > 0 && c.LedgerScan < time.Second {
		errs = append(errs, fmt.Errorf("ledger scan %s: use at least 1s, or %d (off)", c.LedgerScan, NoLedgerScan))
	}
	if c.AnswerCacheBytes < 0 {
		errs = append(errs, fmt.Errorf("answer cache bytes %d: must not be negative", c.AnswerCacheBytes))
	}
	if c.AuditRetention < c.LedgerTTL {
		errs = append(errs, fmt.Errorf("audit retention %s: must be at least the ledger TTL (%s), so that the trail keeps the history of every record still answered", c.AuditRetention, c.LedgerTTL))
	}
	if c.AuditCheckpoint < time.Second {
		errs = append(errs, fmt.Errorf("audit checkpoint every %s: must be at least 1s", c.AuditCheckpoint))
	}
	if c.AuditQueue < 1 {
		errs = append(errs, fmt.Errorf("audit queue %d: must be at least 1", c.AuditQueue))
	}
	if c.MaxRetryDelay < c.RetryDelay {
		errs = append(errs, fmt.Errorf("max retry delay %s: must be at least the retry delay (%s)", c.MaxRetryDelay, c.RetryDelay))
	}
	if err := errors.Join(errs...); err != nil {
		return fmt.Errorf("worker config: %w", err)
	}
	return nil
}

// LedgerBatchInFlightFor is the default of Config.LedgerBatchInFlight at the
// given replicas: DefaultLedgerBatchInFlight at one,
// DefaultReplicatedLedgerBatchInFlight at more.
func LedgerBatchInFlightFor(replicas int) int {
	if replicas > 1 {
		return DefaultReplicatedLedgerBatchInFlight
	}
	return DefaultLedgerBatchInFlight
}
