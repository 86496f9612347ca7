package mcp

import (
	"errors"
	"fmt"
	"net/url"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/idemgate/idemgate/pkg/effects/mcp/upstream"
)

// An error quoting the URL as the HTTP client does (password as ***) names
// it as the catalogue does.
func TestMCPConnHidesTheURLAsQuoted(t *testing.T) {
	t.Parallel()
	c := NewConn(upstream.Server{URL: "http://agent-user:pw-s3cret@127.0.0.1:9/mcp?token=tok-s3cret"}, nil)
	err := c.hide(fmt.Errorf("connect: %w", &url.Error{Op: "Post", URL: "http://agent-user:***@127.0.0.1:9/mcp?token=tok-s3cret", Err: errors.New("connection refused")}))
	require.EqualError(t, err, `connect: Post "http://127.0.0.1:9/mcp": connection refused`)
	var ue *url.Error
	require.ErrorAs(t, err, &ue, "the chain is kept")
}
