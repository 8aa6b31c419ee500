package config

import "fmt"

// Transport security modes (tls.mode).
const (
	// TLSModeMutual: the cluster port, the edge's HTTP listener, the hops
	// to workers and the embedded NATS server run over TLS with
	// certificates from one CA; peers must present one.
	TLSModeMutual = "mutual"
	// TLSModePlaintext: no TLS anywhere (the edge logs a warning). The
	// internal key, the cluster key and the admin token still
	// authenticate, but anyone on the path reads and can replay traffic.
	TLSModePlaintext = "plaintext"
)

// HTTP listener modes (tls.http) and client authentication
// (tls.http_client_auth).
const (
	HTTPListenerTLS       = "tls"
	HTTPListenerPlaintext = "plaintext"
	ClientAuthNone        = "none"
	ClientAuthRequire     = "require"
)

// TLSConfig is the edge's tls section. See docs/security.md.
type TLSConfig struct {
	// Mode is mutual or plaintext. A configuration file without it runs
	// plaintext with a warning (configs written before the section
	// existed keep starting during an upgrade); DefaultConfig says
	// plaintext explicitly.
	Mode string `yaml:"mode"`
	// CAFile verifies every peer (edges, workers, NATS, clients that
	// present certificates); CertFile and KeyFile are this edge's
	// identity, presented on every link. Renewed files are picked up
	// without a restart.
	CAFile   string `yaml:"ca_file"`
	CertFile string `yaml:"cert_file"`
	KeyFile  string `yaml:"key_file"`
	// HTTP is the edge's own listener (public and admin API): tls (the
	// default in mutual mode) or plaintext, for an edge behind a gateway
	// that terminates TLS on the same host or pod network. The admin
	// token then crosses that network in the clear.
	HTTP string `yaml:"http"`
	// HTTPClientAuth: none (default) or require — clients of the HTTP
	// listener (gateway, operators, probes) must present a certificate
	// from the CA.
	HTTPClientAuth string `yaml:"http_client_auth"`
	// WorkerServerName, when set, is the name workers' certificates must
	// carry instead of their URL's host (workers advertising pod IPs
	// with a shared certificate).
	WorkerServerName string `yaml:"worker_server_name"`
}

// mutual reports whether the edge runs mutual TLS.
func (t TLSConfig) Mutual() bool { return t.Mode == TLSModeMutual }

// httpTLS reports whether the HTTP listener serves TLS.
func (t TLSConfig) HTTPTLS() bool {
	return t.Mutual() && (t.HTTP == "" || t.HTTP == HTTPListenerTLS)
}

// NATSTLSConfig is nats.tls: TLS toward an external NATS server.
type NATSTLSConfig struct {
	CAFile     string `yaml:"ca_file"`
	CertFile   string `yaml:"cert_file"`
	KeyFile    string `yaml:"key_file"`
	ServerName string `yaml:"server_name"`
}

func (n NATSTLSConfig) Set() bool { return n != NATSTLSConfig{} }

// NATSWorkerUser is one entry of nats.worker_users: a worker's account
// on the embedded NATS server (plaintext mode; with mutual TLS workers are
// identified by their certificates). Its user name is the instance id and
// it may publish only that instance's telemetry.
type NATSWorkerUser struct {
	Instance string `yaml:"instance"`
	Password string `yaml:"password"`
}

// validateTLS checks the tls section and the TLS-dependent parts of the
// others; errors name the key.
func (c *Config) validateTLS(bad func(key, format string, args ...any)) {
	t := c.TLS
	fileKeys := []struct{ key, path string }{{"tls.ca_file", t.CAFile}, {"tls.cert_file", t.CertFile}, {"tls.key_file", t.KeyFile}}
	switch t.Mode {
	case TLSModeMutual:
		// The files are read by New (errors name the key too), not here:
		// a configuration is checked where its certificates are not
		// mounted (CI, an operator's laptop).
		for _, f := range fileKeys {
			if f.path == "" {
				bad(f.key, "required with tls.mode: mutual")
			}
		}
	case "", TLSModePlaintext:
		for _, f := range fileKeys {
			if f.path != "" {
				bad(f.key, "set, but tls.mode is %q: certificates are used only with tls.mode: mutual", t.Mode)
			}
		}
		for _, k := range []struct{ key, v string }{{"tls.http", t.HTTP}, {"tls.http_client_auth", t.HTTPClientAuth}, {"tls.worker_server_name", t.WorkerServerName}} {
			if k.v != "" && !(k.key == "tls.http" && k.v == HTTPListenerPlaintext) && !(k.key == "tls.http_client_auth" && k.v == ClientAuthNone) {
				bad(k.key, "needs tls.mode: mutual")
			}
		}
	default:
		bad("tls.mode", "unknown value %q (allowed: mutual, plaintext)", t.Mode)
	}
	switch t.HTTP {
	case "", HTTPListenerTLS, HTTPListenerPlaintext:
	default:
		bad("tls.http", "unknown value %q (allowed: tls, plaintext)", t.HTTP)
	}
	switch t.HTTPClientAuth {
	case "", ClientAuthNone:
	case ClientAuthRequire:
		if t.HTTP == HTTPListenerPlaintext {
			bad("tls.http_client_auth", "require needs tls.http: tls")
		}
	default:
		bad("tls.http_client_auth", "unknown value %q (allowed: none, require)", t.HTTPClientAuth)
	}
	if t.Mutual() {
		// Hops carry prompts and signed hints: no plaintext hop when
		// the edge runs TLS.
		for _, fl := range []struct {
			key string
			s   *ServersConfig
		}{{"context_servers", &c.ContextServers}, {"generation_servers", &c.GenerationServers}} {
			for i, si := range fl.s.URLs {
				if len(si.URL) >= 7 && si.URL[:7] == "http://" {
					bad(fmt.Sprintf("%s.urls[%d]", fl.key, i), "%s is plaintext but tls.mode is mutual: workers are reached over TLS (https://)", si.URL)
				}
			}
		}
	}

	c.validateNATSTLS(bad)
}

// validateNATSTLS checks nats.tls (TLS toward an external server) and
// nats.worker_users (the embedded server's accounts).
func (c *Config) validateNATSTLS(bad func(key, format string, args ...any)) {
	n := c.NATS
	nt := n.TLS
	if nt.Set() {
		if !n.Enabled() {
			bad("nats.tls", "set without nats.urls or nats.embedded")
		}
		if n.Embedded {
			bad("nats.tls", "is for an external NATS server; the embedded server uses the tls section's files")
		}
		if (nt.CertFile == "") != (nt.KeyFile == "") {
			bad("nats.tls.cert_file", "cert_file and key_file go together")
		}
	}
	if len(n.WorkerUsers) > 0 {
		c.validateWorkerUsers(bad)
	}
}

// validateWorkerUsers checks nats.worker_users: the embedded server's
// per-worker accounts (plaintext mode only).
func (c *Config) validateWorkerUsers(bad func(key, format string, args ...any)) {
	n, t := c.NATS, c.TLS
	switch {
	case !n.Embedded:
		bad("nats.worker_users", "accounts of the embedded NATS server: set nats.embedded")
	case t.Mutual():
		bad("nats.worker_users", "not used with tls.mode: mutual (the embedded server identifies workers by their certificates)")
	case n.User == "":
		bad("nats.user", "required with nats.worker_users (the edge's own account; without it the server would accept anyone)")
	}
	seen := map[string]bool{}
	for i, u := range n.WorkerUsers {
		key := fmt.Sprintf("nats.worker_users[%d]", i)
		if !validInstanceName(u.Instance) {
			bad(key+".instance", "%q must be 1..128 characters of [A-Za-z0-9_-] (the worker's instance_id)", u.Instance)
		}
		if seen[u.Instance] || u.Instance == n.User {
			bad(key+".instance", "duplicate user %q", u.Instance)
		}
		seen[u.Instance] = true
		if len(u.Password) < MinSecretLen {
			bad(key+".password", "%d bytes is too short (want at least %d)", len(u.Password), MinSecretLen)
		}
	}
}

// ChecksWorkerIdentity: hops and probes to discovered workers must reach
// a server whose certificate names the instance (mutual TLS with a
// certificate per worker; tls.worker_server_name declares one shared by
// all workers, which names no instance).
func (t TLSConfig) ChecksWorkerIdentity() bool {
	return t.Mutual() && t.WorkerServerName == ""
}
