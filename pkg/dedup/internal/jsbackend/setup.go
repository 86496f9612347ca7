package jsbackend

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"strings"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/idemgate/idemgate/pkg/retry"
)

// expiryMarkerTTL is how long the delete marker of an expired record stays.
const expiryMarkerTTL = time.Minute

// metadataPrefix starts the stream metadata entries the ledger records on
// its buckets (its shape: partitions, layout, a migration under way).
const metadataPrefix = "idemgate."

// Settings are a bucket's settings; dedup.BucketConfig says what each means.
type Settings struct {
	Name          string
	Replicas      int
	Storage       jetstream.StorageType
	AtomicPublish bool
	MaxConsumers  int
	// Metadata are stream metadata entries to record (each key starting
	// with "idemgate."); the bucket's other idemgate.* entries are kept.
	Metadata map[string]string
}

// Ensure creates the bucket s describes, or updates an existing one to
// match it, and returns it. Atomic publish, once allowed, stays allowed, so
// that a writer without group commit does not undo it for one with.
func Ensure(ctx context.Context, js jetstream.JetStream, s Settings) (jetstream.KeyValue, error) {
	kv, err := Create(ctx, js, s)
	if !errors.Is(err, jetstream.ErrBucketExists) {
		return kv, err
	}
	// Updating the bucket rewrites its stream's configuration: keep atomic
	// publish on if it was, and the ledger's metadata.
	stream := streamName(s.Name)
	var metadata map[string]string
	st, err := js.Stream(ctx, stream)
	switch {
	case err == nil:
		s.AtomicPublish = s.AtomicPublish || st.CachedInfo().Config.AllowAtomicPublish
		for k, v := range st.CachedInfo().Config.Metadata {
			if strings.HasPrefix(k, metadataPrefix) {
				metadata = setMeta(metadata, k, v)
			}
		}
	case !errors.Is(err, jetstream.ErrStreamNotFound):
		return nil, fmt.Errorf("ensure bucket %s: stream info: %w", s.Name, err)
	}
	for k, v := range s.Metadata {
		metadata = setMeta(metadata, k, v)
	}
	if kv, err = js.CreateOrUpdateKeyValue(ctx, kvConfig(s, metadata)); err != nil {
		return nil, fmt.Errorf("ensure bucket %s: update: %w", s.Name, err)
	}
	if err := streamSettings(ctx, js, s); err != nil {
		return nil, err
	}
	return kv, nil
}

// Create creates the bucket s describes, with every setting in one
// request, and returns it once its stream has a leader. A bucket of that
// name with exactly this configuration is returned as it is; one with
// another gives an error matching jetstream.ErrBucketExists.
//
// Creating first, before any other request on the bucket, is what lets
// workers starting together on a cluster race to create it: the server
// answers a create of an identical configuration even while another's is in
// flight, and the answer names the stream's leader, but it leaves a request
// on a stream that has not elected its first leader yet (an info, an
// update) unanswered. So Create asks nothing else until the create's answer
// names a leader, repeating the create (answered every time) until it does.
func Create(ctx context.Context, js jetstream.JetStream, s Settings) (jetstream.KeyValue, error) {
	// Waiting for the leader is several requests: without a deadline it
	// is bounded as one request is (the client's default timeout).
	if _, ok := ctx.Deadline(); !ok && js.Options().DefaultTimeout > 0 {
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeout(ctx, js.Options().DefaultTimeout)
		defer cancel()
	}
	info, err := accountInfo(ctx, js)
	if err != nil {
		return nil, fmt.Errorf("ensure bucket %s: account info: %w", s.Name, err)
	}
	if info.API.Level < 1 {
		return nil, fmt.Errorf("ensure bucket %s: %w", s.Name, jetstream.ErrLimitMarkerTTLNotSupported)
	}
	polls := retry.Doubling(ctx, firstLeaderPoll, maxLeaderPoll)
	for {
		st, err := js.CreateStream(ctx, streamConfig(s))
		if errors.Is(err, jetstream.ErrStreamNameAlreadyInUse) {
			return nil, fmt.Errorf("ensure bucket %s: %w: %w", s.Name, jetstream.ErrBucketExists, err)
		}
		if err != nil {
			return nil, fmt.Errorf("ensure bucket %s: create: %w", s.Name, err)
		}
		if c := st.CachedInfo().Cluster; c == nil || c.Leader != "" {
			break
		}
		if !retry.Wait(ctx, polls) {
			return nil, fmt.Errorf("ensure bucket %s: no leader elected yet: %w", s.Name, ctx.Err())
		}
	}
	kv, err := js.KeyValue(ctx, s.Name)
	if err != nil {
		return nil, fmt.Errorf("ensure bucket %s: bind: %w", s.Name, err)
	}
	return kv, nil
}

// accountInfo asks for the account's JetStream information, again after an
// unanswered request (a server whose meta leader is still being elected
// may drop it), each request bounded by maxLeaderPoll×4, until ctx ends.
func accountInfo(ctx context.Context, js jetstream.JetStream) (*jetstream.AccountInfo, error) {
	for {
		rctx, cancel := context.WithTimeout(ctx, 4*maxLeaderPoll)
		info, err := js.AccountInfo(rctx)
		cancel()
		if err == nil || ctx.Err() != nil || !errors.Is(err, context.DeadlineExceeded) {
			return info, err
		}
	}
}

// Create asks again whether the new stream has a leader after
// firstLeaderPoll, then after twice as long each time, up to maxLeaderPoll.
const (
	firstLeaderPoll = 20 * time.Millisecond
	maxLeaderPoll   = 500 * time.Millisecond
)

// streamConfig is the stream configuration of the bucket s describes: the
// one jetstream.CreateKeyValue sends for kvConfig(s, s.Metadata), with
// streamSettings' settings (TestCreateMakesWhatEnsureMakes checks it).
func streamConfig(s Settings) jetstream.StreamConfig {
	kc := kvConfig(s, s.Metadata)
	return jetstream.StreamConfig{
		Name:                   streamName(s.Name),
		Description:            kc.Description,
		Subjects:               []string{"$KV." + s.Name + ".>"},
		MaxMsgsPerSubject:      int64(kc.History),
		MaxBytes:               -1,
		MaxMsgSize:             -1,
		MaxMsgs:                -1,
		Storage:                kc.Storage,
		Replicas:               max(kc.Replicas, 1),
		AllowRollup:            true,
		DenyDelete:             true,
		Duplicates:             2 * time.Minute,
		MaxConsumers:           s.MaxConsumers,
		AllowDirect:            true,
		Discard:                jetstream.DiscardNew,
		AllowMsgTTL:            true,
		SubjectDeleteMarkerTTL: kc.LimitMarkerTTL,
		AllowAtomicPublish:     s.AtomicPublish,
		Metadata:               kc.Metadata,
	}
}

// kvConfig is the configuration of the bucket s describes, with metadata.
func kvConfig(s Settings, metadata map[string]string) jetstream.KeyValueConfig {
	// No age limit on the bucket: final records expire by their own TTL
	// (LimitMarkerTTL allows per-message TTLs; an expired record leaves a
	// delete marker for that long, so that a watcher sees it go).
	return jetstream.KeyValueConfig{
		Bucket:         s.Name,
		Description:    "idemgate ledger: one record per operation key",
		History:        1,
		Storage:        s.Storage,
		Replicas:       s.Replicas,
		LimitMarkerTTL: expiryMarkerTTL,
		Metadata:       metadata,
	}
}

// streamSettings sets what a bucket's configuration does not hold on its
// stream: atomic publish (when s allows it) and s.MaxConsumers.
func streamSettings(ctx context.Context, js jetstream.JetStream, s Settings) error {
	st, err := js.Stream(ctx, streamName(s.Name))
	if err != nil {
		return fmt.Errorf("ensure bucket %s: stream info: %w", s.Name, err)
	}
	if sc := st.CachedInfo().Config; (s.AtomicPublish && !sc.AllowAtomicPublish) || sc.MaxConsumers != s.MaxConsumers {
		sc.AllowAtomicPublish = sc.AllowAtomicPublish || s.AtomicPublish
		sc.MaxConsumers = s.MaxConsumers
		if _, err := js.UpdateStream(ctx, sc); err != nil {
			return fmt.Errorf("ensure bucket %s: stream settings: %w", s.Name, err)
		}
	}
	return nil
}

// setMeta sets m[k] = v, making m when nil.
func setMeta(m map[string]string, k, v string) map[string]string {
	if m == nil {
		m = map[string]string{}
	}
	m[k] = v
	return m
}

// Metadata returns the stream metadata of the bucket named bucket; exists is
// false when there is no such bucket.
func Metadata(ctx context.Context, js jetstream.JetStream, bucket string) (md map[string]string, exists bool, err error) {
	s, err := js.Stream(ctx, streamName(bucket))
	if errors.Is(err, jetstream.ErrStreamNotFound) {
		return nil, false, nil
	}
	if err != nil {
		return nil, false, fmt.Errorf("ledger %s: stream metadata: %w", bucket, err)
	}
	return s.CachedInfo().Config.Metadata, true, nil
}

// SetMetadata sets and deletes entries of the stream metadata of the bucket
// named bucket.
func SetMetadata(ctx context.Context, js jetstream.JetStream, bucket string, set map[string]string, del []string) error {
	s, err := js.Stream(ctx, streamName(bucket))
	if err != nil {
		return err
	}
	sc := s.CachedInfo().Config
	md := maps.Clone(sc.Metadata)
	if md == nil {
		md = map[string]string{}
	}
	maps.Copy(md, set)
	for _, k := range del {
		delete(md, k)
	}
	sc.Metadata = md
	_, err = js.UpdateStream(ctx, sc)
	return err
}

// SettingsOf returns the settings of the existing bucket named bucket (its
// metadata aside); MaxConsumers is 0 for a stream without a limit.
func SettingsOf(ctx context.Context, js jetstream.JetStream, bucket string) (Settings, error) {
	s, err := js.Stream(ctx, streamName(bucket))
	if err != nil {
		return Settings{}, err
	}
	sc := s.CachedInfo().Config
	return Settings{Name: bucket, Replicas: sc.Replicas, Storage: sc.Storage, AtomicPublish: sc.AllowAtomicPublish,
		MaxConsumers: max(sc.MaxConsumers, 0)}, nil
}

// Open returns the existing bucket named bucket, as js.KeyValue does.
func Open(ctx context.Context, js jetstream.JetStream, bucket string) (jetstream.KeyValue, error) {
	return js.KeyValue(ctx, bucket)
}
