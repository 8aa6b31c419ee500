package respid

import (
	"errors"
	"strings"
	"testing"
	"time"
)

func TestMintParseRoundTrip(t *testing.T) {
	c := NewCodec([]byte("cluster-key-0123456789"))
	in := ID{Fleet: 1, Instance: "gen-2", Rank: 3, BootID: 0xdeadbeef, Conversation: "sess-é/1",
		Upstream: "resp_abc123", Edge: "edge-3", Minted: time.UnixMilli(1_700_000_000_123), Continued: true}
	s := c.Mint(in)
	if !strings.HasPrefix(s, Prefix) || !Minted(s) {
		t.Fatalf("id %q lacks the prefix", s)
	}
	for _, r := range s {
		if !(r >= 'a' && r <= 'z' || r >= 'A' && r <= 'Z' || r >= '0' && r <= '9' || r == '_' || r == '-') {
			t.Fatalf("id %q has %q: not safe in a URL path", s, r)
		}
	}
	got, err := c.Parse(s)
	if err != nil {
		t.Fatal(err)
	}
	if got != in {
		t.Fatalf("got %+v, want %+v", got, in)
	}
	if d, err := Decode(s); err != nil || d != in {
		t.Fatalf("Decode: %+v, %v", d, err)
	}
	// No rank and no conversation survive too.
	in.Rank, in.Conversation, in.BootID = -1, "", 0
	if got, err := c.Parse(c.Mint(in)); err != nil || got != in {
		t.Fatalf("got %+v, %v, want %+v", got, err, in)
	}
}

func TestParseRefusesOtherKeysAndGarbage(t *testing.T) {
	a, b := NewCodec([]byte("key-a")), NewCodec([]byte("key-b"))
	s := a.Mint(ID{Instance: "ctx-1", Upstream: "resp_x", Rank: -1})
	if _, err := b.Parse(s); !errors.Is(err, ErrForged) {
		t.Fatalf("another cluster's id: %v, want ErrForged", err)
	}
	// Any changed byte fails authentication or decoding, never panics.
	for i := len(Prefix); i < len(s); i++ {
		c := []byte(s)
		c[i] ^= 1
		if _, err := a.Parse(string(c)); err == nil {
			t.Fatalf("changing byte %d of %q still parses", i, s)
		}
	}
	for _, bad := range []string{"", "resp_abc", Prefix, Prefix + "!!!", Prefix + strings.Repeat("A", MaxLen), "resp_t1AAAA"} {
		if _, err := a.Parse(bad); !errors.Is(err, ErrNotMinted) {
			t.Errorf("%q: %v, want ErrNotMinted", bad, err)
		}
	}
}

func FuzzDecode(f *testing.F) {
	c := NewCodec(nil)
	f.Add(c.Mint(ID{Instance: "i", Upstream: "u", Rank: 1}))
	f.Add("resp_t1AAAAAAAAAAAAAAAAAAAAAAAAAA")
	f.Fuzz(func(t *testing.T, s string) {
		id, err := Decode(s)
		if err != nil {
			return
		}
		// What decodes re-mints to an id that decodes to the same fields.
		back, err := Decode(c.Mint(id))
		if err != nil || back != id {
			t.Fatalf("re-mint of %+v: %+v, %v", id, back, err)
		}
	})
}

// Conversation ids: conv_ and the format's version, read back whole, and
// no response id passes for one (nor the other way round): each kind has
// its own key.
func TestConversationIDs(t *testing.T) {
	c := NewCodec([]byte("cluster-key-0123456789"))
	in := ID{Fleet: 2, Instance: "gen-1", Rank: 1, BootID: 7, Upstream: "conv_abc", Edge: "edge-1", Minted: time.UnixMilli(1_700_000_000_000)}
	s := c.MintConversation(in)
	if !strings.HasPrefix(s, "conv_") || !strings.HasPrefix(s, ConversationPrefix) {
		t.Fatalf("conversation id %q", s)
	}
	if got, err := c.ParseConversation(s); err != nil || got != in {
		t.Fatalf("got %+v, %v, want %+v", got, err, in)
	}
	if got, err := DecodeConversation(s); err != nil || got != in {
		t.Fatalf("DecodeConversation: %+v, %v", got, err)
	}
	if _, err := c.Parse(s); !errors.Is(err, ErrNotMinted) {
		t.Fatalf("a conversation id parsed as a response id: %v", err)
	}
	resp := c.Mint(in)
	if _, err := c.ParseConversation(resp); !errors.Is(err, ErrNotMinted) {
		t.Fatalf("a response id parsed as a conversation id: %v", err)
	}
	// Same payload under the response key, conversation prefix: forged.
	forged := ConversationPrefix + strings.TrimPrefix(resp, Prefix)
	if _, err := c.ParseConversation(forged); !errors.Is(err, ErrForged) {
		t.Fatalf("a response id's MAC under the conversation prefix: %v", err)
	}
	if _, err := NewCodec([]byte("other")).ParseConversation(s); !errors.Is(err, ErrForged) {
		t.Fatalf("another cluster's conversation id: %v", err)
	}
	if _, err := c.ParseConversation("conv_68b1"); !errors.Is(err, ErrNotMinted) {
		t.Fatalf("OpenAI's id: %v", err)
	}
}
