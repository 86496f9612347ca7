package toolsfile_test

import (
	"strings"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/idemgate/idemgate/pkg/effects/toolsfile"
)

// An unsafe tool whose key a model can choose — keyed by all its args, with
// no schema or one that takes args it does not declare — stops the file
// from loading, with the tool, the file, the line and every way out.
func TestUnsafeToolNeedsAnIdentity(t *testing.T) {
	t.Parallel()
	_, err := toolsfile.Parse([]byte(`tools:
  create_ticket:
    effect: noop
    volatile_args: [requested_at]
  send_email:
    effect: noop
    schema:
      type: object
      properties: {to: {type: string}, subject: {type: string}}
      required: [to, subject]
`), toolsfile.WithFilename("conf/tools.yaml"))
	require.ErrorIs(t, err, toolsfile.ErrConfig)
	lines := strings.Split(err.Error(), "\n")
	require.Len(t, lines, 2, err.Error())
	require.True(t, strings.HasPrefix(lines[0], "conf/tools.yaml:2: create_ticket: an unsafe tool keyed by all its args, with no schema: "+
		"an arg a model invents (a request id, a uuid) makes each retry another operation, which fires again"), lines[0])
	require.True(t, strings.HasPrefix(lines[1], "conf/tools.yaml:5: send_email: an unsafe tool keyed by all its args, whose schema allows args it does not declare"), lines[1])
	for _, fix := range []string{"key_args: [", "additionalProperties: false", "key_args: all", "class: read or idempotent"} {
		require.Contains(t, lines[0], fix)
	}
	require.Contains(t, lines[1], "key_args: [to, subject]", "the schema's required args are suggested")

	// Each way out loads.
	for name, tool := range map[string]string{
		"key_args":                    "{effect: noop, key_args: [to]}",
		"key_args: all":               "{effect: noop, key_args: all}",
		"closed schema":               "{effect: noop, schema: {type: object, properties: {to: {type: string}}, additionalProperties: false}}",
		"unevaluatedProperties":       "{effect: noop, schema: {type: object, properties: {to: {}}, unevaluatedProperties: false}}",
		"idempotent":                  "{effect: noop, class: idempotent}",
		"read":                        "{effect: noop, class: read}",
		"closed schema and key_args":  "{effect: noop, key_args: [to], schema: {type: object, properties: {to: {}}, additionalProperties: false}}",
		"key_args: all, volatile arg": "{effect: noop, key_args: all, volatile_args: [requested_at]}",
	} {
		r, err := toolsfile.Parse([]byte("tools:\n  t: " + tool + "\n"))
		require.NoError(t, err, name)
		require.NoError(t, r.Close())
	}
	all, err := toolsfile.Parse([]byte("tools:\n  t: {effect: noop, key_args: all, volatile_args: [requested_at]}\n"))
	require.NoError(t, err)
	tool, _ := all.Lookup("t")
	require.Empty(t, tool.KeySpec.KeyArgs, "all is the default spelled out: every arg enters the key")
	require.Equal(t, []string{"requested_at"}, tool.KeySpec.VolatileArgs)

	// Schemas that still take an arg they do not declare, and key_args
	// that are neither a list nor all.
	for _, c := range []struct{ tool, want string }{
		{"{effect: noop, schema: {type: object, properties: {to: {}}, additionalProperties: true}}", "whose schema allows args it does not declare"},
		{"{effect: noop, schema: {type: object, properties: {to: {}}, patternProperties: {'.*': {}}, additionalProperties: false}}", "whose schema allows args it does not declare"},
		{"{effect: noop, schema: {type: object, properties: {to: {}}, additionalProperties: {type: string}}}", "whose schema allows args it does not declare"},
		{"{effect: noop, key_args: every}", `tools.yaml:2: t.key_args: "every" is neither a list of argument names nor all`},
		{"{effect: noop, key_args: []}", "tools.yaml:2: t.key_args: is an empty list"},
		{"{effect: noop, class: unsafe}", "tools.yaml:2: t: an unsafe tool keyed by all its args, with no schema"},
	} {
		_, err := toolsfile.Parse([]byte("tools:\n  t: " + c.tool + "\n"))
		require.ErrorContains(t, err, c.want, c.tool)
	}
}
