package devstack

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"strconv"

	"github.com/tether-project/tether/cluster"
)

// manifestName is the file in the data directory that records the cluster's
// shape. Raft persists its peers' addresses in its log, so a restarted
// stack must listen on the same Raft addresses; the manifest is where a
// stack started on free ports finds them again.
const manifestName = "devstack.json"

const manifestVersion = 1

type manifest struct {
	Version int             `json:"version"`
	Edges   []manifestEntry `json:"edges"`
}

type manifestEntry struct {
	ID       string `json:"id"`
	RaftAddr string `json:"raft_addr"`
}

// readManifest reads dir's manifest; found is false when there is none. A
// data directory with Raft state but no manifest is an error: its peers'
// addresses are lost.
func readManifest(dir string) (m manifest, found bool, err error) {
	path := filepath.Join(dir, manifestName)
	data, err := os.ReadFile(path)
	if errors.Is(err, fs.ErrNotExist) {
		for i := 0; i < MaxNodes; i++ {
			if _, serr := os.Stat(filepath.Join(dir, edgeID(i), "raft.db")); serr == nil {
				return manifest{}, false, fmt.Errorf("devstack: %s holds Raft state (%s) but no %s recording its peers' addresses; use another data dir",
					dir, filepath.Join(edgeID(i), "raft.db"), manifestName)
			}
		}
		return manifest{}, false, nil
	}
	if err != nil {
		return manifest{}, false, fmt.Errorf("devstack: %w", err)
	}
	if err := json.Unmarshal(data, &m); err != nil {
		return manifest{}, false, fmt.Errorf("devstack: %s: not a devstack manifest: %w", path, err)
	}
	if m.Version != manifestVersion {
		return manifest{}, false, fmt.Errorf("devstack: %s: version %d, this build reads version %d", path, m.Version, manifestVersion)
	}
	if len(m.Edges) == 0 || len(m.Edges) > MaxNodes {
		return manifest{}, false, fmt.Errorf("devstack: %s: %d edges (want 1..%d)", path, len(m.Edges), MaxNodes)
	}
	for i, e := range m.Edges {
		if e.RaftAddr == "" {
			return manifest{}, false, fmt.Errorf("devstack: %s: edges[%d].raft_addr is empty", path, i)
		}
		if e.ID != edgeID(i) {
			return manifest{}, false, fmt.Errorf("devstack: %s: edges[%d].id is %q, want %q", path, i, e.ID, "edge-"+strconv.Itoa(i+1))
		}
	}
	return m, true, nil
}

// writeManifest records peers atomically (write, sync, rename).
func writeManifest(dir string, peers []cluster.Peer) error {
	m := manifest{Version: manifestVersion}
	for _, p := range peers {
		m.Edges = append(m.Edges, manifestEntry{ID: p.ID, RaftAddr: p.Addr})
	}
	data, err := json.MarshalIndent(m, "", "  ")
	if err != nil {
		return fmt.Errorf("devstack: manifest: %w", err)
	}
	path := filepath.Join(dir, manifestName)
	tmp, err := os.CreateTemp(dir, manifestName+".tmp-*")
	if err != nil {
		return fmt.Errorf("devstack: manifest: %w", err)
	}
	_, werr := tmp.Write(append(data, '\n'))
	serr := tmp.Sync()
	cerr := tmp.Close()
	if err := errors.Join(werr, serr, cerr); err != nil {
		os.Remove(tmp.Name())
		return fmt.Errorf("devstack: write %s: %w", path, err)
	}
	if err := os.Rename(tmp.Name(), path); err != nil {
		os.Remove(tmp.Name())
		return fmt.Errorf("devstack: write %s: %w", path, err)
	}
	return nil
}

// adminTokenName and internalKeyName are the files in the data directory
// keeping the generated admin token and internal_request_auth_key, so a
// restart on the same data dir keeps clients' $TOKEN working (as the CA in
// tls/ keeps their trust) and the ids the edges minted before it (stored
// responses, conversations) authenticating.
const (
	adminTokenName  = "admin-token"
	internalKeyName = "internal-key"
)

// Where a secret came from, for the banner.
const (
	secretGiven     = "given"     // flag or environment: not stored
	secretKept      = "kept"      // read from the data dir
	secretGenerated = "generated" // new, stored in the data dir
)

// secret returns the secret to use and where it came from: the given one
// (flag or environment: it wins and is not stored), else the data dir's
// file name, else a new random one, stored (mode 0600) for the next start.
func secret(dir, name, given string) (string, string, error) {
	if given != "" {
		return given, secretGiven, nil
	}
	path := filepath.Join(dir, name)
	data, err := os.ReadFile(path)
	switch {
	case err == nil:
		v := string(bytes.TrimSpace(data))
		if len(v) < 16 {
			return "", "", fmt.Errorf("devstack: %s holds no secret of at least 16 bytes; remove it to generate one", path)
		}
		return v, secretKept, nil
	case !errors.Is(err, fs.ErrNotExist):
		return "", "", fmt.Errorf("devstack: %s: %w", name, err)
	}
	v := randomSecret()
	if err := os.WriteFile(path, []byte(v+"\n"), 0o600); err != nil {
		return "", "", fmt.Errorf("devstack: %s: %w", name, err)
	}
	return v, secretGenerated, nil
}
