package operator

import (
	"bufio"
	"context"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"time"

	"github.com/tether-project/tether/edge/admin"
	"github.com/tether-project/tether/fsm"
	"github.com/tether-project/tether/ops/audit"
)

// SnapshotFileInfo describes a saved snapshot. SaveSnapshot writes it next
// to the snapshot as FILE.json, because the fsm snapshot format carries the
// state index and hash but not the Raft term.
type SnapshotFileInfo struct {
	Edge     string    `json:"edge"`
	Index    uint64    `json:"index"`
	Term     uint64    `json:"term"`
	Hash     string    `json:"hash"`
	Bindings int       `json:"bindings"`
	Size     int64     `json:"size"`
	SavedAt  time.Time `json:"saved_at"`
}

// SidecarPath is where SaveSnapshot records a snapshot's metadata.
func SidecarPath(path string) string { return path + ".json" }

// SaveSnapshot downloads the current state from the first reachable edge to
// path (written to path.tmp, synced, checked by decoding it and comparing
// its state hash with the edge's header, then renamed), plus the sidecar.
func (c *Client) SaveSnapshot(ctx context.Context, path string) (SnapshotFileInfo, error) {
	var info SnapshotFileInfo
	err := c.first(ctx, func(base string) error {
		resp, err := c.send(ctx, base, http.MethodGet, "snapshot", nil)
		if err != nil {
			return err
		}
		defer resp.Body.Close()
		info = SnapshotFileInfo{Edge: base, Hash: resp.Header.Get(admin.HeaderSnapshotHash), SavedAt: time.Now().UTC()}
		info.Index, _ = strconv.ParseUint(resp.Header.Get(admin.HeaderSnapshotIndex), 10, 64)
		info.Term, _ = strconv.ParseUint(resp.Header.Get(admin.HeaderSnapshotTerm), 10, 64)
		info.Bindings, _ = strconv.Atoi(resp.Header.Get(admin.HeaderSnapshotBindings))
		tmp := path + ".tmp"
		f, err := os.OpenFile(tmp, os.O_CREATE|os.O_TRUNC|os.O_WRONLY, 0o600)
		if err != nil {
			return fmt.Errorf("operator: snapshot save: %w", err)
		}
		defer os.Remove(tmp)
		info.Size, err = io.Copy(f, resp.Body)
		if err == nil {
			err = f.Sync()
		}
		if cerr := f.Close(); err == nil {
			err = cerr
		}
		if err != nil {
			return fmt.Errorf("operator: snapshot save: download from %s: %w", base, err)
		}
		st, err := readSnapshotFile(tmp)
		if err != nil {
			return fmt.Errorf("operator: snapshot save: the download from %s does not decode: %w", base, err)
		}
		h := st.Hash()
		if got := hex.EncodeToString(h[:]); info.Hash != "" && got != info.Hash {
			return fmt.Errorf("operator: snapshot save: %s announced state hash %s, the file holds %s", base, info.Hash, got)
		}
		info.Index, info.Hash, info.Bindings = st.Index(), hex.EncodeToString(h[:]), st.Len()
		if err := os.Rename(tmp, path); err != nil {
			return fmt.Errorf("operator: snapshot save: %w", err)
		}
		meta, _ := json.MarshalIndent(info, "", "  ")
		if err := os.WriteFile(SidecarPath(path), append(meta, '\n'), 0o600); err != nil {
			return fmt.Errorf("operator: snapshot save: %w", err)
		}
		return nil
	})
	return info, err
}

// RestoreResult is the cluster's state right after a restore.
type RestoreResult struct {
	Edge     string `json:"edge"`
	Index    uint64 `json:"index"`
	Hash     string `json:"hash"`
	Bindings int    `json:"bindings"`
}

// RestoreSnapshot replaces the cluster's state with the snapshot at path.
// The file is decoded locally first (a bad file never reaches the
// cluster); the restore must run on the leader, so it goes to each listed
// edge until the leader takes it.
func (c *Client) RestoreSnapshot(ctx context.Context, path string) (RestoreResult, error) {
	st, err := readSnapshotFile(path)
	if err != nil {
		return RestoreResult{}, fmt.Errorf("operator: snapshot restore: %s is not a usable snapshot: %w", path, err)
	}
	// Two passes: leadership may move while the request is on its way (or
	// be lost while the leader installs the snapshot); a restore is
	// idempotent, so trying the new leader is safe.
	var errs []error
	for pass := 0; pass < 2; pass++ {
		for _, base := range c.edges {
			res, err := c.restoreOn(ctx, base, path, st)
			if err == nil {
				return res, nil
			}
			var ae *APIError
			if errors.As(err, &ae) && (ae.Code == "not_leader" || ae.Code == "restore_failed" && strings.Contains(ae.Message, "not the leader")) ||
				unreachable(err) && ctx.Err() == nil {
				errs = append(errs, err)
				continue
			}
			return RestoreResult{}, err
		}
	}
	return RestoreResult{}, fmt.Errorf("operator: snapshot restore: no listed edge is the leader (pass the leader's URL with --edge): %w", errors.Join(errs...))
}

func (c *Client) restoreOn(ctx context.Context, base, path string, st *fsm.State) (RestoreResult, error) {
	f, err := os.Open(path)
	if err != nil {
		return RestoreResult{}, fmt.Errorf("operator: snapshot restore: %w", err)
	}
	defer f.Close()
	resp, err := c.sendType(ctx, base, http.MethodPost, "snapshot/restore", bufio.NewReaderSize(f, 256<<10), "application/octet-stream")
	if err != nil {
		return RestoreResult{}, err
	}
	defer resp.Body.Close()
	var ans struct {
		Index    uint64 `json:"index"`
		Hash     string `json:"hash"`
		Bindings int    `json:"bindings"`
	}
	if err := json.NewDecoder(io.LimitReader(resp.Body, 1<<20)).Decode(&ans); err != nil {
		return RestoreResult{}, fmt.Errorf("operator: snapshot restore: %s: decode answer: %w", base, err)
	}
	res := RestoreResult{Edge: base, Index: ans.Index, Hash: ans.Hash, Bindings: ans.Bindings}
	h := st.Hash()
	if ans.Index == st.Index() && ans.Hash != hex.EncodeToString(h[:]) {
		return res, fmt.Errorf("operator: snapshot restore: %s reports hash %s at index %d, the file holds %x", base, ans.Hash, ans.Index, h)
	}
	return res, nil
}

func readSnapshotFile(path string) (*fsm.State, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	return fsm.ReadSnapshot(bufio.NewReaderSize(f, 256<<10))
}

// SnapshotReport is `tether operator snapshot inspect`.
type SnapshotReport struct {
	Path string `json:"path"`
	// Term is known from the sidecar (SaveSnapshot) or, for a snapshot of
	// the Raft store, its meta.json; 0 when unknown.
	Term      uint64 `json:"term"`
	RaftIndex uint64 `json:"raft_index,omitempty"`
	Size      int64  `json:"size"`
	// Events counts the history the state accumulated, per event type;
	// Bindings per fleet are in Summary.
	Events  map[string]uint64 `json:"events_by_type"`
	Summary audit.Summary     `json:"summary"`
}

// InspectSnapshot reads a snapshot offline: a file written by SaveSnapshot
// (with or without its sidecar), or a directory (or its state.bin) of the
// Raft snapshot store under a data directory.
func InspectSnapshot(path string) (*SnapshotReport, error) {
	rep := &SnapshotReport{Path: path}
	file := path
	if fi, err := os.Stat(path); err != nil {
		return nil, fmt.Errorf("operator: inspect: %w", err)
	} else if fi.IsDir() {
		file = filepath.Join(path, "state.bin")
	}
	metaPath := filepath.Join(filepath.Dir(file), "meta.json")
	if filepath.Base(file) == "state.bin" {
		if b, err := os.ReadFile(metaPath); err == nil {
			var m struct {
				Index, Term uint64
			}
			if json.Unmarshal(b, &m) == nil {
				rep.RaftIndex, rep.Term = m.Index, m.Term
			}
		}
	} else if b, err := os.ReadFile(SidecarPath(file)); err == nil {
		var side SnapshotFileInfo
		if json.Unmarshal(b, &side) == nil {
			rep.Term = side.Term
		}
	}
	if fi, err := os.Stat(file); err == nil {
		rep.Size = fi.Size()
	}
	st, err := readSnapshotFile(file)
	if err != nil {
		return nil, fmt.Errorf("operator: inspect %s: %w", file, err)
	}
	rep.Summary = audit.Summarize(st)
	c := st.Counters()
	var evictions, overflows uint64
	for _, n := range c.Evictions {
		evictions += n
	}
	for _, n := range c.Overflows {
		overflows += n
	}
	rep.Events = map[string]uint64{
		"Bind":     c.BindsCreated + c.BindsExisting,
		"Touch":    c.Touched,
		"Overflow": overflows,
		"Evict":    evictions,
		"Link":     c.LinksCreated,
	}
	return rep, nil
}

// WriteText prints the report for people.
func (r *SnapshotReport) WriteText(w io.Writer) error {
	term := "unknown (no sidecar or meta.json)"
	if r.Term != 0 {
		term = strconv.FormatUint(r.Term, 10)
	}
	if _, err := fmt.Fprintf(w, "snapshot %s (%d bytes)\nterm:           %s\n", r.Path, r.Size, term); err != nil {
		return err
	}
	if r.RaftIndex != 0 {
		fmt.Fprintf(w, "raft index:     %d\n", r.RaftIndex)
	}
	fmt.Fprintf(w, "events by type (cumulative): Bind=%d (created %d) Touch=%d (keys touched) Overflow=%d Evict=%d (bindings removed, any cause) Link=%d\n",
		r.Events["Bind"], r.Summary.Counters.BindsCreated, r.Events["Touch"], r.Events["Overflow"], r.Events["Evict"], r.Events["Link"])
	return r.Summary.WriteText(w)
}
