package worker

import (
	"encoding/json"
	"errors"
	"net/http"

	"github.com/tether-project/tether/internal/convid"
	"github.com/tether-project/tether/internal/hintauth"
	"github.com/tether-project/tether/worker/engine"
)

// Hint verification outcomes, used as metric labels.
const (
	hintIgnored   = "ignored"   // headers present but not applicable (legacy mode, plain aggregated request)
	hintVerified  = "verified"  // signature valid: the affinity id is used
	hintMissing   = "missing"   // affinity id without a signature
	hintMalformed = "malformed" // signature not a v1 value
	hintInvalid   = "invalid"   // wrong key, or signed for other fields
	hintBadFields = "bad_fields"
	hintNoKey     = "no_key" // this worker has no key to verify with
)

// verifyHint applies the trust rule of docs/subagent-routing.md to the sub-agent headers and
// returns the affinity id to schedule by ("" for none).
//
//   - ignore_subagent_hints: the headers are ignored entirely (a worker predating
//     sub-agent hints).
//   - No server_role configured and an ordinary aggregated request: the
//     headers are ignored; the request routes by its own conversation.
//   - Otherwise the role is server_role, or inferred from the request type
//     (context_only → context, generation_only → generation). The inferred
//     role only selects which signature to check: a request carrying either
//     header must have a valid signature for that role, or it is rejected
//     (401 missing, 403 malformed/invalid).
func (s *Server) verifyHint(h http.Header, p *parsedRequest) (string, *apiError) {
	affinity := convid.Header(h, hintauth.HeaderAffinityID)
	sig := convid.Header(h, hintauth.HeaderAffinityAuth)
	if affinity == "" && sig == "" {
		return "", nil
	}
	if s.cfg.IgnoreSubagentHints {
		s.metrics.hints.WithLabelValues(hintIgnored).Inc()
		return "", nil
	}
	role, reqType := s.hintRole(p)
	if role == "" {
		s.metrics.hints.WithLabelValues(hintIgnored).Inc()
		return "", nil
	}
	err := hintauth.VerifyAny(s.hintFormats, s.keys, signedFields(p, role, reqType, affinity, sig), sig)
	if err == nil {
		s.metrics.hints.WithLabelValues(hintVerified).Inc()
		return affinity, nil
	}
	outcome, e := hintRefusal(err, affinity, sig, role, reqType)
	s.metrics.hints.WithLabelValues(outcome).Inc()
	s.metrics.hintFailures.WithLabelValues(outcome).Inc()
	return "", e
}

// hintRole is the role whose signature a hinted request must carry, and its
// request type: server_role, else the one the request type implies (""
// for an aggregated request: the hint is ignored).
func (s *Server) hintRole(p *parsedRequest) (hintauth.Role, hintauth.RequestType) {
	reqType := hintauth.RequestAggregated
	switch p.phase {
	case engine.PhaseContextOnly:
		reqType = hintauth.RequestContextOnly
	case engine.PhaseGenerationOnly:
		reqType = hintauth.RequestGenerationOnly
	}
	if role := s.cfg.ServerRole; role != "" {
		return role, reqType
	}
	switch reqType {
	case hintauth.RequestContextOnly:
		return hintauth.RoleContext, reqType
	case hintauth.RequestGenerationOnly:
		return hintauth.RoleGeneration, reqType
	}
	return "", reqType
}

// signedFields are the values a hint's signature covers, as the format of
// sig signs them.
func signedFields(p *parsedRequest, role hintauth.Role, reqType hintauth.RequestType, affinity, sig string) hintauth.Fields {
	var disaggID string
	if p.disagg != nil {
		disaggID = p.disagg.DisaggRequestID.text
	}
	f := hintauth.Fields{
		Role:            role,
		Model:           p.model,
		ConversationID:  p.conversationID,
		AffinityID:      affinity,
		RequestType:     reqType,
		DisaggRequestID: disaggID,
	}
	if hintauth.SignatureFormat(sig) == hintauth.FormatTRTLLM {
		// TensorRT-LLM signs the values as its request model holds them
		// (tensorrt_llm/serve/disagg_auth.py): the body's
		// conversation_params.conversation_id as is when the body has
		// conversation_params, and the raw request_type (null without
		// disaggregated_params).
		if p.convParams {
			f.ConversationID = p.bodyConvID
		}
		f.RequestType = hintauth.RequestAggregated
		if p.disagg != nil {
			f.RequestType = hintauth.RequestType(p.disagg.RequestType)
		}
	}
	return f
}

// hintRefusal is the metric outcome and the client's error of a hint whose
// signature did not verify (err).
func hintRefusal(err error, affinity, sig string, role hintauth.Role, reqType hintauth.RequestType) (string, *apiError) {
	const code = "invalid_subagent_affinity_signature"
	switch {
	case errors.Is(err, hintauth.ErrMissing):
		return hintMissing, newAPIError(http.StatusUnauthorized, "authentication_error", "missing_subagent_affinity_signature", hintauth.HeaderAffinityAuth,
			"%s is set but %s is missing: sub-agent affinity must be signed by the edge", hintauth.HeaderAffinityID, hintauth.HeaderAffinityAuth)
	case errors.Is(err, hintauth.ErrMalformed), errors.Is(err, hintauth.ErrFormatNotAccepted):
		return hintMalformed, newAPIError(http.StatusForbidden, "permission_error", code, hintauth.HeaderAffinityAuth,
			"malformed sub-agent affinity signature: %v", err)
	case errors.Is(err, hintauth.ErrBadFields):
		msg := "sub-agent affinity signature cannot be verified: %v"
		if affinity == "" {
			msg = "%s is set without " + hintauth.HeaderAffinityID + " (%v)"
			return hintBadFields, newAPIError(http.StatusForbidden, "permission_error", code, hintauth.HeaderAffinityID, msg, hintauth.HeaderAffinityAuth, err)
		}
		return hintBadFields, newAPIError(http.StatusForbidden, "permission_error", code, hintauth.HeaderAffinityAuth, msg, err)
	case errors.Is(err, hintauth.ErrNoKey):
		return hintNoKey, newAPIError(http.StatusForbidden, "permission_error", code, hintauth.HeaderAffinityAuth,
			"this worker has no internal_request_auth_key, so it cannot accept sub-agent affinity hints")
	}
	return hintInvalid, newAPIError(http.StatusForbidden, "permission_error", code, hintauth.HeaderAffinityAuth,
		"invalid sub-agent affinity signature (%s format) for role %s, request type %s: not signed with this worker's internal_request_auth_key for this request's model, conversation and disaggregated request id",
		hintauth.SignatureFormat(sig), role, reqType)
}

// verifyDisaggAuth checks x-trtllm-disagg-auth on a generation_only
// request whose disaggregated_params carry encoded_opaque_state or
// ctx_info_endpoint, as TensorRT-LLM's workers do
// (tensorrt_llm/serve/disagg_auth.py validate_internal_disagg_request):
// without a key configured the request is accepted (TensorRT-LLM warns);
// with one, a missing or wrong signature is refused (403). The handoff of
// edges predating that protocol (opaque_state, unsigned) is accepted only
// while hint_signature_formats lists tether-v1 (docs/upgrades.md).
func (s *Server) verifyDisaggAuth(h http.Header, p *parsedRequest) *apiError {
	if p.phase != engine.PhaseGenerationOnly || p.disagg == nil {
		return nil
	}
	if p.legacyHandoff {
		if !s.cfg.acceptsTetherV1() {
			return newAPIError(http.StatusBadRequest, "invalid_request_error", "legacy_disaggregated_params", "disaggregated_params.opaque_state",
				"disaggregated_params.opaque_state is the handoff of edges predating the TensorRT-LLM protocol; this worker accepts only encoded_opaque_state (hint_signature_formats does not list tether-v1)")
		}
		return nil
	}
	if len(s.keys) == 0 {
		return nil
	}
	var state json.RawMessage
	if p.disagg.EncodedOpaqueState != nil {
		state, _ = json.Marshal(*p.disagg.EncodedOpaqueState)
	}
	_, err := hintauth.VerifyDisagg(s.keys, p.disagg.CtxInfoEndpoint, state, h.Get(hintauth.HeaderDisaggAuth))
	if err == nil {
		return nil
	}
	s.metrics.hintFailures.WithLabelValues("disagg_auth").Inc()
	return newAPIError(http.StatusForbidden, "permission_error", "invalid_disagg_auth", hintauth.HeaderDisaggAuth,
		"invalid internal disaggregated request authentication (%s): the encoded_opaque_state/ctx_info_endpoint of this generation_only request are not signed with this worker's internal_request_auth_key: %v", hintauth.HeaderDisaggAuth, err)
}
