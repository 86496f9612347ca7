package effects_test

import (
	"context"
	"encoding/json"
	"fmt"
	"time"

	"github.com/idemgate/idemgate/pkg/effects"
)

// Parse a tools file, look a tool up and fire its effect.
func Example() {
	registry, err := effects.Parse([]byte(`
tools:
  demo_echo:
    effect: noop
    key_args: [text]
    lease: 10s
  demo_fixed:
    effect: noop
    noop: {result: {ok: true}}
`))
	if err != nil {
		fmt.Println(err)
		return
	}
	defer registry.Close()
	fmt.Println(registry.Names())

	tool, _ := registry.Lookup("demo_echo")
	fmt.Println(tool.Kind, tool.KeySpec.KeyArgs, tool.Lease)

	out, err := tool.Effect.Fire(context.Background(), effects.Call{
		Key:  "demo_echo.3b1f",
		Tool: "demo_echo",
		Args: json.RawMessage(`{"text":"hi"}`),
	})
	fmt.Println(string(out.Result), out.Invocations, err)
	// Output:
	// [demo_echo demo_fixed]
	// noop [text] 10s
	// {"echo":{"text":"hi"}} 1 <nil>
}

// Every problem in a tools file is reported, each with its line and a hint.
func ExampleParse_errors() {
	_, err := effects.Parse([]byte(`
tools:
  send_email:
    effect: webhook
    lease: 30
    webhook:
      url: http://127.0.0.1:8080/hooks/email
      timout: 10s
`), effects.WithFilename("tools.yaml"))
	fmt.Println(err)
	// Output:
	// tools.yaml:5: send_email.lease: "30" is not a duration (write e.g. 30s)
	// tools.yaml:8: send_email.webhook.timout: unknown field (did you mean timeout?)
}

// A kind of effect that needs something at run time (a connection, a
// client) is added with WithFactory; the loader needs no change.
func ExampleWithFactory() {
	queue := func(s *effects.Section) (effects.Effect, error) {
		subject := s.String("subject", "")
		if subject == "" {
			s.Invalid("subject", "is missing", "write e.g. subject: billing.charge")
		}
		timeout := s.Duration("timeout", 5*time.Second)
		return effects.EffectFunc(func(ctx context.Context, call effects.Call) (effects.Outcome, error) {
			ctx, cancel := context.WithTimeout(ctx, timeout)
			defer cancel()
			_ = ctx // send call.Args to subject, forwarding call.Key ...
			return effects.Outcome{Result: json.RawMessage(`{"queued":true}`), Invocations: 1}, nil
		}), nil
	}
	registry, err := effects.Parse([]byte(`
tools:
  charge:
    effect: queue
    queue: {subject: billing.charge, timeout: 2s}
`), effects.WithFactory("queue", queue))
	if err != nil {
		fmt.Println(err)
		return
	}
	defer registry.Close()
	tool, _ := registry.Lookup("charge")
	fmt.Println(tool.Name, tool.Kind)
	// Output: charge queue
}

// Effects written in code are registered without a tools file.
func ExampleNewRegistry() {
	registry, err := effects.NewRegistry(&effects.Tool{
		Name: "add_note",
		Effect: effects.EffectFunc(func(_ context.Context, call effects.Call) (effects.Outcome, error) {
			if len(call.Args) > 1024 {
				return effects.Outcome{}, effects.Permanent("", "note too long")
			}
			return effects.Outcome{Result: json.RawMessage(`{"saved":true}`), Invocations: 1}, nil
		}),
	})
	if err != nil {
		fmt.Println(err)
		return
	}
	tool, _ := registry.Lookup("add_note")
	fmt.Println(tool.Name, tool.Lease)
	// Output: add_note 30s
}
