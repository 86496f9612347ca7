package jsbackend

import (
	"context"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
)

// Watcher watches one key's messages, pushed by the server as they are
// written (no polling). A watch may be served by a replica that lags behind
// the leader: what it shows may be older than an acknowledged write.
type Watcher struct {
	kw jetstream.KeyWatcher
}

// Watch watches key: its latest message first (none when it has none), then
// every later one. It may start before the key exists. The watch ends with
// ctx or Stop; its updates channel is then closed.
func (b *Bucket) Watch(ctx context.Context, key string) (*Watcher, error) {
	kw, err := b.kv.Watch(ctx, key)
	if err != nil {
		return nil, err
	}
	return &Watcher{kw: kw}, nil
}

// WatchAll watches every key of the bucket from now on: each message written
// after the call, pushed by the server. The watch ends with ctx or Stop.
func (b *Bucket) WatchAll(ctx context.Context) (*Watcher, error) {
	kw, err := b.kv.WatchAll(ctx, jetstream.UpdatesOnly())
	if err != nil {
		return nil, err
	}
	return &Watcher{kw: kw}, nil
}

// Updates delivers the watched key's messages; Observed reads each.
func (w *Watcher) Updates() <-chan jetstream.KeyValueEntry { return w.kw.Updates() }

// Stop ends the watch.
func (w *Watcher) Stop() { _ = w.kw.Stop() }

// Observed returns the message an update of Updates delivers; ok is false
// for the update that marks the end of the initial messages (and carries
// none).
func Observed(u jetstream.KeyValueEntry) (e Entry, ok bool) {
	if u == nil {
		return Entry{}, false
	}
	op := u.Operation()
	return Entry{Rev: u.Revision(), Data: u.Value(), Deleted: op == jetstream.KeyValueDelete || op == jetstream.KeyValuePurge}, true
}

// Waker is a plain subscription to one key's subject, on which every write
// of the key is published: a signal that the key may have changed, never
// its value. It creates nothing on the server (no consumer) and receives
// only what its own connection subscribed to, so a user allowed to
// subscribe to the bucket's subjects needs no JetStream permission to use
// it. A signal may come before the write is stored, for a write the stream
// refuses, or not at all (a reconnect, interest not yet known to the
// writer's server): read the key from the leader after each, and again now
// and then.
type Waker struct {
	sub *nats.Subscription
	c   chan struct{}
}

// Wake subscribes to key's subject. Signals that arrive while one is
// pending are merged into it. Stop ends the subscription.
func (b *Bucket) Wake(key string) (*Waker, error) {
	w := &Waker{c: make(chan struct{}, 1)}
	sub, err := b.nc.Subscribe(b.keyPrefix+key, func(*nats.Msg) {
		select {
		case w.c <- struct{}{}:
		default: // one signal pending is enough
		}
	})
	if err != nil {
		return nil, err
	}
	w.sub = sub
	return w, nil
}

// C delivers a signal after each write published on the key's subject.
func (w *Waker) C() <-chan struct{} { return w.c }

// Stop ends the subscription.
func (w *Waker) Stop() { _ = w.sub.Unsubscribe() }
