package effects_test

import (
	"context"
	"encoding/json"
	"fmt"

	"github.com/idemgate/idemgate/pkg/effects"
)

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
