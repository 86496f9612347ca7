package worker

import (
	"fmt"

	"github.com/nats-io/nats.go"
	"go.uber.org/zap"
)

// serveForget subscribes to Names.ForgetSubject — every worker, no queue
// group — and drops each key published there from the answer cache: an
// operator deleted the key's record so that the operation may run again,
// and a cached answer would otherwise replay it for up to the cache's age.
// The key is the operation's or, in a compact ledger, the one it is stored
// under; the cache finds the entry by either.
// The subscription ends when it is unsubscribed.
func (w *Worker) serveForget() (*nats.Subscription, error) {
	subject := w.res.names.ForgetSubject()
	sub, err := w.nc.Subscribe(subject, func(m *nats.Msg) {
		key := string(m.Data)
		if key == "" {
			return
		}
		w.answers.forget(key)
		w.log.Info("forgot the cached answer of a key", zap.String("key", key))
	})
	if err != nil {
		return nil, fmt.Errorf("subscribe %s: %w", subject, err)
	}
	return sub, nil
}
