package netguard_test

import (
	"errors"
	"net/netip"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/idemgate/idemgate/pkg/effects/netguard"
)

func TestGuardRefusesNonPublicAddresses(t *testing.T) {
	t.Parallel()
	g := netguard.New()
	for _, tc := range []struct {
		addr, what string
	}{
		{"127.0.0.1", "loopback"},
		{"127.255.0.9", "loopback"},
		{"::1", "loopback"},
		{"::ffff:127.0.0.1", "loopback"},
		{"10.1.2.3", "private"},
		{"172.16.0.1", "private"},
		{"172.31.255.255", "private"},
		{"192.168.1.1", "private"},
		{"fd00:ec2::254", "private"},
		{"169.254.169.254", "link-local"},
		{"::ffff:169.254.169.254", "link-local"},
		{"fe80::1", "link-local"},
		{"0.0.0.0", "unspecified"},
		{"::", "unspecified"},
		{"0.1.2.3", "this-network"},
		{"224.0.0.1", "multicast"},
		{"239.1.1.1", "multicast"},
		{"ff02::1", "multicast"},
		{"100.64.0.1", "shared address space (CGNAT)"},
		{"100.100.100.200", "shared address space (CGNAT)"},
		{"192.0.0.192", "IETF protocol assignments"},
		{"255.255.255.255", "reserved or broadcast"},
		{"64:ff9b::a00:1", "NAT64 (reaches IPv4 addresses)"},
		{"64:ff9b::808:808", "NAT64 (reaches IPv4 addresses)"},
		{"64:ff9b:1::7f00:1", "local NAT64"},
		{"fec0::1", "site-local"},
		{"::7f00:1", "IPv4-compatible (reaches IPv4 addresses)"},
		{"::a9fe:a9fe", "IPv4-compatible (reaches IPv4 addresses)"},
		{"::ffff:0:7f00:1", "IPv4-translated, SIIT (reaches IPv4 addresses)"},
		{"::ffff:0:a9fe:a9fe", "IPv4-translated, SIIT (reaches IPv4 addresses)"},
		{"2002:7f00:1::1", "6to4 (reaches IPv4 addresses)"},
		{"2002:a9fe:a9fe::", "6to4 (reaches IPv4 addresses)"},
		{"2001:0:4136:e378:8000:63bf:80ff:fffe", "Teredo (reaches IPv4 addresses)"},
		{"100::1", "discard-only"},
		{"192.88.99.1", "6to4 relay anycast (reaches IPv6 through IPv4)"},
	} {
		err := g.Check(netip.MustParseAddr(tc.addr))
		require.ErrorIs(t, err, netguard.ErrForbidden, tc.addr)
		var de *netguard.DestinationError
		require.True(t, errors.As(err, &de), tc.addr)
		require.Equal(t, tc.what, de.What, tc.addr)
	}
	for _, ok := range []string{"93.184.215.14", "8.8.8.8", "172.32.0.1", "100.128.0.1", "2606:4700::1111", "::ffff:8.8.8.8",
		"2001:4860:4860::8888" /* not Teredo: 2001:0::/32 only */, "2003::1", "192.88.100.1"} {
		require.NoError(t, g.Check(netip.MustParseAddr(ok)), ok)
	}
}

func TestGuardAllowlist(t *testing.T) {
	t.Parallel()
	allow, err := netguard.ParsePrefixes([]string{" 127.0.0.1 ", "10.0.0.0/8", "", "fd00::/8"})
	require.NoError(t, err)
	g := netguard.New(allow...)
	for _, ok := range []string{"127.0.0.1", "::ffff:127.0.0.1", "10.200.3.4", "fd12::1"} {
		require.NoError(t, g.Check(netip.MustParseAddr(ok)), ok)
	}
	for _, no := range []string{"127.0.0.2", "192.168.0.1", "169.254.169.254", "fc00::1"} {
		require.ErrorIs(t, g.Check(netip.MustParseAddr(no)), netguard.ErrForbidden, no)
	}
	// Control sees the dialled ip:port.
	require.NoError(t, g.Control("tcp4", "10.0.0.1:443", nil))
	require.ErrorIs(t, g.Control("tcp6", "[fe80::1%eth0]:80", nil), netguard.ErrForbidden)
	require.ErrorIs(t, g.Control("tcp", "not-an-address", nil), netguard.ErrForbidden)

	_, err = netguard.ParsePrefixes([]string{"10.0.0.0/33", "localhost"})
	require.ErrorContains(t, err, `"10.0.0.0/33" is not a CIDR prefix`)
	require.ErrorContains(t, err, `"localhost" is not an IP address`)
}
