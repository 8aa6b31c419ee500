package bench

import (
	"bufio"
	"bytes"
	"cmp"
	"compress/gzip"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math"
	"os"
	"path/filepath"
	"slices"
	"sort"
	"strings"
	"time"
)

// TraceOptions control how trace files become a workload.
type TraceOptions struct {
	// SharedPrefixBlocks prepends this many blocks common to every
	// request of every trace (a fleet-wide system prompt), to study
	// cross-conversation prefix sharing.
	SharedPrefixBlocks int
	// Limit keeps only the first Limit traces in file-name order (0: all).
	Limit int
	// Smallest keeps only the Smallest traces with the fewest prompt
	// tokens in total (0: all): a cheap subset for e2e mode. Applied after
	// Limit.
	Smallest int
	// MaxDuration keeps only traces whose last top-level request starts
	// within this long (0: all). Applied before Smallest.
	MaxDuration time.Duration
	// Stagger starts each conversation at an offset in [0, Stagger)
	// derived from its trace id (the same in every run), instead of all
	// in the same instant.
	Stagger time.Duration
	// Half keeps one half of the traces (HalfTuning, HalfValidation; ""
	// keeps all): the traces sorted by id, the 1st, 3rd, 5th... form the
	// tuning half and the 2nd, 4th, 6th... the validation half. Applied
	// first, before MaxDuration and Smallest. Parameters are chosen on the
	// tuning half; the published figures are the validation half's.
	Half string
}

// The two halves of the trace split (TraceOptions.Half).
const (
	HalfTuning     = "tuning"
	HalfValidation = "validation"
)

// splitHalf keeps the agents of one half: agents sorted by id, even
// positions (0-based) tuning, odd ones validation.
func splitHalf(agents []*Agent, half string) ([]*Agent, error) {
	if half == "" {
		return agents, nil
	}
	if half != HalfTuning && half != HalfValidation {
		return nil, fmt.Errorf("bench: traces: unknown half %q (allowed: %s, %s)", half, HalfTuning, HalfValidation)
	}
	sorted := slices.Clone(agents)
	slices.SortFunc(sorted, func(a, b *Agent) int { return cmp.Compare(a.ID, b.ID) })
	want := 0
	if half == HalfValidation {
		want = 1
	}
	var out []*Agent
	for i, a := range sorted {
		if i%2 == want {
			out = append(out, a)
		}
	}
	if len(out) == 0 {
		return nil, fmt.Errorf("bench: traces: the %s half is empty (%d traces)", half, len(agents))
	}
	return out, nil
}

// Trace file format (kv-cache-tester): one conversation per file.
type traceFile struct {
	ID          string         `json:"id"`
	BlockSize   int            `json:"block_size"`
	HashIDScope string         `json:"hash_id_scope"`
	Requests    []traceRequest `json:"requests"`
}

type traceRequest struct {
	T            *float64       `json:"t"`
	Type         string         `json:"type"`
	In           int            `json:"in"`
	Out          int            `json:"out"`
	HashIDs      []int64        `json:"hash_ids"`
	AgentID      string         `json:"agent_id"`
	SubagentType string         `json:"subagent_type"`
	Requests     []traceRequest `json:"requests"`
}

// TraceFiles lists the trace files of dir (*.json and *.json.gz), sorted.
func TraceFiles(dir string) ([]string, error) {
	entries, err := os.ReadDir(dir)
	if err != nil {
		return nil, fmt.Errorf("bench: traces: %w", err)
	}
	var files []string
	for _, e := range entries {
		n := e.Name()
		if e.Type().IsRegular() && (strings.HasSuffix(n, ".json") || strings.HasSuffix(n, ".json.gz")) {
			files = append(files, filepath.Join(dir, n))
		}
	}
	sort.Strings(files)
	if len(files) == 0 {
		return nil, fmt.Errorf("bench: traces: no *.json or *.json.gz files in %s", dir)
	}
	return files, nil
}

// LoadTraces reads every trace file of dir into one workload.
func LoadTraces(dir string, opts TraceOptions) (*Workload, error) {
	files, err := TraceFiles(dir)
	if err != nil {
		return nil, err
	}
	if opts.Limit > 0 && opts.Limit < len(files) {
		files = files[:opts.Limit]
	}
	return LoadTraceFiles(files, opts)
}

// LoadTraceFiles reads the given trace files (gzip or plain JSON) into one
// workload: one root agent per file, named by the trace id, with its
// sub-agents as child agents named "<trace id>/<agent id>". Hash ids with
// scope "local" are namespaced by trace id, so equal ids of different
// traces are different blocks.
func LoadTraceFiles(files []string, opts TraceOptions) (*Workload, error) {
	if opts.SharedPrefixBlocks < 0 || opts.Smallest < 0 || opts.MaxDuration < 0 || opts.Stagger < 0 {
		return nil, fmt.Errorf("bench: shared prefix blocks (%d), smallest (%d), max duration (%v) and stagger (%v) must be >= 0",
			opts.SharedPrefixBlocks, opts.Smallest, opts.MaxDuration, opts.Stagger)
	}
	w := &Workload{Name: "traces"}
	ids := map[string]string{}
	var shared []uint64
	for i := 0; i < opts.SharedPrefixBlocks; i++ {
		shared = append(shared, namespaceKey(stringHash("tether-bench/shared-prefix"), int64(i)))
	}
	for _, path := range files {
		tf, err := readTraceFile(path)
		if err != nil {
			return nil, err
		}
		if prev, dup := ids[tf.ID]; dup {
			return nil, fmt.Errorf("bench: trace %s: id %q already used by %s", path, tf.ID, prev)
		}
		ids[tf.ID] = path
		if w.BlockSize == 0 {
			w.BlockSize = tf.BlockSize
		} else if tf.BlockSize != w.BlockSize {
			return nil, fmt.Errorf("bench: trace %s: block_size %d, earlier traces use %d", path, tf.BlockSize, w.BlockSize)
		}
		root, err := buildTraceAgent(path, tf, shared, opts.SharedPrefixBlocks*tf.BlockSize)
		if err != nil {
			return nil, err
		}
		if opts.Stagger > 0 {
			root.Start = time.Duration(mix64(stringHash(tf.ID)) % uint64(opts.Stagger))
		}
		w.Agents = append(w.Agents, root)
	}
	agents, err := splitHalf(w.Agents, opts.Half)
	if err != nil {
		return nil, err
	}
	w.Agents = agents
	if opts.MaxDuration > 0 {
		w.Agents = slices.DeleteFunc(w.Agents, func(a *Agent) bool {
			return len(a.Steps) > 0 && a.Steps[len(a.Steps)-1].At > opts.MaxDuration
		})
		if len(w.Agents) == 0 {
			return nil, fmt.Errorf("bench: traces: no trace ends within --max-duration %v", opts.MaxDuration)
		}
	}
	if opts.Smallest > 0 && opts.Smallest < len(w.Agents) {
		size := map[*Agent]int64{}
		for _, a := range w.Agents {
			sub := &Workload{Agents: []*Agent{a}}
			size[a] = sub.Stats().PromptTokens
		}
		keep := slices.Clone(w.Agents)
		slices.SortStableFunc(keep, func(a, b *Agent) int { return cmp.Compare(size[a], size[b]) })
		keep = keep[:opts.Smallest]
		w.Agents = slices.DeleteFunc(w.Agents, func(a *Agent) bool { return !slices.Contains(keep, a) })
	}
	if err := w.Validate(); err != nil {
		return nil, err
	}
	return w, nil
}

// readTraceFile decodes one file, gzip-compressed or not (by magic bytes).
func readTraceFile(path string) (*traceFile, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, fmt.Errorf("bench: trace %s: %w", path, err)
	}
	defer f.Close()
	br := bufio.NewReaderSize(f, 1<<16)
	var r io.Reader = br
	if magic, _ := br.Peek(2); bytes.Equal(magic, []byte{0x1f, 0x8b}) {
		gz, err := gzip.NewReader(br)
		if err != nil {
			return nil, fmt.Errorf("bench: trace %s: gzip: %w", path, err)
		}
		defer gz.Close()
		r = gz
	}
	dec := json.NewDecoder(r)
	var tf traceFile
	if err := dec.Decode(&tf); err != nil {
		var syn *json.SyntaxError
		var typ *json.UnmarshalTypeError
		switch {
		case errors.As(err, &syn):
			return nil, fmt.Errorf("bench: trace %s: malformed JSON at byte %d: %w", path, syn.Offset, err)
		case errors.As(err, &typ):
			return nil, fmt.Errorf("bench: trace %s: field %s: %w", path, typ.Field, err)
		case errors.Is(err, io.ErrUnexpectedEOF) || errors.Is(err, io.EOF):
			return nil, fmt.Errorf("bench: trace %s: malformed JSON: truncated: %w", path, err)
		}
		return nil, fmt.Errorf("bench: trace %s: %w", path, err)
	}
	if _, err := dec.Token(); err != io.EOF {
		return nil, fmt.Errorf("bench: trace %s: trailing data after the JSON object", path)
	}
	switch {
	case strings.TrimSpace(tf.ID) == "":
		return nil, fmt.Errorf("bench: trace %s: missing \"id\"", path)
	case tf.BlockSize < 1 || tf.BlockSize > 1<<20:
		return nil, fmt.Errorf("bench: trace %s: \"block_size\" must be 1..1048576, got %d", path, tf.BlockSize)
	case tf.HashIDScope != "local" && tf.HashIDScope != "global":
		return nil, fmt.Errorf("bench: trace %s: \"hash_id_scope\" must be \"local\" or \"global\", got %q", path, tf.HashIDScope)
	case len(tf.Requests) == 0:
		return nil, fmt.Errorf("bench: trace %s: no requests", path)
	}
	return &tf, nil
}

func buildTraceAgent(path string, tf *traceFile, shared []uint64, sharedTokens int) (*Agent, error) {
	ns := stringHash("tether-bench/global")
	if tf.HashIDScope == "local" {
		ns = stringHash("tether-bench/trace/" + tf.ID)
	}
	used := map[string]bool{tf.ID: true}
	var build func(a *Agent, reqs []traceRequest, where string) error
	build = func(a *Agent, reqs []traceRequest, where string) error {
		prevSub := false
		for i := range reqs {
			tr := &reqs[i]
			loc := fmt.Sprintf("%s[%d]", where, i)
			if tr.T == nil {
				return fmt.Errorf("bench: trace %s: %s: missing \"t\"", path, loc)
			}
			t := *tr.T
			if math.IsNaN(t) || math.IsInf(t, 0) || t < 0 || t > 1e9 {
				return fmt.Errorf("bench: trace %s: %s: \"t\" must be a finite number of seconds >= 0, got %v", path, loc, t)
			}
			at := time.Duration(t * float64(time.Second))
			switch tr.Type {
			case "s", "n":
				if tr.In < 0 || tr.Out < 0 {
					return fmt.Errorf("bench: trace %s: %s: negative token count (in %d, out %d)", path, loc, tr.In, tr.Out)
				}
				keys := make([]uint64, 0, len(shared)+len(tr.HashIDs))
				keys = append(keys, shared...)
				for _, id := range tr.HashIDs {
					keys = append(keys, namespaceKey(ns, id))
				}
				a.Steps = append(a.Steps, Step{At: at, Request: &Request{
					PromptTokens: tr.In + sharedTokens,
					OutputTokens: max(tr.Out, 1),
					Stream:       tr.Type == "s",
					Keys:         keys,
					Blocks:       ChainBlocks(keys),
				}})
				prevSub = false
			case "subagent":
				name := tr.AgentID
				if strings.TrimSpace(name) == "" {
					name = fmt.Sprintf("sub%d", i)
				}
				id := a.Root().ID + "/" + name
				for n := 2; used[id]; n++ {
					id = fmt.Sprintf("%s/%s#%d", a.Root().ID, name, n)
				}
				used[id] = true
				child := &Agent{ID: id, Parent: a, Kind: tr.SubagentType}
				if len(tr.Requests) == 0 {
					return fmt.Errorf("bench: trace %s: %s: sub-agent %q has no requests", path, loc, tr.AgentID)
				}
				if err := build(child, tr.Requests, loc+".requests"); err != nil {
					return err
				}
				// Sub-agents launched back to back run together; the
				// parent's next request waits for all of them.
				a.Steps = append(a.Steps, Step{At: at, WithPrevious: prevSub, SubAgent: child})
				prevSub = true
			default:
				return fmt.Errorf("bench: trace %s: %s: unknown \"type\" %q (want \"s\", \"n\" or \"subagent\")", path, loc, tr.Type)
			}
		}
		return nil
	}
	root := &Agent{ID: tf.ID, Kind: "conversation"}
	if err := build(root, tf.Requests, "requests"); err != nil {
		return nil, err
	}
	return root, nil
}
