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

// An operator pages through every open operation, then forgets a settled
// one so that it may run again.
func ExampleLedger_List() {
	dir, _ := os.MkdirTemp("", "ledger-list-example")
	defer os.RemoveAll(dir)
	s, _ := server.NewServer(&server.Options{Port: -1, JetStream: true, StoreDir: dir, NoLog: true, NoSigs: true})
	s.Start()
	defer func() { s.Shutdown(); s.WaitForShutdown() }()
	s.ReadyForConnections(10 * time.Second)
	nc, _ := nats.Connect(s.ClientURL())
	defer nc.Close()
	js, _ := jetstream.New(nc)
	ctx := context.Background()
	ledger, err := dedup.Open(ctx, js, dedup.BucketConfig{Bucket: "LIST_EXAMPLE"})
	if err != nil {
		fmt.Println(err)
		return
	}
	for _, key := range []string{"refund.a1", "refund.b2", "send_email.c3"} {
		c, _ := ledger.Claim(ctx, dedup.ClaimRequest{Key: key, Fingerprint: "fp", Holder: "w1", Session: "run-7"})
		if key == "send_email.c3" {
			_, _ = c.Lease.Complete(ctx, json.RawMessage(`{}`), 1)
		}
	}

	q := dedup.Query{Statuses: dedup.OpenStatuses, Limit: 1}
	for {
		page, err := ledger.List(ctx, q)
		if err != nil {
			fmt.Println(err)
			return
		}
		for _, r := range page.Records {
			fmt.Println(r.Key, r.Status, r.Session)
		}
		if !page.More {
			break
		}
		q.After = page.Next
	}
	rec, err := ledger.Forget(ctx, "send_email.c3")
	fmt.Println("forgot a", rec.Status, "operation:", err)
	// Output:
	// refund.a1 pending run-7
	// refund.b2 pending run-7
	// forgot a completed operation: <nil>
}
