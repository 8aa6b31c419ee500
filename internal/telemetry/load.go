package telemetry

import (
	"bytes"
	"encoding/json"
	"fmt"
	"io"
	"net/url"
)

// LoadReport is a worker's identity and per-rank load. Published on
// LoadSubject every telemetry interval, it is also the worker's registration
// and heartbeat: an edge learns a worker from its first report and
// considers it gone after a few missed intervals (or a Draining report).
type LoadReport struct {
	V             int    `json:"v"`
	Instance      string `json:"instance"`
	Fleet         Fleet  `json:"fleet"`
	Role          string `json:"role"`          // configured server_role: "context", "generation" or "" (omitted)
	URL           string `json:"url"`           // base URL the edge sends requests to
	Model         string `json:"model"`         // model served
	Version       string `json:"version"`       // software version
	FeatureLevel  int    `json:"feature_level"` // see FeatureLevel
	VerifiesHints bool   `json:"verifies_hints"`
	BootID        uint64 `json:"boot_id"`      // random per process start; a change means a restart
	Seq           uint64 `json:"seq"`          // load report sequence, from 1 per boot
	KVSeq         uint64 `json:"kv_seq"`       // last KV event batch sequence published (0: none yet)
	SentUnixMilli int64  `json:"sent_unix_ms"` // worker wall clock, informational
	IntervalMilli int64  `json:"interval_ms"`  // the worker's telemetry interval
	BlockSize     int    `json:"block_size"`   // tokens per KV block (internal/prefix hashes)
	// KVSource says where the worker's KV events come from: "" its own
	// cache (the simulated engine), KVSourceEngineEvents the upstream
	// engine's events translated by the proxy, KVSourceNone a proxy that
	// publishes none (the edge then knows only its own predictions).
	KVSource string     `json:"kv_source,omitempty"`
	Draining bool       `json:"draining,omitempty"`
	Ranks    []RankLoad `json:"ranks"`
	// MaxLoRAs is the LoRA adapters one rank holds at once (0: the worker
	// serves no adapters); each rank lists its own in RankLoad.
	MaxLoRAs int `json:"max_loras,omitempty"`
}

// RankLoad is one attention-DP rank's figures.
type RankLoad struct {
	Rank               int   `json:"rank"`
	ActivePromptTokens int64 `json:"active_prompt_tokens"`
	ActiveRequests     int64 `json:"active_requests"`
	QueuedRequests     int64 `json:"queued_requests"`
	// PrefillTokens is the prefill the rank has still to compute for the
	// requests it admitted, in prompt tokens: the part of queued prompts
	// its cache does not hold and what running prefills have left. A
	// request behind it waits that long for its own prefill to start, also
	// behind a prefill already running, which the request counts do not
	// show. Reported from FeatureLevel 2 (an edge takes 0 from an older
	// worker for "not reported"); a worker that cannot see its engine's
	// progress estimates it (worker/proxy).
	PrefillTokens int64 `json:"prefill_tokens,omitempty"`
	KVBlocksUsed  int64 `json:"kv_blocks_used"`
	KVBlocksTotal int64 `json:"kv_blocks_total"`
	// Rolling-window cache effectiveness: prompt tokens looked up and hit.
	WindowLookupTokens int64 `json:"window_lookup_tokens"`
	WindowHitTokens    int64 `json:"window_hit_tokens"`
	Overflows          int64 `json:"overflows"` // requests placed here because their affine rank was saturated (since boot)
	Evictions          int64 `json:"evictions"` // KV blocks evicted (since boot)
	// LoRAAdapters are the adapters the rank holds (least recently used
	// first); LoRARunning those of them with running or queued requests.
	LoRAAdapters []string `json:"lora_adapters,omitempty"`
	LoRARunning  []string `json:"lora_running,omitempty"`
}

// LoadReport.KVSource values.
const (
	KVSourceEngineEvents = "engine_events"
	KVSourceNone         = "none"
)

// HitRate is WindowHitTokens/WindowLookupTokens (0 with no lookups).
func (r RankLoad) HitRate() float64 {
	if r.WindowLookupTokens == 0 {
		return 0
	}
	return float64(r.WindowHitTokens) / float64(r.WindowLookupTokens)
}

// EncodeLoad validates r and encodes it as JSON; V is set to Version.
func EncodeLoad(r LoadReport) ([]byte, error) {
	r.V = Version
	if err := r.validate(LoadSubject(r.Fleet, r.Instance)); err != nil {
		return nil, err
	}
	return json.Marshal(r)
}

// DecodeLoad decodes and validates a load report received on subject.
func DecodeLoad(subject string, data []byte) (LoadReport, error) {
	s, err := expectSubject(subject, SubjectLoad)
	if err != nil {
		return LoadReport{}, err
	}
	var r LoadReport
	if err := decodeJSON(subject, data, &r); err != nil {
		return LoadReport{}, err
	}
	if r.Instance != s.Instance {
		return LoadReport{}, decodeErr(ErrSubjectMismatch, subject, "instance", "payload %q, subject %q", r.Instance, s.Instance)
	}
	if r.Fleet != s.Fleet {
		return LoadReport{}, decodeErr(ErrSubjectMismatch, subject, "fleet", "payload %q, subject %q", r.Fleet, s.Fleet)
	}
	if err := r.validate(subject); err != nil {
		return LoadReport{}, err
	}
	return r, nil
}

func (r *LoadReport) validate(subject string) error {
	if err := ValidInstanceID(r.Instance); err != nil {
		return decodeErr(ErrOutOfRange, subject, "instance", "%v", err)
	}
	if !r.Fleet.Valid() {
		return decodeErr(ErrOutOfRange, subject, "fleet", "%q (want context or generation)", r.Fleet)
	}
	if r.Role != "" && r.Role != "context" && r.Role != "generation" {
		return decodeErr(ErrOutOfRange, subject, "role", "%q (want context, generation or empty)", r.Role)
	}
	if r.KVSource != "" && r.KVSource != KVSourceEngineEvents && r.KVSource != KVSourceNone {
		return decodeErr(ErrOutOfRange, subject, "kv_source", "%q (want %s, %s or empty)", r.KVSource, KVSourceEngineEvents, KVSourceNone)
	}
	if err := checkURL(r.URL); err != nil {
		return decodeErr(ErrOutOfRange, subject, "url", "%v", err)
	}
	for _, f := range []struct {
		name, v  string
		required bool
	}{{"model", r.Model, true}, {"version", r.Version, false}} {
		if f.required && f.v == "" {
			return decodeErr(ErrOutOfRange, subject, f.name, "empty")
		}
		if len(f.v) > MaxStringLen {
			return decodeErr(ErrOutOfRange, subject, f.name, "%d bytes (max %d)", len(f.v), MaxStringLen)
		}
	}
	if r.FeatureLevel < 1 || r.FeatureLevel > MaxFeatureLevel {
		return decodeErr(ErrOutOfRange, subject, "feature_level", "%d (want 1..%d)", r.FeatureLevel, MaxFeatureLevel)
	}
	if r.BootID == 0 {
		return decodeErr(ErrOutOfRange, subject, "boot_id", "zero")
	}
	if r.Seq == 0 {
		return decodeErr(ErrOutOfRange, subject, "seq", "zero (sequences start at 1)")
	}
	if r.IntervalMilli < 1 || r.IntervalMilli > MaxIntervalMilli {
		return decodeErr(ErrOutOfRange, subject, "interval_ms", "%d (want 1..%d)", r.IntervalMilli, MaxIntervalMilli)
	}
	if r.BlockSize < 1 || r.BlockSize > MaxBlockSize {
		return decodeErr(ErrOutOfRange, subject, "block_size", "%d (want 1..%d)", r.BlockSize, MaxBlockSize)
	}
	if r.MaxLoRAs < 0 || r.MaxLoRAs > MaxLoRAs {
		return decodeErr(ErrOutOfRange, subject, "max_loras", "%d (want 0..%d)", r.MaxLoRAs, MaxLoRAs)
	}
	if len(r.Ranks) < 1 || len(r.Ranks) > MaxRanks {
		return decodeErr(ErrOutOfRange, subject, "ranks", "%d ranks (want 1..%d)", len(r.Ranks), MaxRanks)
	}
	for i := range r.Ranks {
		if err := r.Ranks[i].validate(subject, i); err != nil {
			return err
		}
	}
	return nil
}

// validate checks the figures of rank i of a report.
func (rk *RankLoad) validate(subject string, i int) error {
	field := func(name string) string { return fmt.Sprintf("ranks[%d].%s", i, name) }
	if rk.Rank != i {
		return decodeErr(ErrOutOfRange, subject, field("rank"), "%d at index %d (ranks are listed in order from 0)", rk.Rank, i)
	}
	for _, c := range []struct {
		name string
		v    int64
		max  int64
	}{
		{"active_prompt_tokens", rk.ActivePromptTokens, MaxTokens},
		{"active_requests", rk.ActiveRequests, MaxRequestsPerRank},
		{"queued_requests", rk.QueuedRequests, MaxRequestsPerRank},
		{"prefill_tokens", rk.PrefillTokens, MaxTokens},
		{"kv_blocks_used", rk.KVBlocksUsed, MaxBlocks},
		{"kv_blocks_total", rk.KVBlocksTotal, MaxBlocks},
		{"window_lookup_tokens", rk.WindowLookupTokens, MaxCounter},
		{"window_hit_tokens", rk.WindowHitTokens, MaxCounter},
		{"overflows", rk.Overflows, MaxCounter},
		{"evictions", rk.Evictions, MaxCounter},
	} {
		if c.v < 0 || c.v > c.max {
			return decodeErr(ErrOutOfRange, subject, field(c.name), "%d (want 0..%d)", c.v, c.max)
		}
	}
	if rk.KVBlocksUsed > rk.KVBlocksTotal {
		return decodeErr(ErrOutOfRange, subject, field("kv_blocks_used"), "%d exceeds kv_blocks_total %d", rk.KVBlocksUsed, rk.KVBlocksTotal)
	}
	for _, l := range []struct {
		name  string
		names []string
	}{{"lora_adapters", rk.LoRAAdapters}, {"lora_running", rk.LoRARunning}} {
		if len(l.names) > MaxLoRAs {
			return decodeErr(ErrOutOfRange, subject, field(l.name), "%d adapters (max %d)", len(l.names), MaxLoRAs)
		}
		for _, n := range l.names {
			if n == "" || len(n) > MaxStringLen {
				return decodeErr(ErrOutOfRange, subject, field(l.name), "adapter name of %d bytes (want 1..%d)", len(n), MaxStringLen)
			}
		}
	}
	if rk.WindowHitTokens > rk.WindowLookupTokens {
		return decodeErr(ErrOutOfRange, subject, field("window_hit_tokens"), "%d exceeds window_lookup_tokens %d", rk.WindowHitTokens, rk.WindowLookupTokens)
	}
	return nil
}

func checkURL(s string) error {
	if s == "" {
		return fmt.Errorf("empty")
	}
	if len(s) > MaxStringLen {
		return fmt.Errorf("%d bytes (max %d)", len(s), MaxStringLen)
	}
	u, err := url.Parse(s)
	if err != nil {
		return fmt.Errorf("%q: %v", s, err)
	}
	if (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" {
		return fmt.Errorf("%q: want an absolute http(s) URL", s)
	}
	return nil
}

// versionProbe reads only the version, so a future version whose other
// fields changed type is reported as a version problem, not as garbage.
type versionProbe struct {
	V *int `json:"v"`
}

// decodeJSON decodes one JSON object into dst after checking its version.
// Unknown fields are allowed (additive changes do not bump the version);
// trailing data is not.
func decodeJSON(subject string, data []byte, dst any) error {
	var p versionProbe
	if err := json.Unmarshal(data, &p); err != nil {
		return decodeErr(ErrMalformed, subject, "", "%v", err)
	}
	if p.V == nil {
		return decodeErr(ErrUnknownVersion, subject, "v", "missing")
	}
	if *p.V != Version {
		return decodeErr(ErrUnknownVersion, subject, "v", "%d (this build understands %d)", *p.V, Version)
	}
	dec := json.NewDecoder(bytes.NewReader(data))
	if err := dec.Decode(dst); err != nil {
		return decodeErr(ErrMalformed, subject, "", "%v", err)
	}
	if _, err := dec.Token(); err != io.EOF {
		return decodeErr(ErrMalformed, subject, "", "trailing data after the JSON object")
	}
	return nil
}
