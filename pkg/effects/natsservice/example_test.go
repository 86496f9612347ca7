package natsservice_test

import (
	"context"
	"encoding/json"
	"fmt"
	"time"

	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/micro"

	"github.com/idemgate/idemgate/pkg/effects"
	"github.com/idemgate/idemgate/pkg/effects/toolsfile"
)

// A tool answered by a NATS service: the worker adds the nats kind with its
// own connection, and any service on the subject — here one built with
// nats.go's micro package — receives the args and the key.
func Example() {
	// An embedded server, so that the example runs on its own; a worker
	// uses the connection it already has.
	ns, err := server.NewServer(&server.Options{Host: "127.0.0.1", Port: -1, NoLog: true, NoSigs: true})
	if err != nil {
		fmt.Println(err)
		return
	}
	ns.Start()
	defer func() { ns.Shutdown(); ns.WaitForShutdown() }()
	if !ns.ReadyForConnections(5 * time.Second) {
		fmt.Println("server not ready")
		return
	}
	nc, err := nats.Connect(ns.ClientURL())
	if err != nil {
		fmt.Println(err)
		return
	}
	defer nc.Close()

	// The service, in any language; a keyed one remembers what it did for
	// each Idempotency-Key and answers a repeat with the same reply.
	svc, err := micro.AddService(nc, micro.Config{
		Name:    "billing",
		Version: "1.0.0",
		Endpoint: &micro.EndpointConfig{
			Subject: "billing.charge",
			Handler: micro.HandlerFunc(func(req micro.Request) {
				var args struct {
					Cents int `json:"cents"`
				}
				if json.Unmarshal(req.Data(), &args) != nil || args.Cents <= 0 {
					_ = req.Error("400", "cents must be a positive number", nil)
					return
				}
				_ = req.RespondJSON(map[string]any{"charge": "ch_" + req.Headers().Get("Idempotency-Key"), "cents": args.Cents})
			}),
		},
	})
	if err != nil {
		fmt.Println(err)
		return
	}
	defer func() { _ = svc.Stop() }()

	registry, err := toolsfile.Parse([]byte(`
tools:
  charge:
    effect: nats
    key_args: [order_id]
    nats:
      subject: billing.charge
      timeout: 5s
`), toolsfile.WithNATSConn(nc))
	if err != nil {
		fmt.Println(err)
		return
	}
	defer registry.Close()
	tool, _ := registry.Lookup("charge")

	out, err := tool.Effect.Fire(context.Background(), effects.Call{Key: "charge.7f3a", Tool: "charge", Args: json.RawMessage(`{"cents":1250}`)})
	fmt.Println(string(out.Result), out.Invocations, err)

	_, err = tool.Effect.Fire(context.Background(), effects.Call{Key: "charge.9b21", Tool: "charge", Args: json.RawMessage(`{"cents":0}`)})
	fmt.Println(err)
	// Output:
	// {"cents":1250,"charge":"ch_charge.7f3a"} 1 <nil>
	// effect_failed: nats service billing.charge answered 400: cents must be a positive number
}
