package jsbackend_test

import (
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"
	"github.com/stretchr/testify/require"

	"github.com/idemgate/idemgate/internal/natstest"
	"github.com/idemgate/idemgate/pkg/dedup/internal/jsbackend"
)

// Create makes in one request the bucket a key-value create followed by an
// update of the stream's settings makes (what Ensure does to a bucket that
// is there with another configuration), and a second Create of it returns
// it as it is.
func TestCreateMakesWhatEnsureMakes(t *testing.T) {
	t.Parallel()
	ctx := t.Context()
	js, err := jetstream.New(natstest.Connect(t, natstest.RunServer(t).ClientURL()), jetstream.WithDefaultTimeout(time.Minute))
	require.NoError(t, err)
	settings := func(name string) jsbackend.Settings {
		return jsbackend.Settings{Name: name, Replicas: 1, Storage: jetstream.FileStorage, AtomicPublish: true, MaxConsumers: 100,
			Metadata: map[string]string{"idemgate.partitions": "1"}}
	}
	_, err = jsbackend.Create(ctx, js, settings("CREATED"))
	require.NoError(t, err)
	_, err = jsbackend.Create(ctx, js, settings("CREATED"))
	require.NoError(t, err, "a second create of the same bucket returns it")

	// The bucket as a plain key-value create makes it, then ensured.
	_, err = js.CreateKeyValue(ctx, jetstream.KeyValueConfig{Bucket: "ENSURED", Description: "idemgate ledger: one record per operation key",
		History: 1, Storage: jetstream.FileStorage, Replicas: 1, LimitMarkerTTL: time.Minute, Metadata: map[string]string{"idemgate.partitions": "1"}})
	require.NoError(t, err)
	_, err = jsbackend.Ensure(ctx, js, settings("ENSURED"))
	require.NoError(t, err)

	config := func(name string) jetstream.StreamConfig {
		s, err := js.Stream(ctx, "KV_"+name)
		require.NoError(t, err)
		c := s.CachedInfo().Config
		require.Equal(t, []string{"$KV." + name + ".>"}, c.Subjects)
		c.Name, c.Subjects = "", nil
		return c
	}
	require.Equal(t, config("ENSURED"), config("CREATED"))
}
