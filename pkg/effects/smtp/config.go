package smtp

import (
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"net"
	"net/mail"
	"net/smtp"
	"os"
	"regexp"
	"strconv"
	"strings"
	"time"

	"github.com/idemgate/idemgate/pkg/effects"
	"github.com/idemgate/idemgate/pkg/intent"
)

// StartTLSPolicy says whether an smtp effect encrypts its connection to the
// relay with STARTTLS.
type StartTLSPolicy string

// STARTTLS policies.
const (
	// StartTLSOpportunistic upgrades the connection when the relay offers
	// STARTTLS and sends in the clear when it does not. When it is offered,
	// the relay's certificate must verify: a failed handshake is an error,
	// never a fallback to plain text.
	StartTLSOpportunistic StartTLSPolicy = "opportunistic"
	// StartTLSRequired refuses to send unless the connection is upgraded and
	// the relay's certificate verifies.
	StartTLSRequired StartTLSPolicy = "required"
	// StartTLSOff never upgrades the connection.
	StartTLSOff StartTLSPolicy = "off"
)

// Config configures an smtp effect. Zero fields mean the defaults.
type Config struct {
	// Addr is the relay's host:port, e.g. "smtp.internal:587". Required.
	Addr string
	// From is the sender, an address with an optional display name
	// ("Billing <billing@example.com>"): the From header and the envelope
	// sender. Required.
	From string
	// StartTLS is the STARTTLS policy. Default StartTLSOpportunistic.
	StartTLS StartTLSPolicy
	// CAFile is a PEM file of the certificate authorities that sign the
	// relay's certificate, for a relay with a private CA. Default: the
	// system's roots. The certificate must name the host of Addr.
	CAFile string
	// Username, when set, authenticates with AUTH PLAIN. The credentials
	// are sent only over TLS, or to a relay on localhost.
	Username string
	// Password is Username's password. It appears in no error and no
	// result. (A tools file names an environment variable holding it.)
	Password string
	// Timeout bounds one SMTP transaction: connecting, the dialogue and the
	// relay's reply to the message. Default DefaultTimeout.
	Timeout time.Duration
	// Retry is the retry policy, as for a webhook.
	Retry effects.RetryPolicy
	// Helo is the name given in EHLO. Default DefaultHelo.
	Helo string
}

// String describes the config with the password redacted, so that printing
// it never shows the secret.
func (c Config) String() string {
	pw := ""
	if c.Password != "" {
		pw = "[redacted]"
	}
	return fmt.Sprintf("{Addr:%s From:%s StartTLS:%s CAFile:%s Username:%s Password:%s Timeout:%s Retry:%+v Helo:%s}",
		c.Addr, c.From, c.StartTLS, c.CAFile, c.Username, pw, c.Timeout, c.Retry, c.Helo)
}

// GoString is String for %#v.
func (c Config) GoString() string { return "smtp.Config" + c.String() }

// New returns an smtp effect for cfg, or an error joining a
// *SettingError for every invalid field. It reads CAFile.
func New(cfg Config) (*Effect, error) {
	return cfg.withDefaults().build()
}

func (c Config) withDefaults() Config {
	if c.StartTLS == "" {
		c.StartTLS = StartTLSOpportunistic
	}
	if c.Timeout == 0 {
		c.Timeout = DefaultTimeout
	}
	if c.Helo == "" {
		c.Helo = DefaultHelo
	}
	c.Retry = c.Retry.WithDefaults()
	return c
}

var (
	heloPattern   = regexp.MustCompile(`^(?:[A-Za-z0-9](?:[A-Za-z0-9-]*[A-Za-z0-9])?(?:\.[A-Za-z0-9](?:[A-Za-z0-9-]*[A-Za-z0-9])?)*|\[[0-9A-Fa-f:.]+\])$`)
	domainPattern = regexp.MustCompile(`^[A-Za-z0-9-]+(?:\.[A-Za-z0-9-]+)*$`)
)

// build validates a config with its defaults applied and builds the effect.
func (c Config) build() (*Effect, error) {
	var errs []error
	add := func(field, problem, hint string) {
		errs = append(errs, &effects.SettingError{Kind: intent.EffectSMTP, Field: field, Problem: problem, Hint: hint})
	}
	s := &Effect{addr: c.Addr, starttls: c.StartTLS, timeout: c.Timeout, retry: c.Retry, helo: c.Helo}

	const addrHint = "write e.g. smtp.internal:587"
	if c.Addr == "" {
		add("addr", "is missing", addrHint)
	} else if host, port, err := net.SplitHostPort(c.Addr); err != nil {
		add("addr", fmt.Sprintf("%q is not host:port", c.Addr), addrHint)
	} else if n, err := strconv.Atoi(port); err != nil || n < 1 || n > 65535 {
		add("addr", fmt.Sprintf("%q has no valid port", c.Addr), addrHint)
	} else if host == "" {
		add("addr", fmt.Sprintf("%q has no host", c.Addr), addrHint)
	} else {
		s.host = host
	}

	const fromHint = "write e.g. from: Billing <billing@example.com>"
	if c.From == "" {
		add("from", "is missing", fromHint)
	} else if a, err := mail.ParseAddress(c.From); err != nil {
		add("from", fmt.Sprintf("%q is not an email address", c.From), fromHint)
	} else if !isASCII(a.Address) {
		add("from", fmt.Sprintf("%q is not an ASCII address", a.Address), "international addresses are not supported")
	} else if p := envelopeProblem(a.Address); p != "" {
		add("from", fmt.Sprintf("%q cannot be sent as the envelope sender: %s", a.Address, p), fromHint)
	} else {
		s.from, s.fromHdr = a.Address, a.String()
		s.domain = a.Address[strings.LastIndexByte(a.Address, '@')+1:]
		if !domainPattern.MatchString(s.domain) {
			s.domain = "idemgate"
		}
	}

	switch c.StartTLS {
	case StartTLSOpportunistic, StartTLSRequired, StartTLSOff:
	default:
		add("starttls", fmt.Sprintf("%q is not one of required, opportunistic, off", c.StartTLS), "write e.g. starttls: required")
	}

	if c.StartTLS != StartTLSOff {
		s.tlsConfig = &tls.Config{ServerName: s.host, MinVersion: tls.VersionTLS12}
	}
	if c.CAFile != "" {
		switch pool, err := loadCAFile(c.CAFile); {
		case c.StartTLS == StartTLSOff:
			add("ca_file", "has no use with starttls: off", "remove ca_file, or set starttls: required")
		case err != nil:
			add("ca_file", err.Error(), "give a PEM file of the CA certificates that sign the relay's certificate")
		case s.tlsConfig != nil:
			s.tlsConfig.RootCAs = pool
		}
	}

	switch {
	case c.Username == "" && c.Password != "":
		add("username", "is missing, but a password is set", "add username:, or remove password_env")
	case c.Username != "" && c.Password == "":
		add("password_env", "is missing, or names an empty variable", "add password_env: naming the environment variable that holds the password")
	case strings.ContainsAny(c.Username, "\x00\r\n"):
		add("username", "holds a NUL or a line break", "write the username on one line")
	case strings.ContainsRune(c.Password, 0):
		add("password_env", "the password holds a NUL", "AUTH PLAIN cannot carry it")
	case c.Username != "" && c.StartTLS == StartTLSOff && !isLocalhost(s.host):
		add("username", fmt.Sprintf("the password would cross the network in the clear to %s", s.host), "set starttls: required (AUTH is sent only over TLS, or to localhost)")
	case c.Username != "":
		s.auth = smtp.PlainAuth("", c.Username, c.Password, s.host)
	}

	if c.Timeout < 0 {
		add("timeout", "is negative", "write e.g. 30s")
	}
	if !heloPattern.MatchString(c.Helo) {
		add("helo", fmt.Sprintf("%q is not a host name", c.Helo), "write e.g. helo: worker1.example.com")
	}
	if err := errors.Join(append(errs, c.Retry.Problems(intent.EffectSMTP)...)...); err != nil {
		return nil, err
	}
	return s, nil
}

// loadCAFile reads a PEM file of CA certificates.
func loadCAFile(path string) (*x509.CertPool, error) {
	data, err := os.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("cannot be read: %w", err)
	}
	pool := x509.NewCertPool()
	if !pool.AppendCertsFromPEM(data) {
		return nil, fmt.Errorf("%s holds no PEM certificate", path)
	}
	return pool, nil
}

// isLocalhost is net/smtp's rule for where AUTH PLAIN may go without TLS.
func isLocalhost(host string) bool {
	return host == "localhost" || host == "127.0.0.1" || host == "::1"
}

func isASCII(s string) bool {
	for i := 0; i < len(s); i++ {
		if s[i] >= 0x80 {
			return false
		}
	}
	return true
}
