// Package console is idemgate's operator console: HTML pages on the
// operator API's calls, for the work that needs a person (docs/console.md).
// The HTTP front door (internal/httpapi) mounts it under Path, with the
// same tokens, roles and namespaces: an operator logs in by pasting an
// operator token, and every page and action then runs as that token,
// through the same pkg/client calls the JSON routes make, within the
// token's limits (Config.Limiter).
//
// A session lives in the front door's memory, named by an HttpOnly,
// SameSite=Strict cookie; every page carries a strict Content-Security-
// Policy and every form the session's CSRF token. The templates and
// assets are embedded.
package console
