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

// Config configures a Node. Zero values take the documented defaults.
type Config struct {
	// NodeID is stable and unique across the cluster's lifetime (a removed
	// node re-joins under a new id).
	NodeID string
	// DataDir holds raft.db (raft-boltdb/v2: log and stable store),
	// snapshots/, archive.db and, after a removal, the REMOVED tombstone.
	DataDir string
	// BindAddr is the TCP listen address for Raft and forwarding (one
	// multiplexed port), e.g. "127.0.0.1:0". Ignored when Listener is set.
	BindAddr string
	// AdvertiseAddr is the address peers dial; defaults to the bound address
	// (required when binding an unspecified IP such as 0.0.0.0).
	AdvertiseAddr string
	// Bootstrap starts a new cluster with Peers as the initial voters, only
	// if DataDir holds no Raft state (otherwise it is ignored).
	Bootstrap bool
	// Peers are the initial voters for Bootstrap, including this node.
	Peers []Peer
	// Join lists addresses of existing members (any member: a follower
	// forwards to the leader) to ask to add this node (used when DataDir
	// holds no Raft state). Open returns once the addition committed.
	Join []string
	// Suffrage is how this node asks to join: SuffrageVoter (default) joins
	// as a voter while the cluster has fewer than Autopilot.Voters voters
	// and as a non-voter otherwise; SuffrageNonvoter always joins as a
	// non-voter (it replicates and applies the log, serves reads from its
	// state and forwards proposals, but does not vote). Autopilot may
	// promote either kind to replace a failed voter.
	Suffrage Suffrage
	// Autopilot manages the membership from the leader (raft-autopilot).
	Autopilot AutopilotConfig
	// AuthKey authenticates forwarding, join and admin RPCs between nodes
	// (required, at least 16 bytes, the same on every node).
	AuthKey []byte
	// TLS, when set, wraps all inter-node traffic: it is used as the server
	// config for accepted connections and (cloned, ServerName defaulting to
	// the dialed host) as the client config. For mutual TLS set
	// Certificates, RootCAs, ClientCAs and ClientAuth =
	// tls.RequireAndVerifyClientCert.
	TLS *tls.Config
	// ProposeTimeout bounds a proposal (default 50ms): without a leader or
	// quorum Propose fails with ErrUnavailable within it. The hot routing
	// path depends on this bound.
	ProposeTimeout time.Duration
	// MaxBatch is the most proposals per log entry (default 512, at most
	// fsm.MaxEntryProposals).
	MaxBatch int
	// Raft timing; zero fields take LAN defaults.
	Raft RaftTiming
	// Snapshot policy (hashicorp/raft semantics); zero takes raft's
	// defaults (8192 entries, 120s, 10240 trailing logs).
	SnapshotThreshold uint64
	SnapshotInterval  time.Duration
	TrailingLogs      uint64
	// Archive retention.
	Archive ArchiveOptions
	// HashHistory is how many recent command entries' state hashes the node
	// keeps for HashAt (default 65,536: 2.5 MiB).
	HashHistory int
	// FeatureLevel is the highest fsm feature level this node supports
	// (default and maximum fsm.FeatureLevelMax). It caps the state machine
	// (fsm.Options.MaxFeatureLevel): a node configured at level N halts, with
	// the upgrade message, on a committed event or cluster level above N,
	// as the release that understood only N would. Reported in Status.
	FeatureLevel uint32
	// Version is this node's release, reported in Status.
	Version string
	// Listener, when set, is used instead of listening on BindAddr (tests
	// wrap it for fault injection). Open takes ownership.
	Listener net.Listener
	// Dial, when set, opens inter-node connections (tests wrap it).
	Dial func(ctx context.Context, addr string) (net.Conn, error)
	// Registerer receives tether_cluster_* metrics when set.
	Registerer prometheus.Registerer
	Logger     *slog.Logger
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
	// Voters is the number of voters autopilot keeps (default 3): a
	// healthy non-voter is promoted only while fewer healthy voters than
	// this exist, and a failed voter beyond it is demoted.
	Voters int
	// StabilizationTime is how long a non-voter must have been healthy
	// before it may be promoted (default 10s).
	StabilizationTime time.Duration
	// DeadServerTimeout is how long a member may stay unreachable before
	// autopilot removes it from the configuration (default 10m; negative:
	// never remove).
	DeadServerTimeout time.Duration
	// LastContactThreshold: a member whose last contact with the leader
	// is older than this is unhealthy (default 2 × Raft.HeartbeatTimeout).
	LastContactThreshold time.Duration
	// MaxTrailingLogs: a member more than this many entries behind the
	// leader's last index is unhealthy (default 1024).
	MaxTrailingLogs uint64
	// Interval between health checks and reconciliations (default 1s).
	Interval time.Duration
}

// Peer is a voter of the initial configuration.
type Peer struct{ ID, Addr string }

// RaftTiming are hashicorp/raft's timing knobs.
type RaftTiming struct {
	// HeartbeatTimeout: follower time without leader contact before it
	// starts an election (default 1s: DESIGN.md "Raft timing").
	HeartbeatTimeout time.Duration
	// ElectionTimeout: candidate time without a result before a new
	// election (default HeartbeatTimeout).
	ElectionTimeout time.Duration
	// LeaderLeaseTimeout: leader time without quorum contact before it
	// steps down (default HeartbeatTimeout; at most HeartbeatTimeout).
	LeaderLeaseTimeout time.Duration
	// CommitTimeout: idle time after which the leader sends an
	// AppendEntries anyway, which is how followers learn the commit index
	// when no new entries flow (default 2ms; raft randomises it up to 2x).
	// It bounds how long a follower waits to apply an entry it forwarded
	// (read-your-writes), so it is kept far below raft's 50ms default; the
	// price is a few hundred empty AppendEntries per second per follower
	// when idle.
	CommitTimeout time.Duration
	// MaxAppendEntries bounds entries per AppendEntries RPC (default 64).
	MaxAppendEntries int
}

// ArchiveOptions is the archive's retention.
type ArchiveOptions struct {
	MaxAge    time.Duration // drop records older than the newest minus MaxAge (log time); 0 = keep
	MaxEvents uint64        // keep at most this many events; 0 = keep all
}

const (
	defaultProposeTimeout = 50 * time.Millisecond
	defaultMaxBatch       = 512
	defaultHashHistory    = 1 << 16
	minAuthKeyLen         = 16
)

// Autopilot's defaults, for a zero AutopilotConfig field; the edge's
// cluster.autopilot keys default to the same values.
const (
	DefaultAutopilotVoters       = 3
	DefaultAutopilotStabilize    = 10 * time.Second
	DefaultAutopilotDeadServer   = 10 * time.Minute
	DefaultAutopilotTrailingLogs = 1024
	DefaultAutopilotInterval     = time.Second
)

func (t RaftTiming) withDefaults() RaftTiming {
	if t.HeartbeatTimeout <= 0 {
		t.HeartbeatTimeout = time.Second
	}
	if t.ElectionTimeout <= 0 {
		t.ElectionTimeout = t.HeartbeatTimeout
	}
	if t.LeaderLeaseTimeout <= 0 {
		t.LeaderLeaseTimeout = t.HeartbeatTimeout
	}
	if t.CommitTimeout <= 0 {
		t.CommitTimeout = 2 * time.Millisecond
	}
	if t.MaxAppendEntries <= 0 {
		t.MaxAppendEntries = 64
	}
	return t
}

func (a AutopilotConfig) withDefaults(rt RaftTiming, bad func(key, format string, args ...any)) AutopilotConfig {
	if a.Voters < 0 {
		bad("Autopilot.Voters", "negative")
	} else if a.Voters == 0 {
		a.Voters = DefaultAutopilotVoters
	}
	if a.StabilizationTime < 0 {
		bad("Autopilot.StabilizationTime", "negative")
	} else if a.StabilizationTime == 0 {
		a.StabilizationTime = DefaultAutopilotStabilize
	}
	if a.DeadServerTimeout == 0 {
		a.DeadServerTimeout = DefaultAutopilotDeadServer
	}
	if a.LastContactThreshold < 0 {
		bad("Autopilot.LastContactThreshold", "negative")
	} else if a.LastContactThreshold == 0 {
		a.LastContactThreshold = 2 * rt.HeartbeatTimeout
	}
	if a.MaxTrailingLogs == 0 {
		a.MaxTrailingLogs = DefaultAutopilotTrailingLogs
	}
	if a.Interval < 0 {
		bad("Autopilot.Interval", "negative")
	} else if a.Interval == 0 {
		a.Interval = DefaultAutopilotInterval
	}
	return a
}

// withDefaults fills defaults and validates; errors name the offending key.
func (c Config) withDefaults() (Config, error) {
	var errs []error
	bad := func(key, format string, args ...any) {
		errs = append(errs, fmt.Errorf("cluster: config %s: %s", key, fmt.Sprintf(format, args...)))
	}
	if c.NodeID == "" {
		bad("NodeID", "required (a stable, unique node id)")
	} else if len(c.NodeID) > transport.MaxNodeIDLen {
		bad("NodeID", "longer than %d bytes", transport.MaxNodeIDLen)
	}
	if c.DataDir == "" {
		bad("DataDir", "required")
	}
	if c.Listener == nil && c.BindAddr == "" {
		bad("BindAddr", "required unless Listener is set (e.g. \"127.0.0.1:7400\")")
	}
	if c.BindAddr != "" && c.Listener == nil {
		if _, _, err := net.SplitHostPort(c.BindAddr); err != nil {
			bad("BindAddr", "%q is not host:port: %v", c.BindAddr, err)
		}
	}
	if c.AdvertiseAddr != "" {
		host, port, err := net.SplitHostPort(c.AdvertiseAddr)
		switch {
		case err != nil:
			bad("AdvertiseAddr", "%q is not host:port: %v", c.AdvertiseAddr, err)
		case port == "0":
			bad("AdvertiseAddr", "%q has port 0; advertise the real port", c.AdvertiseAddr)
		case host == "" || net.ParseIP(host) != nil && net.ParseIP(host).IsUnspecified():
			bad("AdvertiseAddr", "%q is not a dialable address", c.AdvertiseAddr)
		}
	}
	if len(c.AuthKey) == 0 {
		bad("AuthKey", "required: the internal key that authenticates inter-node RPCs")
	} else if len(c.AuthKey) < minAuthKeyLen {
		bad("AuthKey", "%d bytes is too short (want at least %d)", len(c.AuthKey), minAuthKeyLen)
	}
	if c.Bootstrap {
		if len(c.Peers) == 0 {
			bad("Peers", "Bootstrap needs the initial voters (including this node)")
		}
		seen := map[string]bool{}
		self := false
		for i, p := range c.Peers {
			if p.ID == "" || p.Addr == "" {
				bad("Peers", "entry %d needs both ID and Addr", i)
				continue
			}
			if seen[p.ID] {
				bad("Peers", "duplicate ID %q", p.ID)
			}
			seen[p.ID] = true
			if p.ID == c.NodeID {
				self = true
			}
		}
		if len(c.Peers) > 0 && !self {
			bad("Peers", "Bootstrap peers must include this node (%q)", c.NodeID)
		}
	}
	if c.Bootstrap && len(c.Join) > 0 {
		bad("Join", "set either Bootstrap or Join, not both")
	}
	if c.ProposeTimeout < 0 {
		bad("ProposeTimeout", "negative")
	} else if c.ProposeTimeout == 0 {
		c.ProposeTimeout = defaultProposeTimeout
	}
	if c.HashHistory < 0 {
		bad("HashHistory", "negative")
	} else if c.HashHistory == 0 {
		c.HashHistory = defaultHashHistory
	}
	if c.MaxBatch < 0 {
		bad("MaxBatch", "negative")
	} else if c.MaxBatch == 0 {
		c.MaxBatch = defaultMaxBatch
	} else if c.MaxBatch > fsm.MaxEntryProposals {
		bad("MaxBatch", "%d exceeds the %d proposals a log entry can hold", c.MaxBatch, fsm.MaxEntryProposals)
	}
	c.Raft = c.Raft.withDefaults()
	switch c.Suffrage {
	case "":
		c.Suffrage = SuffrageVoter
	case SuffrageVoter, SuffrageNonvoter:
	default:
		bad("Suffrage", "%q is not %q or %q", c.Suffrage, SuffrageVoter, SuffrageNonvoter)
	}
	if c.Suffrage == SuffrageNonvoter && c.Bootstrap {
		bad("Suffrage", "a non-voter cannot bootstrap a cluster; set Join instead")
	}
	c.Autopilot = c.Autopilot.withDefaults(c.Raft, bad)
	if c.Raft.LeaderLeaseTimeout > c.Raft.HeartbeatTimeout {
		bad("Raft.LeaderLeaseTimeout", "%s exceeds Raft.HeartbeatTimeout %s", c.Raft.LeaderLeaseTimeout, c.Raft.HeartbeatTimeout)
	}
	if c.Raft.ElectionTimeout < c.Raft.HeartbeatTimeout {
		bad("Raft.ElectionTimeout", "%s is below Raft.HeartbeatTimeout %s", c.Raft.ElectionTimeout, c.Raft.HeartbeatTimeout)
	}
	if c.Raft.HeartbeatTimeout < 5*time.Millisecond {
		bad("Raft.HeartbeatTimeout", "%s is below raft's 5ms minimum", c.Raft.HeartbeatTimeout)
	}
	if c.Raft.CommitTimeout < time.Millisecond {
		bad("Raft.CommitTimeout", "%s is below raft's 1ms minimum", c.Raft.CommitTimeout)
	}
	if c.Raft.MaxAppendEntries > 1024 {
		bad("Raft.MaxAppendEntries", "%d exceeds raft's maximum 1024", c.Raft.MaxAppendEntries)
	}
	if c.SnapshotInterval != 0 && c.SnapshotInterval < 5*time.Millisecond {
		bad("SnapshotInterval", "%s is below raft's 5ms minimum", c.SnapshotInterval)
	}
	if c.FeatureLevel == 0 {
		c.FeatureLevel = fsm.FeatureLevelMax
	} else if c.FeatureLevel > fsm.FeatureLevelMax {
		bad("FeatureLevel", "%d exceeds what this build supports (%d)", c.FeatureLevel, fsm.FeatureLevelMax)
	}
	if c.Logger == nil {
		c.Logger = slog.New(slog.DiscardHandler)
	}
	return c, errors.Join(errs...)
}
