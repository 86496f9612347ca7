// Package natstest runs embedded NATS servers with JetStream for tests.
//
// Every server stores its data in a temporary directory, listens on a random
// loopback port and is shut down (and waited for) when the test ends, so a test
// needs no external infrastructure and leaves nothing behind:
//
//	s := natstest.RunServer(t)
//	nc := natstest.Connect(t, s.ClientURL())
//
// RunCluster starts an in-process JetStream cluster for tests that need
// replicated (R3) streams and buckets.
package natstest

import (
	"fmt"
	"net"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"
)

// A server or cluster is waited for until it is usable, however long a
// loaded machine makes that take: the test binary's -timeout is the bound
// (a quiet machine's few seconds are no measure). Every stall of
// stallReport is logged, so a wait that never ends says what it waits for.
const stallReport = 30 * time.Second

// waitUntil polls ready every poll until it reports true, logging what it
// waits for (what) at every stallReport.
func waitUntil(t testing.TB, what string, poll time.Duration, ready func() bool) {
	t.Helper()
	start, reported := time.Now(), time.Now()
	for !ready() {
		if time.Since(reported) >= stallReport {
			reported = time.Now()
			t.Logf("natstest: %s not ready after %s; still waiting", what, time.Since(start).Round(time.Second))
		}
		time.Sleep(poll)
	}
}

// RunServer starts a single JetStream-enabled server on a random loopback port,
// storing its data under t.TempDir(). Each opt may adjust the options before
// the server starts. The server is shut down, and waited for, in t.Cleanup.
func RunServer(t testing.TB, opts ...func(*server.Options)) *server.Server {
	t.Helper()
	o := options(t)
	for _, opt := range opts {
		opt(o)
	}
	return start(t, o)
}

// RunCluster starts an n-node JetStream cluster in this process, on loopback
// ports, and returns once a meta leader is elected and sees all n peers — that
// is, once a stream with up to n replicas can be created. Every server is shut
// down in t.Cleanup. Clients may connect to any of the servers. Each opt may
// adjust every server's options before it starts.
func RunCluster(t testing.TB, n int, opts ...func(*server.Options)) []*server.Server {
	t.Helper()
	if n < 1 {
		t.Fatalf("natstest: cluster size %d: need at least one server", n)
	}
	ports := freePorts(t, n)
	routes := make([]string, n)
	for i, p := range ports {
		routes[i] = fmt.Sprintf("nats-route://127.0.0.1:%d", p)
	}
	servers := make([]*server.Server, n)
	for i := range servers {
		o := options(t)
		o.ServerName = fmt.Sprintf("n%d", i+1)
		o.Cluster = server.ClusterOpts{Name: "natstest", Host: "127.0.0.1", Port: ports[i]}
		o.Routes = server.RoutesFromStr(strings.Join(routes, ","))
		for _, opt := range opts {
			opt(o)
		}
		servers[i] = start(t, o)
	}
	waitClusterReady(t, servers)
	return servers
}

// options are a test server's: JetStream on a random loopback port, stored
// under t.TempDir(), silent, no signal handlers.
func options(t testing.TB) *server.Options {
	return &server.Options{
		Host:      "127.0.0.1",
		Port:      -1,
		JetStream: true,
		StoreDir:  t.TempDir(),
		NoLog:     true,
		NoSigs:    true,
	}
}

// Connect connects a client to url and closes it in t.Cleanup.
func Connect(t testing.TB, url string, opts ...nats.Option) *nats.Conn {
	t.Helper()
	// The client's default 2 s dial-and-handshake bound is a quiet
	// machine's: tests connecting dozens of clients at once to an
	// in-process cluster on a loaded machine exceed it. An opt may set
	// its own.
	opts = append([]nats.Option{nats.Timeout(time.Minute)}, opts...)
	nc, err := nats.Connect(url, opts...)
	if err != nil {
		t.Fatalf("natstest: connect %s: %v", url, err)
	}
	t.Cleanup(nc.Close)
	return nc
}

func start(t testing.TB, o *server.Options) *server.Server {
	t.Helper()
	s, err := server.NewServer(o)
	if err != nil {
		t.Fatalf("natstest: new server: %v", err)
	}
	s.Start()
	t.Cleanup(func() {
		s.Shutdown()
		s.WaitForShutdown()
	})
	waitUntil(t, "server "+s.Name(), 0, func() bool { return s.ReadyForConnections(time.Second) })
	return s
}

// waitClusterReady polls until one server is the meta leader and counts every
// server as a current JetStream peer.
func waitClusterReady(t testing.TB, servers []*server.Server) {
	t.Helper()
	waitUntil(t, fmt.Sprintf("cluster of %d", len(servers)), 10*time.Millisecond, func() bool {
		for _, s := range servers {
			if s.JetStreamIsLeader() && len(s.JetStreamClusterPeers()) == len(servers) {
				return true
			}
		}
		return false
	})
}

// freePorts reserves n distinct loopback ports by listening on port 0. The
// listeners are closed before returning, so another process could in theory
// take a port before the server binds it; in tests that is rare enough.
func freePorts(t testing.TB, n int) []int {
	t.Helper()
	ports := make([]int, n)
	ls := make([]net.Listener, n)
	for i := range ports {
		l, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			t.Fatalf("natstest: reserve port: %v", err)
		}
		ls[i] = l
		ports[i] = l.Addr().(*net.TCPAddr).Port
	}
	for _, l := range ls {
		_ = l.Close()
	}
	return ports
}
