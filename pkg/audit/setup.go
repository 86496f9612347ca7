package audit

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/idemgate/idemgate/pkg/intent"
)

// DefaultRetention is how long the audit stream keeps an append: longer
// than the ledger keeps a final record (24h by default), so that the
// history of every record still answered is there.
const DefaultRetention = 30 * 24 * time.Hour

// StreamConfig is the audit stream's.
type StreamConfig struct {
	// Replicas of the stream and the keys bucket. Default: 1.
	Replicas int
	// Retention is how long an append is kept. Default: DefaultRetention.
	Retention time.Duration
}

// EnsureStream creates (or updates) the audit stream, Names.AuditStream on
// Names.AuditSubjects(): file storage, limits retention by age, and no
// message deletes or purges through the API — a trail is appended to,
// never edited (a server operator can still delete the whole stream;
// verification shows what is missing then). It also creates the bucket of
// public keys (Names.AuditKeys) when there is none.
func EnsureStream(ctx context.Context, js jetstream.JetStream, names intent.Names, cfg StreamConfig) (jetstream.Stream, error) {
	if cfg.Replicas == 0 {
		cfg.Replicas = 1
	}
	if cfg.Retention == 0 {
		cfg.Retention = DefaultRetention
	}
	sc := jetstream.StreamConfig{
		Name:        names.AuditStream,
		Description: "idemgate audit trail: signed, hash-chained events of every operation, per ledger partition (docs/audit.md)",
		Subjects:    []string{names.AuditSubjects()},
		Retention:   jetstream.LimitsPolicy,
		Storage:     jetstream.FileStorage,
		Replicas:    cfg.Replicas,
		MaxAge:      cfg.Retention,
		Discard:     jetstream.DiscardOld,
		DenyDelete:  true,
		DenyPurge:   true,
	}
	// Created first, updated only when there with another configuration:
	// workers starting together on a cluster race to create it, and the
	// server answers an identical create even while another's is in
	// flight, but can leave an update of a stream that has not elected
	// its first leader yet unanswered.
	s, err := js.CreateStream(ctx, sc)
	if errors.Is(err, jetstream.ErrStreamNameAlreadyInUse) {
		s, err = js.CreateOrUpdateStream(ctx, sc)
	}
	if err != nil {
		return nil, fmt.Errorf("audit stream %s: %w", names.AuditStream, err)
	}
	if _, err := keysBucket(ctx, js, names, cfg.Replicas); err != nil {
		return nil, err
	}
	return s, nil
}

// keysBucket creates (or binds) the bucket of public keys. It creates
// first, as EnsureStream does, and binds one there with another
// configuration.
func keysBucket(ctx context.Context, js jetstream.JetStream, names intent.Names, replicas int) (jetstream.KeyValue, error) {
	kv, err := js.CreateKeyValue(ctx, jetstream.KeyValueConfig{
		Bucket:      names.AuditKeys,
		Description: "idemgate audit: the public keys workers sign with, by key id",
		History:     1,
		Storage:     jetstream.FileStorage,
		Replicas:    replicas,
	})
	if errors.Is(err, jetstream.ErrBucketExists) {
		kv, err = js.KeyValue(ctx, names.AuditKeys)
	}
	if err != nil {
		return nil, fmt.Errorf("audit keys bucket %s: %w", names.AuditKeys, err)
	}
	return kv, nil
}

// PublishKey publishes k in the installation's bucket of public keys (the
// keys verify uses when given none), unless a key of its id is there
// already: the first publication's validity stands.
func PublishKey(ctx context.Context, js jetstream.JetStream, names intent.Names, k PublicKey) error {
	if _, err := k.decode(); err != nil {
		return err
	}
	kv, err := js.KeyValue(ctx, names.AuditKeys)
	if err != nil {
		return fmt.Errorf("audit keys bucket %s: %w", names.AuditKeys, err)
	}
	data, err := json.Marshal(k)
	if err != nil {
		return fmt.Errorf("audit: encode key: %w", err)
	}
	if _, err := kv.Create(ctx, k.ID, data); err != nil && !errors.Is(err, jetstream.ErrKeyExists) {
		return fmt.Errorf("publish key %s in %s: %w", k.ID, names.AuditKeys, err)
	}
	return nil
}

// PublishedKeys returns the public keys the installation's workers
// published. They are as trustworthy as the bucket: an auditor who must
// not trust the installation verifies with a keys file of its own.
func PublishedKeys(ctx context.Context, js jetstream.JetStream, names intent.Names) (*KeySet, error) {
	kv, err := js.KeyValue(ctx, names.AuditKeys)
	if err != nil {
		return nil, fmt.Errorf("audit keys bucket %s: %w", names.AuditKeys, err)
	}
	ids, err := kv.ListKeys(ctx)
	if err != nil {
		return nil, fmt.Errorf("audit keys bucket %s: %w", names.AuditKeys, err)
	}
	ks := &KeySet{}
	for id := range ids.Keys() {
		if !isKeyID(id) {
			continue
		}
		e, err := kv.Get(ctx, id)
		if errors.Is(err, jetstream.ErrKeyNotFound) {
			continue
		}
		if err != nil {
			return nil, fmt.Errorf("audit key %s: %w", id, err)
		}
		var k PublicKey
		if err := json.Unmarshal(e.Value(), &k); err != nil {
			return nil, fmt.Errorf("%w: published key %s: %w", ErrInvalid, id, err)
		}
		if err := ks.Add(k); err != nil {
			return nil, fmt.Errorf("published key %s: %w", id, err)
		}
	}
	return ks, nil
}
