// Package httpdoor is what idemgate's two HTTP front doors, the HTTP API
// (internal/httpapi) and the MCP server's streamable HTTP transport
// (internal/mcpgate), do alike, so that each fault gets one answer from
// both: the bearer token of a request (401 with an RFC 6750 challenge for
// a missing, malformed or unknown token, 403 for a token not allowed the
// request), its body read within a size limit (413) and a deadline (408),
// the RFC 9457 problem form both answer in (with the codes and titles they
// share: rate_limited, no_route, unavailable too), and serving an
// http.Server until its context ends, then draining the requests in
// progress.
package httpdoor
