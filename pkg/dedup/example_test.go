package dedup_test

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"time"

	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/idemgate/idemgate/pkg/dedup"
)

// A worker claims a key, fires the effect once and records the result; a
// duplicate of the same operation is answered from the ledger.
func Example() {
	dir, _ := os.MkdirTemp("", "ledger-example")
	defer os.RemoveAll(dir)
	s, _ := server.NewServer(&server.Options{Port: -1, JetStream: true, StoreDir: dir, NoLog: true, NoSigs: true})
	s.Start()
	defer func() { s.Shutdown(); s.WaitForShutdown() }()
	s.ReadyForConnections(10 * time.Second)
	nc, _ := nats.Connect(s.ClientURL())
	defer nc.Close()
	js, _ := jetstream.New(nc)

	ctx := context.Background()
	ledger, err := dedup.Open(ctx, js, dedup.BucketConfig{})
	if err != nil {
		fmt.Println(err)
		return
	}

	req := dedup.ClaimRequest{
		Key:         "send_email.3f2a",
		Tool:        "send_email",
		Fingerprint: "9c1e",
		Holder:      "worker-1",
		Lease:       30 * time.Second,
	}
	first, _ := ledger.Claim(ctx, req)
	fmt.Println("first:", first.Outcome)
	// ... fire the effect, forwarding the key downstream ...
	_, _ = first.Lease.Complete(ctx, json.RawMessage(`{"message_id":"m-1"}`), 1)

	req.Holder = "worker-2"
	dup, _ := ledger.Claim(ctx, req)
	fmt.Println("duplicate:", dup.Outcome, dup.Record.Status, string(dup.Record.Result))

	req.Fingerprint = "other-args"
	conflict, _ := ledger.Claim(ctx, req)
	fmt.Println("other arguments:", conflict.Outcome)
	// Output:
	// first: acquired
	// duplicate: done completed {"message_id":"m-1"}
	// other arguments: conflict
}
