package fsm

import (
	"encoding/binary"
	"fmt"
)

// CacheAnswers are engines' answers about their prefix caches, each beside
// what the answering edge's KV index had claimed: for every request the
// edge placed by the index (a new placement or a sticky turn), the prompt
// tokens the index said the chosen instance held and the cached tokens the
// engine's usage reported. An edge batches its answers (one event per
// touch interval) and records them off the request path. Like Evidence it
// is optional and changes no state: replicas and builds that do not know it
// skip it. `tether audit accuracy` grades the index from it; `tether audit
// tune` replays its requests (Prefix says which prompts share which
// prefix).
type CacheAnswers struct {
	Edge    string
	Answers []CacheAnswer
}

// CacheAnswer is one answer.
type CacheAnswer struct {
	Fleet    Fleet
	Instance string
	// ConversationID is the request's conversation ("" none), as Link
	// events name conversations.
	ConversationID string
	Source         KVSource
	// AtUnixMilli is when the answer arrived, by the edge's clock.
	AtUnixMilli     int64
	BlockSize       uint32
	PromptTokens    uint32
	PredictedTokens uint32 // what the edge's KV index said the instance held
	CachedTokens    uint32 // what the engine said it held (usage cached_tokens)
	// Blocks is the prompt's whole blocks as the edge cut them; Prefix
	// fingerprints the prompt: the low 32 bits of its chained block hash at
	// each of AnswerPrefixPositions(Blocks), so two answers share exactly
	// the fingerprints of the positions their prompts share.
	Blocks uint32
	Prefix []uint32
}

// KVSource is where an edge's KV index learned an instance's cache.
type KVSource uint8

const (
	KVSourceUnknown KVSource = iota
	// KVSourceEngineEvents: the engine's own KV events (read by the edge,
	// or translated by a tether worker proxy).
	KVSourceEngineEvents
	// KVSourceTetherWorker: a tether worker's simulated engine's events.
	KVSourceTetherWorker
	// KVSourceShadow: the edge's model of a static engine's cache.
	KVSourceShadow
	// KVSourcePredictionsOnly: nothing but the edge's own short-lived
	// predictions of the prompts it sent there.
	KVSourcePredictionsOnly
)

var kvSourceNames = [...]string{"unknown", "engine_events", "tether_worker", "shadow", "predictions_only"}

func (s KVSource) String() string {
	if int(s) < len(kvSourceNames) {
		return kvSourceNames[s]
	}
	return fmt.Sprintf("kv_source(%d)", uint8(s))
}

// ParseKVSource parses a KVSource's name.
func ParseKVSource(name string) (KVSource, error) {
	for i, n := range kvSourceNames {
		if n == name {
			return KVSource(i), nil
		}
	}
	return 0, fmt.Errorf("unknown kv source %q (want engine_events, tether_worker, shadow or predictions_only)", name)
}

// MaxCacheAnswers bounds one CacheAnswers event; MaxAnswerPrefix one
// answer's fingerprints (AnswerPrefixPositions never gives more).
const (
	MaxCacheAnswers = 4096
	MaxAnswerPrefix = 64
)

// AnswerPrefixPositions are the 1-based block positions of a prompt of n
// blocks that CacheAnswer.Prefix fingerprints: 1, 2, 3, 4, 6, 8, 12, 16,
// 24, … (the powers of two and one and a half times them) up to n, and n.
// Two prompts sharing k leading blocks share the fingerprints of every
// position up to k, so a replay built from them shares at least two thirds
// of what they shared.
func AnswerPrefixPositions(n int) []int {
	var out []int
	for p := 1; p <= n && p > 0; p *= 2 {
		out = append(out, p)
		if q := p + p/2; q > p && q <= n {
			out = append(out, q)
		}
	}
	if n > 0 && (len(out) == 0 || out[len(out)-1] != n) {
		out = append(out, n)
	}
	return out
}

func (CacheAnswers) Type() EventType { return TypeCacheAnswers }

// cacheAnswers changes no state: the event exists for audit.
func (tx *txn) cacheAnswers(CacheAnswers) Result { return Result{Status: StatusApplied} }

func encodeCacheAnswers(w *fieldWriter, e CacheAnswers) {
	w.str("Edge", e.Edge)
	if len(e.Answers) > MaxCacheAnswers && w.err == nil {
		w.err = fmt.Errorf("fsm: encode %v: %d answers, the limit is %d", e.Type(), len(e.Answers), MaxCacheAnswers)
	}
	w.uvarint(uint64(len(e.Answers)))
	for i := range e.Answers {
		a := &e.Answers[i]
		w.u8(uint8(a.Fleet))
		w.str("Answers.Instance", a.Instance)
		w.str("Answers.ConversationID", a.ConversationID)
		w.u8(uint8(a.Source))
		w.varint(a.AtUnixMilli)
		w.uvarint(uint64(a.BlockSize))
		w.uvarint(uint64(a.PromptTokens))
		w.uvarint(uint64(a.PredictedTokens))
		w.uvarint(uint64(a.CachedTokens))
		w.uvarint(uint64(a.Blocks))
		if len(a.Prefix) > MaxAnswerPrefix && w.err == nil {
			w.err = fmt.Errorf("fsm: encode %v: %d prefix fingerprints, the limit is %d", e.Type(), len(a.Prefix), MaxAnswerPrefix)
		}
		w.uvarint(uint64(len(a.Prefix)))
		for _, f := range a.Prefix {
			w.b = binary.LittleEndian.AppendUint32(w.b, f)
		}
	}
}

func decodeCacheAnswers(r *reader) (e CacheAnswers) {
	e.Edge = r.str("CacheAnswers.Edge")
	n := r.Count("CacheAnswers.Answers count", MaxCacheAnswers, 9)
	if r.Failed() || n == 0 {
		return
	}
	e.Answers = make([]CacheAnswer, n)
	for i := range e.Answers {
		a := &e.Answers[i]
		a.Fleet = Fleet(r.U8("CacheAnswers.Fleet"))
		a.Instance = r.str("CacheAnswers.Instance")
		a.ConversationID = r.str("CacheAnswers.ConversationID")
		a.Source = KVSource(r.U8("CacheAnswers.Source"))
		a.AtUnixMilli = r.Varint("CacheAnswers.AtUnixMilli")
		a.BlockSize = r.Uint32("CacheAnswers.BlockSize")
		a.PromptTokens = r.Uint32("CacheAnswers.PromptTokens")
		a.PredictedTokens = r.Uint32("CacheAnswers.PredictedTokens")
		a.CachedTokens = r.Uint32("CacheAnswers.CachedTokens")
		a.Blocks = r.Uint32("CacheAnswers.Blocks")
		if m := r.Count("CacheAnswers.Prefix count", MaxAnswerPrefix, 4); m > 0 {
			a.Prefix = make([]uint32, m)
			for j := range a.Prefix {
				b := r.Bytes(4, "CacheAnswers.Prefix")
				if b == nil {
					break
				}
				a.Prefix[j] = binary.LittleEndian.Uint32(b)
			}
		}
		if r.Failed() {
			e.Answers = e.Answers[:i]
			return
		}
	}
	return
}

// CacheAnswerJSON is one answer as audit and the admin API print it.
type CacheAnswerJSON struct {
	Fleet           string   `json:"fleet"`
	Instance        string   `json:"instance"`
	ConversationID  string   `json:"conversation_id,omitempty"`
	Source          string   `json:"source"`
	AtUnixMilli     int64    `json:"at_unix_ms"`
	BlockSize       uint32   `json:"block_size"`
	PromptTokens    uint32   `json:"prompt_tokens"`
	PredictedTokens uint32   `json:"predicted_tokens"`
	CachedTokens    uint32   `json:"cached_tokens"`
	Blocks          uint32   `json:"blocks"`
	Prefix          []uint32 `json:"prefix"`
}

type cacheAnswersJSON struct {
	Edge    string            `json:"edge"`
	Answers []CacheAnswerJSON `json:"answers"`
}

func describeCacheAnswers(e CacheAnswers) any {
	out := cacheAnswersJSON{Edge: e.Edge, Answers: make([]CacheAnswerJSON, len(e.Answers))}
	for i, a := range e.Answers {
		p := a.Prefix
		if p == nil {
			p = []uint32{}
		}
		out.Answers[i] = CacheAnswerJSON{Fleet: a.Fleet.String(), Instance: a.Instance, ConversationID: a.ConversationID,
			Source: a.Source.String(), AtUnixMilli: a.AtUnixMilli, BlockSize: a.BlockSize, PromptTokens: a.PromptTokens,
			PredictedTokens: a.PredictedTokens, CachedTokens: a.CachedTokens, Blocks: a.Blocks, Prefix: p}
	}
	return out
}
