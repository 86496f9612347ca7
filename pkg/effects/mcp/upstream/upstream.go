// Package upstream names an upstream MCP server — a command or a URL, as a
// tools file or a command line gives it — and writes the name the tool
// catalogue shows, without what may be a secret. The mcp effect
// (pkg/effects/mcp) calls the server's tools; the MCP front door's proxy
// mode names the server it stands in front of the same way.
package upstream

import (
	"errors"
	"fmt"
	"net/netip"
	"net/url"
	"strings"

	"github.com/idemgate/idemgate/pkg/effects/internal/text"
)

// Server names an MCP server: a command run with its stdin and stdout
// as the stdio transport, or the URL of a streamable HTTP endpoint. Exactly
// one is set.
type Server struct {
	// Command is the program and its arguments.
	Command []string
	// URL is an http or https URL. Its connections go only to public
	// addresses and those in AllowPrivate (see netguard.Guard), checked when each
	// is dialled, as a webhook's are.
	URL string
	// AllowPrivate lists the addresses outside the public internet a URL
	// upstream may be reached at: loopback, private, link-local and the
	// other ranges a netguard.Guard refuses by default. Default none. Only with
	// URL.
	AllowPrivate []netip.Prefix
}

// String names the upstream without what may be a secret: a URL without its
// user, password, query and fragment (https://mcp.example.com/mcp), or a
// command's program and the count of its arguments (npx [2 arguments not
// shown]). A URL upstream's credential can only go in its URL, and a
// command's in its arguments (--api-key ...). It is the upstream's name in
// the catalogue, which every agent reads, and in every message and log.
func (u Server) String() string {
	switch {
	case u.URL != "":
		return text.URL(u.URL)
	case len(u.Command) == 0:
		return ""
	case len(u.Command) == 1:
		return u.Command[0]
	case len(u.Command) == 2:
		return u.Command[0] + " [1 argument not shown]"
	}
	return fmt.Sprintf("%s [%d arguments not shown]", u.Command[0], len(u.Command)-1)
}

// Validate reports what is wrong with u.
func (u Server) Validate() error {
	switch {
	case len(u.Command) > 0 && u.URL != "":
		return errors.New("give a command or a url, not both")
	case u.URL != "":
		p, err := url.Parse(u.URL)
		if err != nil || (p.Scheme != "http" && p.Scheme != "https") || p.Host == "" {
			return fmt.Errorf("url %s is not an http or https URL with a host", text.URL(u.URL))
		}
	case len(u.Command) == 0 || u.Command[0] == "":
		return errors.New("give the server's command (a list: program, then arguments) or its url")
	case len(u.AllowPrivate) > 0:
		return errors.New("allow_private applies only to a url upstream: a command runs on the worker's host")
	}
	return nil
}

// Parse reads an upstream given on a command line: a URL when it starts
// with http:// or https://, else a command split on spaces.
func Parse(s string) (Server, error) {
	s = strings.TrimSpace(s)
	u := Server{Command: strings.Fields(s)}
	if strings.HasPrefix(s, "http://") || strings.HasPrefix(s, "https://") {
		u = Server{URL: s}
	}
	return u, u.Validate()
}
