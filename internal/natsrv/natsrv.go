// Package natsrv runs the embedded JetStream server a worker uses when no
// external NATS server is given.
package natsrv

import (
	"errors"
	"fmt"
	"net"
	"strconv"
	"syscall"
	"time"

	"github.com/nats-io/nats-server/v2/server"
)

// Errors of Start, matched with errors.Is.
var (
	// ErrAddrInUse: the client address is taken (another worker or
	// nats-server listens on it).
	ErrAddrInUse = errors.New("natsrv: address in use")
	// ErrStoreLocked: another server (usually another worker's) runs on the
	// store directory.
	ErrStoreLocked = errors.New("natsrv: store dir in use")
)

// readyTimeout bounds the wait for a started server to accept connections.
const readyTimeout = 30 * time.Second

// Sync policies of the embedded server's store.
const (
	// SyncAlways flushes every write to disk before JetStream acknowledges it:
	// an acknowledged claim or result survives power loss. The default.
	SyncAlways = "always"
	// SyncLazy is the server's own default: acknowledge, then flush every two
	// minutes. A power loss (not a process crash) can lose up to that much
	// acknowledged ledger history, and with it the at-most-once guarantee for
	// the operations in it.
	SyncLazy = "lazy"
)

// Config is the embedded server's configuration.
type Config struct {
	// StoreDir is where JetStream keeps its files. Required.
	StoreDir string
	// Listen is the client address, host:port, other processes and languages
	// connect to. Default: "127.0.0.1:4222". Port 0 picks a free port.
	Listen string
	// Sync is SyncAlways, SyncLazy, or a flush interval such as "100ms"
	// (acknowledges before the flush: a bounded loss window on power loss).
	// Default: SyncAlways.
	Sync string
	// ServerName names the server. Default: "idemgate", or the config
	// file's server_name.
	ServerName string
	// ConfigFile is a nats-server configuration file read first: accounts,
	// users and their permissions, TLS, limits (deployments/nats/secure
	// holds ones for idemgate). StoreDir, Listen and Sync replace its
	// host/port, store_dir and sync_interval, and JetStream is always on.
	// Default: none (no authentication: Listen should then be loopback).
	ConfigFile string
}

// Start starts the server and waits until it accepts connections.
//
// It fails at once, before the store is opened, when the client address is
// taken (ErrAddrInUse, naming the address) or another server holds the store
// directory (ErrStoreLocked, naming its process). The store directory stays
// locked (LockFile in it) until the server has shut down, or the process
// ends. An error the server reports while starting (a store it cannot open)
// is returned as soon as it happens.
func Start(cfg Config) (*server.Server, error) {
	if cfg.StoreDir == "" {
		return nil, errors.New("natsrv: no store dir: set one (e.g. ./data/jetstream)")
	}
	if cfg.Listen == "" {
		cfg.Listen = "127.0.0.1:4222"
	}
	host, portStr, err := net.SplitHostPort(cfg.Listen)
	if err != nil {
		return nil, fmt.Errorf("natsrv: listen %q: write host:port, e.g. 127.0.0.1:4222", cfg.Listen)
	}
	port, err := strconv.Atoi(portStr)
	if err != nil || port < 0 || port > 65535 {
		return nil, fmt.Errorf("natsrv: listen %q: the port must be a number 0-65535", cfg.Listen)
	}
	if port == 0 {
		port = server.RANDOM_PORT
	}
	opts := &server.Options{}
	if cfg.ConfigFile != "" {
		if opts, err = server.ProcessConfigFile(cfg.ConfigFile); err != nil {
			return nil, fmt.Errorf("natsrv: server config: %w", err)
		}
	}
	if cfg.ServerName != "" || opts.ServerName == "" {
		opts.ServerName = cfg.ServerName
	}
	opts.Host, opts.Port = host, port
	opts.JetStream, opts.StoreDir = true, cfg.StoreDir
	opts.NoSigs, opts.DisableJetStreamBanner = true, true
	opts.SyncAlways, opts.SyncInterval = false, 0
	switch cfg.Sync {
	case "", SyncAlways:
		opts.SyncAlways = true
	case SyncLazy:
	default:
		d, err := time.ParseDuration(cfg.Sync)
		if err != nil || d <= 0 {
			return nil, fmt.Errorf("natsrv: sync %q: use %q, %q or a positive duration such as 100ms", cfg.Sync, SyncAlways, SyncLazy)
		}
		opts.SyncInterval = d
	}
	if opts.ServerName == "" {
		opts.ServerName = "idemgate"
	}
	if port != server.RANDOM_PORT {
		if err := probeListen(net.JoinHostPort(host, strconv.Itoa(port))); err != nil {
			return nil, err
		}
	}
	lock, err := lockStore(cfg.StoreDir)
	if err != nil {
		return nil, err
	}
	unlock := func() {
		if lock != nil {
			_ = lock.Close()
		}
	}
	s, err := server.NewServer(opts)
	if err != nil {
		unlock()
		return nil, fmt.Errorf("natsrv: %w", err)
	}
	fatal := &fatalLogger{errs: make(chan string, 1)}
	s.SetLogger(fatal, false, false)
	s.Start()
	deadline := time.Now().Add(readyTimeout)
	for !s.ReadyForConnections(50 * time.Millisecond) {
		select {
		case msg := <-fatal.errs:
			s.Shutdown()
			s.WaitForShutdown()
			unlock()
			return nil, fmt.Errorf("natsrv: server on %s: %s", cfg.Listen, msg)
		default:
		}
		if time.Now().After(deadline) {
			s.Shutdown()
			s.WaitForShutdown()
			unlock()
			return nil, fmt.Errorf("natsrv: server not ready on %s within %s", cfg.Listen, readyTimeout)
		}
	}
	// The lock is held for the server's life: released once it has shut
	// down (the goroutine ends then).
	go func() { s.WaitForShutdown(); unlock() }()
	return s, nil
}

// probeListen fails with ErrAddrInUse when addr cannot be listened on, so
// that a taken port is reported at once with its address.
func probeListen(addr string) error {
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		if errors.Is(err, syscall.EADDRINUSE) {
			return fmt.Errorf("%w: %s: another process listens on it", ErrAddrInUse, addr)
		}
		return fmt.Errorf("natsrv: listen %s: %w", addr, err)
	}
	return ln.Close()
}

// fatalLogger is the server's logger: it keeps quiet, as an embedded server
// without one does, but hands on its fatal errors (a port it cannot listen
// on, a store it cannot open), which would otherwise go unseen.
type fatalLogger struct{ errs chan string }

func (l *fatalLogger) Fatalf(format string, v ...any) {
	select {
	case l.errs <- fmt.Sprintf(format, v...):
	default:
	}
}
func (*fatalLogger) Noticef(string, ...any) {}
func (*fatalLogger) Warnf(string, ...any)   {}
func (*fatalLogger) Errorf(string, ...any)  {}
func (*fatalLogger) Debugf(string, ...any)  {}
func (*fatalLogger) Tracef(string, ...any)  {}
