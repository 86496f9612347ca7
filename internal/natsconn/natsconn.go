// Package natsconn turns a process's NATS identity and TLS settings into
// connection options, for the worker and for submit alike.
package natsconn

import (
	"errors"
	"fmt"

	"github.com/nats-io/nats.go"
)

// PasswordEnv is the environment variable a process reads its NATS password
// from. A password is never a flag: a command line is visible to every user
// of the host.
const PasswordEnv = "IDEMGATE_NATS_PASSWORD"

// ClientAuth is how a process proves who it is to a NATS server and checks
// the server's certificate. At most one of Creds, NkeySeed and User is set;
// the zero value connects anonymously without TLS.
type ClientAuth struct {
	// Creds is a credentials file (a user JWT and its nkey seed, for servers
	// run in operator mode).
	Creds string
	// NkeySeed is a file holding a user's nkey seed ("SU...").
	NkeySeed string
	// User and Password authenticate with a user and password.
	User, Password string
	// TLSCA is a PEM file of the CAs that sign the server's certificate. It
	// also turns TLS on. Default: the system's roots (when the server
	// requires TLS).
	TLSCA string
	// TLSCert and TLSKey are a client certificate and its key, for servers
	// that verify clients.
	TLSCert, TLSKey string
	// InboxPrefix replaces "_INBOX" in the subjects replies come back on.
	// A server that gives each user its own inbox subjects (see
	// deployments/nats/secure) needs it set to that user's prefix.
	InboxPrefix string
}

// Options returns the nats.Options for a, or an error saying which settings
// do not go together.
func (a ClientAuth) Options() ([]nats.Option, error) {
	var opts []nats.Option
	n := 0
	for _, set := range []bool{a.Creds != "", a.NkeySeed != "", a.User != ""} {
		if set {
			n++
		}
	}
	switch {
	case n > 1:
		return nil, errors.New("natsconn: choose one of a credentials file, an nkey seed file or a user")
	case a.Password != "" && a.User == "":
		return nil, fmt.Errorf("natsconn: a password (%s) without a user: set the user too", PasswordEnv)
	case a.User != "" && a.Password == "":
		return nil, fmt.Errorf("natsconn: user %q has no password: set %s", a.User, PasswordEnv)
	case (a.TLSCert == "") != (a.TLSKey == ""):
		return nil, errors.New("natsconn: a TLS client certificate needs its key and the key its certificate")
	}
	switch {
	case a.Creds != "":
		opts = append(opts, nats.UserCredentials(a.Creds))
	case a.NkeySeed != "":
		o, err := nats.NkeyOptionFromSeed(a.NkeySeed)
		if err != nil {
			return nil, fmt.Errorf("natsconn: nkey seed: %w", err)
		}
		opts = append(opts, o)
	case a.User != "":
		opts = append(opts, nats.UserInfo(a.User, a.Password))
	}
	if a.TLSCA != "" {
		opts = append(opts, nats.RootCAs(a.TLSCA))
	}
	if a.TLSCert != "" {
		opts = append(opts, nats.ClientCert(a.TLSCert, a.TLSKey))
	}
	if a.InboxPrefix != "" {
		opts = append(opts, nats.CustomInboxPrefix(a.InboxPrefix))
	}
	return opts, nil
}
