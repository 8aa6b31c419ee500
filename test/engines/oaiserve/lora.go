package oaiserve

import (
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"slices"
	"sort"
	"strconv"
	"strings"
	"time"
)

// LoRA serving as vLLM does it (vllm serve --enable-lora --lora-modules
// name=path --max-loras N; VLLM_ALLOW_RUNTIME_LORA_UPDATING=True adds POST
// /v1/load_lora_adapter and /v1/unload_lora_adapter): a request whose model
// names a registered adapter runs under it; each rank holds at most
// MaxLoRAs adapters in GPU slots (least recently used replaced) and keys
// its prefix cache by the adapter's name (vLLM puts lora_name in every
// block's hash); /v1/models lists adapters with root = path and parent =
// the base model (serving_models.py); /metrics carries
// vllm:lora_requests_info (vllm/v1/metrics/loggers.py): labels max_lora,
// running_lora_adapters and waiting_lora_adapters (names joined by
// commas), value the time the label set was last current, one series per
// label set ever seen.

// loraState is the stand-in's adapters (under Server.mu).
type loraState struct {
	paths   map[string]string // registered adapter → path, in registration order below
	order   []string
	slots   [][]string       // per rank, least recently used first
	running []map[string]int // per rank: adapter → requests running
	loads   int
	series  map[[3]string]float64 // (max_lora, running, waiting) → last current time
}

func (s *Server) initLoRA() {
	if !s.opts.EnableLoRA() {
		return
	}
	n := s.opts.DataParallelSize
	l := &loraState{paths: map[string]string{}, slots: make([][]string, n), running: make([]map[string]int, n), series: map[[3]string]float64{}}
	for i := range l.running {
		l.running[i] = map[string]int{}
	}
	for _, m := range s.opts.LoRAModules {
		name, path, ok := strings.Cut(m, "=")
		if !ok {
			path = name
		}
		l.paths[name] = path
		l.order = append(l.order, name)
	}
	s.lora = l
}

// EnableLoRA: the server serves adapters (--enable-lora).
func (o Options) EnableLoRA() bool { return len(o.LoRAModules) > 0 || o.RuntimeLoRA }

func (o Options) maxLoRAs() int { return max(o.MaxLoRAs, 1) } // vLLM's default max_loras is 1

// adapterOf resolves a request's model: "" the base model, an adapter, or
// ok=false (vLLM answers 404 "The model `x` does not exist.").
func (s *Server) adapterOf(model string) (string, bool) {
	if model == "" || model == s.opts.Model {
		return "", true
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.lora == nil {
		return "", false
	}
	_, ok := s.lora.paths[model]
	return model, ok
}

// sglangAdapter resolves a request's adapter as SGLang does
// (python/sglang/srt/entrypoints/openai/serving_base.py
// _parse_model_parameter and _resolve_lora_path; examples/runtime/lora.py;
// docs advanced_features/lora.md): a body lora_path names the adapter and
// takes precedence; else a model "<base>:<adapter>" names it after its
// first colon; a model without one is the base model whatever its name
// (SGLang does not check it: a model naming an adapter alone runs on the
// base model). An adapter it does not hold fails the request
// (tokenizer_manager.py: the LoRA registry's "not loaded"), as msg.
func (s *Server) sglangAdapter(model string, top map[string]json.RawMessage) (adapter, msg string) {
	if raw, ok := top["lora_path"]; ok && !isNullJSON(raw) {
		if err := json.Unmarshal(raw, &adapter); err != nil {
			return "", "lora_path: Input should be a valid string"
		}
	} else if _, name, ok := strings.Cut(model, ":"); ok {
		adapter = name
	}
	if adapter == "" {
		return "", ""
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.lora == nil {
		return "", "LoRA is not enabled. Please set `--enable-lora` to use LoRA adapters."
	}
	if _, ok := s.lora.paths[adapter]; !ok {
		return "", fmt.Sprintf("The following requested LoRA adapters are not loaded: %s", adapter)
	}
	return adapter, ""
}

// startAdapterLocked puts adapter in a slot of rank (a load when it was
// not there) and counts it running.
func (s *Server) startAdapterLocked(rank int, adapter string) {
	l := s.lora
	if adapter == "" || l == nil {
		return
	}
	slots := l.slots[rank]
	if i := slices.Index(slots, adapter); i >= 0 {
		slots = slices.Delete(slots, i, i+1)
	} else {
		l.loads++
		if len(slots) >= s.opts.maxLoRAs() {
			// The least recently used idle adapter makes room (a real engine
			// would queue the request while every slot is running; the
			// stand-in answers at once, so none stays running long).
			victim := 0
			for i, a := range slots {
				if l.running[rank][a] == 0 {
					victim = i
					break
				}
			}
			slots = slices.Delete(slots, victim, victim+1)
		}
	}
	l.slots[rank] = append(slots, adapter)
	l.running[rank][adapter]++
	s.noteLoRALocked()
}

func (s *Server) endAdapterLocked(rank int, adapter string) {
	l := s.lora
	if adapter == "" || l == nil {
		return
	}
	if l.running[rank][adapter]--; l.running[rank][adapter] <= 0 {
		delete(l.running[rank], adapter)
	}
	s.noteLoRALocked()
}

// noteLoRALocked records the current label set of vllm:lora_requests_info
// (the engine sets it at every scheduler step).
func (s *Server) noteLoRALocked() {
	l := s.lora
	var running []string
	for _, m := range l.running {
		for a := range m {
			running = append(running, a)
		}
	}
	sort.Strings(running)
	running = slices.Compact(running)
	key := [3]string{strconv.Itoa(s.opts.maxLoRAs()), strings.Join(running, ","), ""}
	l.series[key] = float64(time.Now().UnixNano()) / 1e9
}

// AdapterLoads counts adapters loaded into a slot so far.
func (s *Server) AdapterLoads() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.lora == nil {
		return 0
	}
	return s.lora.loads
}

// HoldsAdapter reports whether rank holds adapter in a slot.
func (s *Server) HoldsAdapter(rank int, adapter string) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.lora != nil && slices.Contains(s.lora.slots[rank], adapter)
}

func (s *Server) loraCards(created int64) []any {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.lora == nil {
		return nil
	}
	var out []any
	owner := "vllm"
	if s.opts.Engine == SGLang {
		owner = "sglang"
	}
	for _, a := range s.lora.order {
		out = append(out, map[string]any{"id": a, "object": "model", "created": created, "owned_by": owner,
			"root": s.lora.paths[a], "parent": s.opts.Model, "max_model_len": nil, "permission": []any{}})
	}
	return out
}

// loraMetrics appends vllm:lora_requests_info.
func (s *Server) loraMetrics(b *strings.Builder) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.lora == nil {
		return
	}
	s.noteLoRALocked()
	fmt.Fprintf(b, "# HELP vllm:lora_requests_info Running stats on lora requests.\n# TYPE vllm:lora_requests_info gauge\n")
	keys := make([][3]string, 0, len(s.lora.series))
	for k := range s.lora.series {
		keys = append(keys, k)
	}
	sort.Slice(keys, func(i, j int) bool { return s.lora.series[keys[i]] < s.lora.series[keys[j]] })
	for _, k := range keys {
		fmt.Fprintf(b, "vllm:lora_requests_info{max_lora=%q,running_lora_adapters=%q,waiting_lora_adapters=%q} %s\n",
			k[0], k[1], k[2], strconv.FormatFloat(s.lora.series[k], 'f', -1, 64))
	}
}

// loadAdapter is POST /v1/load_lora_adapter {lora_name, lora_path}
// (serving_models.py load_lora_adapter): 200 with a text answer, 400 when
// a field is missing or the adapter is already loaded.
func (s *Server) loadAdapter(w http.ResponseWriter, r *http.Request) {
	var req struct {
		Name string `json:"lora_name"`
		Path string `json:"lora_path"`
	}
	b, _ := io.ReadAll(io.LimitReader(r.Body, 1<<20))
	if err := json.Unmarshal(b, &req); err != nil {
		writeJSON(w, http.StatusBadRequest, s.errorBody(http.StatusBadRequest, "BadRequestError", "invalid JSON: "+err.Error()))
		return
	}
	if req.Name == "" || req.Path == "" {
		writeJSON(w, http.StatusBadRequest, s.errorBody(http.StatusBadRequest, "InvalidUserInput", "Both 'lora_name' and 'lora_path' must be provided."))
		return
	}
	s.mu.Lock()
	_, dup := s.lora.paths[req.Name]
	if !dup {
		s.lora.paths[req.Name] = req.Path
		s.lora.order = append(s.lora.order, req.Name)
	}
	s.mu.Unlock()
	if dup {
		writeJSON(w, http.StatusBadRequest, s.errorBody(http.StatusBadRequest, "InvalidUserInput",
			fmt.Sprintf("The lora adapter '%s' has already been loaded. If you want to load the adapter in place, set 'load_inplace' to True.", req.Name)))
		return
	}
	w.Header().Set("Content-Type", "text/plain; charset=utf-8")
	fmt.Fprintf(w, "Success: LoRA adapter '%s' added successfully.", req.Name)
}

// loraIDLocked is the adapter's lora_id as vLLM's KV events carry it: the
// integer id the server gave the adapter when it registered it (its place
// in registration order, from 1).
func (s *Server) loraIDLocked(adapter string) any {
	if s.lora == nil {
		return nil
	}
	if i := slices.Index(s.lora.order, adapter); i >= 0 {
		return i + 1
	}
	return nil
}
