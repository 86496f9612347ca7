package integration

import (
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
)

func jetstreamFor(nc *nats.Conn) (jetstream.JetStream, error) { return jetstream.New(nc) }
