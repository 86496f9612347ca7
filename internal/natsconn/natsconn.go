// Package natsconn is how every idemgate command connects to NATS: one set
// of flags under the same names in each (Register), validated with errors
// that name the flag to fix (Flags.Validate), and turned into the
// connection's options (Flags.Options) or the connection itself
// (Flags.Connect).
package natsconn

import (
	"crypto/tls"
	"crypto/x509"
	"errors"
	"flag"
	"fmt"
	"os"
	"time"

	"github.com/nats-io/nats.go"
	"go.uber.org/zap"

	"github.com/idemgate/idemgate/internal/envflag"
)

// PasswordEnv is the environment variable a process reads its NATS password
// from. A password is never a flag: a command line is visible to every user
// of the host.
const PasswordEnv = "IDEMGATE_NATS_PASSWORD"

// EnvAliases are the variables of the NATS ecosystem (the nats CLI's) that
// set the connection flags when the command's own IDEMGATE_ variables do
// not: the aliases argument of envflag.Apply.
var EnvAliases = map[string]string{"nats-url": "NATS_URL", "nats-creds": "NATS_CREDS"}

// ErrInvalid is the error of connection settings that do not work; the
// message names the flag and how to fix it.
var ErrInvalid = errors.New("natsconn: invalid connection settings")

// Reconnection of a command that keeps its connection (Defaults.Reconnect).
const (
	// ReconnectWait is the pause between reconnection attempts: a holder
	// must be back to extend its lease (or record its outcome) soon after a
	// server restart, before another worker confirms it gone.
	ReconnectWait = 250 * time.Millisecond
	// ReconnectJitter and ReconnectJitterTLS are added at random to each
	// pause, so that many processes do not reconnect at once.
	ReconnectJitter    = 100 * time.Millisecond
	ReconnectJitterTLS = 250 * time.Millisecond
)

// Flags are a process's NATS connection settings. At most one of Creds,
// NkeySeed and User is set; the zero value connects anonymously without TLS.
type Flags struct {
	// URL is the server list, comma separated (--nats-url).
	URL string
	// Name is the connection's name in the server's monitoring and logs
	// (--nats-name). Default: the command's, e.g. idemgate-worker.
	Name string
	// Timeout bounds one connection attempt: dial, TLS handshake and the
	// server's first answer (--nats-timeout). Default: the command's (2s, or
	// 5s for submit).
	Timeout time.Duration
	// Creds is a credentials file: a user JWT and its nkey seed, for
	// servers run in operator mode (--nats-creds).
	Creds string
	// NkeySeed is a file holding a user's nkey seed, "SU..." (--nats-nkey).
	NkeySeed string
	// User and Password authenticate with a user and password (--nats-user;
	// the password is read from PasswordEnv, never a flag).
	User, Password string
	// TLSCA is a PEM file of the CAs that sign the server's certificate; it
	// also turns TLS on (--nats-tls-ca). Default: the system's roots, when
	// the server requires TLS.
	TLSCA string
	// TLSCert and TLSKey are a client certificate and its key, for servers
	// that verify clients (--nats-tls-cert, --nats-tls-key).
	TLSCert, TLSKey string
	// InboxPrefix replaces "_INBOX" in the subjects replies come back on
	// (--nats-inbox-prefix). A server that gives each user its own inbox
	// subjects (deployments/nats/secure) needs the user's prefix.
	InboxPrefix string
	// Reconnect keeps the connection for the life of the process: the first
	// connection is retried in the background, and a lost one forever (the
	// worker, the gateway, the MCP server). False: a failed first connection
	// is an error at once (submit). Not a flag: Defaults.Reconnect.
	Reconnect bool
}

// Defaults are a command's defaults for Register.
type Defaults struct {
	// URL is the default of --nats-url (e.g. nats.DefaultURL); URLHelp is
	// added to its usage (e.g. what an empty URL means).
	URL, URLHelp string
	// Name is the default of --nats-name, e.g. idemgate-worker.
	Name string
	// Timeout is the default of --nats-timeout. Default: nats.DefaultTimeout.
	Timeout time.Duration
	// Reconnect is Flags.Reconnect.
	Reconnect bool
	// OldTLSNames registers --tls-ca, --tls-cert and --tls-key as
	// deprecated names of the --nats-tls-* flags, for the commands that had
	// them (mcp, submit, worker; the gateway's --tls-* serve HTTPS).
	OldTLSNames bool
}

// Register registers the connection flags on fs — the same names, usage and
// environment variables in every command — with the deprecated names of
// earlier releases (envflag.Deprecate), and returns the settings they fill.
func Register(fs *flag.FlagSet, d Defaults) *Flags {
	if d.Timeout == 0 {
		d.Timeout = nats.DefaultTimeout
	}
	f := &Flags{Reconnect: d.Reconnect}
	fs.StringVar(&f.URL, "nats-url", d.URL, "NATS server(s), comma separated"+d.URLHelp+" (env NATS_URL)")
	fs.StringVar(&f.Name, "nats-name", d.Name, "this connection's name in the NATS server's monitoring and logs")
	fs.DurationVar(&f.Timeout, "nats-timeout", d.Timeout, "bound of one connection attempt to NATS: dial, TLS handshake, the server's first answer")
	fs.StringVar(&f.Creds, "nats-creds", "", "NATS credentials file: a user JWT and its nkey seed (env NATS_CREDS)")
	fs.StringVar(&f.NkeySeed, "nats-nkey", "", "file holding the NATS user's nkey seed")
	fs.StringVar(&f.User, "nats-user", "", "NATS user; the password comes from the environment variable "+PasswordEnv+", never a flag")
	fs.StringVar(&f.TLSCA, "nats-tls-ca", "", "PEM file of the CAs that sign the NATS server's certificate (turns TLS on; default: the system's roots)")
	fs.StringVar(&f.TLSCert, "nats-tls-cert", "", "client certificate for NATS servers that verify clients (with --nats-tls-key)")
	fs.StringVar(&f.TLSKey, "nats-tls-key", "", "key of --nats-tls-cert")
	fs.StringVar(&f.InboxPrefix, "nats-inbox-prefix", "", "subject prefix of reply inboxes instead of _INBOX, as the NATS user's permissions allow (e.g. _INBOX.<user>)")
	envflag.Deprecate(fs, "creds", "nats-creds")
	envflag.Deprecate(fs, "nkey", "nats-nkey")
	envflag.Deprecate(fs, "inbox-prefix", "nats-inbox-prefix")
	if d.OldTLSNames {
		envflag.Deprecate(fs, "tls-ca", "nats-tls-ca")
		envflag.Deprecate(fs, "tls-cert", "nats-tls-cert")
		envflag.Deprecate(fs, "tls-key", "nats-tls-key")
	}
	return f
}

// Validate reports the first setting that does not work, naming its flag
// and how to fix it (errors.Is ErrInvalid). It reads the password from
// PasswordEnv when Password is empty, and reads the files the settings name,
// so that a missing or unreadable one fails at start rather than at every
// connection attempt.
func (f *Flags) Validate() error {
	if f.Password == "" {
		f.Password = os.Getenv(PasswordEnv)
	}
	n := 0
	for _, set := range []bool{f.Creds != "", f.NkeySeed != "", f.User != ""} {
		if set {
			n++
		}
	}
	switch {
	case n > 1:
		return fmt.Errorf("%w: --nats-creds, --nats-nkey and --nats-user each say who connects: give one of them", ErrInvalid)
	case f.Password != "" && f.User == "":
		return fmt.Errorf("%w: a password (%s) without a user: give --nats-user too", ErrInvalid, PasswordEnv)
	case f.User != "" && f.Password == "":
		return fmt.Errorf("%w: --nats-user %q has no password: set %s in the environment", ErrInvalid, f.User, PasswordEnv)
	case (f.TLSCert == "") != (f.TLSKey == ""):
		return fmt.Errorf("%w: a TLS client certificate needs its key and the key its certificate: give both --nats-tls-cert and --nats-tls-key", ErrInvalid)
	case f.Timeout <= 0:
		return fmt.Errorf("%w: --nats-timeout %s: give a positive duration, e.g. 2s", ErrInvalid, f.Timeout)
	}
	if f.InboxPrefix != "" {
		if err := nats.CustomInboxPrefix(f.InboxPrefix)(&nats.Options{}); err != nil {
			return fmt.Errorf("%w: --nats-inbox-prefix %q: give a subject without wildcards or a trailing dot, e.g. _INBOX.worker", ErrInvalid, f.InboxPrefix)
		}
	}
	for _, file := range []struct{ flag, path string }{{"nats-creds", f.Creds}, {"nats-nkey", f.NkeySeed}} {
		if file.path == "" {
			continue
		}
		if _, err := os.ReadFile(file.path); err != nil {
			return fmt.Errorf("%w: --%s: %v", ErrInvalid, file.flag, err)
		}
	}
	if f.TLSCA != "" {
		pem, err := os.ReadFile(f.TLSCA)
		if err != nil {
			return fmt.Errorf("%w: --nats-tls-ca: %v", ErrInvalid, err)
		}
		if !x509.NewCertPool().AppendCertsFromPEM(pem) {
			return fmt.Errorf("%w: --nats-tls-ca %s holds no PEM certificate: give the CA certificate file", ErrInvalid, f.TLSCA)
		}
	}
	if f.TLSCert != "" {
		if _, err := tls.LoadX509KeyPair(f.TLSCert, f.TLSKey); err != nil {
			return fmt.Errorf("%w: --nats-tls-cert and --nats-tls-key: %v", ErrInvalid, err)
		}
	}
	return nil
}

// Options validates f (Validate) and returns its nats.Options: identity,
// TLS, inbox prefix, name, timeout, reconnection, and — with log not nil —
// handlers that log the connection's losses, returns and asynchronous errors
// (a permissions violation among them).
func (f *Flags) Options(log *zap.Logger) ([]nats.Option, error) {
	if err := f.Validate(); err != nil {
		return nil, err
	}
	opts := []nats.Option{nats.Timeout(f.Timeout)}
	if f.Name != "" {
		opts = append(opts, nats.Name(f.Name))
	}
	switch {
	case f.Creds != "":
		opts = append(opts, nats.UserCredentials(f.Creds))
	case f.NkeySeed != "":
		o, err := nats.NkeyOptionFromSeed(f.NkeySeed)
		if err != nil {
			return nil, fmt.Errorf("%w: --nats-nkey: %v", ErrInvalid, err)
		}
		opts = append(opts, o)
	case f.User != "":
		opts = append(opts, nats.UserInfo(f.User, f.Password))
	}
	if f.TLSCA != "" {
		opts = append(opts, nats.RootCAs(f.TLSCA))
	}
	if f.TLSCert != "" {
		opts = append(opts, nats.ClientCert(f.TLSCert, f.TLSKey))
	}
	if f.InboxPrefix != "" {
		opts = append(opts, nats.CustomInboxPrefix(f.InboxPrefix))
	}
	if f.Reconnect {
		opts = append(opts, nats.MaxReconnects(-1), nats.RetryOnFailedConnect(true),
			nats.ReconnectWait(ReconnectWait), nats.ReconnectJitter(ReconnectJitter, ReconnectJitterTLS))
	}
	if log != nil {
		opts = append(opts, logEvents(log.With(zap.String("connection", f.Name)))...)
	}
	return opts, nil
}

// Connect connects to f.URL with f's options (Options). With Reconnect the
// connection may still be on its way when it returns.
func (f *Flags) Connect(log *zap.Logger) (*nats.Conn, error) {
	opts, err := f.Options(log)
	if err != nil {
		return nil, err
	}
	nc, err := nats.Connect(f.URL, opts...)
	if err != nil {
		return nil, fmt.Errorf("connect %s: %w", f.URL, err)
	}
	return nc, nil
}

// logEvents are the handlers that log a connection's events.
func logEvents(log *zap.Logger) []nats.Option {
	return []nats.Option{
		nats.ConnectHandler(func(nc *nats.Conn) {
			log.Info("NATS connected", zap.String("url", nc.ConnectedUrlRedacted()))
		}),
		nats.DisconnectErrHandler(func(_ *nats.Conn, err error) {
			if err != nil { // nil: closed by this process
				log.Warn("NATS connection lost: reconnecting", zap.Error(err))
			}
		}),
		nats.ReconnectHandler(func(nc *nats.Conn) {
			log.Info("NATS reconnected", zap.String("url", nc.ConnectedUrlRedacted()))
		}),
		nats.ErrorHandler(func(_ *nats.Conn, sub *nats.Subscription, err error) {
			fields := []zap.Field{zap.Error(err)}
			if sub != nil {
				fields = append(fields, zap.String("subject", sub.Subject))
			}
			log.Error("NATS asynchronous error", fields...)
		}),
	}
}
