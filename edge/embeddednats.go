package edge

import (
	natsserver "github.com/nats-io/nats-server/v2/server"

	"github.com/tether-project/tether/edge/natsembed"
)

// embeddedNATSAuth sets the embedded server's authorization: certificate
// identities with mutual TLS; otherwise, with nats.worker_users, the
// edge's account (nats.user) plus one account per worker, each pinned to
// its instance; otherwise startNATS's single account (nats.user or
// nats.token, shared by everyone, unrestricted) or none.
func (e *Edge) embeddedNATSAuth(opts *natsserver.Options) {
	n := e.cfg.NATS
	switch {
	case e.tls.natsServer != nil:
		opts.TLSConfig = e.tls.natsServer
		opts.TLSVerify = true
		opts.TLSTimeout = 5
		opts.CustomClientAuthentication = natsembed.CertAuth{Logger: e.log}
	case len(n.WorkerUsers) > 0:
		opts.Username, opts.Password, opts.Authorization = "", "", ""
		opts.Users = []*natsserver.User{{Username: n.User, Password: n.Password, Permissions: natsembed.EdgePermissions()}}
		for _, w := range n.WorkerUsers {
			opts.Users = append(opts.Users, &natsserver.User{Username: w.Instance, Password: w.Password, Permissions: natsembed.WorkerPermissions(w.Instance)})
		}
	}
}
