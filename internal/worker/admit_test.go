package worker

import (
	"encoding/json"
	"testing"
	"unsafe"

	"github.com/stretchr/testify/require"

	"github.com/idemgate/idemgate/pkg/intent"
)

// TestShareArgs: canonical args sent verbatim are kept once, inside the
// message's bytes, and an append to them copies; args sent otherwise keep
// their canonical copy.
func TestShareArgs(t *testing.T) {
	t.Parallel()
	data := []byte(`{"tool":"t","args":{"a":1,"b":"x"}}`)
	env := &intent.Envelope{Args: json.RawMessage(`{"a":1,"b":"x"}`)}
	shareArgs(env, data)
	require.Equal(t, `{"a":1,"b":"x"}`, string(env.Args))
	start := uintptr(unsafe.Pointer(&data[0]))
	at := uintptr(unsafe.Pointer(&env.Args[0]))
	require.True(t, at >= start && at < start+uintptr(len(data)), "the args are not shared with the message")
	require.Equal(t, len(env.Args), cap(env.Args))
	_ = append(env.Args, '!')
	require.Equal(t, `{"tool":"t","args":{"a":1,"b":"x"}}`, string(data))

	canonical := json.RawMessage(`{"a":1,"b":"x"}`)
	env = &intent.Envelope{Args: canonical}
	shareArgs(env, []byte(`{"tool":"t","args":{"b":"x", "a":1}}`))
	require.Equal(t, &canonical[0], &env.Args[0])
}
