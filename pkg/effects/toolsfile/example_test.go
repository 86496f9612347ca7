package toolsfile_test

import (
	"context"
	"encoding/json"
	"fmt"
	"net/netip"

	"github.com/idemgate/idemgate/pkg/effects"
	"github.com/idemgate/idemgate/pkg/effects/toolsfile"
)

// Parse a tools file, look a tool up and fire its effect.
func Example() {
	registry, err := toolsfile.Parse([]byte(`
tools:
  demo_echo:
    effect: noop
    key_args: [text]
    lease: 10s
  demo_fixed:
    effect: noop
    key_args: all
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
	_, err := toolsfile.Parse([]byte(`
tools:
  send_email:
    effect: webhook
    key_args: [to, subject]
    lease: 30
    webhook:
      url: http://127.0.0.1:8080/hooks/email
      timout: 10s
`), toolsfile.WithFilename("tools.yaml"))
	fmt.Println(err)
	// Output:
	// tools.yaml:6: send_email.lease: "30" is not a duration (write e.g. 30s)
	// tools.yaml:9: send_email.webhook.timout: unknown field (did you mean timeout?)
}

// A webhook to a loopback address is refused when it fires, and the loader
// warns about it; WithAllowPrivate (the worker's --webhook-allow) lets every
// URL-taking effect of the file reach the addresses it names.
func ExampleWithAllowPrivate() {
	file := []byte(`
tools:
  create_ticket:
    effect: webhook
    key_args: [title]
    webhook: {url: "http://127.0.0.1:8787/tickets"}
`)
	strict, err := toolsfile.Parse(file)
	if err != nil {
		fmt.Println(err)
		return
	}
	defer strict.Close()
	fmt.Println(len(strict.Warnings()), "warning:", strict.Warnings()[0].Problem)

	allowed, err := toolsfile.Parse(file, toolsfile.WithAllowPrivate(netip.MustParsePrefix("127.0.0.0/8")))
	if err != nil {
		fmt.Println(err)
		return
	}
	defer allowed.Close()
	fmt.Println(len(allowed.Warnings()), "warnings")
	// Output:
	// 1 warning: http://127.0.0.1:8787/tickets names 127.0.0.1, a loopback address: every request would be refused when the tool fires
	// 0 warnings
}
