package integration

import (
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/hex"
	"encoding/json"
	"encoding/pem"
	"errors"
	"fmt"
	"math/big"
	"net"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/stretchr/testify/require"

	"github.com/idemgate/idemgate/pkg/client"
	"github.com/idemgate/idemgate/pkg/intent"
)

// The tests in this file start nats-server in this process from the shipped
// files in deployments/nats/secure, with TLS from a CA made for the test and
// passwords made for the test, and check that each role can do its job and
// nothing else.

// secureDir holds the shipped configurations.
var secureDir = filepath.Join("..", "deployments", "nats", "secure")

// testCA is a certificate authority made for one test.
type testCA struct {
	cert    *x509.Certificate
	key     *ecdsa.PrivateKey
	certPEM string // file holding the CA's certificate
}

func newTestCA(t *testing.T, dir, name string) *testCA {
	t.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	require.NoError(t, err)
	tmpl := &x509.Certificate{
		SerialNumber:          big.NewInt(1),
		Subject:               pkix.Name{CommonName: name},
		NotBefore:             time.Now().Add(-time.Hour),
		NotAfter:              time.Now().Add(time.Hour),
		IsCA:                  true,
		BasicConstraintsValid: true,
		KeyUsage:              x509.KeyUsageCertSign | x509.KeyUsageDigitalSignature,
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	require.NoError(t, err)
	cert, err := x509.ParseCertificate(der)
	require.NoError(t, err)
	ca := &testCA{cert: cert, key: key, certPEM: filepath.Join(dir, name+".pem")}
	writePEM(t, ca.certPEM, "CERTIFICATE", der)
	return ca
}

// serverCert issues a certificate for 127.0.0.1 and localhost and returns
// the certificate and key files.
func (ca *testCA) serverCert(t *testing.T, dir string) (certFile, keyFile string) {
	t.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	require.NoError(t, err)
	tmpl := &x509.Certificate{
		SerialNumber: big.NewInt(2),
		Subject:      pkix.Name{CommonName: "idemgate nats"},
		NotBefore:    time.Now().Add(-time.Hour),
		NotAfter:     time.Now().Add(time.Hour),
		KeyUsage:     x509.KeyUsageDigitalSignature,
		ExtKeyUsage:  []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth},
		IPAddresses:  []net.IP{net.ParseIP("127.0.0.1")},
		DNSNames:     []string{"localhost"},
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, ca.cert, &key.PublicKey, ca.key)
	require.NoError(t, err)
	keyDER, err := x509.MarshalECPrivateKey(key)
	require.NoError(t, err)
	certFile, keyFile = filepath.Join(dir, "server.pem"), filepath.Join(dir, "server-key.pem")
	writePEM(t, certFile, "CERTIFICATE", der)
	writePEM(t, keyFile, "EC PRIVATE KEY", keyDER)
	return certFile, keyFile
}

func writePEM(t *testing.T, path, typ string, der []byte) {
	t.Helper()
	require.NoError(t, os.WriteFile(path, pem.EncodeToMemory(&pem.Block{Type: typ, Bytes: der}), 0o600))
}

// secureServer is a nats-server started from a shipped secure config.
type secureServer struct {
	srv       *server.Server
	url       string
	ca        *testCA
	env       map[string]string // the values the config reads from the environment
	mu        sync.Mutex
	violation []string // the server's log lines about permission violations
}

var envRef = regexp.MustCompile(`\$(IDEMGATE_[A-Z0-9_]+)`)

// startSecure starts nats-server from deployments/nats/secure/<file>. The
// file's environment variables (passwords, certificate and key) are given
// values made for the test and defined at the top of a copy of the file, so
// the server reads the shipped file's text unchanged. Listen address, store
// directory and monitoring are replaced to fit a test.
func startSecure(t *testing.T, file string) *secureServer {
	t.Helper()
	dir := t.TempDir()
	ca := newTestCA(t, dir, "test-ca")
	cert, key := ca.serverCert(t, dir)

	perms, err := os.ReadFile(filepath.Join(secureDir, "permissions.conf"))
	require.NoError(t, err)
	require.NoError(t, os.WriteFile(filepath.Join(dir, "permissions.conf"), perms, 0o600))
	text, err := os.ReadFile(filepath.Join(secureDir, file))
	require.NoError(t, err)

	s := &secureServer{ca: ca, env: map[string]string{}}
	var defs strings.Builder
	for _, line := range strings.Split(string(text), "\n") {
		if i := strings.IndexByte(line, '#'); i >= 0 {
			line = line[:i]
		}
		for _, m := range envRef.FindAllStringSubmatch(line, -1) {
			name := m[1]
			if _, done := s.env[name]; done || strings.Contains(string(perms), name+":") {
				continue
			}
			switch {
			case name == "IDEMGATE_NATS_TLS_CERT":
				s.env[name] = cert
			case name == "IDEMGATE_NATS_TLS_KEY":
				s.env[name] = key
			case strings.HasSuffix(name, "_PASSWORD"):
				s.env[name] = randomSecret(t)
			default:
				t.Fatalf("%s: unexpected variable %s", file, name)
			}
			fmt.Fprintf(&defs, "%s: %q\n", name, s.env[name])
		}
	}
	conf := filepath.Join(dir, file)
	require.NoError(t, os.WriteFile(conf, []byte(defs.String()+string(text)), 0o600))

	opts, err := server.ProcessConfigFile(conf)
	require.NoError(t, err)
	opts.Host, opts.Port = "127.0.0.1", -1
	opts.HTTPHost, opts.HTTPPort = "", 0
	opts.StoreDir = t.TempDir()
	opts.NoSigs, opts.NoLog = true, false
	require.True(t, opts.SyncAlways, "the shipped file syncs before it acknowledges")
	srv, err := server.NewServer(opts)
	require.NoError(t, err)
	srv.SetLogger(violationLog{s}, false, false)
	srv.Start()
	t.Cleanup(func() { srv.Shutdown(); srv.WaitForShutdown() })
	require.True(t, srv.ReadyForConnections(10*time.Second), "server ready")
	s.url, s.srv = srv.ClientURL(), srv
	return s
}

func randomSecret(t *testing.T) string {
	t.Helper()
	b := make([]byte, 16)
	_, err := rand.Read(b)
	require.NoError(t, err)
	return hex.EncodeToString(b)
}

// password returns the password of user, as its variable names it
// (agent-1 → IDEMGATE_AGENT_1_PASSWORD).
func (s *secureServer) password(t *testing.T, user string) string {
	t.Helper()
	name := "IDEMGATE_" + strings.ToUpper(strings.ReplaceAll(user, "-", "_")) + "_PASSWORD"
	pw, ok := s.env[name]
	require.True(t, ok, "no variable %s in the config", name)
	return pw
}

// violations returns the permission violations the server logged so far.
func (s *secureServer) violations() []string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return append([]string(nil), s.violation...)
}

// violationLog keeps the server's permission-violation lines.
type violationLog struct{ s *secureServer }

func (l violationLog) Errorf(format string, v ...any) {
	if line := fmt.Sprintf(format, v...); strings.Contains(line, "Violation") {
		l.s.mu.Lock()
		l.s.violation = append(l.s.violation, line)
		l.s.mu.Unlock()
	}
}
func (violationLog) Noticef(string, ...any) {}
func (violationLog) Warnf(string, ...any)   {}
func (violationLog) Fatalf(string, ...any)  {}
func (violationLog) Debugf(string, ...any)  {}
func (violationLog) Tracef(string, ...any)  {}

// conn is a client connection and the asynchronous errors the server sent it.
type conn struct {
	*nats.Conn
	errs chan error
}

// connect connects as user with its password, the test CA and the user's
// own inbox prefix.
func (s *secureServer) connect(t *testing.T, user string, extra ...nats.Option) *conn {
	t.Helper()
	c := &conn{errs: make(chan error, 64)}
	opts := append([]nats.Option{
		nats.UserInfo(user, s.password(t, user)),
		nats.RootCAs(s.ca.certPEM),
		nats.CustomInboxPrefix("_INBOX." + user),
		nats.ErrorHandler(func(_ *nats.Conn, _ *nats.Subscription, err error) {
			select {
			case c.errs <- err:
			default:
			}
		}),
	}, extra...)
	nc, err := nats.Connect(s.url, opts...)
	require.NoError(t, err, "connect as %s", user)
	t.Cleanup(nc.Close)
	c.Conn = nc
	return c
}

// startSecureWorker runs a worker process as user: TLS with the test CA,
// the password in the environment (never on the command line), its inbox
// prefix, and a noop tool.
func (s *secureServer) startSecureWorker(t *testing.T, user string) *proc {
	t.Helper()
	tools := writeTools(t, "tools:\n  echo:\n    effect: noop\n    key_args: all\n")
	args := []string{
		"--tools", tools, "--holder", user, "--log-level", "debug",
		"--nats-url", s.url, "--nats-tls-ca", s.ca.certPEM, "--nats-user", user, "--nats-inbox-prefix", "_INBOX.worker",
	}
	p := launchWorker(t, user, args, []string{"IDEMGATE_NATS_PASSWORD=" + s.password(t, user)})
	p.waitLog(t, "worker consuming", 20*time.Second)
	return p
}

// refused runs op and requires the server to refuse it: a permissions
// violation naming subject arrives on c's error handler. op gets a context
// that ends once the refusal arrived (a refused request gets no reply), and
// must then have failed.
func refused(t *testing.T, c *conn, subject string, op func(ctx context.Context) error) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	done := make(chan error, 1)
	go func() { done <- op(ctx) }()
	want := fmt.Sprintf("%q", subject)
	for {
		select {
		case err := <-c.errs:
			if !errors.Is(err, nats.ErrPermissionViolation) || !strings.Contains(err.Error(), want) {
				continue
			}
			cancel()
			require.Error(t, <-done, "the refused operation failed")
			return
		case <-ctx.Done():
			err := <-done
			t.Fatalf("no permissions violation for %s (the operation returned %v)", subject, err)
		}
	}
}

// submitAs submits an echo intent through c and returns the answer.
func submitAs(t *testing.T, c *conn, args string) *intent.Result {
	t.Helper()
	cl, err := client.New(c.Conn)
	require.NoError(t, err)
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	res, err := cl.Submit(ctx, &intent.Envelope{Tool: "echo", Args: json.RawMessage(args)})
	require.NoError(t, err)
	require.Equal(t, intent.StatusCompleted, res.Status, "%+v", res)
	return res
}

// An agent's legitimate path works end to end under the shipped users and
// permissions: it submits through a worker (itself a user of its own, over
// TLS), gets the answer, reads and watches its own ledger record, and asks
// the tool catalogue. Neither the worker nor the agent is refused anything.
func TestSecureAgentPathWorks(t *testing.T) {
	t.Parallel()
	s := startSecure(t, "users.conf")
	s.startSecureWorker(t, "worker")
	agent := s.connect(t, "agent-1")

	res := submitAs(t, agent, `{"n":1}`)
	require.False(t, res.Replayed)
	again := submitAs(t, agent, `{"n":1}`)
	require.True(t, again.Replayed, "the repeat is answered from the ledger")

	cl, err := client.New(agent.Conn)
	require.NoError(t, err)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	rec, err := cl.Get(ctx, res.Key) // leader read
	require.NoError(t, err)
	require.Equal(t, intent.StatusCompleted, rec.Status)
	rec, err = cl.Watch(ctx, res.Key) // ledger watch
	require.NoError(t, err)
	require.Equal(t, res.Fingerprint, rec.Fingerprint)
	js, err := jetstream.New(agent.Conn)
	require.NoError(t, err)
	kv, err := js.KeyValue(ctx, "IDEM_LEDGER")
	require.NoError(t, err)
	_, err = kv.Get(ctx, storedKey(t, js, res.Key)) // direct get
	require.NoError(t, err)
	cat, err := cl.Tools(ctx)
	require.NoError(t, err)
	require.Len(t, cat.Tools, 1)

	// A watch of a key with no record yet waits for it without a consumer:
	// a subscription to the key's subject and leader reads.
	env := intent.Envelope{Tool: "echo", Args: json.RawMessage(`{"n":"watched"}`)}
	p, err := cl.Prepare(ctx, env, intent.Limits{MaxBytes: 1 << 20, MaxDepth: intent.MaxCanonicalDepth})
	require.NoError(t, err)
	subs := agent.NumSubscriptions()
	watched := make(chan error, 1)
	go func() {
		rec, err := cl.Watch(ctx, p.ID.Key)
		if err == nil && rec.Status != intent.StatusCompleted {
			err = fmt.Errorf("watched %s", rec.Status)
		}
		watched <- err
	}()
	for agent.NumSubscriptions() == subs { // the watch subscribed: it waits
		select {
		case err := <-watched:
			t.Fatalf("the watch ended before the key had a record: %v", err)
		case <-ctx.Done():
			t.Fatal("the watch never subscribed to the key's subject")
		case <-time.After(5 * time.Millisecond):
		}
	}
	submitAs(t, agent, `{"n":"watched"}`)
	require.NoError(t, <-watched, "the watch saw the record")

	require.Empty(t, s.violations(), "no role was refused anything on its legitimate path")
	select {
	case err := <-agent.errs:
		t.Fatalf("the agent got an error: %v", err)
	default:
	}
}

// The TypeScript client, as an agent under the shipped permissions, waits
// for a key with no record yet and gets its record once it is written (its
// watch creates no consumer), then submits a copy on its own inbox and is
// answered replayed, refused nothing.
func TestSecureTSAgentWatches(t *testing.T) {
	t.Parallel()
	dir := tsClient(t)
	s := startSecure(t, "users.conf")
	s.startSecureWorker(t, "worker")
	agent := s.connect(t, "agent-1")
	cl, err := client.New(agent.Conn)
	require.NoError(t, err)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	args := `{"n":"ts"}`
	p, err := cl.Prepare(ctx, intent.Envelope{Tool: "echo", Args: json.RawMessage(args)}, intent.Limits{MaxBytes: 1 << 20, MaxDepth: intent.MaxCanonicalDepth})
	require.NoError(t, err)

	script := `import { IdemClient } from ` + strconv.Quote("file://"+filepath.Join(dir, "dist", "index.js")) + `;
const c = await IdemClient.connect(process.env.URL, { nats: {
  user: "agent-1", pass: process.env.PASSWORD, tls: { caFile: process.env.CA }, inboxPrefix: "_INBOX.agent-1" } });
try {
  const rec = await c.watch(process.env.KEY, 50000);
  // A copy of the operation, answered from the ledger (its own inbox).
  const res = await c.submit({ tool: "echo", args: JSON.parse(process.env.ARGS) }, 50000);
  console.log(JSON.stringify({ ...rec, replayed: res.replayed, key: res.key }));
} finally {
  await c.close();
}`
	cmd := exec.CommandContext(ctx, "node", "--input-type=module", "-e", script)
	cmd.Env = append(os.Environ(), "URL="+s.url, "PASSWORD="+s.password(t, "agent-1"), "CA="+s.ca.certPEM, "KEY="+p.ID.Key, "ARGS="+args)
	var out, errOut strings.Builder
	cmd.Stdout, cmd.Stderr = &out, &errOut
	require.NoError(t, cmd.Start())
	done := make(chan error, 1)
	go func() { done <- cmd.Wait() }()

	subject := "$KV.IDEM_LEDGER." + storedKey(t, mustJS(t, agent.Conn), p.ID.Key)
	for !subscribed(t, s.srv, subject) { // the watch waits
		select {
		case err := <-done:
			t.Fatalf("the TypeScript watch ended before the key had a record: %v\n%s%s", err, out.String(), errOut.String())
		case <-ctx.Done():
			t.Fatal("the TypeScript watch never subscribed to the key's subject")
		case <-time.After(10 * time.Millisecond):
		}
	}
	res := submitAs(t, agent, args)
	require.Equal(t, p.ID.Key, res.Key)
	require.NoError(t, <-done, "the TypeScript watch: %s%s", out.String(), errOut.String())
	var rec struct {
		Status      string `json:"status"`
		Fingerprint string `json:"fingerprint"`
		Replayed    bool   `json:"replayed"`
		Key         string `json:"key"`
	}
	require.NoError(t, json.Unmarshal([]byte(out.String()), &rec), out.String())
	require.Equal(t, string(intent.StatusCompleted), rec.Status)
	require.Equal(t, res.Fingerprint, rec.Fingerprint)
	require.True(t, rec.Replayed, "the TypeScript copy is answered from the ledger")
	require.Equal(t, res.Key, rec.Key)
	require.Empty(t, s.violations(), "the TypeScript agent was refused nothing")
}

func mustJS(t *testing.T, nc *nats.Conn) jetstream.JetStream {
	t.Helper()
	js, err := jetstream.New(nc)
	require.NoError(t, err)
	return js
}

// subscribed reports whether a connection to srv subscribes to subject.
func subscribed(t *testing.T, srv *server.Server, subject string) bool {
	t.Helper()
	connz, err := srv.Connz(&server.ConnzOptions{Subscriptions: true})
	require.NoError(t, err)
	for _, c := range connz.Conns {
		if slices.Contains(c.Subs, subject) {
			return true
		}
	}
	return false
}

// What a (prompt-injected) agent may try, and the server refuses.
func TestSecureAgentIsConfined(t *testing.T) {
	t.Parallel()
	s := startSecure(t, "users.conf")
	s.startSecureWorker(t, "worker")
	agent := s.connect(t, "agent-1")
	key := submitAs(t, agent, `{"n":2}`).Key
	js, err := jetstream.New(agent.Conn)
	require.NoError(t, err)
	kvCtx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	kv, err := js.KeyValue(kvCtx, "IDEM_LEDGER")
	require.NoError(t, err)

	t.Run("ConsumeTheIntentStream", func(t *testing.T) {
		refused(t, agent, "$JS.API.CONSUMER.CREATE.IDEM_INTENTS.THIEF", func(ctx context.Context) error {
			_, err := js.CreateOrUpdateConsumer(ctx, "IDEM_INTENTS", jetstream.ConsumerConfig{Name: "THIEF", AckPolicy: jetstream.AckExplicitPolicy})
			return err
		})
		refused(t, agent, "$JS.API.CONSUMER.MSG.NEXT.IDEM_INTENTS.IDEM_WORKERS", func(ctx context.Context) error {
			_, err := agent.RequestWithContext(ctx, "$JS.API.CONSUMER.MSG.NEXT.IDEM_INTENTS.IDEM_WORKERS", []byte(`{"batch":1}`))
			return err
		})
		refused(t, agent, "$JS.API.STREAM.MSG.GET.IDEM_INTENTS", func(ctx context.Context) error {
			_, err := agent.RequestWithContext(ctx, "$JS.API.STREAM.MSG.GET.IDEM_INTENTS", []byte(`{"seq":1}`))
			return err
		})
		refused(t, agent, "idem.intents.>", func(ctx context.Context) error {
			sub, err := agent.SubscribeSync("idem.intents.>")
			if err != nil {
				return err
			}
			_, err = sub.NextMsgWithContext(ctx)
			return err
		})
	})
	t.Run("WriteOrDeleteALedgerKey", func(t *testing.T) {
		stored := storedKey(t, js, key)
		refused(t, agent, "$KV.IDEM_LEDGER."+stored, func(ctx context.Context) error {
			_, err := kv.Put(ctx, stored, []byte(`{"status":"completed"}`))
			return err
		})
		refused(t, agent, "$KV.IDEM_LEDGER."+stored, func(ctx context.Context) error {
			return kv.Delete(ctx, stored)
		})
		refused(t, agent, "$JS.API.STREAM.PURGE.KV_IDEM_LEDGER", func(ctx context.Context) error {
			_, err := agent.RequestWithContext(ctx, "$JS.API.STREAM.PURGE.KV_IDEM_LEDGER", nil)
			return err
		})
		refused(t, agent, "$JS.API.CONSUMER.CREATE.KV_IDEM_LEDGER.SPY", func(ctx context.Context) error {
			// A consumer on the bucket without a filter in the subject.
			_, err := js.CreateOrUpdateConsumer(ctx, "KV_IDEM_LEDGER", jetstream.ConsumerConfig{Name: "SPY"})
			return err
		})
	})
	t.Run("PublishAnOperatorDecision", func(t *testing.T) {
		refused(t, agent, "idem.control.approve", func(ctx context.Context) error {
			_, err := js.Publish(ctx, "idem.control.approve", []byte(`{"key":"`+key+`"}`))
			return err
		})
		refused(t, agent, "idem.control.resolve", func(ctx context.Context) error {
			cl, err := client.New(agent.Conn)
			if err != nil {
				return err
			}
			_, err = cl.Decide(ctx, intent.ControlResolve, intent.Control{Key: key, Outcome: intent.OutcomeSucceeded})
			return err
		})
	})
	t.Run("ReadDeadLetters", func(t *testing.T) {
		refused(t, agent, "$JS.API.STREAM.MSG.GET.IDEM_DLQ", func(ctx context.Context) error {
			_, err := agent.RequestWithContext(ctx, "$JS.API.STREAM.MSG.GET.IDEM_DLQ", []byte(`{"seq":1}`))
			return err
		})
	})
	t.Run("DeliverIntoAnotherSubject", func(t *testing.T) {
		// A push consumer's deliver subject is not checked against its
		// creator's permissions: the server delivers the stream's
		// messages there itself. So an agent may create no consumer.
		victim := s.connect(t, "agent-2")
		worker := s.connect(t, "worker")
		stored := storedKey(t, js, key)
		for _, tc := range []struct{ name, filter, deliver string }{
			{"STEAL", "$KV.IDEM_LEDGER." + stored, "_INBOX.agent-2.stolen"},
			{"FLOOD", "$KV.IDEM_LEDGER.>", "idem.cache.forget"},
			{"PULL", "$KV.IDEM_LEDGER." + stored, ""},
		} {
			got := make(chan *nats.Msg, 16)
			on := victim
			if tc.deliver == "idem.cache.forget" {
				on = worker
			}
			if tc.deliver != "" {
				sub, err := on.ChanSubscribe(tc.deliver, got)
				require.NoError(t, err)
				require.NoError(t, on.Flush())
				defer func() { _ = sub.Unsubscribe() }()
			}
			subject := "$JS.API.CONSUMER.CREATE.KV_IDEM_LEDGER." + tc.name + "." + tc.filter
			refused(t, agent, subject, func(ctx context.Context) error {
				req := fmt.Sprintf(`{"stream_name":"KV_IDEM_LEDGER","config":{"name":%q,"deliver_subject":%q,"filter_subject":%q,"deliver_policy":"all","ack_policy":"none"}}`,
					tc.name, tc.deliver, tc.filter)
				resp, err := agent.RequestWithContext(ctx, subject, []byte(req))
				if err != nil {
					return err
				}
				if tc.deliver == "" {
					return fmt.Errorf("consumer created: %s", resp.Data)
				}
				select {
				case m := <-got:
					return fmt.Errorf("the agent's consumer delivered %s into %s: %s", m.Subject, tc.deliver, m.Data)
				case <-ctx.Done():
					return fmt.Errorf("consumer created (%s), nothing delivered yet: %w", resp.Data, ctx.Err())
				}
			})
			require.NoError(t, on.Flush())
			require.Empty(t, got, "nothing was delivered into %s", tc.deliver)
		}
	})
	t.Run("ForgeAnAnswer", func(t *testing.T) {
		refused(t, agent, "_INBOX.agent-2.x", func(ctx context.Context) error {
			if err := agent.Publish("_INBOX.agent-2.x", []byte(`{"status":"completed"}`)); err != nil {
				return err
			}
			<-ctx.Done()
			return ctx.Err()
		})
	})
}

// An agent cannot listen to another caller's answers: subscriptions to the
// default inbox space or another user's are refused, and nothing of the
// other caller's answer reaches it.
func TestSecureRepliesArePrivate(t *testing.T) {
	t.Parallel()
	s := startSecure(t, "users.conf")
	s.startSecureWorker(t, "worker")
	victim := s.connect(t, "agent-1")
	spy := s.connect(t, "agent-2")

	got := make(chan *nats.Msg, 16)
	for _, subject := range []string{"_INBOX.>", "_INBOX.agent-1.>", ">"} {
		refused(t, spy, subject, func(ctx context.Context) error {
			if _, err := spy.ChanSubscribe(subject, got); err != nil {
				return err
			}
			<-ctx.Done()
			return ctx.Err()
		})
	}
	// The spy's own inbox works.
	own, err := spy.SubscribeSync(spy.NewRespInbox())
	require.NoError(t, err)
	require.NoError(t, spy.Flush())

	submitAs(t, victim, `{"secret":"s3cret"}`)
	require.NoError(t, spy.Flush())
	select {
	case m := <-got:
		t.Fatalf("the spy received %s: %s", m.Subject, m.Data)
	default:
	}
	require.NoError(t, own.Unsubscribe())
}

// Clients without credentials, or with wrong ones, are refused.
func TestSecureAnonymousRefused(t *testing.T) {
	t.Parallel()
	s := startSecure(t, "users.conf")
	_, err := nats.Connect(s.url, nats.RootCAs(s.ca.certPEM), nats.MaxReconnects(0))
	require.ErrorIs(t, err, nats.ErrAuthorization, "no user")
	_, err = nats.Connect(s.url, nats.RootCAs(s.ca.certPEM), nats.UserInfo("agent-1", "guess"), nats.MaxReconnects(0))
	require.ErrorIs(t, err, nats.ErrAuthorization, "wrong password")
}

// TLS with the test CA works (every other test connects that way); a client
// that trusts another CA, or only the system's roots, is refused, and so is
// one that does not speak TLS.
func TestSecureTLS(t *testing.T) {
	t.Parallel()
	s := startSecure(t, "users.conf")
	agent := s.connect(t, "agent-1")
	require.True(t, agent.TLSRequired())
	state, err := agent.TLSConnectionState()
	require.NoError(t, err)
	require.True(t, state.HandshakeComplete)

	other := newTestCA(t, t.TempDir(), "other-ca")
	pw := s.password(t, "agent-1")
	_, err = nats.Connect(s.url, nats.RootCAs(other.certPEM), nats.UserInfo("agent-1", pw), nats.MaxReconnects(0))
	var unknown x509.UnknownAuthorityError
	require.ErrorAs(t, err, &unknown, "a certificate from another CA is not trusted")
	_, err = nats.Connect(s.url, nats.UserInfo("agent-1", pw), nats.MaxReconnects(0))
	require.ErrorAs(t, err, &unknown, "the system roots do not trust the test CA")

	// A plain-text client: the server wants TLS first and never reads the
	// credentials.
	u, err := url.Parse(s.url)
	require.NoError(t, err)
	raw, err := net.DialTimeout("tcp", u.Host, 5*time.Second)
	require.NoError(t, err)
	defer raw.Close()
	require.NoError(t, raw.SetDeadline(time.Now().Add(10*time.Second)))
	info := make([]byte, 4096)
	n, err := raw.Read(info)
	require.NoError(t, err)
	require.Contains(t, string(info[:n]), `"tls_required":true`)
	_, err = fmt.Fprintf(raw, "CONNECT {\"user\":\"agent-1\",\"pass\":%q}\r\nPING\r\n", pw)
	require.NoError(t, err)
	rest, _ := readAll(raw)
	require.NotContains(t, rest, "PONG", "a plain-text client gets no service")
}

func readAll(c net.Conn) (string, error) {
	var b strings.Builder
	buf := make([]byte, 1024)
	for {
		n, err := c.Read(buf)
		b.Write(buf[:n])
		if err != nil {
			return b.String(), err
		}
	}
}

// Tenants in their own accounts (tenants.conf) each run an installation; an
// agent of one cannot read, watch or answer the other's records, and its
// own installation works.
func TestSecureTenantsAreIsolated(t *testing.T) {
	t.Parallel()
	s := startSecure(t, "tenants.conf")
	s.startSecureWorker(t, "acme-worker")
	s.startSecureWorker(t, "globex-worker")
	acme := s.connect(t, "acme-agent")
	globex := s.connect(t, "globex-agent")

	theirs := submitAs(t, globex, `{"order":"g-1"}`)
	ours := submitAs(t, acme, `{"order":"a-1"}`)

	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	cl, err := client.New(acme.Conn)
	require.NoError(t, err)
	_, err = cl.Get(ctx, ours.Key)
	require.NoError(t, err, "ACME reads its own record")
	_, err = cl.Get(ctx, theirs.Key)
	require.ErrorIs(t, err, client.ErrNotFound, "GLOBEX's record is not in ACME's ledger")

	// Listening to the whole ledger's subjects, ACME's agent sees ACME's
	// writes only.
	js, err := jetstream.New(acme.Conn)
	require.NoError(t, err)
	writes := make(chan *nats.Msg, 64)
	sub, err := acme.ChanSubscribe("$KV.IDEM_LEDGER.>", writes)
	require.NoError(t, err)
	defer func() { _ = sub.Unsubscribe() }()
	require.NoError(t, acme.Flush())
	submitAs(t, globex, `{"order":"g-2"}`)
	ours2 := submitAs(t, acme, `{"order":"a-2"}`)
	require.NoError(t, acme.Flush())
	require.NotEmpty(t, writes, "ACME's agent sees its own ledger's writes")
	for len(writes) > 0 {
		m := <-writes
		require.Equal(t, "$KV.IDEM_LEDGER."+storedKey(t, js, ours2.Key), m.Subject)
	}

	// The same request from GLOBEX's side finds its record: the key is
	// right, the account is the boundary.
	gl, err := client.New(globex.Conn)
	require.NoError(t, err)
	_, err = gl.Get(ctx, theirs.Key)
	require.NoError(t, err)

	// ACME's agent cannot listen to GLOBEX's inboxes either.
	refused(t, acme, "_INBOX.globex-agent.>", func(ctx context.Context) error {
		if _, err := acme.SubscribeSync("_INBOX.globex-agent.>"); err != nil {
			return err
		}
		<-ctx.Done()
		return ctx.Err()
	})
	require.Empty(t, filterOut(s.violations(), "_INBOX.globex-agent.>"), "no other refusal")
}

func filterOut(lines []string, subject string) []string {
	var out []string
	for _, l := range lines {
		if !strings.Contains(l, subject) {
			out = append(out, l)
		}
	}
	return out
}

// An operator decides, reads the ledger and handles dead letters; it does
// not consume intents or write the ledger itself.
func TestSecureOperatorRole(t *testing.T) {
	t.Parallel()
	s := startSecure(t, "users.conf")
	s.startSecureWorker(t, "worker")
	agent := s.connect(t, "agent-1")
	op := s.connect(t, "operator")
	key := submitAs(t, agent, `{"n":3}`).Key

	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	// A malformed intent is rejected and dead-lettered by the worker.
	ajs, err := jetstream.New(agent.Conn)
	require.NoError(t, err)
	_, err = ajs.Publish(ctx, "idem.intents.echo", []byte(`not json`))
	require.NoError(t, err)

	cl, err := client.New(op.Conn)
	require.NoError(t, err)
	var letters []client.DeadLetter
	require.Eventually(t, func() bool {
		letters, err = cl.DeadLetters(ctx, 10)
		return err == nil && len(letters) == 1
	}, 10*time.Second, 20*time.Millisecond, "the dead letter is listed: %v", err)
	_, err = cl.ReplayDeadLetter(ctx, letters[0].Seq)
	require.NoError(t, err)
	rec, err := cl.Get(ctx, key)
	require.NoError(t, err)
	require.Equal(t, intent.StatusCompleted, rec.Status)
	res, err := cl.Decide(ctx, intent.ControlResolve, intent.Control{Key: key, Outcome: intent.OutcomeSucceeded})
	require.NoError(t, err, "the decision is published and answered")
	require.Equal(t, key, res.Key)
	require.Empty(t, s.violations(), "the operator and the worker were refused nothing")

	js, err := jetstream.New(op.Conn)
	require.NoError(t, err)
	refused(t, op, "$JS.API.CONSUMER.CREATE.IDEM_INTENTS.OPS", func(ctx context.Context) error {
		_, err := js.CreateOrUpdateConsumer(ctx, "IDEM_INTENTS", jetstream.ConsumerConfig{Name: "OPS"})
		return err
	})
	stored := storedKey(t, js, key)
	refused(t, op, "$KV.IDEM_LEDGER."+stored, func(ctx context.Context) error {
		_, err := js.Publish(ctx, "$KV.IDEM_LEDGER."+stored, []byte(`{}`))
		return err
	})
}

// The submit command works against the hardened configuration with an
// agent's user, password (from the environment), CA and inbox prefix; the
// operator approves with its own user.
func TestSecureSubmitCommand(t *testing.T) {
	t.Parallel()
	s := startSecure(t, "users.conf")
	s.startSecureWorker(t, "worker")
	run := func(user string, args ...string) submitted {
		t.Helper()
		full := append(args, "--nats-url", s.url, "--nats-tls-ca", s.ca.certPEM, "--nats-user", user, "--nats-inbox-prefix", "_INBOX."+user, "--wait", "20s")
		cmd := exec.Command(bin("submit"), full...)
		cmd.Env = append(os.Environ(), "IDEMGATE_NATS_PASSWORD="+s.password(t, user))
		return runClient(t, cmd)
	}
	first := run("agent-1", "--tool", "echo", "--args", `{"via":"submit"}`)
	require.Equal(t, 0, first.code, first.stderr)
	again := run("agent-1", "--tool", "echo", "--args", `{"via":"submit"}`)
	require.Equal(t, 3, again.code, again.stderr)
	wrongInbox := exec.Command(bin("submit"), "--tool", "echo", "--args", `{}`, "--nats-url", s.url, "--nats-tls-ca", s.ca.certPEM,
		"--nats-user", "agent-1", "--nats-inbox-prefix", "_INBOX.agent-2", "--wait", "3s")
	wrongInbox.Env = append(os.Environ(), "IDEMGATE_NATS_PASSWORD="+s.password(t, "agent-1"))
	require.Error(t, wrongInbox.Run(), "another user's inbox is refused")
}
