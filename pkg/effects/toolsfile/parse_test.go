package toolsfile_test

import (
	"context"
	"encoding/json"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/idemgate/idemgate/pkg/effects"
	"github.com/idemgate/idemgate/pkg/effects/toolsfile"
	"github.com/idemgate/idemgate/pkg/effects/webhook"
	"github.com/idemgate/idemgate/pkg/intent"
)

const goodTools = `# tools.yaml
tools:
  send_email:
    effect: webhook
    key_args: [to, subject]
    window: 168h
    volatile_args: [trace_id]
    lease: 45s
    webhook:
      url: http://127.0.0.1:8080/hooks/email
      method: put
      headers: {Authorization: "Bearer x"}
      timeout: 5s
      retry: {max_attempts: 2, initial_interval: 100ms, max_interval: 1s}
  demo_echo:
    effect: noop
    key_args: all
  fixed:
    effect: noop
    key_args: [id]
    noop: {delay: 0s, result: {"ok": true, n: [1, 2.5, null]}}
  bare_hook:
    effect: webhook
    class: idempotent
    webhook:
      url: https://hooks.example.com/x
`

func parse(t *testing.T, data string, opts ...toolsfile.Option) *effects.Registry {
	t.Helper()
	r, err := toolsfile.Parse([]byte(data), opts...)
	require.NoError(t, err)
	t.Cleanup(func() { require.NoError(t, r.Close()) })
	return r
}

func TestParse(t *testing.T) {
	t.Parallel()
	r := parse(t, goodTools)
	require.Equal(t, []string{"bare_hook", "demo_echo", "fixed", "send_email"}, r.Names())

	email, ok := r.Lookup("send_email")
	require.True(t, ok)
	require.Equal(t, "send_email", email.Name)
	require.Equal(t, "webhook", email.Kind)
	require.Equal(t, intent.KeySpec{KeyArgs: []string{"to", "subject"}, Window: 168 * time.Hour, VolatileArgs: []string{"trace_id"}}, email.KeySpec)
	require.Equal(t, 45*time.Second, email.Lease)
	require.Equal(t, 2*5*time.Second+time.Second, email.MaxDuration)
	require.IsType(t, &webhook.Effect{}, email.Effect)

	hook, ok := r.Lookup("bare_hook")
	require.True(t, ok)
	require.Equal(t, effects.DefaultLease, hook.Lease)
	require.Equal(t, intent.KeySpec{}, hook.KeySpec)
	require.Equal(t, 4*webhook.DefaultTimeout+3*effects.DefaultMaxInterval, hook.MaxDuration)

	echo, ok := r.Lookup("demo_echo")
	require.True(t, ok)
	out, err := echo.Effect.Fire(context.Background(), effects.Call{Key: "k", Tool: "demo_echo", Args: json.RawMessage(`{"x":1}`)})
	require.NoError(t, err)
	require.JSONEq(t, `{"echo":{"x":1}}`, string(out.Result))

	fixed, _ := r.Lookup("fixed")
	out, err = fixed.Effect.Fire(context.Background(), effects.Call{Key: "k", Tool: "fixed", Args: json.RawMessage(`{}`)})
	require.NoError(t, err)
	require.JSONEq(t, `{"ok":true,"n":[1,2.5,null]}`, string(out.Result))

	_, ok = r.Lookup("nope")
	require.False(t, ok)
}

func TestParseNamesAreACopy(t *testing.T) {
	t.Parallel()
	r := parse(t, goodTools)
	names := r.Names()
	names[0] = "changed"
	require.Equal(t, "bare_hook", r.Names()[0])
}

// TestParseErrors checks that each mistake is reported at its line, with the
// field and a hint.
func TestParseErrors(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name string
		file string
		want []string // one entry per expected error, in order
	}{
		{
			name: "DurationWithoutUnit",
			file: "tools:\n  send_email:\n    effect: webhook\n    webhook:\n      url: http://h/x\n      timeout: 10\n    key_args: [a]\n",
			want: []string{`tools.yaml:6: send_email.webhook.timeout: "10" is not a duration (write e.g. 10s)`},
		},
		{
			name: "DurationInDays",
			file: "tools:\n  t:\n    effect: noop\n    window: 7d\n    key_args: [a]\n",
			want: []string{`tools.yaml:4: t.window: "7d" is not a duration (write days in hours, e.g. 168h for 7d)`},
		},
		{
			name: "UnknownField",
			file: "tools:\n  t:\n    effect: webhook\n    webhook:\n      url: http://h/x\n      timout: 5s\n    key_args: [a]\n",
			want: []string{`tools.yaml:6: t.webhook.timout: unknown field (did you mean timeout?)`},
		},
		{
			name: "UnknownToolField",
			file: "tools:\n  t:\n    effect: noop\n    keyargs: [a]\n    key_args: [a]\n",
			want: []string{`tools.yaml:4: t.keyargs: unknown field (did you mean key_args?)`},
		},
		{
			name: "UnknownTopLevel",
			file: "tool:\n  t:\n    effect: noop\n",
			want: []string{`tools.yaml:1: tools: is missing`, `tools.yaml:1: tool: unknown field (did you mean tools?)`},
		},
		{
			name: "UnknownNestedField",
			file: "tools:\n  t:\n    effect: webhook\n    webhook:\n      url: http://h/x\n      retry: {max_attempts: 3, jitter: 0.5}\n    key_args: [a]\n",
			want: []string{`tools.yaml:6: t.webhook.retry.jitter: unknown field (known fields: initial_interval, max_attempts, max_interval)`},
		},
		{
			name: "UnknownEffect",
			file: "tools:\n  t:\n    effect: webhok\n    webhook: {url: http://h/x}\n    key_args: [a]\n",
			want: []string{`tools.yaml:3: t.effect: unknown effect "webhok" (did you mean webhook?)`},
		},
		{
			name: "OtherKindsSettings",
			file: "tools:\n  t:\n    effect: noop\n    webhook: {url: http://h/x}\n    key_args: [a]\n",
			want: []string{`tools.yaml:4: t.webhook: settings for effect webhook, but this tool's effect is noop (remove the webhook block or change effect)`},
		},
		{
			name: "MissingEffect",
			file: "tools:\n  t:\n    lease: 5s\n    key_args: [a]\n",
			want: []string{`tools.yaml:2: t.effect: is missing (add effect: one of mcp, noop, smtp, webhook)`},
		},
		{
			name: "MissingWebhookSettings",
			file: "tools:\n  t:\n    effect: webhook\n    key_args: [a]\n",
			want: []string{`tools.yaml:2: t.webhook: is missing (add webhook: with at least url: http://...)`},
		},
		{
			name: "MissingURL",
			file: "tools:\n  t:\n    effect: webhook\n    webhook:\n      method: POST\n    key_args: [a]\n",
			want: []string{`tools.yaml:4: t.webhook.url: is missing (write e.g. http://127.0.0.1:8080/hooks/email)`},
		},
		{
			name: "BadURL",
			file: "tools:\n  t:\n    effect: webhook\n    webhook:\n      url: ftp://h/x\n    key_args: [a]\n",
			want: []string{`tools.yaml:5: t.webhook.url: "ftp://h/x" is not an http or https URL`},
		},
		{
			name: "BadToolName",
			file: "tools:\n  Send-Email:\n    effect: noop\n    key_args: [a]\n",
			want: []string{`tools.yaml:2: tools: tool name "Send-Email" is invalid (use 1-64 of a-z, 0-9, '_' and '-')`},
		},
		{
			name: "DuplicateTool",
			file: "tools:\n  t:\n    effect: noop\n    key_args: [a]\n  t:\n    effect: noop\n",
			want: []string{`tools.yaml:5: t: tool defined twice (first at line 2)`},
		},
		{
			name: "DuplicateField",
			file: "tools:\n  t:\n    effect: noop\n    effect: webhook\n    key_args: [a]\n",
			want: []string{`tools.yaml:4: t.effect: is repeated (first at line 3)`},
		},
		{
			name: "WindowNotWholeSeconds",
			file: "tools:\n  t:\n    effect: noop\n    window: 1500ms\n    key_args: [a]\n",
			want: []string{`tools.yaml:4: t.window: 1.5s is not a whole number of seconds`},
		},
		{
			name: "WindowZero",
			file: "tools:\n  t:\n    effect: noop\n    window: 0s\n    key_args: [a]\n",
			want: []string{`tools.yaml:4: t.window: must be at least 1s (remove window`},
		},
		{
			name: "LeaseTooShort",
			file: "tools:\n  t:\n    effect: noop\n    lease: 500ms\n    key_args: [a]\n",
			want: []string{`tools.yaml:4: t.lease: 500ms is under the minimum of 1s`},
		},
		{
			name: "NegativeDuration",
			file: "tools:\n  t:\n    effect: noop\n    lease: -5s\n    key_args: [a]\n",
			want: []string{`tools.yaml:4: t.lease: -5s is negative`},
		},
		{
			name: "KeyArgsEmptyAndRepeated",
			file: "tools:\n  t:\n    effect: noop\n    key_args:\n      - to\n      - \"\"\n      - to\n",
			want: []string{`tools.yaml:6: t.key_args[1]: is empty`, `tools.yaml:7: t.key_args[2]: "to" is listed twice`},
		},
		{
			name: "KeyArgsNotAList",
			file: "tools:\n  t:\n    effect: noop\n    key_args: to\n",
			want: []string{`tools.yaml:4: t.key_args: "to" is neither a list of argument names nor all (write e.g. key_args: [order_id], or key_args: all when every argument names the operation)`},
		},
		{
			name: "VolatileKeyArg",
			file: "tools:\n  t:\n    effect: noop\n    key_args: [to]\n    volatile_args: [to]\n",
			want: []string{`tools.yaml:5: t.volatile_args: "to" is also a key arg`},
		},
		{
			name: "WrongTypes",
			file: "tools:\n  t:\n    effect: webhook\n    webhook:\n      url: http://h/x\n      headers: [a]\n      retry:\n        max_attempts: many\n    key_args: [a]\n",
			want: []string{`tools.yaml:6: t.webhook.headers: is a list, want a mapping`, `tools.yaml:8: t.webhook.retry.max_attempts: "many" is not a whole number (write e.g. max_attempts: 4)`},
		},
		{
			name: "ExplicitZero",
			file: "tools:\n  t:\n    effect: webhook\n    webhook:\n      url: http://h/x\n      retry: {max_attempts: 0}\n    key_args: [a]\n",
			want: []string{`tools.yaml:6: t.webhook.retry.max_attempts: must be positive`},
		},
		{
			name: "ReservedHeader",
			file: "tools:\n  t:\n    effect: webhook\n    webhook:\n      url: http://h/x\n      headers:\n        Idempotency-Key: fixed\n    key_args: [a]\n",
			want: []string{`tools.yaml:7: t.webhook.headers.Idempotency-Key: is set by the webhook itself (remove it)`},
		},
		{
			name: "EmptyValue",
			file: "tools:\n  t:\n    effect: noop\n    lease:\n    key_args: [a]\n",
			want: []string{`tools.yaml:4: t.lease: is empty, want a duration`},
		},
		{
			name: "NoopBadResult",
			file: "tools:\n  t:\n    effect: noop\n    noop:\n      result: {1: a}\n    key_args: [a]\n",
			want: []string{`tools.yaml:5: t.noop.result: cannot be written as JSON`},
		},
		{
			name: "EmptyFile",
			file: "# nothing here\n",
			want: []string{`tools.yaml:1: the file is empty`},
		},
		{
			name: "NoTools",
			file: "tools: {}\n",
			want: []string{`tools.yaml:1: tools: is a mapping, want a mapping of tool names to tools`},
		},
		{
			name: "Syntax",
			file: "tools:\n  t:\n    url: a: b\n",
			want: []string{`tools.yaml:3: mapping values are not allowed in this context (check the indentation and quote values that hold ':' or '#')`},
		},
		{
			name: "TwoDocuments",
			file: "tools:\n  t:\n    effect: noop\n---\ntools: {}\n",
			want: []string{`tools.yaml:4: more than one YAML document (remove the '---' separator`},
		},
		{
			name: "MultipleCollected",
			file: "tools:\n  a:\n    effect: noop\n    lease: 10\n    key_args: [a]\n  b:\n    effect: webhook\n    webhook:\n      url: http://h/x\n      timeout: 10\n      retries: 3\n    key_args: [a]\n",
			want: []string{
				`tools.yaml:4: a.lease: "10" is not a duration (write e.g. 30s)`,
				`tools.yaml:10: b.webhook.timeout: "10" is not a duration (write e.g. 10s)`,
				`tools.yaml:11: b.webhook.retries: unknown field (did you mean retry?)`,
			},
		},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			r, err := toolsfile.Parse([]byte(tc.file))
			require.Nil(t, r)
			require.ErrorIs(t, err, toolsfile.ErrConfig)
			lines := strings.Split(err.Error(), "\n")
			require.Len(t, lines, len(tc.want), "errors: %v", err)
			for i, want := range tc.want {
				require.True(t, strings.HasPrefix(lines[i], want), "error %d:\n got  %s\n want %s...", i, lines[i], want)
			}
			var ce *toolsfile.ConfigError
			require.True(t, errors.As(err, &ce))
			require.Equal(t, "tools.yaml", ce.File)
		})
	}
}

func TestLoadFile(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	path := filepath.Join(dir, "tools.yaml")
	require.NoError(t, os.WriteFile(path, []byte(goodTools), 0o600))
	r, err := toolsfile.LoadFile(path)
	require.NoError(t, err)
	t.Cleanup(func() { _ = r.Close() })
	require.Len(t, r.Names(), 4)

	bad := filepath.Join(dir, "bad.yaml")
	require.NoError(t, os.WriteFile(bad, []byte("tools:\n  t:\n    effect: noop\n    lease: 10\n    key_args: [a]\n"), 0o600))
	_, err = toolsfile.LoadFile(bad)
	require.ErrorContains(t, err, bad+":4: t.lease:")

	_, err = toolsfile.LoadFile(filepath.Join(dir, "missing.yaml"))
	require.ErrorIs(t, err, os.ErrNotExist)
	require.NotErrorIs(t, err, toolsfile.ErrConfig)
}
