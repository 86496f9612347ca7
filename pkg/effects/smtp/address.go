package smtp

import (
	"fmt"
	"net/netip"
	"strings"
)

// RFC 5321 limits (section 4.5.3.1).
const (
	maxLocalPart = 64
	maxDomain    = 255
	maxPath      = 254 // 256 octets of a path, less its angle brackets
)

// envelopeProblem says why addr (an address as net/mail parsed it, quotes
// removed) cannot be written in an SMTP envelope as MAIL FROM:<addr> or
// RCPT TO:<addr>, or "" when it can. The effect accepts only what RFC 5321
// section 4.1.2 calls a Mailbox with a Dot-string local part: a quoted local
// part would have to be quoted again on the wire, and written unquoted its
// spaces, '<' and '>' would let an address smuggle another recipient or ESMTP
// parameters ("a@evil.example> NOTIFY=..."@good.example) past a header that
// shows only good.example.
func envelopeProblem(addr string) string {
	at := strings.LastIndexByte(addr, '@')
	if at < 0 {
		return "it has no @domain"
	}
	local, domain := addr[:at], addr[at+1:]
	switch {
	case len(addr) > maxPath:
		return fmt.Sprintf("it is %d bytes, over the %d an SMTP path allows", len(addr), maxPath)
	case local == "" || len(local) > maxLocalPart:
		return fmt.Sprintf("its local part must be 1 to %d bytes", maxLocalPart)
	case !dotString(local):
		return "its local part is not a plain dot-atom (letters, digits, !#$%&'*+-/=?^_`{|}~ and single dots between them): quoted local parts, spaces, '<', '>', '@' and control characters cannot be sent"
	}
	if strings.HasPrefix(domain, "[") && strings.HasSuffix(domain, "]") {
		lit := domain[1 : len(domain)-1]
		if v6, ok := strings.CutPrefix(lit, "IPv6:"); ok {
			if a, err := netip.ParseAddr(v6); err == nil && a.Is6() && !a.Is4In6() && a.Zone() == "" {
				return ""
			}
		} else if a, err := netip.ParseAddr(lit); err == nil && a.Is4() {
			return ""
		}
		return "its address literal is not [IPv4] or [IPv6:address]"
	}
	if !mailDomain(domain) {
		return "its domain is not a host name (letters, digits and '-' in dot-separated labels)"
	}
	return ""
}

// dotString reports whether s is an RFC 5321 Dot-string: atoms of atext
// joined by single dots.
func dotString(s string) bool {
	for _, atom := range strings.Split(s, ".") {
		if atom == "" {
			return false
		}
		for i := 0; i < len(atom); i++ {
			if !atext(atom[i]) {
				return false
			}
		}
	}
	return true
}

// atext is RFC 5322's atext, in ASCII.
func atext(c byte) bool {
	return c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' || strings.IndexByte("!#$%&'*+-/=?^_`{|}~", c) >= 0
}

// mailDomain reports whether s is an RFC 5321 Domain: dot-separated labels
// of letters, digits and '-', each 1 to 63 bytes, starting and ending with
// a letter or digit.
func mailDomain(s string) bool {
	if s == "" || len(s) > maxDomain {
		return false
	}
	for _, label := range strings.Split(s, ".") {
		if label == "" || len(label) > 63 || label[0] == '-' || label[len(label)-1] == '-' {
			return false
		}
		for i := 0; i < len(label); i++ {
			c := label[i]
			if !(c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' || c == '-') {
				return false
			}
		}
	}
	return true
}
