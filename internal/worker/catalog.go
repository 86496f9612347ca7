package worker

import (
	"fmt"

	"github.com/nats-io/nats.go/micro"
	"go.uber.org/zap"

	"github.com/idemgate/idemgate/pkg/effects/mcp/upstream"
	"github.com/idemgate/idemgate/pkg/intent"
)

// Version is reported by the workers' NATS service.
const Version = "0.1.0"

// catalog is the tool catalogue this worker serves on Names.ToolsSubject.
func (w *Worker) catalog() intent.Catalog {
	var cat intent.Catalog
	for _, name := range w.tools.Names() {
		t, _ := w.tools.Lookup(name)
		info := intent.ToolInfo{
			Name:          t.Name,
			Effect:        t.Kind,
			Class:         t.Policy.Class,
			SafeToRetry:   t.Policy.SafeToRetry(),
			Ledger:        t.Policy.Ledger,
			KeyArgs:       t.KeySpec.KeyArgs,
			WindowSeconds: int64(t.KeySpec.Window.Seconds()),
			VolatileArgs:  t.KeySpec.VolatileArgs,
			LeaseSeconds:  t.Lease.Seconds(),
			Description:   t.Description,
			Schema:        t.Schema,
			Destructive:   t.IsDestructive(),
		}
		if t.Policy.Approval {
			info.Approval, info.Approver = intent.ApprovalRequired, intent.ApproverOperator
			if t.Policy.UserApproves {
				info.Approver = intent.ApproverUser
			}
		}
		if t.Policy.Ledger {
			info.RetentionSeconds = int64(w.cfg.LedgerTTL.Seconds())
			if t.Policy.Retention > 0 {
				info.RetentionSeconds = int64(t.Policy.Retention.Seconds())
			}
		}
		if m, ok := t.Effect.(upstreamEffect); ok {
			info.Upstream, info.UpstreamTool = m.Upstream().String(), m.UpstreamTool()
		}
		if t.Policy.Ledger {
			info.OnAbandoned = t.Policy.OnAbandoned
			info.OnFailure, info.OnComplete = t.Policy.OnFailure, t.Policy.OnComplete
		}
		info.Budget = t.Policy.Budget.Info()
		info.Probe = t.Prober != nil
		cat.Tools = append(cat.Tools, info)
	}
	return cat
}

// upstreamEffect is an effect that calls a tool of an upstream MCP server
// (the mcp kind's).
type upstreamEffect interface {
	Upstream() upstream.Server
	UpstreamTool() string
}

// serveCatalog runs the workers' NATS service ("idemgate", discoverable with
// $SRV.PING/INFO/STATS like any nats.go micro service) with the tool
// catalogue endpoint on Names.ToolsSubject. One worker of the queue group
// answers each request.
func (w *Worker) serveCatalog() (micro.Service, error) {
	svc, err := micro.AddService(w.nc, micro.Config{
		Name:        "idemgate",
		Version:     Version,
		Description: "idempotency gateway for tool calls: the tool catalogue",
		QueueGroup:  w.res.names.Consumer,
		Endpoint: &micro.EndpointConfig{
			Subject: w.res.names.ToolsSubject,
			Handler: micro.HandlerFunc(func(req micro.Request) {
				// Built per request: tools of an upstream MCP server come
				// and go with its list.
				if err := req.RespondJSON(w.catalog()); err != nil {
					w.log.Debug("answer tool catalogue", zap.Error(err))
				}
			}),
		},
	})
	if err != nil {
		return nil, fmt.Errorf("serve tool catalogue on %s: %w", w.res.names.ToolsSubject, err)
	}
	return svc, nil
}
