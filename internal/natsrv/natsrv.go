// Package natsrv runs the embedded JetStream server a worker uses when no
// external NATS server is given.
package natsrv

import (
	"errors"
	"fmt"
	"net"
	"strconv"
	"time"

	"github.com/nats-io/nats-server/v2/server"
)

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
	s, err := server.NewServer(opts)
	if err != nil {
		return nil, fmt.Errorf("natsrv: %w", err)
	}
	s.Start()
	if !s.ReadyForConnections(30 * time.Second) {
		s.Shutdown()
		return nil, fmt.Errorf("natsrv: server not ready on %s within 30s", cfg.Listen)
	}
	return s, nil
}
