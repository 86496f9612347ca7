// Package netguard decides which IP addresses an effect that takes a URL
// (a webhook, an mcp upstream given by url) may connect to: public
// addresses, and the private ones an allowlist names. The check is made
// when each connection is dialled, to the address the name resolved to.
package netguard

import (
	"errors"
	"fmt"
	"net"
	"net/http"
	"net/netip"
	"net/url"
	"strings"
	"syscall"
	"time"
)

// ErrForbidden is matched by errors.Is when an effect refused to connect to
// an address its Guard does not allow.
var ErrForbidden = errors.New("netguard: destination not allowed")

// blockedRange is an address range an effect may not reach unless allowed.
type blockedRange struct {
	prefix netip.Prefix
	what   string
}

// blockedRanges are refused by default, besides what netip.Addr classifies as
// loopback, private, link-local, multicast or unspecified. They are the ranges
// that reach the worker's own host, its network, or a cloud's metadata
// service rather than the public internet.
var blockedRanges = []blockedRange{
	{netip.MustParsePrefix("0.0.0.0/8"), "this-network"},
	{netip.MustParsePrefix("100.64.0.0/10"), "shared address space (CGNAT)"},
	{netip.MustParsePrefix("192.0.0.0/24"), "IETF protocol assignments"},
	{netip.MustParsePrefix("198.18.0.0/15"), "benchmarking"},
	{netip.MustParsePrefix("240.0.0.0/4"), "reserved or broadcast"},
	{netip.MustParsePrefix("168.63.129.16/32"), "cloud host endpoint"},
	{netip.MustParsePrefix("fec0::/10"), "site-local"},
	{netip.MustParsePrefix("192.88.99.0/24"), "6to4 relay anycast (reaches IPv6 through IPv4)"},
	{netip.MustParsePrefix("100::/64"), "discard-only"},
	// IPv6 forms that embed or relay to an IPv4 address: each would reach
	// an IPv4 host (a loopback or private one among them) without its
	// address ever being judged as IPv4. Refused whole; an allowlist entry
	// may let a known one through. (IPv4-mapped ::ffff:a.b.c.d is judged as
	// the IPv4 address it carries.)
	{netip.MustParsePrefix("::/96"), "IPv4-compatible (reaches IPv4 addresses)"},
	{netip.MustParsePrefix("::ffff:0:0:0/96"), "IPv4-translated, SIIT (reaches IPv4 addresses)"},
	{netip.MustParsePrefix("64:ff9b::/96"), "NAT64 (reaches IPv4 addresses)"},
	{netip.MustParsePrefix("64:ff9b:1::/48"), "local NAT64"},
	{netip.MustParsePrefix("2002::/16"), "6to4 (reaches IPv4 addresses)"},
	{netip.MustParsePrefix("2001::/32"), "Teredo (reaches IPv4 addresses)"},
}

// Guard decides which IP addresses an effect may open connections to.
// Public unicast addresses are allowed. Loopback (127.0.0.0/8, ::1), private
// (10.0.0.0/8, 172.16.0.0/12, 192.168.0.0/16, fc00::/7), link-local
// (169.254.0.0/16 with the cloud metadata services, fe80::/10), unspecified,
// multicast, shared (100.64.0.0/10, CGNAT) and the other ranges listed in
// docs/security.md are refused unless an allowed prefix contains them.
// IPv4-mapped IPv6 addresses are judged as the IPv4 address they carry.
//
// The guard is applied when a connection is dialled, to the address the
// name resolved to, so a name that resolves to a public address when it is
// configured and to a private one later (DNS rebinding) is still refused.
//
// The zero value and a nil *Guard allow nothing beyond public addresses.
type Guard struct {
	allow []netip.Prefix
}

// New returns a guard that also allows the addresses in allow.
func New(allow ...netip.Prefix) *Guard {
	g := &Guard{}
	for _, p := range allow {
		g.allow = append(g.allow, p.Masked())
	}
	return g
}

// Check returns nil when the guard allows a connection to ip, and otherwise a
// *DestinationError (matching ErrForbidden) saying why not.
func (g *Guard) Check(ip netip.Addr) error {
	ip = ip.Unmap().WithZone("")
	what := restricted(ip)
	if what == "" {
		return nil
	}
	if g != nil {
		for _, p := range g.allow {
			if p.Contains(ip) {
				return nil
			}
		}
	}
	return &DestinationError{Addr: ip, What: what}
}

// Control is a net.Dialer Control function: it refuses the connection
// before it is made when the guard does not allow the dialled address.
func (g *Guard) Control(network, address string, _ syscall.RawConn) error {
	ap, err := netip.ParseAddrPort(address)
	if err != nil {
		// Only IP networks reach here; an unparsable address is refused.
		return fmt.Errorf("%w: %s address %q", ErrForbidden, network, address)
	}
	return g.Check(ap.Addr())
}

// DestinationError is a refused connection: the address and the range it
// falls in.
type DestinationError struct {
	Addr netip.Addr // the address dialled
	What string     // its range: "loopback", "private", ...
}

// Error names the address and its range.
func (e *DestinationError) Error() string {
	return fmt.Sprintf("address %s is %s and not allowed", e.Addr, e.What)
}

// Is reports whether target is ErrForbidden.
func (e *DestinationError) Is(target error) bool { return target == ErrForbidden }

// restricted names the range ip falls in when it is refused by default, and
// returns "" for an address that is public.
func restricted(ip netip.Addr) string {
	switch {
	case !ip.IsValid():
		return "invalid"
	case ip.IsUnspecified():
		return "unspecified"
	case ip.IsLoopback():
		return "loopback"
	case ip.IsPrivate():
		return "private"
	case ip.IsLinkLocalUnicast():
		return "link-local"
	case ip.IsMulticast(), ip.IsLinkLocalMulticast(), ip.IsInterfaceLocalMulticast():
		return "multicast"
	}
	for _, r := range blockedRanges {
		if r.prefix.Contains(ip) {
			return r.what
		}
	}
	return ""
}

// ParsePrefixes reads an allowlist: CIDR prefixes ("10.0.0.0/8", "fd00::/8")
// or single addresses ("127.0.0.1", taken as /32 or /128). Entries may be
// surrounded by spaces; empty entries are skipped.
func ParsePrefixes(list []string) ([]netip.Prefix, error) {
	var out []netip.Prefix
	var errs []error
	for _, s := range list {
		s = strings.TrimSpace(s)
		if s == "" {
			continue
		}
		p, err := ParsePrefix(s)
		if err != nil {
			errs = append(errs, err)
			continue
		}
		out = append(out, p)
	}
	return out, errors.Join(errs...)
}

// ParsePrefix reads one allowlist entry: a CIDR prefix or a single address.
func ParsePrefix(s string) (netip.Prefix, error) {
	if strings.Contains(s, "/") {
		p, err := netip.ParsePrefix(s)
		if err != nil {
			return netip.Prefix{}, fmt.Errorf("%q is not a CIDR prefix (write e.g. 10.0.0.0/8 or 127.0.0.1/32)", s)
		}
		return p.Masked(), nil
	}
	a, err := netip.ParseAddr(s)
	if err != nil || a.Zone() != "" {
		return netip.Prefix{}, fmt.Errorf("%q is not an IP address or CIDR prefix (write e.g. 10.0.0.0/8 or 127.0.0.1/32)", s)
	}
	a = a.Unmap()
	return netip.PrefixFrom(a, a.BitLen()), nil
}

// checkLiteralHost applies the guard to a URL host that is an IP literal.
// It is used where the dialled address is not the destination (a proxy).
func (g *Guard) checkLiteralHost(host string) error {
	h, _, err := net.SplitHostPort(host)
	if err != nil {
		h = host
	}
	h = strings.TrimSuffix(strings.TrimPrefix(h, "["), "]")
	ip, err := netip.ParseAddr(h)
	if err != nil {
		return nil // a name: the proxy resolves it
	}
	return g.Check(ip)
}

// Transport returns an HTTP transport every connection of which the guard
// admits; timeout bounds a dial (at most 30s) and a TLS handshake (at most
// 10s). Through a proxy the dialled address is the proxy's: the guard checks
// it (a private proxy must be allowed) and an IP-literal destination; a
// destination name is resolved by the proxy, whose egress policy then
// applies.
func (g *Guard) Transport(timeout time.Duration) *http.Transport {
	dialer := &net.Dialer{Timeout: min(timeout, 30*time.Second), KeepAlive: 30 * time.Second, Control: g.Control}
	return &http.Transport{
		Proxy: func(r *http.Request) (*url.URL, error) {
			p, err := http.ProxyFromEnvironment(r)
			if p == nil || err != nil {
				return p, err
			}
			if err := g.checkLiteralHost(r.URL.Host); err != nil {
				return nil, err
			}
			return p, nil
		},
		DialContext:           dialer.DialContext,
		ForceAttemptHTTP2:     true,
		MaxIdleConns:          64,
		MaxIdleConnsPerHost:   16,
		IdleConnTimeout:       90 * time.Second,
		TLSHandshakeTimeout:   min(timeout, 10*time.Second),
		ExpectContinueTimeout: time.Second,
	}
}
