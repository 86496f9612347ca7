// Command submit publishes tool intents to idemgate and prints their answers.
//
//	submit --tool send_email --args '{"to":"ada@example.com"}'   one intent, from flags
//	submit --file intent.json        one intent envelope from a file ("-": stdin)
//	submit --jsonl intents.jsonl     many envelopes, one per line; answers as JSON lines
//	submit get KEY                   the ledger record of KEY
//	submit key --tool T --args JSON  the key and fingerprint an intent derives, without publishing
//	submit tools                     the tools the workers serve
//	submit approve KEY [--fingerprint FP] [--by NAME] [--reason R]
//	submit deny KEY [--reason R]     operator decisions on an operation awaiting approval
//	submit resolve KEY --outcome succeeded|failed [--result JSON]
//	                                 settle an uncertain operation
//	submit dlq list | dlq replay SEQ the dead-letter stream
//	submit list [--status open] [--tool T] [--session S] [--older-than D] [--past-lease] [--limit N] [--after SEQ] [--all]
//	                                 ledger records, one JSON object per line
//	submit forget KEY                delete a settled operation's record so that it may run again
//
// Exit status of a single intent (and of a decision): 0 fired (completed by this call), 3 replayed
// (completed earlier), 4 conflict, 5 failed, rejected or denied, 6 awaiting
// approval or uncertain, 2 no answer in time, 1 any other error.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"os/signal"
	"syscall"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/idemgate/idemgate/internal/envflag"
	"github.com/idemgate/idemgate/internal/natsconn"
	"github.com/idemgate/idemgate/pkg/client"
	"github.com/idemgate/idemgate/pkg/intent"
)

// Exit statuses.
const (
	exitFired    = 0
	exitError    = 1
	exitTimeout  = 2
	exitReplayed = 3
	exitConflict = 4
	exitFailed   = 5
	exitOpen     = 6
)

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	code := run(ctx, os.Args[1:], os.Stdin, os.Stdout, os.Stderr)
	stop()
	os.Exit(code)
}

// common are the flags every subcommand takes.
type common struct {
	natsURL, prefix string
	auth            natsconn.ClientAuth
}

func (c *common) register(fs *flag.FlagSet) {
	fs.StringVar(&c.natsURL, "nats-url", nats.DefaultURL, "NATS server(s), comma separated (env NATS_URL)")
	fs.StringVar(&c.auth.Creds, "creds", "", "NATS credentials file (env NATS_CREDS)")
	fs.StringVar(&c.auth.User, "nats-user", "", "NATS user; the password comes from the environment variable "+natsconn.PasswordEnv)
	fs.StringVar(&c.auth.NkeySeed, "nkey", "", "file holding the NATS user's nkey seed")
	fs.StringVar(&c.auth.TLSCA, "tls-ca", "", "PEM file of the CAs that sign the NATS server's certificate (turns TLS on)")
	fs.StringVar(&c.auth.TLSCert, "tls-cert", "", "client certificate, for servers that verify clients (with --tls-key)")
	fs.StringVar(&c.auth.TLSKey, "tls-key", "", "key of --tls-cert")
	fs.StringVar(&c.auth.InboxPrefix, "inbox-prefix", "", "subject prefix of reply inboxes, as this user's permissions allow (e.g. _INBOX.agent-1)")
	fs.StringVar(&c.prefix, "prefix", intent.DefaultPrefix, "names prefix of the installation")
}

// parse parses flags and positional arguments in any order (submit get KEY
// --nats-url URL works as well as submit get --nats-url URL KEY); the
// positional arguments are then fs.Args(). A "--" ends the flags.
func (c *common) parse(fs *flag.FlagSet, args []string) error {
	var positional []string
	for {
		if err := fs.Parse(args); err != nil {
			return err
		}
		rest := fs.Args()
		if len(rest) == 0 {
			break
		}
		if len(args) > len(rest) && args[len(args)-len(rest)-1] == "--" {
			positional = append(positional, rest...)
			break
		}
		positional = append(positional, rest[0])
		args = rest[1:]
	}
	if err := fs.Parse(append([]string{"--"}, positional...)); err != nil {
		return err
	}
	return envflag.Apply(fs, "IDEMGATE", map[string]string{"nats-url": "NATS_URL", "creds": "NATS_CREDS"})
}

func (c *common) connect() (*nats.Conn, *client.Client, error) {
	opts := []nats.Option{nats.Name("idemgate-submit"), nats.Timeout(5 * time.Second)}
	c.auth.Password = os.Getenv(natsconn.PasswordEnv)
	auth, err := c.auth.Options()
	if err != nil {
		return nil, nil, err
	}
	opts = append(opts, auth...)
	nc, err := nats.Connect(c.natsURL, opts...)
	if err != nil {
		return nil, nil, fmt.Errorf("connect %s: %w", c.natsURL, err)
	}
	cl, err := client.New(nc, client.WithPrefix(c.prefix))
	if err != nil {
		nc.Close()
		return nil, nil, err
	}
	return nc, cl, nil
}

func run(ctx context.Context, args []string, stdin io.Reader, stdout, stderr io.Writer) int {
	var err error
	code := exitError
	if len(args) > 0 {
		switch args[0] {
		case "get":
			code, err = cmdGet(ctx, args[1:], stdout, stderr)
		case "key":
			code, err = cmdKey(ctx, args[1:], stdout, stderr)
		case "tools":
			code, err = cmdTools(ctx, args[1:], stdout, stderr)
		case intent.ControlApprove, intent.ControlDeny, intent.ControlResolve:
			code, err = cmdDecide(ctx, args[0], args[1:], stdout, stderr)
		case "dlq":
			code, err = cmdDLQ(ctx, args[1:], stdout, stderr)
		case "list":
			code, err = cmdList(ctx, args[1:], stdout, stderr)
		case "forget":
			code, err = cmdForget(ctx, args[1:], stdout, stderr)
		default:
			code, err = cmdSubmit(ctx, args, stdin, stdout, stderr)
		}
	} else {
		code, err = cmdSubmit(ctx, args, stdin, stdout, stderr)
	}
	if errors.Is(err, flag.ErrHelp) {
		return 0
	}
	if err != nil {
		fmt.Fprintln(stderr, "submit:", err)
		if code == exitFired {
			code = exitError
		}
	}
	return code
}

// exitCode tells the outcomes of one answer apart.
func exitCode(res *intent.Result) int {
	switch {
	case res.Status == intent.StatusConflict:
		return exitConflict
	case res.Status == intent.StatusFailed, res.Status == intent.StatusRejected, res.Status == intent.StatusDenied:
		return exitFailed
	case !res.Status.Final():
		return exitOpen
	case res.Replayed:
		return exitReplayed
	}
	return exitFired
}

// defaultWait exceeds a crashed holder's recovery — two default leases (30s
// each: the lease, then the takeover's confirmation) plus the consumer's ack
// wait (30s) — plus an effect's retries, so a caller whose worker died still
// gets its answer from the worker that takes over.
const defaultWait = 3 * time.Minute
