package cluster

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/tether-project/tether/cluster/transport"
	"github.com/tether-project/tether/fsm"
)

// Config configures a Node: the Settings an operator writes, the tuning
// below them and the runtime dependencies. Zero values take the defaults
// (WithDefaults); ValidateConfig checks the result, and Open does both.
type Config struct {
	Settings `yaml:",inline"`

	// AuthKey authenticates forwarding, join and admin RPCs between nodes
	// (required, at least 16 bytes, the same on every node).
	AuthKey []byte `yaml:"-"`
	// TLS, when set, wraps all inter-node traffic: it is used as the server
	// config for accepted connections and (cloned, ServerName defaulting to
	// the dialed host) as the client config. For mutual TLS set
	// Certificates, RootCAs, ClientCAs and ClientAuth =
	// tls.RequireAndVerifyClientCert.
	TLS *tls.Config `yaml:"-"`
	// MaxBatch is the most proposals per log entry (default 512, at most
	// fsm.MaxEntryProposals).
	MaxBatch int `yaml:"-"`
	// Snapshot policy (hashicorp/raft semantics); zero takes raft's
	// defaults (8192 entries, 120s, 10240 trailing logs).
	SnapshotThreshold uint64        `yaml:"-"`
	SnapshotInterval  time.Duration `yaml:"-"`
	TrailingLogs      uint64        `yaml:"-"`
	// HashHistory is how many recent command entries' state hashes the node
	// keeps for HashAt (default 65,536: 2.5 MiB).
	HashHistory int `yaml:"-"`
	// Version is this node's release, reported in Status.
	Version string `yaml:"-"`
	// Listener, when set, is used instead of listening on BindAddr (tests
	// wrap it for fault injection). Open takes ownership.
	Listener net.Listener `yaml:"-"`
	// Dial, when set, opens inter-node connections (tests wrap it).
	Dial func(ctx context.Context, addr string) (net.Conn, error) `yaml:"-"`
	// Registerer receives tether_cluster_* metrics when set.
	Registerer prometheus.Registerer `yaml:"-"`
	Logger     *slog.Logger          `yaml:"-"`
}

// Settings are a node's configuration as an operator writes it (the
// edge's cluster section inlines them: the yaml tags are its keys, and
// ValidateConfig's errors name them).
type Settings struct {
	// NodeID is stable and unique across the cluster's lifetime (a removed
	// node re-joins under a new id).
	NodeID string `yaml:"node_id"`
	// DataDir holds raft.db (raft-boltdb/v2: log and stable store),
	// snapshots/, archive.db and, after a removal, the REMOVED tombstone.
	DataDir string `yaml:"data_dir"`
	// BindAddr is the TCP listen address for Raft and forwarding (one
	// multiplexed port), e.g. "127.0.0.1:0". Ignored when Listener is set.
	BindAddr string `yaml:"bind_addr"`
	// AdvertiseAddr is the address peers dial; defaults to the bound address
	// (required when binding an unspecified IP such as 0.0.0.0).
	AdvertiseAddr string `yaml:"advertise_addr"`
	// Bootstrap starts a new cluster with Peers as the initial voters, only
	// if DataDir holds no Raft state (otherwise it is ignored).
	Bootstrap bool `yaml:"bootstrap"`
	// Peers are the initial voters for Bootstrap, including this node.
	Peers []Peer `yaml:"peers"`
	// Join lists addresses of existing members (any member: a follower
	// forwards to the leader) to ask to add this node (used when DataDir
	// holds no Raft state). Open returns once the addition committed.
	Join []string `yaml:"join"`
	// Suffrage is how this node asks to join: SuffrageVoter (default) joins
	// as a voter while the cluster has fewer than Autopilot.Voters voters
	// and as a non-voter otherwise; SuffrageNonvoter always joins as a
	// non-voter (it replicates and applies the log, serves reads from its
	// state and forwards proposals, but does not vote). Autopilot may
	// promote either kind to replace a failed voter.
	Suffrage Suffrage `yaml:"suffrage"`
	// Autopilot manages the membership from the leader (raft-autopilot).
	Autopilot AutopilotConfig `yaml:"autopilot"`
	// ProposeTimeout bounds a proposal (default: Raft.ElectionTimeout):
	// without a leader or quorum Propose fails with ErrUnavailable within
	// it. A proposal from a follower takes a forwarding round trip, the
	// leader's disk write, a replication round trip with the follower's
	// disk write, the commit notice and the local apply; on a loaded
	// 2-core machine a disk write alone can take 5–50 ms, and failing
	// sooner than an election timeout gains nothing: until then the
	// cluster cannot even tell that its leader is gone.
	ProposeTimeout time.Duration `yaml:"propose_timeout"`
	// Raft timing; zero fields take LAN defaults.
	Raft RaftTiming `yaml:"raft"`
	// Archive retention.
	Archive ArchiveOptions `yaml:",inline"`
	// FeatureLevel is the highest fsm feature level this node supports
	// (default and maximum fsm.FeatureLevelMax). It caps the state machine
	// (fsm.Options.MaxFeatureLevel): a node configured at level N halts, with
	// the upgrade message, on a committed event or cluster level above N,
	// as the release that understood only N would (a rolling upgrade runs
	// a new build as the previous release this way). Reported in Status.
	FeatureLevel uint32 `yaml:"compat_feature_level"`
}

// Suffrage is a node's configured role in the Raft group.
type Suffrage string

const (
	SuffrageVoter    Suffrage = "voter"
	SuffrageNonvoter Suffrage = "nonvoter"
)

// AutopilotConfig tunes the leader's membership management
// (github.com/hashicorp/raft-autopilot; see DESIGN.md "Autopilot").
type AutopilotConfig struct {
	// Voters is the number of voters autopilot keeps (default 3, at most
	// 9): a healthy non-voter is promoted only while fewer healthy voters
	// than this exist, and a failed voter beyond it is demoted.
	Voters int `yaml:"voters"`
	// StabilizationTime is how long a non-voter must have been healthy
	// before it may be promoted (default 10s).
	StabilizationTime time.Duration `yaml:"stabilization_time"`
	// DeadServerTimeout is how long a member may stay unreachable before
	// autopilot removes it from the configuration (default 10m; negative:
	// never remove).
	DeadServerTimeout time.Duration `yaml:"dead_server_timeout"`
	// LastContactThreshold: a member whose last contact with the leader
	// is older than this is unhealthy (default 2 × Raft.HeartbeatTimeout).
	LastContactThreshold time.Duration `yaml:"last_contact_threshold"`
	// MaxTrailingLogs: a member more than this many entries behind the
	// leader's last index is unhealthy (default 1024).
	MaxTrailingLogs uint64 `yaml:"max_trailing_logs"`
	// Interval between health checks and reconciliations (default 1s).
	Interval time.Duration `yaml:"interval"`
}

// Peer is a voter of the initial configuration.
type Peer struct {
	ID   string `yaml:"id"`
	Addr string `yaml:"addr"`
}

// RaftTiming are hashicorp/raft's timing knobs.
type RaftTiming struct {
	// HeartbeatTimeout: follower time without leader contact before it
	// starts an election (default 1s: DESIGN.md "Raft timing").
	HeartbeatTimeout time.Duration `yaml:"heartbeat_timeout"`
	// ElectionTimeout: candidate time without a result before a new
	// election (default HeartbeatTimeout).
	ElectionTimeout time.Duration `yaml:"election_timeout"`
	// LeaderLeaseTimeout: leader time without quorum contact before it
	// steps down (default HeartbeatTimeout; at most HeartbeatTimeout).
	LeaderLeaseTimeout time.Duration `yaml:"leader_lease_timeout"`
	// CommitTimeout: idle time after which the leader sends an
	// AppendEntries anyway, which is how followers learn the commit index
	// when no new entries flow (default 2ms; raft randomises it up to 2x).
	// It bounds how long a follower waits to apply an entry it forwarded
	// (read-your-writes), so it is kept far below raft's 50ms default; the
	// price is a few hundred empty AppendEntries per second per follower
	// when idle.
	CommitTimeout time.Duration `yaml:"commit_timeout"`
	// MaxAppendEntries bounds entries per AppendEntries RPC (default 64).
	MaxAppendEntries int `yaml:"max_append_entries"`
}

// ArchiveOptions is the archive's retention.
type ArchiveOptions struct {
	MaxAge    time.Duration `yaml:"archive_max_age"`    // drop records older than the newest minus MaxAge (log time); 0 = keep
	MaxEvents uint64        `yaml:"archive_max_events"` // keep at most this many events; 0 = keep all
}

const (
	defaultMaxBatch    = 512
	defaultHashHistory = 1 << 16
	minAuthKeyLen      = 16
	maxVoters          = 9
)

// Autopilot's defaults, for a zero AutopilotConfig field.
const (
	DefaultAutopilotVoters       = 3
	DefaultAutopilotStabilize    = 10 * time.Second
	DefaultAutopilotDeadServer   = 10 * time.Minute
	DefaultAutopilotTrailingLogs = 1024
	DefaultAutopilotInterval     = time.Second
)

// WithDefaults fills the zero timing knobs: the defaults of every knob
// are here, those that follow another knob (election and lease from the
// heartbeat) included.
func (t RaftTiming) WithDefaults() RaftTiming {
	if t.HeartbeatTimeout == 0 {
		t.HeartbeatTimeout = time.Second
	}
	if t.ElectionTimeout == 0 {
		t.ElectionTimeout = t.HeartbeatTimeout
	}
	if t.LeaderLeaseTimeout == 0 {
		t.LeaderLeaseTimeout = t.HeartbeatTimeout
	}
	if t.CommitTimeout == 0 {
		t.CommitTimeout = 2 * time.Millisecond
	}
	if t.MaxAppendEntries == 0 {
		t.MaxAppendEntries = 64
	}
	return t
}

// WithDefaults fills the zero autopilot knobs (LastContactThreshold from
// rt, the Raft timing with its defaults).
func (a AutopilotConfig) WithDefaults(rt RaftTiming) AutopilotConfig {
	if a.Voters == 0 {
		a.Voters = DefaultAutopilotVoters
	}
	if a.StabilizationTime == 0 {
		a.StabilizationTime = DefaultAutopilotStabilize
	}
	if a.DeadServerTimeout == 0 {
		a.DeadServerTimeout = DefaultAutopilotDeadServer
	}
	if a.LastContactThreshold == 0 {
		a.LastContactThreshold = 2 * rt.HeartbeatTimeout
	}
	if a.MaxTrailingLogs == 0 {
		a.MaxTrailingLogs = DefaultAutopilotTrailingLogs
	}
	if a.Interval == 0 {
		a.Interval = DefaultAutopilotInterval
	}
	return a
}

// WithDefaults fills the zero settings with their defaults; it checks
// nothing (ValidateConfig does).
func (s Settings) WithDefaults() Settings {
	s.Raft = s.Raft.WithDefaults()
	s.Autopilot = s.Autopilot.WithDefaults(s.Raft)
	if s.Suffrage == "" {
		s.Suffrage = SuffrageVoter
	}
	if s.ProposeTimeout == 0 {
		s.ProposeTimeout = s.Raft.ElectionTimeout
	}
	if s.FeatureLevel == 0 {
		s.FeatureLevel = fsm.FeatureLevelMax
	}
	return s
}

// WithDefaults fills the zero fields of c with their defaults; it checks
// nothing (ValidateConfig does).
func (c Config) WithDefaults() Config {
	c.Settings = c.Settings.WithDefaults()
	if c.MaxBatch == 0 {
		c.MaxBatch = defaultMaxBatch
	}
	if c.HashHistory == 0 {
		c.HashHistory = defaultHashHistory
	}
	if c.Logger == nil {
		c.Logger = slog.New(slog.DiscardHandler)
	}
	return c
}

// ConfigError is one problem of a Config, at Key: the setting's key
// (Settings' yaml tags, e.g. "advertise_addr", "raft.heartbeat_timeout",
// "peers[1]"; the snake_case field name for the others: "auth_key",
// "max_batch"), so that a program that reads the settings from a file
// reports the problem under the key the file uses.
type ConfigError struct {
	Key string
	Msg string
}

func (e *ConfigError) Error() string { return "cluster: config " + e.Key + ": " + e.Msg }

// ConfigErrors lists the ConfigErrors in err (ValidateConfig's result).
func ConfigErrors(err error) []*ConfigError {
	var out []*ConfigError
	if ce, ok := err.(*ConfigError); ok {
		return append(out, ce)
	}
	if j, ok := err.(interface{ Unwrap() []error }); ok {
		for _, e := range j.Unwrap() {
			out = append(out, ConfigErrors(e)...)
		}
	}
	return out
}

// ValidateConfig checks c, a Config with its defaults filled in
// (WithDefaults); it changes nothing. The error joins one *ConfigError per
// problem.
func ValidateConfig(c Config) error {
	var errs []error
	bad := func(key, format string, args ...any) {
		errs = append(errs, &ConfigError{Key: key, Msg: fmt.Sprintf(format, args...)})
	}
	c.Settings.validateNode(c.Listener != nil, bad)
	c.Settings.validateMembership(bad)
	c.Raft.validate(bad)
	c.Autopilot.validate(bad)
	if len(c.AuthKey) == 0 {
		bad("auth_key", "required: the internal key that authenticates inter-node RPCs")
	} else if len(c.AuthKey) < minAuthKeyLen {
		bad("auth_key", "%d bytes is too short (want at least %d)", len(c.AuthKey), minAuthKeyLen)
	}
	if c.ProposeTimeout < 0 {
		bad("propose_timeout", "must be >= 0 (0: the election timeout), got %s", c.ProposeTimeout)
	}
	if c.HashHistory < 0 {
		bad("hash_history", "negative")
	}
	if c.MaxBatch < 0 {
		bad("max_batch", "negative")
	} else if c.MaxBatch > fsm.MaxEntryProposals {
		bad("max_batch", "%d exceeds the %d proposals a log entry can hold", c.MaxBatch, fsm.MaxEntryProposals)
	}
	if c.SnapshotInterval != 0 && c.SnapshotInterval < 5*time.Millisecond {
		bad("snapshot_interval", "%s is below raft's 5ms minimum", c.SnapshotInterval)
	}
	if c.FeatureLevel > fsm.FeatureLevelMax {
		bad("compat_feature_level", "%d exceeds what this build supports (%d)", c.FeatureLevel, fsm.FeatureLevelMax)
	}
	return errors.Join(errs...)
}

// validateNode: the node's identity, data and addresses. listener: the
// caller brings its own listener (BindAddr is then not used).
func (s *Settings) validateNode(listener bool, bad func(key, format string, args ...any)) {
	if s.NodeID == "" {
		bad("node_id", "required (a stable, unique node id)")
	} else if len(s.NodeID) > transport.MaxNodeIDLen {
		bad("node_id", "longer than %d bytes", transport.MaxNodeIDLen)
	}
	if s.DataDir == "" {
		bad("data_dir", "required: where the Raft log, snapshots and the event archive live")
	}
	bindUnspecified := false
	switch host, _, err := net.SplitHostPort(s.BindAddr); {
	case listener:
	case s.BindAddr == "":
		bad("bind_addr", "required (e.g. \"127.0.0.1:7400\")")
	case err != nil:
		bad("bind_addr", "%q is not host:port: %v", s.BindAddr, err)
	default:
		ip := net.ParseIP(host)
		bindUnspecified = host == "" || ip != nil && ip.IsUnspecified()
	}
	if s.AdvertiseAddr == "" {
		if bindUnspecified {
			bad("advertise_addr", "required when bind_addr %q binds every address: peers cannot dial it", s.BindAddr)
		}
		return
	}
	host, port, err := net.SplitHostPort(s.AdvertiseAddr)
	switch ip := net.ParseIP(host); {
	case err != nil:
		bad("advertise_addr", "%q is not host:port: %v", s.AdvertiseAddr, err)
	case port == "0":
		bad("advertise_addr", "%q has port 0; advertise the real port", s.AdvertiseAddr)
	case host == "" || ip != nil && ip.IsUnspecified():
		bad("advertise_addr", "%q is not an address peers can dial (it names every address of the host)", s.AdvertiseAddr)
	}
}

// validateMembership: bootstrap, join, suffrage.
func (s *Settings) validateMembership(bad func(key, format string, args ...any)) {
	if s.Bootstrap {
		if len(s.Peers) == 0 {
			bad("peers", "required with bootstrap: the initial voters, including this node")
		}
		seen := map[string]bool{}
		self := false
		for i, p := range s.Peers {
			if p.ID == "" || p.Addr == "" {
				bad(fmt.Sprintf("peers[%d]", i), "needs both id and addr")
				continue
			}
			if seen[p.ID] {
				bad(fmt.Sprintf("peers[%d].id", i), "duplicate id %q", p.ID)
			}
			seen[p.ID] = true
			self = self || p.ID == s.NodeID
		}
		if len(s.Peers) > 0 && !self && s.NodeID != "" {
			bad("peers", "must include this node (node_id %q)", s.NodeID)
		}
		if len(s.Join) > 0 {
			bad("join", "set either bootstrap or join, not both")
		}
	}
	switch s.Suffrage {
	case SuffrageVoter:
	case SuffrageNonvoter:
		if s.Bootstrap {
			bad("suffrage", "a nonvoter cannot bootstrap the cluster: set join (any member's address) instead of bootstrap")
		}
	default:
		bad("suffrage", "%q is not %s or %s", s.Suffrage, SuffrageVoter, SuffrageNonvoter)
	}
}

func (t RaftTiming) validate(bad func(key, format string, args ...any)) {
	for _, d := range []struct {
		key string
		v   time.Duration
	}{{"raft.heartbeat_timeout", t.HeartbeatTimeout}, {"raft.election_timeout", t.ElectionTimeout},
		{"raft.leader_lease_timeout", t.LeaderLeaseTimeout}, {"raft.commit_timeout", t.CommitTimeout}} {
		if d.v < 0 {
			bad(d.key, "negative")
		}
	}
	if t.LeaderLeaseTimeout > t.HeartbeatTimeout {
		bad("raft.leader_lease_timeout", "%s exceeds raft.heartbeat_timeout %s", t.LeaderLeaseTimeout, t.HeartbeatTimeout)
	}
	if t.ElectionTimeout < t.HeartbeatTimeout {
		bad("raft.election_timeout", "%s is below raft.heartbeat_timeout %s", t.ElectionTimeout, t.HeartbeatTimeout)
	}
	if t.HeartbeatTimeout < 5*time.Millisecond {
		bad("raft.heartbeat_timeout", "%s is below raft's 5ms minimum", t.HeartbeatTimeout)
	}
	if t.CommitTimeout < time.Millisecond {
		bad("raft.commit_timeout", "%s is below raft's 1ms minimum", t.CommitTimeout)
	}
	if t.MaxAppendEntries < 1 || t.MaxAppendEntries > 1024 {
		bad("raft.max_append_entries", "must be 1..1024 (raft's maximum), got %d", t.MaxAppendEntries)
	}
}

func (a AutopilotConfig) validate(bad func(key, format string, args ...any)) {
	if a.Voters < 1 || a.Voters > maxVoters {
		bad("autopilot.voters", "must be 1..%d (3 or 5 recommended), got %d", maxVoters, a.Voters)
	}
	if a.StabilizationTime < 0 {
		bad("autopilot.stabilization_time", "must be >= 0, got %s", a.StabilizationTime)
	}
	if a.LastContactThreshold < 0 {
		bad("autopilot.last_contact_threshold", "must be >= 0 (0: 2 × the heartbeat timeout), got %s", a.LastContactThreshold)
	}
	if a.Interval <= 0 {
		bad("autopilot.interval", "must be > 0, got %s", a.Interval)
	}
}
