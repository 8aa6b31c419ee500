package hintauth

// TensorRT-LLM's signatures, byte for byte (the default format).
//
// Sources (TensorRT-LLM, public): tensorrt_llm/serve/disagg_auth.py
// (_sign_subagent_affinity, build_subagent_affinity_headers,
// validate_subagent_affinity, _auth_payload, _sign_request,
// validate_internal_disagg_request) and tensorrt_llm/serve/conversation_id.py
// (SUBAGENT_AFFINITY_HEADER, extract_subagent_affinity_id_from_headers).
// Both signatures are
//
//	"sha256=" + lowercase hex HMAC-SHA256(key as UTF-8, M)
//	M = json.dumps(payload, sort_keys=True, separators=(",", ":")).encode("utf-8")
//
// with json.dumps' default ensure_ascii=True. The hint's payload is
//
//	{"purpose": "x-trtllm-subagent-affinity-id", "role": ServerRole.name
//	 ("CONTEXT" | "GENERATION"), "model": request.model, "conversation_id":
//	 conversation_params.conversation_id (the child's; null when absent),
//	 "subagent_affinity_id": the header value, stripped, "request_type":
//	 disaggregated_params.request_type (null without disaggregated_params),
//	 "disagg_request_id": disaggregated_params.disagg_request_id (int or null)}
//
// and the KV-transfer payload of x-trtllm-disagg-auth is
//
//	{"ctx_info_endpoint": its first element when a list (null when empty),
//	 "encoded_opaque_state": ...}
//
// sent whenever either field is not null. See DESIGN.md for how Go values
// map onto the Python ones (header values are latin-1 to Starlette).

import (
	"bytes"
	"crypto/hmac"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"math/big"
	"sort"
	"strings"
	"unicode/utf16"
)

// HeaderDisaggAuth carries the KV-transfer signature on a generation hop.
const HeaderDisaggAuth = "x-trtllm-disagg-auth"

// Format is a hint signature format.
type Format string

const (
	// FormatTRTLLM is TensorRT-LLM's "sha256=<hex>" over canonical JSON.
	FormatTRTLLM Format = "trtllm"
	// FormatTetherV1 is tether's original "v1:<base64url>" over
	// length-prefixed fields (hintauth.go), kept for migrations.
	FormatTetherV1 Format = "tether-v1"
)

// Valid reports whether f is a defined format.
func (f Format) Valid() bool { return f == FormatTRTLLM || f == FormatTetherV1 }

// trtllmPrefix starts every TensorRT-LLM signature.
const trtllmPrefix = "sha256="

// trtllmPurpose is the payload's purpose: TensorRT-LLM's
// SUBAGENT_AFFINITY_HEADER constant.
const trtllmPurpose = HeaderAffinityID

// PayloadTRTLLM returns M, the message TensorRT-LLM signs for a hint with
// these fields. The mapping from Fields:
//   - role: "CONTEXT" / "GENERATION" (ServerRole.name);
//   - conversation_id: ConversationID as text (null when "");
//   - subagent_affinity_id: AffinityID as the header bytes Starlette
//     decodes as latin-1, trimmed like Python's str.strip of that text;
//   - request_type: null for RequestAggregated (no disaggregated_params),
//     else its value;
//   - disagg_request_id: DisaggRequestID as an integer (null when "").
//
// It fails (ErrBadFields) when the fields have no TensorRT-LLM form: an
// unknown role, or a request id that is not an integer.
func PayloadTRTLLM(f Fields) ([]byte, error) {
	var role string
	switch f.Role {
	case RoleContext:
		role = "CONTEXT"
	case RoleGeneration:
		role = "GENERATION"
	default:
		return nil, fmt.Errorf("%w: role %q (want context or generation)", ErrBadFields, string(f.Role))
	}
	var id []byte
	if f.DisaggRequestID != "" {
		n, ok := new(big.Int).SetString(f.DisaggRequestID, 10)
		if !ok {
			return nil, fmt.Errorf("%w: disagg_request_id %q is not an integer", ErrBadFields, f.DisaggRequestID)
		}
		id = n.Append(nil, 10)
	}
	// Keys in sorted order (sort_keys=True).
	b := make([]byte, 0, 192+len(f.Model)+len(f.ConversationID)+len(f.AffinityID))
	b = append(b, `{"conversation_id":`...)
	if f.ConversationID == "" {
		b = append(b, "null"...)
	} else {
		b = AppendPyString(b, f.ConversationID)
	}
	b = append(b, `,"disagg_request_id":`...)
	if id == nil {
		b = append(b, "null"...)
	} else {
		b = append(b, id...)
	}
	b = append(b, `,"model":`...)
	b = AppendPyString(b, f.Model)
	b = append(b, `,"purpose":`...)
	b = AppendPyString(b, trtllmPurpose)
	b = append(b, `,"request_type":`...)
	if f.RequestType == RequestAggregated || f.RequestType == "" {
		b = append(b, "null"...)
	} else {
		b = AppendPyString(b, string(f.RequestType))
	}
	b = append(b, `,"role":`...)
	b = AppendPyString(b, role)
	b = append(b, `,"subagent_affinity_id":`...)
	b = appendPyLatin1(b, pyStrip(f.AffinityID))
	b = append(b, '}')
	return b, nil
}

// SignTRTLLM returns the x-trtllm-subagent-affinity-auth value for f:
// "sha256=" + lowercase hex HMAC. Fields without a TensorRT-LLM form get
// an error.
func SignTRTLLM(key []byte, f Fields) (string, error) {
	m, err := PayloadTRTLLM(f)
	if err != nil {
		return "", err
	}
	return trtllmSig(key, m), nil
}

// SignAs signs f in format ft.
func SignAs(ft Format, key []byte, f Fields) (string, error) {
	if ft == FormatTetherV1 {
		return Sign(key, f), nil
	}
	return SignTRTLLM(key, f)
}

func trtllmSig(key, m []byte) string {
	h := hmac.New(sha256.New, key)
	h.Write(m)
	return trtllmPrefix + hex.EncodeToString(h.Sum(nil))
}

// SignatureFormat tells which format a header value claims ("" when
// neither prefix matches).
func SignatureFormat(sig string) Format {
	switch {
	case strings.HasPrefix(sig, trtllmPrefix):
		return FormatTRTLLM
	case strings.HasPrefix(sig, versionPrefix):
		return FormatTetherV1
	}
	return ""
}

// ErrFormatNotAccepted: the signature is in a format this verifier was
// configured to refuse.
var ErrFormatNotAccepted = errors.New("hintauth: signature format not accepted")

// VerifyAny verifies sig in whichever of the accepted formats it claims
// (by its prefix), under each of keys. Errors wrap the package's errors,
// or ErrFormatNotAccepted.
func VerifyAny(accepted []Format, keys [][]byte, f Fields, sig string) error {
	if sig == "" {
		return ErrMissing
	}
	ft := SignatureFormat(sig)
	if ft == "" {
		return fmt.Errorf("%w: want %q followed by 64 lowercase hex digits (or a tether %q signature)", ErrMalformed, trtllmPrefix, versionPrefix)
	}
	ok := false
	for _, a := range accepted {
		ok = ok || a == ft
	}
	if !ok {
		return fmt.Errorf("%w: %s (accepted: %v)", ErrFormatNotAccepted, ft, accepted)
	}
	if ft == FormatTetherV1 {
		return Verify(keys, f, sig)
	}
	return VerifyTRTLLM(keys, f, sig)
}

// VerifyTRTLLM checks a "sha256=<hex>" hint signature for f under each of
// keys (constant-time comparison of the whole value, as TensorRT-LLM's
// hmac.compare_digest).
func VerifyTRTLLM(keys [][]byte, f Fields, sig string) error {
	if sig == "" {
		return ErrMissing
	}
	if err := checkTRTLLMSig(sig); err != nil {
		return err
	}
	if pyStrip(f.AffinityID) == "" {
		return fmt.Errorf("%w: empty affinity id", ErrBadFields)
	}
	m, err := PayloadTRTLLM(f)
	if err != nil {
		return err
	}
	return verifyMsg(keys, m, sig)
}

func checkTRTLLMSig(sig string) error {
	rest, ok := strings.CutPrefix(sig, trtllmPrefix)
	if !ok {
		return fmt.Errorf("%w: want %q followed by 64 lowercase hex digits", ErrMalformed, trtllmPrefix)
	}
	if len(rest) != 2*sha256.Size {
		return fmt.Errorf("%w: %d hex digits, want %d", ErrMalformed, len(rest), 2*sha256.Size)
	}
	for i := 0; i < len(rest); i++ {
		if c := rest[i]; !('0' <= c && c <= '9' || 'a' <= c && c <= 'f') {
			return fmt.Errorf("%w: not lowercase hex", ErrMalformed)
		}
	}
	return nil
}

func verifyMsg(keys [][]byte, m []byte, sig string) error {
	tried := 0
	for _, k := range keys {
		if len(k) == 0 {
			continue
		}
		tried++
		if hmac.Equal([]byte(sig), []byte(trtllmSig(k, m))) {
			return nil
		}
	}
	if tried == 0 {
		return ErrNoKey
	}
	return ErrInvalid
}

// DisaggPayload returns the message of x-trtllm-disagg-auth for a
// generation request's disaggregated_params fields ctx_info_endpoint and
// encoded_opaque_state, given as raw JSON (nil or "null": absent). need
// reports whether the request must carry the header at all (either field
// set). A list endpoint is reduced to its first element.
func DisaggPayload(ctxInfoEndpoint, encodedOpaqueState json.RawMessage) (m []byte, need bool, err error) {
	ep, err := decodeJSON(ctxInfoEndpoint)
	if err != nil {
		return nil, false, fmt.Errorf("%w: ctx_info_endpoint: %v", ErrBadFields, err)
	}
	st, err := decodeJSON(encodedOpaqueState)
	if err != nil {
		return nil, false, fmt.Errorf("%w: encoded_opaque_state: %v", ErrBadFields, err)
	}
	need = ep != nil || st != nil
	if l, ok := ep.([]any); ok {
		ep = nil
		if len(l) > 0 {
			ep = l[0]
		}
	}
	b := append([]byte(nil), `{"ctx_info_endpoint":`...)
	if b, err = AppendPyValue(b, ep); err != nil {
		return nil, false, fmt.Errorf("%w: ctx_info_endpoint: %v", ErrBadFields, err)
	}
	b = append(b, `,"encoded_opaque_state":`...)
	if b, err = AppendPyValue(b, st); err != nil {
		return nil, false, fmt.Errorf("%w: encoded_opaque_state: %v", ErrBadFields, err)
	}
	return append(b, '}'), need, nil
}

// SignDisagg returns the x-trtllm-disagg-auth value for the fields ("" when
// neither is set: no header).
func SignDisagg(key []byte, ctxInfoEndpoint, encodedOpaqueState json.RawMessage) (string, error) {
	m, need, err := DisaggPayload(ctxInfoEndpoint, encodedOpaqueState)
	if err != nil || !need {
		return "", err
	}
	return trtllmSig(key, m), nil
}

// VerifyDisagg checks x-trtllm-disagg-auth. need is false when neither
// field is set (then nothing is checked).
func VerifyDisagg(keys [][]byte, ctxInfoEndpoint, encodedOpaqueState json.RawMessage, sig string) (need bool, err error) {
	m, need, err := DisaggPayload(ctxInfoEndpoint, encodedOpaqueState)
	if err != nil || !need {
		return need, err
	}
	if sig == "" {
		return true, ErrMissing
	}
	if err := checkTRTLLMSig(sig); err != nil {
		return true, err
	}
	return true, verifyMsg(keys, m, sig)
}

func decodeJSON(raw json.RawMessage) (any, error) {
	if len(bytes.TrimSpace(raw)) == 0 {
		return nil, nil
	}
	d := json.NewDecoder(bytes.NewReader(raw))
	d.UseNumber()
	var v any
	if err := d.Decode(&v); err != nil {
		return nil, err
	}
	return v, nil
}

// AppendPyValue appends v (as decoded by encoding/json with UseNumber) the
// way Python's json.dumps(sort_keys=True, separators=(",", ":")) writes
// it. Floats are refused: Python's repr of a float is not reproduced.
func AppendPyValue(b []byte, v any) ([]byte, error) {
	switch x := v.(type) {
	case nil:
		return append(b, "null"...), nil
	case bool:
		if x {
			return append(b, "true"...), nil
		}
		return append(b, "false"...), nil
	case string:
		return AppendPyString(b, x), nil
	case json.Number:
		n, ok := new(big.Int).SetString(x.String(), 10)
		if !ok {
			return nil, fmt.Errorf("number %s is not an integer", x)
		}
		return n.Append(b, 10), nil
	case []any:
		b = append(b, '[')
		for i, e := range x {
			if i > 0 {
				b = append(b, ',')
			}
			var err error
			if b, err = AppendPyValue(b, e); err != nil {
				return nil, err
			}
		}
		return append(b, ']'), nil
	case map[string]any:
		keys := make([]string, 0, len(x))
		for k := range x {
			keys = append(keys, k)
		}
		// Python sorts str keys by code point; for valid UTF-8, byte
		// order is code point order.
		sort.Strings(keys)
		b = append(b, '{')
		for i, k := range keys {
			if i > 0 {
				b = append(b, ',')
			}
			b = append(AppendPyString(b, k), ':')
			var err error
			if b, err = AppendPyValue(b, x[k]); err != nil {
				return nil, err
			}
		}
		return append(b, '}'), nil
	}
	return nil, fmt.Errorf("unsupported value %T", v)
}

// AppendPyString appends s as Python's json.dumps writes a str with
// ensure_ascii=True: `"` and `\` escaped, \n \r \t \b \f by name, every
// other character outside ' '..'~' as \uXXXX in lowercase hex, beyond
// U+FFFF as a UTF-16 surrogate pair; `/`, `<`, `>` and `&` as they are.
// s is read as UTF-8; an invalid byte counts as U+FFFD (as encoding/json
// decodes and re-encodes such a string).
func AppendPyString(b []byte, s string) []byte {
	b = append(b, '"')
	for _, r := range s { // invalid bytes yield utf8.RuneError = U+FFFD
		b = appendPyRune(b, r)
	}
	return append(b, '"')
}

// appendPyLatin1 appends s as Python's json.dumps writes the str that
// Starlette decodes from the header bytes s (latin-1: byte = code point).
func appendPyLatin1(b []byte, s string) []byte {
	b = append(b, '"')
	for i := 0; i < len(s); i++ {
		b = appendPyRune(b, rune(s[i]))
	}
	return append(b, '"')
}

const hexDigits = "0123456789abcdef"

func appendPyRune(b []byte, r rune) []byte {
	switch r {
	case '"':
		return append(b, '\\', '"')
	case '\\':
		return append(b, '\\', '\\')
	case '\n':
		return append(b, '\\', 'n')
	case '\r':
		return append(b, '\\', 'r')
	case '\t':
		return append(b, '\\', 't')
	case '\b':
		return append(b, '\\', 'b')
	case '\f':
		return append(b, '\\', 'f')
	}
	if r >= ' ' && r <= '~' {
		return append(b, byte(r))
	}
	if r > 0xFFFF {
		hi, lo := utf16.EncodeRune(r)
		return appendU(appendU(b, hi), lo)
	}
	return appendU(b, r)
}

func appendU(b []byte, r rune) []byte {
	return append(b, '\\', 'u', hexDigits[r>>12&0xF], hexDigits[r>>8&0xF], hexDigits[r>>4&0xF], hexDigits[r&0xF])
}

// pyStrip trims what Python's str.strip() trims from the latin-1 text of
// header bytes: ASCII white space (\t \n \v \f \r, space, \x1c-\x1f), and
// the latin-1 white space \x85 and \xa0.
func pyStrip(s string) string {
	isSpace := func(c byte) bool {
		return c == ' ' || c >= '\t' && c <= '\r' || c >= 0x1c && c <= 0x1f || c == 0x85 || c == 0xa0
	}
	i, j := 0, len(s)
	for i < j && isSpace(s[i]) {
		i++
	}
	for j > i && isSpace(s[j-1]) {
		j--
	}
	return s[i:j]
}

// DisaggFormat is the payload of x-trtllm-disagg-auth a release signs.
type DisaggFormat string

const (
	// DisaggFields (the default): the two protected fields,
	// {"ctx_info_endpoint", "encoded_opaque_state"} (disagg_auth.py
	// _auth_payload of current releases); the header is sent when either
	// is set.
	DisaggFields DisaggFormat = "trtllm"
	// DisaggParams: the whole disaggregated_params as the worker's
	// pydantic model dumps it (model_dump(mode="json", exclude_none=False)
	// of the first releases with the header); the header is sent when
	// encoded_opaque_state is set. The edge signs the handoff as it
	// forwards it, so context and generation servers must run the same
	// release (the dump holds every field of their DisaggregatedParams).
	DisaggParams DisaggFormat = "trtllm-params"
)

// Valid reports whether f is a defined format.
func (f DisaggFormat) Valid() bool { return f == DisaggFields || f == DisaggParams }

// DisaggParamsPayload is the message of DisaggParams for the generation
// request's disaggregated_params (each field as raw JSON); need reports
// whether encoded_opaque_state is set (else no header is sent).
func DisaggParamsPayload(params map[string]json.RawMessage) (m []byte, need bool, err error) {
	obj := make(map[string]any, len(params))
	for k, raw := range params {
		v, err := decodeJSON(raw)
		if err != nil {
			return nil, false, fmt.Errorf("%w: %s: %v", ErrBadFields, k, err)
		}
		obj[k] = v
	}
	need = obj["encoded_opaque_state"] != nil
	if m, err = AppendPyValue(nil, obj); err != nil {
		return nil, false, fmt.Errorf("%w: %v", ErrBadFields, err)
	}
	return m, need, nil
}

// SignDisaggAs returns the x-trtllm-disagg-auth value of format f for a
// generation request's disaggregated_params ("" when the format sends no
// header for them).
func SignDisaggAs(f DisaggFormat, key []byte, params map[string]json.RawMessage) (string, error) {
	if f == DisaggParams {
		m, need, err := DisaggParamsPayload(params)
		if err != nil || !need {
			return "", err
		}
		return trtllmSig(key, m), nil
	}
	return SignDisagg(key, params["ctx_info_endpoint"], params["encoded_opaque_state"])
}
