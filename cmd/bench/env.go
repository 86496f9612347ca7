package main

import (
	"errors"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"strings"
	"time"

	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"

	"github.com/idemgate/idemgate/internal/natsrv"
)

// readyTimeout bounds how long a server or cluster may take to become usable.
const readyTimeout = 30 * time.Second

// env is one JetStream deployment a scenario runs on: a single embedded
// server (natsrv, as the worker embeds it) or an in-process 3-node cluster,
// each with a fresh store directory that close removes.
type env struct {
	servers  []*server.Server
	dir      string
	tcp      bool
	replicas int
	sync     string // the store's sync policy
	conns    []*nats.Conn
}

// startEnv starts a fresh deployment under base with the given sync policy
// (natsrv.SyncAlways, natsrv.SyncLazy or an interval).
func startEnv(base string, cluster, tcp bool, sync string) (*env, error) {
	dir, err := os.MkdirTemp(base, "idemgate-bench-")
	if err != nil {
		return nil, fmt.Errorf("store dir: %w", err)
	}
	e := &env{dir: dir, tcp: tcp, replicas: 1, sync: sync}
	if !cluster {
		s, err := natsrv.Start(natsrv.Config{
			StoreDir:   filepath.Join(dir, "n1"),
			Listen:     "127.0.0.1:0",
			Sync:       sync,
			ServerName: "bench",
		})
		if err != nil {
			_ = os.RemoveAll(dir)
			return nil, err
		}
		e.servers = []*server.Server{s}
		return e, nil
	}
	e.replicas = 3
	if err := e.startCluster(3, sync); err != nil {
		e.close()
		return nil, err
	}
	return e, nil
}

// startCluster starts an n-node JetStream cluster on loopback ports and waits
// until a meta leader sees every peer.
func (e *env) startCluster(n int, sync string) error {
	ports, err := freePorts(n)
	if err != nil {
		return err
	}
	routes := make([]string, n)
	for i, p := range ports {
		routes[i] = fmt.Sprintf("nats-route://127.0.0.1:%d", p)
	}
	for i := range n {
		o := &server.Options{
			ServerName:             fmt.Sprintf("n%d", i+1),
			Host:                   "127.0.0.1",
			Port:                   server.RANDOM_PORT,
			JetStream:              true,
			StoreDir:               filepath.Join(e.dir, fmt.Sprintf("n%d", i+1)),
			NoSigs:                 true,
			NoLog:                  true,
			DisableJetStreamBanner: true,
			Cluster:                server.ClusterOpts{Name: "bench", Host: "127.0.0.1", Port: ports[i]},
			Routes:                 server.RoutesFromStr(strings.Join(routes, ",")),
		}
		switch sync {
		case natsrv.SyncAlways:
			o.SyncAlways = true
		case natsrv.SyncLazy, "":
		default:
			d, err := time.ParseDuration(sync)
			if err != nil {
				return fmt.Errorf("sync %q: %w", sync, err)
			}
			o.SyncInterval = d
		}
		s, err := server.NewServer(o)
		if err != nil {
			return fmt.Errorf("cluster node %d: %w", i+1, err)
		}
		s.Start()
		e.servers = append(e.servers, s)
		if !s.ReadyForConnections(readyTimeout) {
			return fmt.Errorf("cluster node %d not ready after %s", i+1, readyTimeout)
		}
	}
	deadline := time.Now().Add(readyTimeout)
	for time.Now().Before(deadline) {
		for _, s := range e.servers {
			if s.JetStreamIsLeader() && len(s.JetStreamClusterPeers()) == n {
				return nil
			}
		}
		time.Sleep(20 * time.Millisecond)
	}
	return fmt.Errorf("cluster of %d not ready after %s", n, readyTimeout)
}

// connect opens a client connection to the first server: in-process (no
// socket) unless the deployment is TCP loopback.
func (e *env) connect(name string) (*nats.Conn, error) { return e.connectWorker(name, false) }

// connectWorker is connect, over TCP loopback when tcp whatever the
// deployment's setting.
func (e *env) connectWorker(name string, tcp bool) (*nats.Conn, error) {
	opts := []nats.Option{nats.Name(name), nats.MaxReconnects(-1)}
	url := e.servers[0].ClientURL()
	if !e.tcp && !tcp {
		opts = append(opts, nats.InProcessServer(e.servers[0]))
	}
	nc, err := nats.Connect(url, opts...)
	if err != nil {
		return nil, fmt.Errorf("connect %s: %w", name, err)
	}
	e.conns = append(e.conns, nc)
	return nc, nil
}

// close closes every connection, shuts the servers down (waiting for them)
// and removes the store directory.
func (e *env) close() {
	for _, nc := range e.conns {
		nc.Close()
	}
	for _, s := range e.servers {
		s.Shutdown()
	}
	for _, s := range e.servers {
		s.WaitForShutdown()
	}
	_ = os.RemoveAll(e.dir)
}

// freePorts reserves n distinct loopback ports by listening on port 0.
func freePorts(n int) ([]int, error) {
	var errs []error
	ports := make([]int, 0, n)
	for range n {
		l, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			errs = append(errs, err)
			break
		}
		defer func() { _ = l.Close() }()
		ports = append(ports, l.Addr().(*net.TCPAddr).Port)
	}
	if err := errors.Join(errs...); err != nil {
		return nil, fmt.Errorf("reserve port: %w", err)
	}
	return ports, nil
}
