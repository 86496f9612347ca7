package worker

import "github.com/idemgate/idemgate/pkg/effects/mcp"

// The catalogue names the upstream of a tool whose effect is the mcp kind's.
var _ upstreamEffect = (*mcp.Effect)(nil)
