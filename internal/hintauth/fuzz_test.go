package hintauth

import (
	"errors"
	"testing"
)

// FuzzVerify feeds arbitrary header values and fields to Verify. It must
// never panic, must return one of the documented errors, and may accept a
// signature only if it is exactly what Sign produces for the fields.
func FuzzVerify(f *testing.F) {
	base := contextFields()
	f.Add(Sign(testKey, base), string(base.Role), base.Model, base.ConversationID, base.AffinityID, string(base.RequestType), base.DisaggRequestID)
	f.Add("", "context", "m", "c", "p", "aggregated", "")
	f.Add("v1:", "generation", "m", "c", "p", "generation_only", "1")
	f.Add("v2:AAAA", "context", "", "", "p", "context_only", "")
	f.Add("v1:====", "x", "m", "c", "p", "aggregated", "")
	f.Fuzz(func(t *testing.T, sig, role, model, conv, affinity, reqType, reqID string) {
		fields := Fields{Role: Role(role), Model: model, ConversationID: conv, AffinityID: affinity, RequestType: RequestType(reqType), DisaggRequestID: reqID}
		err := Verify([][]byte{testKey}, fields, sig)
		if err == nil {
			if sig != Sign(testKey, fields) {
				t.Fatalf("accepted %q, which Sign does not produce", sig)
			}
			return
		}
		known := false
		for _, s := range []error{ErrMissing, ErrMalformed, ErrInvalid, ErrBadFields, ErrNoKey} {
			known = known || errors.Is(err, s)
		}
		if !known {
			t.Fatalf("Verify returned an undocumented error: %v", err)
		}
		// A valid signature for valid fields always verifies.
		if fields.Validate() == nil {
			if err := Verify([][]byte{testKey}, fields, Sign(testKey, fields)); err != nil {
				t.Fatalf("own signature rejected: %v", err)
			}
		}
	})
}

// FuzzParseSignature checks that any accepted header value round-trips: it is
// the canonical form of the MAC it decodes to.
func FuzzParseSignature(f *testing.F) {
	f.Add(Sign(testKey, contextFields()))
	f.Add("v1:AAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAA")
	f.Add("v1:AAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAB")
	f.Add("v9:x")
	f.Add(":")
	f.Fuzz(func(t *testing.T, sig string) {
		raw, err := ParseSignature(sig)
		if err != nil {
			if raw != nil {
				t.Fatal("error with a result")
			}
			return
		}
		if len(raw) != macLen {
			t.Fatalf("accepted %d-byte MAC", len(raw))
		}
		if got := versionPrefix + encodeMAC(raw); got != sig {
			t.Fatalf("accepted non-canonical %q (canonical %q)", sig, got)
		}
	})
}
