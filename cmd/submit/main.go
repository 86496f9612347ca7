// Command submit publishes tool intents to idemgate and prints their answers,
// and gives operators the ledger: records, decisions, dead letters. Run
// submit help for the subcommands, the exit statuses and examples.
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
	"go.uber.org/zap"

	"github.com/idemgate/idemgate/internal/envflag"
	"github.com/idemgate/idemgate/internal/logging"
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
	prefix string
	nats   *natsconn.Flags
	log    *logging.Flags
	config string
	logger *zap.Logger // built by parse
}

func (c *common) register(fs *flag.FlagSet) {
	c.nats = natsconn.Register(fs, natsconn.Defaults{URL: nats.DefaultURL, Name: "idemgate-submit", Timeout: 5 * time.Second, OldTLSNames: true})
	c.log = logging.Register(fs, logging.Flags{Level: "warn", Format: "console"})
	fs.StringVar(&c.prefix, "prefix", intent.DefaultPrefix, "names prefix of the installation")
	fs.StringVar(&c.config, "config", "", envflag.ConfigUsage)
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
	if err := envflag.Load(fs, &c.config, envflag.Sources{Aliases: natsconn.EnvAliases, CommandLineOnly: commandLineOnly}); err != nil {
		return err
	}
	var err error
	c.logger, err = c.log.Logger()
	return err
}

// commandLineOnly are the flags that confirm a dangerous act: taken from
// the command line only, never from the environment or a config file.
var commandLineOnly = []string{"force", "yes"}

// connect connects to NATS; the connection's troubles (a permissions
// violation among them) are logged to stderr.
func (c *common) connect() (*nats.Conn, *client.Client, error) {
	nc, err := c.nats.Connect(c.logger)
	if err != nil {
		return nil, nil, err
	}
	cl, err := client.New(nc, client.WithPrefix(c.prefix))
	if err != nil {
		nc.Close()
		return nil, nil, err
	}
	return nc, cl, nil
}

// usage is the text of submit help.
const usage = `usage: submit [flags]                 publish one intent and print its answer
       submit SUBCOMMAND [flags] [ARGS]  (submit SUBCOMMAND --help for its flags)

Publishing:
  submit --tool T --args JSON [--session S]  one intent, from flags
  submit --file FILE                         one intent envelope from a file ("-": stdin)
  submit --jsonl FILE [--strict]             many envelopes, one per line; one answer per line
Subcommands:
  key --tool T --args JSON [-q|-f|-l] the key and fingerprint (-l: the ledger key) an intent derives, without publishing
  watch KEY                        wait for an operation's final answer (after exit 2, or from another shell)
  get KEY                          the ledger record of KEY
  tools                            the tools the workers serve, and how each derives its keys
  approve KEY [--fingerprint FP]   let an operation awaiting approval fire (shows its args and asks)
  deny KEY [--reason R]            refuse an operation awaiting approval
  resolve KEY --outcome succeeded|failed [--result JSON]
                                   settle an uncertain operation
  probe KEY                        ask an uncertain operation's downstream with its tool's probe: done completes it
  dlq list | dlq replay SEQ        the dead-letter stream: list, or publish one again
  list [--status open] [--tool T] [--session S] [--older-than D] [--past-lease] [--limit N] [--after SEQ] [--all]
                                   ledger records, one JSON object per line (--status open: every unresolved one)
  forget KEY [--force] [--by WHO] [--reason R]
                                   delete a settled operation's record so that it may run again
                                   (--force: an unresolved one too, once nobody can be firing it)
  migrate [--partitions N] [--layout 2]
                                   grow the ledger's partitions, or convert it to compact keys, with every worker stopped
  audit export [--partition N] [--since T] [--until T] [--from CP] [-o FILE]
                                   the audit trail as JSON lines, ending with its checkpoint (docs/audit.md)
  audit verify FILE [--keys KEYS] [--checkpoint CP] [--from CP] [--partial]
                                   check every signature, every partition's chain and its end; names the first break
  audit checkpoint [--stored] [-o FILE]
                                   signed checkpoints of every partition (size and head), as JSON
  audit show KEY [--json]          one operation's history from the audit trail
  audit keys                       the workers' published public keys, as a keys file
  help                             this text

Exit status:
  0  fired by this call (a decision: it took effect); a list, key or record printed
  3  replayed: the answer reports an outcome an earlier call caused
  4  conflict: the key was used with other arguments
  5  failed, rejected or denied (--jsonl: some line was invalid or not completed)
  6  awaiting approval or uncertain (watch KEY, or --wait-final, to wait on)
  7  audit verify: the trail does not verify (the first break is printed)
  2  no answer in time (the operation may still complete: submit watch KEY)
  1  any other error (bad flags or input, no server, ...)

Examples:
  submit --tool send_email --args '{"to":"ada@example.com","subject":"Hi"}' --session run-7
  K=$(submit key -q --tool send_email --args '{"to":"ada@example.com","subject":"Hi"}' --session run-7)
  submit watch "$K"

Every flag but --force and --yes can also be set as IDEMGATE_<FLAG> in the
environment, or in the YAML file of --config; NATS_URL and NATS_CREDS work
as for the nats CLI.
`

// subcommands are the words submit takes before its flags.
var subcommands = []string{"key", "watch", "get", "tools", intent.ControlApprove, intent.ControlDeny, intent.ControlResolve, intent.ControlProbe, "dlq", "list", "forget", "migrate", "audit", "help"}

func run(ctx context.Context, args []string, stdin io.Reader, stdout, stderr io.Writer) int {
	var err error
	code := exitError
	if len(args) > 0 {
		switch args[0] {
		case "help", "-h", "-help", "--help":
			fmt.Fprint(stdout, usage)
			return exitFired
		case "watch":
			code, err = cmdWatch(ctx, args[1:], stdout, stderr)
		case "get":
			code, err = cmdGet(ctx, args[1:], stdout, stderr)
		case "key":
			code, err = cmdKey(ctx, args[1:], stdout, stderr)
		case "tools":
			code, err = cmdTools(ctx, args[1:], stdout, stderr)
		case intent.ControlApprove, intent.ControlDeny, intent.ControlResolve, intent.ControlProbe:
			code, err = cmdDecide(ctx, args[0], args[1:], stdin, stdout, stderr)
		case "dlq":
			code, err = cmdDLQ(ctx, args[1:], stdout, stderr)
		case "list":
			code, err = cmdList(ctx, args[1:], stdout, stderr)
		case "forget":
			code, err = cmdForget(ctx, args[1:], stdout, stderr)
		case "migrate":
			code, err = cmdMigrate(ctx, args[1:], stdout, stderr)
		case "audit":
			code, err = cmdAudit(ctx, args[1:], stdout, stderr)
		default:
			code, err = cmdSubmit(ctx, args, stdin, stdout, stderr)
		}
	} else {
		code, err = cmdSubmit(ctx, args, stdin, stdout, stderr)
	}
	if errors.Is(err, flag.ErrHelp) {
		return exitFired
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
