package integration

import (
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/idemgate/idemgate/pkg/intent"
)

// submit help (and --help, -h) lists every subcommand with one line, the
// exit statuses and examples, on stdout, and exits 0; a subcommand's --help
// too.
func TestSubmitHelp(t *testing.T) {
	t.Parallel()
	for _, args := range [][]string{{"help"}, {"--help"}, {"-h"}} {
		s := runClient(t, exec.Command(bin("submit"), args...))
		require.Equal(t, 0, s.code, "%v: %s", args, s.stderr)
		require.Empty(t, s.stderr, "%v", args)
		for _, want := range []string{"key --tool", "watch KEY", "get KEY", "tools ", "approve KEY", "deny KEY", "resolve KEY", "probe KEY", "dlq list", "help ",
			"Exit status:", "  3  replayed", "  2  no answer in time", "Examples:", "--jsonl FILE"} {
			require.Contains(t, s.stdout, want, "%v", args)
		}
	}
	for _, sub := range []string{"key", "watch", "get", "tools", "approve", "deny", "resolve", "probe"} {
		s := runClient(t, exec.Command(bin("submit"), sub, "--help"))
		require.Equal(t, 0, s.code, "%s --help: %s", sub, s.stderr)
		require.Contains(t, s.stdout, "usage: submit "+sub, sub)
	}
	s := runClient(t, exec.Command(bin("submit"), "--tool", "x", "--help"))
	require.Equal(t, 0, s.code)
	require.Contains(t, s.stdout, "Exit status:")
	unknown := runClient(t, exec.Command(bin("submit"), "lsit"))
	require.Equal(t, 1, unknown.code)
	require.Contains(t, unknown.stderr, "subcommands: key, watch")
}

// A subcommand named after flags (submit --nats-url X get KEY) is told to
// come first, with the command line rearranged, instead of "unexpected
// argument".
func TestSubmitSubcommandAfterFlags(t *testing.T) {
	t.Parallel()
	s := runClient(t, exec.Command(bin("submit"), "--nats-url", "nats://127.0.0.1:1", "get", "send_email.abc"))
	require.Equal(t, 1, s.code, s.stderr)
	require.Contains(t, s.stderr, `"get" is a subcommand: name it first, its flags after it: submit get --nats-url nats://127.0.0.1:1 send_email.abc`)
	s = runClient(t, exec.Command(bin("submit"), "--args", `{"a": 1}`, "--session", "it's", "key", "--tool", "t"))
	require.Equal(t, 1, s.code, s.stderr)
	require.Contains(t, s.stderr, `submit key --args '{"a": 1}' --session 'it'\''s' --tool t`)
}

// Malformed --args is reported as such, with the byte position and a caret.
func TestSubmitArgsErrors(t *testing.T) {
	t.Parallel()
	for args, want := range map[string]string{
		`{to:"a@b.c"}`:             "--args is not valid JSON: at byte 1: unexpected character 't'",
		`{"to":"a@b.c"`:            "--args is not valid JSON: at byte 13: the JSON text is incomplete",
		`{"to":"a","to":"b"}`:      `--args is refused: at byte 10: member name "to" repeated`,
		`{"id":9007199254740993}`:  "--args is refused: at byte 6: number 9007199254740993 is beyond",
		`{"a":1} trailing garbage`: "--args is not valid JSON: at byte 8:",
	} {
		s := submit(t, "nats://127.0.0.1:1", "--tool", "send_email", "--args", args)
		require.Equal(t, 1, s.code, args)
		require.Contains(t, s.stderr, want, args)
		require.NotContains(t, s.stderr, "MarshalJSON", args)
		require.Contains(t, s.stderr, "^", "a caret shows where: %s", s.stderr)
	}
}

// submit key takes the spec from the catalogue, --spec or --tools FILE, and
// each gives the key the workers use (the demo's create_ticket: volatile
// requested_at); -q prints only the key, for K=$(submit key -q ...); a
// tool the workers do not serve fails with did you mean.
func TestSubmitKeySpecs(t *testing.T) {
	t.Parallel()
	url := jetStream(t)
	hook := newSink(t, nil)
	tools := demoTools(t, hook.URL)
	startWorker(t, "w1", url, tools)
	args := []string{"--tool", "create_ticket", "--session", "s1", "--args", `{"title":"Disk full","requested_at":"2026-11-30T09:00:00Z"}`}

	fired := submit(t, url, append(args, "--wait", "30s")...)
	require.Equal(t, 0, fired.code, fired.stderr)

	quiet := func(extra ...string) string {
		t.Helper()
		s := submit(t, url, append(append([]string{"key", "-q"}, args...), extra...)...)
		require.Equal(t, 0, s.code, s.stderr)
		return strings.TrimSpace(s.stdout)
	}
	require.Equal(t, fired.res.Key, quiet(), "from the catalogue")
	noServer := "nats://127.0.0.1:1"
	fromFile := submit(t, noServer, append(append([]string{"key", "-q"}, args...), "--tools", tools)...)
	require.Equal(t, 0, fromFile.code, fromFile.stderr)
	require.Equal(t, fired.res.Key+"\n", fromFile.stdout, "from the tools file, without a server; -q prints the key alone")
	fromSpec := submit(t, noServer, append(append([]string{"key", "-q"}, args...), "--spec", `{"volatile_args":["requested_at"]}`)...)
	require.Equal(t, fired.res.Key+"\n", fromSpec.stdout, fromSpec.stderr)
	def := submit(t, noServer, append(append([]string{"key", "-q"}, args...), "--default-spec")...)
	require.NotEqual(t, fired.res.Key+"\n", def.stdout, "the default derivation keeps requested_at: another key")

	typo := submit(t, url, "key", "--tool", "create_tiket", "--args", `{}`)
	require.Equal(t, 1, typo.code)
	require.Contains(t, typo.stderr, `did you mean "create_ticket"?`)
	badFile := submit(t, noServer, "key", "--tool", "create_tiket", "--args", `{}`, "--tools", tools)
	require.Equal(t, 1, badFile.code)
	require.Contains(t, badFile.stderr, `did you mean "create_ticket"?`)
	badSpec := submit(t, noServer, "key", "--tool", "x", "--args", `{}`, "--spec", `{"keyargs":["a"]}`)
	require.Equal(t, 1, badSpec.code)
	require.Contains(t, badSpec.stderr, "keyargs")

	// The answer of an intent for an unknown tool says so too.
	unknown := submit(t, url, "--tool", "create_tiket", "--args", `{}`, "--wait", "30s")
	require.Equal(t, 5, unknown.code, unknown.stdout)
	require.Equal(t, intent.CodeUnknownTool, unknown.res.Error.Code)
	require.Contains(t, unknown.res.Error.Message, `did you mean "create_ticket"?`)
}

// submit watch KEY waits for an operation's final answer: here one that
// awaits approval, approved meanwhile (with --yes: no terminal); a key with
// no record times out with exit 2; a malformed key is refused.
func TestSubmitWatchAndApprove(t *testing.T) {
	t.Parallel()
	url := jetStream(t)
	hook := newSink(t, nil)
	startWorker(t, "w1", url, demoTools(t, hook.URL))
	parked := submit(t, url, "--tool", "refund", "--args", `{"order_id":"o-77","amount_cents":1200}`, "--wait", "30s")
	require.Equal(t, 6, parked.code, parked.stdout+parked.stderr)

	watching := ledgerWatches(t, t.Context(), url, ledgerKey(t, parked.res.Key))
	watched := make(chan submitted, 1)
	go func() { watched <- submit(t, url, "watch", parked.res.Key, "--wait", "60s") }()
	// Decide only once the watch waits: it must see awaiting_approval first.
	until(t, "submit watch watches the key", func() bool { return watching() == 1 })

	noTTY := submit(t, url, "approve", parked.res.Key)
	require.Equal(t, 1, noTTY.code, "no terminal, no --yes: refused: %s", noTTY.stdout)
	require.Contains(t, noTTY.stderr, `"order_id": "o-77"`, "the args are shown")
	require.Contains(t, noTTY.stderr, "--yes")
	require.Contains(t, noTTY.stderr, parked.res.Fingerprint)
	require.Equal(t, 0, hook.count(), "nothing fired")

	approved := submit(t, url, "approve", parked.res.Key, "--yes", "--by", "ops")
	require.Equal(t, 0, approved.code, approved.stdout+approved.stderr)
	require.Contains(t, approved.stderr, `"order_id": "o-77"`)
	require.Equal(t, intent.StatusCompleted, approved.res.Status)

	w := <-watched
	require.Equal(t, 0, w.code, w.stdout+w.stderr)
	require.Contains(t, w.stderr, "awaiting_approval; waiting for its final answer")
	var rec struct {
		Status   intent.Status `json:"status"`
		Decision struct {
			Op string `json:"op"`
		} `json:"decision"`
	}
	require.NoError(t, json.Unmarshal([]byte(w.stdout), &rec), w.stdout)
	require.Equal(t, intent.StatusCompleted, rec.Status)
	require.Equal(t, "approve", rec.Decision.Op)
	require.Equal(t, 1, hook.count())

	never := submit(t, url, "watch", "refund."+strings.Repeat("ab", 32), "--wait", "1s")
	require.Equal(t, 2, never.code, never.stderr)
	require.Contains(t, never.stderr, "no record yet")
	bad := submit(t, url, "watch", "not-a-key")
	require.Equal(t, 1, bad.code)
	require.Contains(t, bad.stderr, "is not a key")
}

// On a terminal, approve shows the args and fires only on "y".
func TestSubmitApproveAsks(t *testing.T) {
	t.Parallel()
	url := jetStream(t)
	hook := newSink(t, nil)
	startWorker(t, "w1", url, demoTools(t, hook.URL))
	ask := func(order, answer string) (string, int) {
		t.Helper()
		parked := submit(t, url, "--tool", "refund", "--args", fmt.Sprintf(`{"order_id":%q}`, order), "--wait", "30s")
		require.Equal(t, 6, parked.code, parked.stdout+parked.stderr)
		out, code := onTerminal(t, answer+"\n", bin("submit"), "approve", parked.res.Key, "--nats-url", url)
		return out, code
	}
	out, code := ask("o-1", "n")
	require.Equal(t, 1, code, out)
	require.Contains(t, out, `"order_id": "o-1"`)
	require.Contains(t, out, "Fire it with these arguments? [y/N]")
	require.Contains(t, out, "not approved")
	require.Equal(t, 0, hook.count())

	out, code = ask("o-2", "y")
	require.Equal(t, 0, code, out)
	require.Contains(t, out, `"status": "completed"`)
	require.Equal(t, 1, hook.count())
}

// --jsonl checks every line first: an invalid line is reported with its
// number and not sent, the others are; each result carries its line; the
// exit status says some line was not completed. --strict sends nothing.
func TestSubmitJSONLinesPerLine(t *testing.T) {
	t.Parallel()
	url := jetStream(t)
	hook := newSink(t, nil)
	startWorker(t, "w1", url, writeTools(t, webhookTools(hook.URL, "30s")))
	file := filepath.Join(t.TempDir(), "intents.jsonl")
	require.NoError(t, os.WriteFile(file, []byte(strings.Join([]string{
		`{"tool":"send_email","args":{"to":"a@example.com"}}`,
		`{"tool":"send_email","args":{"to":"b@example.com"},"priority":"high"}`,
		``,
		`{"tool":"send_emial","args":{"to":"c@example.com"}}`,
		`{"tool":"send_email","args":{"to":"d@example.com"}}`,
	}, "\n")+"\n"), 0o644))

	strict := submit(t, url, "--jsonl", file, "--strict", "--wait", "30s")
	require.Equal(t, 5, strict.code, strict.stdout+strict.stderr)
	require.Contains(t, strict.stderr, "nothing was sent (--strict)")
	require.Contains(t, strict.stderr, file+`:2: intent: invalid: unknown field "priority"`)
	require.Equal(t, 0, hook.count())

	s := submit(t, url, "--jsonl", file, "--wait", "30s")
	require.Equal(t, 5, s.code, "a line was invalid, another rejected: %s %s", s.stdout, s.stderr)
	byLine := map[int]map[string]any{}
	for _, l := range lines(s.stdout) {
		var m map[string]any
		require.NoError(t, json.Unmarshal([]byte(l), &m), l)
		byLine[int(m["line"].(float64))] = m
	}
	require.Len(t, byLine, 4, s.stdout)
	require.Equal(t, "completed", byLine[1]["status"])
	require.Equal(t, "rejected", byLine[2]["status"])
	require.Equal(t, "invalid_intent", byLine[2]["error"].(map[string]any)["code"])
	require.Equal(t, "rejected", byLine[4]["status"])
	require.Contains(t, byLine[4]["error"].(map[string]any)["message"], `did you mean "send_email"?`)
	require.Equal(t, "completed", byLine[5]["status"])
	require.Equal(t, 2, hook.count(), "the valid lines were sent")
	require.Contains(t, s.stderr, "sent 3/3 answered 3")
	require.Contains(t, s.stderr, "invalid 1")

	good := filepath.Join(t.TempDir(), "good.jsonl")
	require.NoError(t, os.WriteFile(good, []byte(`{"tool":"send_email","args":{"to":"a@example.com"}}`+"\n"), 0o644))
	again := submit(t, url, "--jsonl", good, "--wait", "30s")
	require.Equal(t, 0, again.code, "all completed (a replay too): %s", again.stderr)
}

// onTerminal runs a command with a pseudo-terminal as its stdin, stdout and
// stderr, types input into it, and returns everything it printed and its
// exit code.
func onTerminal(t *testing.T, input string, name string, args ...string) (string, int) {
	t.Helper()
	master, slave := openPTY(t)
	cmd := exec.Command(name, args...)
	cmd.Stdin, cmd.Stdout, cmd.Stderr = slave, slave, slave
	require.NoError(t, cmd.Start())
	_ = slave.Close()
	var out syncBuffer
	copied := make(chan struct{})
	go func() {
		defer close(copied)
		buf := make([]byte, 4096)
		for {
			n, err := master.Read(buf)
			_, _ = out.Write(buf[:n])
			if err != nil {
				return
			}
		}
	}()
	require.Eventually(t, func() bool { return strings.Contains(out.String(), "[y/N]") || cmd.ProcessState != nil },
		30*time.Second, 20*time.Millisecond, "the prompt: %s", out.String())
	_, err := master.Write([]byte(input))
	require.NoError(t, err)
	err = cmd.Wait()
	code := 0
	var ee *exec.ExitError
	if err != nil {
		require.ErrorAs(t, err, &ee)
		code = ee.ExitCode()
	}
	// The process has exited: the master reads what it wrote last, then
	// fails (EIO). Closing the master first could drop that last output.
	select {
	case <-copied:
	case <-time.After(10 * time.Second):
	}
	_ = master.Close()
	<-copied
	return strings.ReplaceAll(out.String(), "\r\n", "\n"), code
}
