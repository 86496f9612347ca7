package mcp

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"time"

	sdk "github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/idemgate/idemgate/pkg/effects"
	"github.com/idemgate/idemgate/pkg/effects/internal/text"
)

// ProbeConfig configures an mcp tool's probe (see Effect.Prober). Zero
// fields mean the defaults.
type ProbeConfig struct {
	// Tool is the upstream's tool that answers a probe, called with
	// {"key": K}. Required.
	Tool string
	// Timeout bounds the probe, connecting included. Default
	// effects.DefaultProbeTimeout.
	Timeout time.Duration
}

// Validate reports every invalid field of c, each a *effects.SettingError
// whose Field is the probe's field name.
func (c ProbeConfig) Validate() error {
	var errs []error
	if c.Tool == "" {
		errs = append(errs, &effects.SettingError{Kind: "probe", Field: "tool", Problem: "is missing", Hint: "name the upstream's tool that answers a probe, e.g. tool: find_refund"})
	}
	if c.Timeout < 0 {
		errs = append(errs, &effects.SettingError{Kind: "probe", Field: "timeout", Problem: "is negative", Hint: "write e.g. 5s"})
	}
	return errors.Join(errs...)
}

// Prober is an mcp tool's probe: one call of an upstream tool that tells
// whether the operation with a key happened (see Probe).
type Prober struct {
	conn    *Conn
	tool    string
	timeout time.Duration
}

var _ effects.Prober = (*Prober)(nil)

// Prober returns the probe cfg describes, on the effect's upstream, or an
// error joining a *effects.SettingError for every invalid field.
func (m *Effect) Prober(cfg ProbeConfig) (*Prober, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	if cfg.Timeout == 0 {
		cfg.Timeout = effects.DefaultProbeTimeout
	}
	return &Prober{conn: m.conn, tool: cfg.Tool, timeout: cfg.Timeout}, nil
}

// Probe calls the probe tool with {"key": K}, the key also in the call's
// _meta (MetaKey) as a firing sends it. The verdict is the "verdict" member
// of the result's structured content, or else of its first text block read
// as a JSON object: done, not_done or unknown; the result of a done is its
// "result" member. A result with isError, or any other verdict, is
// unknown. No answer within the timeout, a broken transport or an error
// of the call itself is an error wrapping effects.ErrProbe.
func (p *Prober) Probe(ctx context.Context, call effects.Call) (effects.ProbeAnswer, error) {
	ans := effects.ProbeAnswer{Verdict: effects.VerdictUnknown, Evidence: effects.Evidence{Request: fmt.Sprintf("mcp %s tool %s", p.conn.up, p.tool)}}
	failed := func(err error) (effects.ProbeAnswer, error) {
		if errors.Is(ctx.Err(), context.DeadlineExceeded) {
			err = fmt.Errorf("no answer within %s", text.FormatDuration(p.timeout))
		}
		ans.Evidence.Status = effects.ClipEvidence(p.conn.hideText(err.Error()))
		return ans, fmt.Errorf("%w: %s: %s", effects.ErrProbe, ans.Evidence.Request, ans.Evidence.Status)
	}
	ctx, cancel := context.WithTimeout(ctx, p.timeout)
	defer cancel()
	cs, err := p.conn.session(ctx)
	if err != nil {
		return failed(err)
	}
	args, _ := json.Marshal(map[string]string{"key": call.Key})
	res, err := cs.CallTool(ctx, &sdk.CallToolParams{Name: p.tool, Arguments: json.RawMessage(args), Meta: sdk.Meta{MetaKey: call.Key}})
	if err != nil {
		if !isRPCError(err) {
			p.conn.drop(cs)
		}
		return failed(err)
	}
	body := contentText(res.Content)
	ans.Evidence.Body = effects.ClipEvidence(p.conn.hideText(body))
	if res.IsError {
		ans.Evidence.Status = "isError"
		return ans, nil
	}
	var v struct {
		Verdict string          `json:"verdict"`
		Result  json.RawMessage `json:"result"`
	}
	if res.StructuredContent != nil {
		data, _ := json.Marshal(res.StructuredContent)
		_ = json.Unmarshal(data, &v)
	} else {
		_ = json.Unmarshal([]byte(strings.TrimSpace(body)), &v)
	}
	ans.Evidence.Status = "verdict: " + v.Verdict
	switch effects.Verdict(v.Verdict) {
	case effects.VerdictDone:
		ans.Verdict, ans.Result = effects.VerdictDone, v.Result
		if len(ans.Result) == 0 {
			ans.Result = json.RawMessage("null")
		}
	case effects.VerdictNotDone:
		ans.Verdict = effects.VerdictNotDone
	}
	return ans, nil
}
