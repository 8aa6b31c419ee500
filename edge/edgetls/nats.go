package edgetls

import (
	"log/slog"

	natsserver "github.com/nats-io/nats-server/v2/server"

	"github.com/tether-project/tether/edge/config"
	"github.com/tether-project/tether/edge/natsembed"
)

// NATSServerAuth sets the embedded NATS server's authorization (n is the
// edge's nats section): certificate identities with mutual TLS; otherwise,
// with nats.worker_users, the edge's account (nats.user) plus one account
// per worker, each pinned to its instance; otherwise the single account
// opts already holds (nats.user or nats.token, shared by everyone,
// unrestricted) or none.
func (t *TLS) NATSServerAuth(opts *natsserver.Options, n config.NATSConfig, log *slog.Logger) {
	switch {
	case t.natsServer != nil:
		opts.TLSConfig = t.natsServer
		opts.TLSVerify = true
		opts.TLSTimeout = 5
		opts.CustomClientAuthentication = natsembed.CertAuth{Logger: log}
	case len(n.WorkerUsers) > 0:
		opts.Username, opts.Password, opts.Authorization = "", "", ""
		opts.Users = []*natsserver.User{{Username: n.User, Password: n.Password, Permissions: natsembed.EdgePermissions()}}
		for _, w := range n.WorkerUsers {
			opts.Users = append(opts.Users, &natsserver.User{Username: w.Instance, Password: w.Password, Permissions: natsembed.WorkerPermissions(w.Instance)})
		}
	}
}
