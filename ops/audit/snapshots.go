package audit

import (
	"bufio"
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"hash/crc64"
	"io"
	"os"
	"path/filepath"
	"slices"
	"strings"

	"github.com/hashicorp/raft"

	"github.com/tether-project/tether/fsm"
)

// Snapshot is one snapshot of hashicorp/raft's file snapshot store
// (DataDir/snapshots/<term>-<index>-<millis>/{meta.json,state.bin}); its
// state.bin is an fsm snapshot stream.
type Snapshot struct {
	ID   string
	Path string // the snapshot's directory
	// Index and Term are Raft's: the last log entry (command or not) the
	// snapshot covers. The fsm state index inside is ≤ Index; no command
	// entry lies between the two.
	Index, Term uint64
	Size        int64
	Voters      []string // the Raft configuration stored with it
	crc         []byte
}

// fileSnapshotMeta mirrors raft's meta.json (raft.SnapshotMeta plus the
// CRC-64/ECMA of state.bin).
type fileSnapshotMeta struct {
	raft.SnapshotMeta
	CRC []byte
}

// listSnapshots reads every complete snapshot's metadata in dir, oldest
// first (raft's order: term, index, id). A missing dir holds none.
func listSnapshots(dir string) ([]Snapshot, error) {
	entries, err := os.ReadDir(dir)
	if errors.Is(err, os.ErrNotExist) {
		return nil, nil
	}
	if err != nil {
		return nil, fmt.Errorf("audit: list snapshots in %s: %w", dir, err)
	}
	var out []Snapshot
	for _, e := range entries {
		if !e.IsDir() || strings.HasSuffix(e.Name(), ".tmp") {
			continue // raft writes into <id>.tmp and renames when complete
		}
		s, err := readSnapshotMeta(filepath.Join(dir, e.Name()))
		if err != nil {
			return nil, err
		}
		out = append(out, s)
	}
	slices.SortFunc(out, func(a, b Snapshot) int {
		if a.Term != b.Term {
			return cmpU64(a.Term, b.Term)
		}
		if a.Index != b.Index {
			return cmpU64(a.Index, b.Index)
		}
		return strings.Compare(a.ID, b.ID)
	})
	return out, nil
}

func cmpU64(a, b uint64) int {
	switch {
	case a < b:
		return -1
	case a > b:
		return 1
	}
	return 0
}

func readSnapshotMeta(dir string) (Snapshot, error) {
	path := filepath.Join(dir, "meta.json")
	b, err := os.ReadFile(path)
	if err != nil {
		return Snapshot{}, fmt.Errorf("audit: snapshot %s: %w", dir, err)
	}
	var m fileSnapshotMeta
	if err := json.Unmarshal(b, &m); err != nil {
		return Snapshot{}, fmt.Errorf("audit: snapshot %s: meta.json: %w", dir, err)
	}
	s := Snapshot{ID: m.ID, Path: dir, Index: m.Index, Term: m.Term, Size: m.Size, crc: m.CRC}
	if s.ID == "" {
		s.ID = filepath.Base(dir)
	}
	for _, srv := range m.Configuration.Servers {
		if srv.Suffrage == raft.Voter {
			s.Voters = append(s.Voters, string(srv.ID))
		}
	}
	return s, nil
}

// Load reads the snapshot's state (see RestoreInto for the checks).
func (s Snapshot) Load() (*fsm.State, error) {
	m := fsm.NewMachine()
	if err := s.RestoreInto(m); err != nil {
		return nil, err
	}
	return m.State(), nil
}

// RestoreInto loads the snapshot into m, checking state.bin's size and
// CRC-64 against meta.json and the fsm state hash recorded inside.
func (s Snapshot) RestoreInto(m *fsm.Machine) error {
	path := filepath.Join(s.Path, "state.bin")
	f, err := os.Open(path)
	if err != nil {
		return fmt.Errorf("audit: snapshot %s: %w", s.ID, err)
	}
	defer f.Close()
	h := crc64.New(crc64.MakeTable(crc64.ECMA))
	cr := &countingReader{r: io.TeeReader(bufio.NewReaderSize(f, 256<<10), h)}
	if err := m.Restore(cr); err != nil {
		return fmt.Errorf("audit: snapshot %s: %w", s.ID, err)
	}
	// Whatever follows the fsm stream still counts for the file's CRC.
	if _, err := io.Copy(io.Discard, cr); err != nil {
		return fmt.Errorf("audit: snapshot %s: %w", s.ID, err)
	}
	if s.Size > 0 && cr.n != s.Size {
		return fmt.Errorf("audit: snapshot %s: state.bin holds %d bytes, meta.json says %d", s.ID, cr.n, s.Size)
	}
	if len(s.crc) > 0 && !bytes.Equal(h.Sum(nil), s.crc) {
		return fmt.Errorf("audit: snapshot %s: state.bin fails its CRC-64 check (corrupt copy?)", s.ID)
	}
	return nil
}

type countingReader struct {
	r io.Reader
	n int64
}

func (c *countingReader) Read(p []byte) (int, error) {
	k, err := c.r.Read(p)
	c.n += int64(k)
	return k, err
}
