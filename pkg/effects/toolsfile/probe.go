package toolsfile

import (
	"fmt"
	"strconv"

	"go.yaml.in/yaml/v3"

	"github.com/idemgate/idemgate/pkg/effects"
	"github.com/idemgate/idemgate/pkg/effects/mcp"
	"github.com/idemgate/idemgate/pkg/effects/natsservice"
	"github.com/idemgate/idemgate/pkg/effects/webhook"
	"github.com/idemgate/idemgate/pkg/intent"
)

// readProbe reads a tool's "probe:" settings for its effect eff of kind
// (docs/tools.md describes them) and builds its prober; nil when the tool
// has none, or when the settings have problems (reported on s).
func readProbe(s *section, kind string, eff effects.Effect) effects.Prober {
	if !s.Has("probe") {
		return nil
	}
	p := s.Section("probe")
	if !p.Present() || len(p.fields) == 0 {
		p.Invalid("", "is empty", "remove probe, or describe how to ask the downstream, e.g. probe: {url: https://api.example/refunds?idempotency_key={key}}")
		return nil
	}
	switch kind {
	case intent.EffectWebhook:
		cfg := webhook.ProbeConfig{
			URL:     p.String("url", ""),
			Method:  p.String("method", webhook.DefaultProbeMethod),
			Timeout: positiveDuration(p, "timeout", effects.DefaultProbeTimeout),
			Done:    readStatuses(p, "done"),
			NotDone: readStatuses(p, "not_done"),
		}
		if err := cfg.Validate(); err != nil {
			p.invalidSettings(err)
			return nil
		}
		w, ok := eff.(*webhook.Effect)
		if !ok {
			return nil // the effect has problems, reported already
		}
		pr, err := w.Prober(cfg)
		if err != nil {
			p.invalidSettings(err)
			return nil
		}
		return pr
	case intent.EffectNATS:
		cfg := natsservice.ProbeConfig{
			Subject: p.String("subject", ""),
			Timeout: positiveDuration(p, "timeout", effects.DefaultProbeTimeout),
		}
		if err := cfg.Validate(); err != nil {
			p.invalidSettings(err)
			return nil
		}
		n, ok := eff.(*natsservice.Effect)
		if !ok {
			return nil
		}
		pr, err := n.Prober(cfg)
		if err != nil {
			p.invalidSettings(err)
			return nil
		}
		return pr
	case intent.EffectMCP:
		cfg := mcp.ProbeConfig{
			Tool:    p.String("tool", ""),
			Timeout: positiveDuration(p, "timeout", effects.DefaultProbeTimeout),
		}
		if err := cfg.Validate(); err != nil {
			p.invalidSettings(err)
			return nil
		}
		m, ok := eff.(*mcp.Effect)
		if !ok {
			return nil
		}
		pr, err := m.Prober(cfg)
		if err != nil {
			p.invalidSettings(err)
			return nil
		}
		return pr
	default:
		// The fields are not read: mark them, so that the one problem is
		// this one.
		for name := range p.fields {
			p.used[name] = true
		}
		s.Invalid("probe", "the "+kind+" effect cannot be probed", "remove probe: webhook, nats and mcp tools take one")
		return nil
	}
}

// readStatuses reads a verdict rule of a webhook probe: a mapping with one
// field, status, a status or a list of them ("done: {status: 200}").
func readStatuses(p *section, name string) []int {
	if !p.Has(name) {
		return nil
	}
	r := p.Section(name)
	hint := "write e.g. " + name + ": {status: 200} or " + name + ": {status: [200, 201]}"
	node, ok := r.Value("status")
	if !ok {
		r.Invalid("", "has no status", hint)
		return nil
	}
	items := []*yaml.Node{node}
	if node.Kind == yaml.SequenceNode {
		items = node.Content
	}
	var out []int
	for _, it := range items {
		it = resolve(it)
		n, err := strconv.Atoi(it.Value)
		if it.Kind != yaml.ScalarNode || it.Tag != "!!int" || err != nil {
			p.c.add(it.Line, r.join("status"), fmt.Sprintf("%s is not an HTTP status", describe(it)), hint)
			continue
		}
		out = append(out, n)
	}
	if len(out) == 0 && len(items) == 0 {
		r.Invalid("status", "is an empty list", hint)
	}
	return out
}
