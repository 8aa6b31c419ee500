// Package natsembed is the NATS server tether runs in process: the edge's
// nats.embedded and tether dev's. It holds who may say what on it (edges
// read all telemetry, a worker publishes only its own) and starts it.
package natsembed

import (
	"log/slog"
	"strconv"
	"time"

	natsserver "github.com/nats-io/nats-server/v2/server"

	"github.com/tether-project/tether/cluster/pki"
	"github.com/tether-project/tether/internal/telemetry"
)

// Who may say what on an embedded NATS server (the edge's nats.embedded,
// and tether dev's). A worker may publish only its own instance's
// telemetry and answer dump requests addressed to it, so one compromised
// worker cannot register, report load or cache contents for another; the
// edges' decoders check the payload's instance against the subject as a
// second line (internal/telemetry DESIGN.md).

// EdgePermissions are an edge's: read every worker's telemetry, ask any
// worker for a KV dump and read the replies; and, for the trtllm-serve
// instances whose /kv_cache_events the leader edge drains, publish their KV
// batches and answer dump requests for them (edge/engineevents); publish and
// read the edges' placements, dispatches and flow control state.
func EdgePermissions() *natsserver.Permissions {
	return &natsserver.Permissions{
		Publish:   &natsserver.SubjectPermission{Allow: []string{telemetry.KVDumpSubject("*"), telemetry.KVSubject("*"), telemetry.PlacementSubjectAll, telemetry.DispatchSubjectAll, telemetry.FlowSubjectAll}},
		Subscribe: &natsserver.SubjectPermission{Allow: []string{"tether.v1.>", "_INBOX.>"}},
		Response:  &natsserver.ResponsePermission{MaxMsgs: maxDumpReplyParts, Expires: time.Minute},
	}
}

// maxDumpReplyParts bounds the reply messages a worker may send to one
// dump request (a dump is split to fit the server's max payload).
const maxDumpReplyParts = 1 << 16

// WorkerPermissions are worker instance's: publish its load reports
// (either fleet: the decoder checks the payload's fleet), KV events and
// evictions, receive dump requests for itself and reply to them (only to
// requests it received: no free publishing on inboxes).
func WorkerPermissions(instance string) *natsserver.Permissions {
	return &natsserver.Permissions{
		Publish: &natsserver.SubjectPermission{Allow: []string{
			telemetry.LoadSubject(telemetry.FleetContext, instance),
			telemetry.LoadSubject(telemetry.FleetGeneration, instance),
			telemetry.KVSubject(instance),
			telemetry.EvictSubject(instance),
		}},
		Subscribe: &natsserver.SubjectPermission{Allow: []string{telemetry.KVDumpSubject(instance)}},
		Response:  &natsserver.ResponsePermission{MaxMsgs: maxDumpReplyParts, Expires: time.Minute},
	}
}

// CertAuth authorizes clients of a NATS server that requires verified
// client certificates (mutual TLS) by the tether identity in the
// certificate (pki.IdentityOf): spiffe://tether/edge/<id> gets
// EdgePermissions, spiffe://tether/worker/<instance> gets
// WorkerPermissions(instance); anything else is refused. Set it as the
// server's CustomClientAuthentication, with a TLSConfig whose ClientAuth is
// tls.RequireAndVerifyClientCert (the chain is verified before Check).
type CertAuth struct {
	Logger *slog.Logger
}

// Check implements natsserver.Authentication.
func (a CertAuth) Check(c natsserver.ClientAuthentication) bool {
	log := a.Logger
	if log == nil {
		log = slog.Default()
	}
	cs := c.GetTLSConnectionState()
	if cs == nil || len(cs.PeerCertificates) == 0 {
		log.Warn("nats: refused a client without a verified certificate", "remote", remote(c))
		return false
	}
	leaf := cs.PeerCertificates[0]
	id, ok := pki.IdentityOf(leaf)
	if !ok {
		log.Warn("nats: refused a certificate without a tether identity (URI SAN spiffe://tether/<edge|worker>/<id>)",
			"remote", remote(c), "subject", leaf.Subject.String())
		return false
	}
	switch id.Role {
	case pki.RoleEdge:
		c.RegisterUser(&natsserver.User{Username: id.String(), Permissions: EdgePermissions()})
		return true
	case pki.RoleWorker:
		if err := telemetry.ValidInstanceID(id.ID); err != nil {
			log.Warn("nats: refused a worker certificate whose id is not an instance id", "remote", remote(c), "identity", id.String(), "err", err)
			return false
		}
		c.RegisterUser(&natsserver.User{Username: id.String(), Permissions: WorkerPermissions(id.ID)})
		return true
	}
	log.Warn("nats: refused a certificate whose role may not use telemetry", "remote", remote(c), "identity", id.String())
	return false
}

func remote(c natsserver.ClientAuthentication) string {
	if a := c.RemoteAddress(); a != nil {
		return a.String()
	}
	return "client " + strconv.FormatUint(c.GetID(), 10)
}
