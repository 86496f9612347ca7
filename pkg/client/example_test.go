package client_test

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"time"

	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"

	"github.com/idemgate/idemgate/internal/worker"
	"github.com/idemgate/idemgate/pkg/client"
	"github.com/idemgate/idemgate/pkg/effects"
	"github.com/idemgate/idemgate/pkg/intent"
)

// Submitting the same operation twice fires it once; the second answer is
// the first one's result, replayed.
func Example() {
	dir, _ := os.MkdirTemp("", "idemgate-example-")
	defer os.RemoveAll(dir)
	srv, _ := server.NewServer(&server.Options{JetStream: true, StoreDir: dir, Port: -1, NoLog: true, NoSigs: true})
	srv.Start()
	defer srv.Shutdown()
	srv.ReadyForConnections(10 * time.Second)
	nc, _ := nats.Connect(srv.ClientURL())
	defer nc.Close()

	// A worker with one tool whose effect counts its firings.
	fired := 0
	tools, _ := effects.NewRegistry(&effects.Tool{Name: "create_ticket", Effect: effects.EffectFunc(
		func(ctx context.Context, call effects.Call) (effects.Outcome, error) {
			fired++
			return effects.Outcome{Result: json.RawMessage(`{"ticket":"T-1"}`), Invocations: 1}, nil
		})})
	ctx, stop := context.WithCancel(context.Background())
	w, err := worker.New(ctx, nc, tools, nil, worker.Config{})
	if err != nil {
		stop()
		fmt.Println(err)
		return
	}
	done := make(chan error)
	go func() { done <- w.Run(ctx, time.Second) }()
	defer func() { stop(); <-done }()
	<-w.Ready()

	cl, _ := client.New(nc)
	for range 2 {
		env, _ := intent.Decode([]byte(`{"tool":"create_ticket","args":{"title":"Printer on fire"},"session":"run-7"}`), intent.Limits{})
		res, err := cl.Submit(ctx, env)
		if err != nil {
			fmt.Println(err)
			return
		}
		fmt.Println(res.Status, "replayed:", res.Replayed, string(res.Result))
	}
	fmt.Println("fired:", fired)
	// Output:
	// completed replayed: false {"ticket":"T-1"}
	// completed replayed: true {"ticket":"T-1"}
	// fired: 1
}
