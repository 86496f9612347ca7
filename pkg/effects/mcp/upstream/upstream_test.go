package upstream_test

import (
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/idemgate/idemgate/pkg/effects/mcp/upstream"
)

// What may be a secret of an upstream — a URL's user, password, query and
// fragment, a command's arguments — is in no name the catalogue shows.
func TestServerStringHidesSecrets(t *testing.T) {
	t.Parallel()
	require.Equal(t, "npx [3 arguments not shown]", upstream.Server{Command: []string{"npx", "srv", "--api-key", "k-s3cret"}}.String())
	require.Equal(t, "srv [1 argument not shown]", upstream.Server{Command: []string{"srv", "k-s3cret"}}.String())
	require.Equal(t, "srv", upstream.Server{Command: []string{"srv"}}.String())
	require.Equal(t, "https://mcp.example.com/v1/mcp", upstream.Server{URL: "https://agent:pw-s3cret@mcp.example.com/v1/mcp?token=tok-s3cret#frag-s3cret"}.String())
}
