package worker

import (
	"context"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"
	"github.com/stretchr/testify/require"
	"go.uber.org/zap"
	"go.uber.org/zap/zapcore"
	"go.uber.org/zap/zaptest/observer"

	"github.com/idemgate/idemgate/internal/natstest"
	"github.com/idemgate/idemgate/pkg/effects"
	"github.com/idemgate/idemgate/pkg/intent"
)

// persistModes builds a worker with cfg on a fresh server (after prepare,
// when set, ran on it) and returns the persist modes of the work stream,
// the dead-letter stream and the ledger's stream, and what it logged at
// warn level.
func persistModes(t *testing.T, cfg Config, prepare func(js jetstream.JetStream)) (work, dlq, ledger jetstream.PersistModeType, warnings []string) {
	t.Helper()
	s := natstest.RunServer(t)
	nc := natstest.Connect(t, s.ClientURL())
	js, err := jetstream.New(nc)
	require.NoError(t, err)
	if prepare != nil {
		prepare(js)
	}
	reg, err := effects.NewRegistry(&effects.Tool{Name: "noop", Kind: "noop", Effect: effects.EffectFunc(
		func(context.Context, effects.Call) (effects.Outcome, error) { return effects.Outcome{}, nil })})
	require.NoError(t, err)
	core, logs := observer.New(zapcore.WarnLevel)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	w, err := New(ctx, nc, reg, zap.New(core), cfg)
	require.NoError(t, err)
	mode := func(name string) jetstream.PersistModeType {
		st, err := js.Stream(ctx, name)
		require.NoError(t, err)
		return st.CachedInfo().Config.PersistMode
	}
	for _, e := range logs.All() {
		warnings = append(warnings, e.Message)
	}
	n := w.Names()
	return mode(n.Stream), mode(n.DLQStream), mode("KV_" + n.Bucket), warnings
}

func TestWorkStreamPersistsAsTheServerWithSyncIntents(t *testing.T) {
	t.Parallel()
	work, dlq, ledger, warnings := persistModes(t, Config{SyncIntents: true}, nil)
	require.Equal(t, jetstream.DefaultPersistMode, work)
	require.Equal(t, jetstream.DefaultPersistMode, dlq)
	require.Equal(t, jetstream.DefaultPersistMode, ledger)
	require.Empty(t, warnings)
}

func TestOnlyTheWorkStreamPersistsAsynchronouslyByDefault(t *testing.T) {
	t.Parallel()
	work, dlq, ledger, warnings := persistModes(t, Config{}, nil)
	require.Equal(t, jetstream.AsyncPersistMode, work)
	require.Equal(t, jetstream.DefaultPersistMode, dlq, "dead letters stay synced")
	require.Equal(t, jetstream.DefaultPersistMode, ledger, "the ledger stays synced")
	require.Empty(t, warnings)
}

// A work stream created before in the other mode is kept as it is, and the
// worker says how to migrate it: the persist mode cannot change in place.
func TestWorkStreamInTheOtherModeIsKeptWithAMigrationHint(t *testing.T) {
	t.Parallel()
	names, err := intent.NewNames("")
	require.NoError(t, err)
	create := func(mode jetstream.PersistModeType) func(js jetstream.JetStream) {
		return func(js jetstream.JetStream) {
			ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
			defer cancel()
			_, err := js.CreateStream(ctx, jetstream.StreamConfig{Name: names.Stream, Subjects: []string{names.Subjects, names.Control},
				Retention: jetstream.WorkQueuePolicy, Storage: jetstream.FileStorage, PersistMode: mode})
			require.NoError(t, err)
		}
	}
	work, _, _, warnings := persistModes(t, Config{}, create(jetstream.DefaultPersistMode))
	require.Equal(t, jetstream.DefaultPersistMode, work)
	require.Len(t, warnings, 1)
	require.Contains(t, warnings[0], "was created with the server's persistence")
	require.Contains(t, warnings[0], "nats stream rm "+names.Stream)

	work, _, _, warnings = persistModes(t, Config{SyncIntents: true}, create(jetstream.AsyncPersistMode))
	require.Equal(t, jetstream.AsyncPersistMode, work)
	require.Len(t, warnings, 1)
	require.Contains(t, warnings[0], "persists asynchronously")
	require.Contains(t, warnings[0], "nats stream rm "+names.Stream)
}

func TestStageTimesAreInOrder(t *testing.T) {
	t.Parallel()
	var mu sync.Mutex
	var got []Stages
	b := start(t, Config{OnStages: func(s Stages) {
		mu.Lock()
		defer mu.Unlock()
		got = append(got, s)
	}}, &effects.Tool{Name: "echo", Effect: effects.EffectFunc(func(context.Context, effects.Call) (effects.Outcome, error) {
		return effects.Outcome{Result: []byte(`{"ok":true}`), Invocations: 1}, nil
	})})
	first := submit(t, b.client, "echo", `{"n":1}`)
	require.Equal(t, intent.StatusCompleted, first.Status)
	mu.Lock()
	defer mu.Unlock()
	require.Len(t, got, 1)
	s := got[0]
	require.Equal(t, first.Key, s.Key)
	for i, pair := range [][2]time.Time{{s.Delivered, s.Claimed}, {s.Claimed, s.Fired}, {s.Fired, s.Recorded}, {s.Recorded, s.Answered}} {
		require.Falsef(t, pair[0].IsZero() || pair[1].IsZero() || pair[1].Before(pair[0]), "stage %d: %v then %v", i, pair[0], pair[1])
	}
	require.False(t, s.Stored.IsZero())
}

// One batch in flight at one replica, where the ledger's stream stages and
// syncs each batch on its own; the ledger's own default on a cluster.
func TestLedgerBatchesInFlightDefaultByReplicas(t *testing.T) {
	t.Parallel()
	for replicas, want := range map[int]int{0: 1, 1: 1, 3: 4} {
		c := Config{Replicas: replicas}
		c.setDefaults()
		require.Equal(t, want, c.LedgerBatchInFlight, "replicas %d", replicas)
	}
	c := Config{Replicas: 3, LedgerBatchInFlight: 2}
	c.setDefaults()
	require.Equal(t, 2, c.LedgerBatchInFlight, "a setting is kept")
}
