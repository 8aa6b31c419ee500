package hintauth

import (
	"encoding/hex"
	"errors"
	"strings"
	"testing"
)

var testKey = []byte("tether-test-key-0123456789abcdef")

func contextFields() Fields {
	return Fields{
		Role:            RoleContext,
		Model:           "llama-3.1-70b",
		ConversationID:  "child-a",
		AffinityID:      "parent-1",
		RequestType:     RequestContextOnly,
		DisaggRequestID: "disagg-42",
	}
}

// The vectors were computed independently (Python hmac/hashlib/struct) from
// the encoding written in the package documentation; any change to the
// encoding breaks them, which is the point: edges and workers of different
// builds must agree byte for byte.
func TestVectors(t *testing.T) {
	gen := contextFields()
	gen.Role, gen.RequestType = RoleGeneration, RequestGenerationOnly
	vectors := []struct {
		name      string
		key       []byte
		f         Fields
		canonical string
		macHex    string
		header    string
	}{
		{
			name:      "context",
			key:       testKey,
			f:         contextFields(),
			canonical: "0000001b7465746865722f7375626167656e742d616666696e6974792f763100000007636f6e746578740000000d6c6c616d612d332e312d373062000000076368696c642d6100000008706172656e742d310000000c636f6e746578745f6f6e6c79000000096469736167672d3432",
			macHex:    "1776eb34be105264e4f2388dc6d701b06cc71dc319207de552eeaab481c099ca",
			header:    "v1:F3brNL4QUmTk8jiNxtcBsGzHHcMZIH3lUu6qtIHAmco",
		},
		{
			name:      "generation",
			key:       testKey,
			f:         gen,
			canonical: "0000001b7465746865722f7375626167656e742d616666696e6974792f76310000000a67656e65726174696f6e0000000d6c6c616d612d332e312d373062000000076368696c642d6100000008706172656e742d310000000f67656e65726174696f6e5f6f6e6c79000000096469736167672d3432",
			macHex:    "347b749a3825dfb813c75f2785ed8bcf7b1365f246ebe0821568d8e58706f273",
			header:    "v1:NHt0mjgl37gTx18nhe2Lz3sTZfJG6-CCFWjY5YcG8nM",
		},
		{
			name:      "empty fields",
			key:       []byte("k"),
			f:         Fields{Role: RoleContext, Model: "m", AffinityID: "p", RequestType: RequestAggregated},
			canonical: "0000001b7465746865722f7375626167656e742d616666696e6974792f763100000007636f6e74657874000000016d0000000000000001700000000a6167677265676174656400000000",
			macHex:    "3ee900fa20e20eb89d41c6e3d787b3774d36cd2c9bd682ced61f5d5ec3d81389",
			header:    "v1:PukA-iDiDridQcbj14ezd002zSyb1oLO1h9dXsPYE4k",
		},
	}
	for _, v := range vectors {
		t.Run(v.name, func(t *testing.T) {
			if got := hex.EncodeToString(AppendCanonical(nil, v.f)); got != v.canonical {
				t.Errorf("canonical encoding\n got %s\nwant %s", got, v.canonical)
			}
			if got := hex.EncodeToString(mac(v.key, v.f)); got != v.macHex {
				t.Errorf("mac = %s, want %s", got, v.macHex)
			}
			if got := Sign(v.key, v.f); got != v.header {
				t.Errorf("Sign = %s, want %s", got, v.header)
			}
			if err := Verify([][]byte{v.key}, v.f, v.header); err != nil {
				t.Errorf("Verify(vector) = %v", err)
			}
		})
	}
}

// The length prefixes keep field boundaries: moving bytes between adjacent
// fields changes the encoding.
func TestCanonicalUnambiguous(t *testing.T) {
	a := contextFields()
	b := a
	a.ConversationID, a.AffinityID = "ab", "c"
	b.ConversationID, b.AffinityID = "a", "bc"
	if string(AppendCanonical(nil, a)) == string(AppendCanonical(nil, b)) {
		t.Fatal("different field splits encode identically")
	}
	if Sign(testKey, a) == Sign(testKey, b) {
		t.Fatal("different field splits sign identically")
	}
}

func TestVerifyCases(t *testing.T) {
	oldKey := []byte("previous-key-abcdefghijklmnop")
	newKey := []byte("current-key-0123456789abcdefgh")
	base := contextFields()
	sig := Sign(newKey, base)
	genBase := base
	genBase.Role, genBase.RequestType = RoleGeneration, RequestGenerationOnly

	tamper := func(mut func(*Fields)) Fields { f := base; mut(&f); return f }
	cases := []struct {
		name string
		keys [][]byte
		f    Fields
		sig  string
		want error // nil = accepted
	}{
		{"valid context", [][]byte{newKey}, base, sig, nil},
		{"valid generation", [][]byte{newKey}, genBase, Sign(newKey, genBase), nil},
		{"valid aggregated without request id", [][]byte{newKey},
			tamper(func(f *Fields) { f.RequestType, f.DisaggRequestID = RequestAggregated, "" }),
			Sign(newKey, tamper(func(f *Fields) { f.RequestType, f.DisaggRequestID = RequestAggregated, "" })), nil},
		{"tampered affinity id", [][]byte{newKey}, tamper(func(f *Fields) { f.AffinityID = "parent-2" }), sig, ErrInvalid},
		{"tampered child conversation", [][]byte{newKey}, tamper(func(f *Fields) { f.ConversationID = "child-b" }), sig, ErrInvalid},
		{"tampered role", [][]byte{newKey}, tamper(func(f *Fields) { f.Role = RoleGeneration }), sig, ErrInvalid},
		{"tampered model", [][]byte{newKey}, tamper(func(f *Fields) { f.Model = "llama-3.1-8b" }), sig, ErrInvalid},
		{"tampered request type", [][]byte{newKey}, tamper(func(f *Fields) { f.RequestType = RequestGenerationOnly }), sig, ErrInvalid},
		{"tampered request id", [][]byte{newKey}, tamper(func(f *Fields) { f.DisaggRequestID = "disagg-43" }), sig, ErrInvalid},
		{"case matters", [][]byte{newKey}, tamper(func(f *Fields) { f.AffinityID = "Parent-1" }), sig, ErrInvalid},
		{"wrong key", [][]byte{[]byte("some-other-key")}, base, sig, ErrInvalid},
		{"signed with another key", [][]byte{newKey}, base, Sign([]byte("attacker"), base), ErrInvalid},
		{"generation signature on context request", [][]byte{newKey}, base, Sign(newKey, genBase), ErrInvalid},
		{"missing", [][]byte{newKey}, base, "", ErrMissing},
		{"no version", [][]byte{newKey}, base, strings.TrimPrefix(sig, "v1:"), ErrMalformed},
		{"unknown version", [][]byte{newKey}, base, "v2:" + strings.TrimPrefix(sig, "v1:"), ErrMalformed},
		{"truncated", [][]byte{newKey}, base, sig[:len(sig)-1], ErrMalformed},
		{"extended", [][]byte{newKey}, base, sig + "A", ErrMalformed},
		{"padded", [][]byte{newKey}, base, sig + "=", ErrMalformed},
		{"standard base64 alphabet", [][]byte{newKey}, base, "v1:" + strings.Repeat("+", 43), ErrMalformed},
		{"hex instead of base64", [][]byte{newKey}, base, "v1:" + strings.Repeat("ab", 32), ErrMalformed},
		{"bad trailing bits", [][]byte{newKey}, base, sig[:len(sig)-1] + flipLastChar(sig), ErrMalformed},
		{"rotation: previous key accepted", [][]byte{newKey, oldKey}, base, Sign(oldKey, base), nil},
		{"rotation: current key accepted", [][]byte{newKey, oldKey}, base, Sign(newKey, base), nil},
		{"rotation: removed key rejected", [][]byte{newKey}, base, Sign(oldKey, base), ErrInvalid},
		{"empty keys skipped", [][]byte{nil, newKey}, base, sig, nil},
		{"no keys", nil, base, sig, ErrNoKey},
		{"only empty keys", [][]byte{{}}, base, Sign(nil, base), ErrNoKey},
		{"unknown role", [][]byte{newKey}, tamper(func(f *Fields) { f.Role = "" }), Sign(newKey, tamper(func(f *Fields) { f.Role = "" })), ErrBadFields},
		{"unknown request type", [][]byte{newKey}, tamper(func(f *Fields) { f.RequestType = "prefill" }), Sign(newKey, tamper(func(f *Fields) { f.RequestType = "prefill" })), ErrBadFields},
		{"empty affinity id", [][]byte{newKey}, tamper(func(f *Fields) { f.AffinityID = "" }), Sign(newKey, tamper(func(f *Fields) { f.AffinityID = "" })), ErrBadFields},
	}
	sentinels := []error{ErrMissing, ErrMalformed, ErrInvalid, ErrBadFields, ErrNoKey}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			err := Verify(c.keys, c.f, c.sig)
			if c.want == nil {
				if err != nil {
					t.Fatalf("Verify = %v, want accepted", err)
				}
				return
			}
			if !errors.Is(err, c.want) {
				t.Fatalf("Verify = %v, want %v", err, c.want)
			}
			for _, s := range sentinels {
				if s != c.want && errors.Is(err, s) {
					t.Fatalf("Verify = %v also matches %v; reasons must be distinct", err, s)
				}
			}
		})
	}
}

// flipLastChar returns a different final character that decodes to the same
// first 32 bytes only if non-canonical trailing bits were accepted.
func flipLastChar(sig string) string {
	last := sig[len(sig)-1]
	// 43 base64 chars carry 258 bits; the last character's low 2 bits are
	// padding and must be zero in the strict encoding.
	const alphabet = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-_"
	i := strings.IndexByte(alphabet, last)
	return string(alphabet[i^1])
}

func TestParseSignatureMessages(t *testing.T) {
	_, err := ParseSignature("v2:abc")
	if err == nil || !strings.Contains(err.Error(), `unsupported version "v2"`) {
		t.Fatalf("v2 error = %v, want unsupported version", err)
	}
	_, err = ParseSignature("v1:abc")
	if err == nil || !strings.Contains(err.Error(), "3 characters, want 43") {
		t.Fatalf("short error = %v, want a length message", err)
	}
}

func BenchmarkVerify(b *testing.B) {
	f := contextFields()
	keys := [][]byte{[]byte("current"), testKey}
	sig := Sign(testKey, f)
	b.ReportAllocs()
	for b.Loop() {
		if err := Verify(keys, f, sig); err != nil {
			b.Fatal(err)
		}
	}
}
