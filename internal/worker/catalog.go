package worker

import (
	"encoding/json"
	"fmt"

	"github.com/nats-io/nats.go"
	"go.uber.org/zap"

	"github.com/idemgate/idemgate/pkg/intent"
)

// catalog is the tool catalogue this worker serves on Names.ToolsSubject.
func (w *Worker) catalog() intent.Catalog {
	var cat intent.Catalog
	for _, name := range w.tools.Names() {
		t, _ := w.tools.Lookup(name)
		cat.Tools = append(cat.Tools, intent.ToolInfo{
			Name:          t.Name,
			Effect:        t.Kind,
			KeyArgs:       t.KeySpec.KeyArgs,
			WindowSeconds: int64(t.KeySpec.Window.Seconds()),
			VolatileArgs:  t.KeySpec.VolatileArgs,
			LeaseSeconds:  t.Lease.Seconds(),
		})
	}
	return cat
}

// serveCatalog answers tool-catalogue requests (one worker of the queue group
// answers each) until the returned subscription is drained.
func (w *Worker) serveCatalog() (*nats.Subscription, error) {
	data, err := json.Marshal(w.catalog())
	if err != nil {
		return nil, fmt.Errorf("encode tool catalogue: %w", err)
	}
	sub, err := w.nc.QueueSubscribe(w.res.names.ToolsSubject, w.res.names.Consumer, func(m *nats.Msg) {
		if err := m.Respond(data); err != nil {
			w.log.Debug("answer tool catalogue", zap.Error(err))
		}
	})
	if err != nil {
		return nil, fmt.Errorf("serve tool catalogue on %s: %w", w.res.names.ToolsSubject, err)
	}
	return sub, nil
}
