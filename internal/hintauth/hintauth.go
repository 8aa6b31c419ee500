// Package hintauth signs and verifies the sub-agent affinity hint that an
// edge forwards to its workers. The edge routes a sub-agent's request by its
// parent's conversation id (the affinity id); the worker must not trust that
// id from a client, so the edge signs it with the shared
// internal_request_auth_key and the worker verifies the signature before
// handing the id to its attention-DP scheduler.
//
// # Formats
//
// The default format is TensorRT-LLM's own ("sha256=<hex>" over canonical
// JSON; trtllm.go), so trtllm-serve workers verify the edges' hints. This
// file is tether's earlier format, version 1, still accepted by workers
// during a migration (docs/upgrades.md).
//
// # Headers
//
//	x-trtllm-subagent-affinity-id:   the affinity id (the parent's conversation id)
//	x-trtllm-subagent-affinity-auth: the signature, "v1:" + base64url(HMAC) (no padding)
//
// # Canonical encoding (version 1)
//
// The signature is HMAC-SHA256(key, M) where M is the concatenation of seven
// fields, in this fixed order, each written as a 4-byte big-endian length
// followed by the field's bytes:
//
//  1. purpose tag, the constant "tether/subagent-affinity/v1"
//  2. worker role: "context" or "generation"
//  3. model
//  4. the child's conversation id (the request's own conversation)
//  5. the affinity id (the parent's conversation id)
//  6. request type: "context_only", "generation_only" or "aggregated"
//  7. disaggregated request id ("" when the request has none)
//
// Length prefixes make the encoding unambiguous (no two field lists share an
// encoding, whatever bytes they contain); the purpose tag keeps a MAC made
// with the same key for another purpose (or a later version of this one)
// from verifying here. Strings are used as given: no trimming, no case or
// Unicode normalisation, so signer and verifier must pass identical bytes.
//
// The header value is "v1:" followed by the unpadded base64url encoding of
// the 32-byte MAC (43 characters). Verification compares MACs in constant
// time (hmac.Equal) against every configured key, which is how keys rotate
// without downtime: workers accept the current and previous keys, then the
// edges switch to the new key, then the old key is removed.
package hintauth

import (
	"crypto/hmac"
	"crypto/sha256"
	"encoding/base64"
	"encoding/binary"
	"errors"
	"fmt"
	"strings"
)

// Header names carrying the hint between edge and worker.
const (
	HeaderAffinityID   = "x-trtllm-subagent-affinity-id"
	HeaderAffinityAuth = "x-trtllm-subagent-affinity-auth"
)

// PurposeV1 is the first field of every version-1 signed message.
const PurposeV1 = "tether/subagent-affinity/v1"

// versionPrefix starts every version-1 header value.
const versionPrefix = "v1:"

// macLen is the HMAC-SHA256 output size; encodedMACLen its unpadded base64 length.
const (
	macLen        = sha256.Size
	encodedMACLen = 43
)

// Role is the worker role a signature is bound to.
type Role string

const (
	RoleContext    Role = "context"
	RoleGeneration Role = "generation"
)

// Valid reports whether r is one of the defined roles.
func (r Role) Valid() bool { return r == RoleContext || r == RoleGeneration }

// RequestType is the disaggregated request type a signature is bound to.
type RequestType string

const (
	RequestContextOnly    RequestType = "context_only"
	RequestGenerationOnly RequestType = "generation_only"
	RequestAggregated     RequestType = "aggregated"
)

// Valid reports whether t is one of the defined request types.
func (t RequestType) Valid() bool {
	return t == RequestContextOnly || t == RequestGenerationOnly || t == RequestAggregated
}

// Fields are the values a hint signature binds together.
type Fields struct {
	Role            Role        // role of the worker the request is sent to
	Model           string      // the request's model
	ConversationID  string      // the child's own conversation id
	AffinityID      string      // the parent's conversation id (the hint)
	RequestType     RequestType // context_only, generation_only or aggregated
	DisaggRequestID string      // disaggregated request id; "" if none
}

// Errors returned by Verify. Callers distinguish them with errors.Is to
// answer clearly (missing → 401, the others → 403).
var (
	// ErrMissing: the affinity id was sent without a signature.
	ErrMissing = errors.New("hintauth: signature missing")
	// ErrMalformed: the signature is not a well-formed version-1 value.
	ErrMalformed = errors.New("hintauth: signature malformed")
	// ErrInvalid: well formed, but no configured key produced it for these fields.
	ErrInvalid = errors.New("hintauth: signature invalid")
	// ErrBadFields: the fields to verify are incomplete or out of range
	// (e.g. an unknown role), so no signature can be valid for them.
	ErrBadFields = errors.New("hintauth: bad fields")
	// ErrNoKey: the verifier has no (non-empty) key configured.
	ErrNoKey = errors.New("hintauth: no key configured")
)

// AppendCanonical appends the version-1 canonical encoding of f (see the
// package documentation) to dst.
func AppendCanonical(dst []byte, f Fields) []byte {
	for _, s := range [...]string{PurposeV1, string(f.Role), f.Model, f.ConversationID, f.AffinityID, string(f.RequestType), f.DisaggRequestID} {
		dst = binary.BigEndian.AppendUint32(dst, uint32(len(s)))
		dst = append(dst, s...)
	}
	return dst
}

func mac(key []byte, f Fields) []byte {
	h := hmac.New(sha256.New, key)
	h.Write(AppendCanonical(make([]byte, 0, 128+len(f.Model)+len(f.ConversationID)+len(f.AffinityID)+len(f.DisaggRequestID)), f))
	return h.Sum(nil)
}

// Sign returns the header value ("v1:" + base64url MAC) signing f with key.
// Fields that Verify would reject (see Fields.Validate) still get a
// signature, but no verifier accepts it.
func Sign(key []byte, f Fields) string {
	return versionPrefix + encodeMAC(mac(key, f))
}

func encodeMAC(raw []byte) string { return base64.RawURLEncoding.EncodeToString(raw) }

// Validate reports whether f can be verified: a defined role and request
// type, and a non-empty affinity id.
func (f Fields) Validate() error {
	if !f.Role.Valid() {
		return fmt.Errorf("%w: role %q (want context or generation)", ErrBadFields, string(f.Role))
	}
	if !f.RequestType.Valid() {
		return fmt.Errorf("%w: request type %q (want context_only, generation_only or aggregated)", ErrBadFields, string(f.RequestType))
	}
	if f.AffinityID == "" {
		return fmt.Errorf("%w: empty affinity id", ErrBadFields)
	}
	return nil
}

// ParseSignature decodes a header value to the raw MAC, rejecting anything
// that is not exactly "v1:" followed by 43 base64url characters.
func ParseSignature(sig string) ([]byte, error) {
	if sig == "" {
		return nil, ErrMissing
	}
	rest, ok := strings.CutPrefix(sig, versionPrefix)
	if !ok {
		if v, _, found := strings.Cut(sig, ":"); found && len(v) <= 8 && strings.HasPrefix(v, "v") {
			return nil, fmt.Errorf("%w: unsupported version %q (want v1)", ErrMalformed, v)
		}
		return nil, fmt.Errorf("%w: want \"v1:\" followed by base64url", ErrMalformed)
	}
	if len(rest) != encodedMACLen {
		return nil, fmt.Errorf("%w: MAC is %d characters, want %d", ErrMalformed, len(rest), encodedMACLen)
	}
	raw, err := base64.RawURLEncoding.Strict().DecodeString(rest)
	if err != nil || len(raw) != macLen {
		return nil, fmt.Errorf("%w: MAC is not unpadded base64url", ErrMalformed)
	}
	return raw, nil
}

// Verify checks sig against f under each of keys (current first, then
// previous keys during a rotation; empty keys are skipped). It returns nil
// when one key matches, else an error wrapping ErrMissing, ErrMalformed,
// ErrInvalid, ErrBadFields or ErrNoKey.
func Verify(keys [][]byte, f Fields, sig string) error {
	got, err := ParseSignature(sig)
	if err != nil {
		return err
	}
	if err := f.Validate(); err != nil {
		return err
	}
	tried := 0
	for _, k := range keys {
		if len(k) == 0 {
			continue
		}
		tried++
		if hmac.Equal(got, mac(k, f)) {
			return nil
		}
	}
	if tried == 0 {
		return ErrNoKey
	}
	return ErrInvalid
}
