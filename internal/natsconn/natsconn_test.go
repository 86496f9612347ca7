package natsconn_test

import (
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/idemgate/idemgate/internal/natsconn"
)

func TestClientAuthRejectsMixtures(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		auth natsconn.ClientAuth
		want string
	}{
		{natsconn.ClientAuth{Creds: "a.creds", User: "u", Password: "p"}, "choose one"},
		{natsconn.ClientAuth{Password: "p"}, "without a user"},
		{natsconn.ClientAuth{User: "u"}, "set " + natsconn.PasswordEnv},
		{natsconn.ClientAuth{TLSCert: "c.pem"}, "needs its key"},
	} {
		_, err := tc.auth.Options()
		require.ErrorContains(t, err, tc.want)
	}
	opts, err := natsconn.ClientAuth{}.Options()
	require.NoError(t, err)
	require.Empty(t, opts)
}
