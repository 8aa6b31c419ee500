// Package telemetry defines the NATS subjects and payloads workers publish
// and edges consume: per-rank load (which doubles as registration and
// heartbeat), KV block events, conversation evictions, and the KV dump a
// fresh or gapped edge requests to rebuild its index. It is pure encode and
// decode; the NATS I/O lives in worker (publish) and edge (subscribe).
//
// # Subjects (version 1)
//
//	tether.v1.load.<fleet>.<instance>   LoadReport, JSON, every telemetry_interval and on large changes
//	tether.v1.kv.<instance>             KVEventBatch, binary, batched per interval, sequence-numbered
//	tether.v1.evict.<instance>          Evictions, JSON, conversation affinity bindings dropped by a worker
//	tether.v1.kvdump.<instance>         request/reply: empty request, KVDump reply (binary, in parts)
//
// <fleet> is "context" or "generation"; <instance> is the worker's instance
// id, restricted to [A-Za-z0-9_-] (1..128 bytes) so it is always exactly one
// subject token. Every payload repeats its instance id and each decoder
// checks it against the subject, so a receiver never attributes a message to
// the wrong worker, and NATS per-user publish permissions
// ("tether.v1.*.w7", "tether.v1.load.*.w7") can pin each worker to its own
// subjects.
//
// # Decoding
//
// Decoders take the subject the message arrived on and validate everything:
// version, types, ranges (no negative loads, no counts beyond sane bounds),
// and instance/fleet against the subject. Every failure is a *DecodeError
// wrapping one of ErrUnknownVersion, ErrMalformed, ErrOutOfRange,
// ErrSubjectMismatch or ErrBadSubject; receivers drop the message and count
// it by DecodeError.Reason(). Decoders never panic and allocate in proportion
// to the input only.
//
// See DESIGN.md for the schemas, the KV binary layout and the sequence/epoch
// rules receivers follow to detect gaps and restarts.
package telemetry

import (
	"errors"
	"fmt"
	"strings"
)

// Version is the payload and subject version this package speaks.
const Version = 1

// FeatureLevel is the worker feature level this build advertises in its load
// reports. 1: v1 telemetry, KV dump, sub-agent hint verification available.
// 2: ranks report prefill_tokens (RankLoad.PrefillTokens).
const FeatureLevel = 2

// FeatureLevelPrefill is the first feature level whose load reports carry
// RankLoad.PrefillTokens.
const FeatureLevelPrefill = 2

// Sanity bounds enforced by the decoders (and encoders).
const (
	MaxInstanceIDLen     = 128
	MaxRanks             = 1024
	MaxLoRAs             = 1024 // adapters per rank in a load report
	MaxRequestsPerRank   = 1 << 24
	MaxTokens            = 1 << 40 // active prompt tokens on one rank
	MaxBlocks            = 1 << 34 // KV blocks on one rank
	MaxCounter           = 1 << 53 // monotonic counters (exact in float64 too)
	MaxStringLen         = 4096    // model, URL, conversation id, version
	MaxEvictionsPerMsg   = 65536
	MaxEventsPerBatch    = 1 << 20
	MaxHashesPerMessage  = 1 << 23 // 64 MiB of hashes, the NATS payload ceiling
	MaxIntervalMilli     = 3_600_000
	MaxBlockSize         = 1 << 20
	MaxFeatureLevel      = 1 << 16
	MaxDumpParts         = 1 << 16
	subjectPrefix        = "tether.v1."
	kindLoad             = "load"
	kindKV               = "kv"
	kindEvict            = "evict"
	kindKVDump           = "kvdump"
	kindPlacement        = "placement"
	kindDispatch         = "dispatch"
	kindFlow             = "flow"
	subjectTokenWildcard = "*"
)

// Fleet is the worker fleet: which edge router pool the worker belongs to.
type Fleet string

const (
	FleetContext    Fleet = "context"
	FleetGeneration Fleet = "generation"
)

// Valid reports whether f is a defined fleet.
func (f Fleet) Valid() bool { return f == FleetContext || f == FleetGeneration }

// Errors wrapped by every *DecodeError (test with errors.Is).
var (
	ErrUnknownVersion  = errors.New("unknown version")
	ErrMalformed       = errors.New("malformed payload")
	ErrOutOfRange      = errors.New("value out of range")
	ErrSubjectMismatch = errors.New("payload does not match subject")
	ErrBadSubject      = errors.New("bad subject")
)

// DecodeError describes why a message was rejected.
type DecodeError struct {
	Kind    error  // one of the Err* sentinels above
	Subject string // the subject the message arrived on
	Field   string // the offending field ("ranks[2].active_requests"), if any
	Detail  string
}

func (e *DecodeError) Error() string {
	var b strings.Builder
	b.WriteString("telemetry: ")
	if e.Subject != "" {
		b.WriteString(e.Subject)
		b.WriteString(": ")
	}
	b.WriteString(e.Kind.Error())
	if e.Field != "" {
		b.WriteString(": ")
		b.WriteString(e.Field)
	}
	if e.Detail != "" {
		b.WriteString(": ")
		b.WriteString(e.Detail)
	}
	return b.String()
}

func (e *DecodeError) Unwrap() error { return e.Kind }

// Reason is a short stable label for metrics: version, malformed, range,
// subject_mismatch or bad_subject.
func (e *DecodeError) Reason() string {
	switch e.Kind {
	case ErrUnknownVersion:
		return "version"
	case ErrMalformed:
		return "malformed"
	case ErrOutOfRange:
		return "range"
	case ErrSubjectMismatch:
		return "subject_mismatch"
	case ErrBadSubject:
		return "bad_subject"
	}
	return "unknown"
}

func decodeErr(kind error, subject, field, format string, args ...any) *DecodeError {
	return &DecodeError{Kind: kind, Subject: subject, Field: field, Detail: fmt.Sprintf(format, args...)}
}

// ValidInstanceID reports whether id can be a worker instance id: 1..128
// bytes of [A-Za-z0-9_-], so it is one NATS subject token.
func ValidInstanceID(id string) error {
	if id == "" {
		return errors.New("instance id is empty")
	}
	if len(id) > MaxInstanceIDLen {
		return fmt.Errorf("instance id is %d bytes (max %d)", len(id), MaxInstanceIDLen)
	}
	for i := 0; i < len(id); i++ {
		c := id[i]
		if !(c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' || c == '_' || c == '-') {
			return fmt.Errorf("instance id %q: character %q not allowed (use letters, digits, '_' and '-')", id, c)
		}
	}
	return nil
}

// LoadSubject is where instance publishes its load reports.
func LoadSubject(fleet Fleet, instance string) string {
	return subjectPrefix + kindLoad + "." + string(fleet) + "." + instance
}

// LoadSubjectAll matches every worker's load reports.
const LoadSubjectAll = subjectPrefix + kindLoad + ".*.*"

// KVSubject is where instance publishes its KV event batches.
func KVSubject(instance string) string { return subjectPrefix + kindKV + "." + instance }

// KVSubjectAll matches every worker's KV event batches.
const KVSubjectAll = subjectPrefix + kindKV + ".*"

// EvictSubject is where instance publishes conversation evictions.
func EvictSubject(instance string) string { return subjectPrefix + kindEvict + "." + instance }

// EvictSubjectAll matches every worker's evictions.
const EvictSubjectAll = subjectPrefix + kindEvict + ".*"

// KVDumpSubject is the request subject instance answers with a KV dump.
func KVDumpSubject(instance string) string { return subjectPrefix + kindKVDump + "." + instance }

// SubjectKind names a subject family.
type SubjectKind string

const (
	SubjectLoad   SubjectKind = kindLoad
	SubjectKV     SubjectKind = kindKV
	SubjectEvict  SubjectKind = kindEvict
	SubjectKVDump SubjectKind = kindKVDump
	// SubjectPlacement: an edge's new placements (Instance is the edge's
	// node id), heard by the other edges (placement.go).
	SubjectPlacement SubjectKind = kindPlacement
	// SubjectDispatch: the requests an edge sends to workers (Instance is
	// the edge's node id), counted by the other edges (dispatch.go).
	SubjectDispatch SubjectKind = kindDispatch
	// SubjectFlow: an edge's flow control state (Instance is the edge's
	// node id), read by the other edges (flow.go).
	SubjectFlow SubjectKind = kindFlow
)

// Subject is a parsed telemetry subject.
type Subject struct {
	Kind     SubjectKind
	Fleet    Fleet // load subjects only
	Instance string
}

// ParseSubject splits a concrete (wildcard-free) telemetry subject.
func ParseSubject(subject string) (Subject, error) {
	rest, ok := strings.CutPrefix(subject, subjectPrefix)
	if !ok {
		return Subject{}, decodeErr(ErrBadSubject, subject, "", "want prefix %q", subjectPrefix)
	}
	toks := strings.Split(rest, ".")
	var s Subject
	switch SubjectKind(toks[0]) {
	case SubjectLoad:
		if len(toks) != 3 {
			return Subject{}, decodeErr(ErrBadSubject, subject, "", "want tether.v1.load.<fleet>.<instance>")
		}
		s = Subject{Kind: SubjectLoad, Fleet: Fleet(toks[1]), Instance: toks[2]}
		if !s.Fleet.Valid() {
			return Subject{}, decodeErr(ErrBadSubject, subject, "", "fleet %q (want context or generation)", toks[1])
		}
	case SubjectKV, SubjectEvict, SubjectKVDump, SubjectPlacement, SubjectDispatch, SubjectFlow:
		if len(toks) != 2 {
			return Subject{}, decodeErr(ErrBadSubject, subject, "", "want tether.v1.%s.<instance>", toks[0])
		}
		s = Subject{Kind: SubjectKind(toks[0]), Instance: toks[1]}
	default:
		return Subject{}, decodeErr(ErrBadSubject, subject, "", "unknown kind %q", toks[0])
	}
	if err := ValidInstanceID(s.Instance); err != nil {
		return Subject{}, decodeErr(ErrBadSubject, subject, "", "%v", err)
	}
	return s, nil
}

// expectSubject parses subject and checks its kind.
func expectSubject(subject string, kind SubjectKind) (Subject, error) {
	s, err := ParseSubject(subject)
	if err != nil {
		return Subject{}, err
	}
	if s.Kind != kind {
		return Subject{}, decodeErr(ErrBadSubject, subject, "", "a %s subject, want %s", s.Kind, kind)
	}
	return s, nil
}
