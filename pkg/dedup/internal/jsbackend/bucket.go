package jsbackend

import (
	"context"
	"errors"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
)

// Refusals of a conditional write. The write did not happen.
var (
	// ErrExists: a create found the key with a message (a record, or a
	// delete marker).
	ErrExists = errors.New("key exists")
	// ErrRevision: a compare-and-set found the key at another revision
	// than the one it names.
	ErrRevision = errors.New("key at another revision")
)

// defaultTimeout bounds a request whose ctx has no deadline, like the
// jetstream package's own API calls.
const defaultTimeout = 5 * time.Second

// settleTimeout bounds the leader read that resolves an ambiguous write (one
// whose acknowledgement was lost), even when the caller's ctx is done.
const settleTimeout = 2 * time.Second

// Entry is the latest message of a key, as the stream has it.
type Entry struct {
	// Rev is the message's stream sequence: the key's revision; 0 when the
	// key has no message.
	Rev uint64
	// Data is the message's data: a record as the ledger wrote it.
	Data []byte
	// Deleted marks a delete or purge marker.
	Deleted bool
}

// Live reports whether e is a record: a message that is not a marker.
func (e Entry) Live() bool { return e.Rev != 0 && !e.Deleted }

// Bucket is one KV bucket of a ledger (one partition), written and read as
// the ledger needs: its methods take KV keys. It is safe for concurrent use.
type Bucket struct {
	kv        jetstream.KeyValue
	js        jetstream.JetStream
	nc        *nats.Conn
	api       string // JetStream API prefix, ending in "."
	getSubj   string // JetStream API subject of a (leader) message get on the bucket's stream
	dgetSubj  string // JetStream API subject prefix of a direct get of a key's latest message
	keyPrefix string // "$KV.<bucket>."
	putPrefix string // subject prefix of a key's writes
	timeout   time.Duration

	batch *batcher // nil: every write goes out on its own

	streamMu sync.Mutex
	stream   jetstream.Stream // the bucket's stream, for Purge; nil until then

	directReads atomic.Uint64 // reads readSince took from a direct get
}

// New returns the Bucket over kv, a bucket of js. js provides the
// connection and API prefix (or domain) of leader reads; mirrored or
// sourced buckets are not supported. With batching, the bucket
// group-commits its writes; batching must be valid (dedup checks it).
func New(js jetstream.JetStream, kv jetstream.KeyValue, batching *Batching) *Bucket {
	jo := js.Options()
	prefix := jetstream.DefaultAPIPrefix
	switch {
	case jo.APIPrefix != "":
		prefix = jo.APIPrefix
		if !strings.HasSuffix(prefix, ".") {
			prefix += "."
		}
	case jo.Domain != "":
		prefix = "$JS." + jo.Domain + ".API."
	}
	timeout := jo.DefaultTimeout
	if timeout <= 0 {
		timeout = defaultTimeout
	}
	b := &Bucket{
		kv:        kv,
		js:        js,
		nc:        js.Conn(),
		api:       prefix,
		getSubj:   prefix + "STREAM.MSG.GET.KV_" + kv.Bucket(),
		dgetSubj:  prefix + "DIRECT.GET.KV_" + kv.Bucket() + ".$KV." + kv.Bucket() + ".",
		keyPrefix: "$KV." + kv.Bucket() + ".",
		putPrefix: "$KV." + kv.Bucket() + ".",
		timeout:   timeout,
	}
	if prefix != jetstream.DefaultAPIPrefix {
		b.putPrefix = prefix + b.putPrefix // as the jetstream KV API publishes
	}
	if batching != nil {
		b.batch = newBatcher(b, *batching)
	}
	return b
}

// Name returns the bucket's name.
func (b *Bucket) Name() string { return b.kv.Bucket() }

// Close stops the group commit: it sends the writes still queued, waits
// for the batches in flight to be answered, and makes later writes go out
// one by one. The bucket stays usable; Close is safe to call more than once.
func (b *Bucket) Close() {
	if b.batch != nil {
		b.batch.close()
	}
}

// Stats reports what the group commit did since New; all zero without it.
func (b *Bucket) Stats() Stats {
	if b.batch == nil {
		return Stats{}
	}
	return b.batch.statsNow()
}

// DirectReads reports how many reads after a refused create were answered
// by a direct get (any replica) rather than the leader.
func (b *Bucket) DirectReads() uint64 { return b.directReads.Load() }

// withTimeout bounds ctx by the bucket's request timeout when it has no
// deadline.
func (b *Bucket) withTimeout(ctx context.Context) (context.Context, context.CancelFunc) {
	if _, ok := ctx.Deadline(); ok {
		return ctx, func() {}
	}
	return context.WithTimeout(ctx, b.timeout)
}

// streamOf returns the bucket's stream, looked up once.
func (b *Bucket) streamOf(ctx context.Context) (jetstream.Stream, error) {
	b.streamMu.Lock()
	defer b.streamMu.Unlock()
	if b.stream == nil {
		s, err := b.js.Stream(ctx, streamName(b.Name()))
		if err != nil {
			return nil, err
		}
		b.stream = s
	}
	return b.stream, nil
}

// streamName is the name of the stream of the KV bucket named bucket.
func streamName(bucket string) string { return "KV_" + bucket }
