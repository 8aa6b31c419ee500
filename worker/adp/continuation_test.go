package adp

import (
	"testing"
)

// tokens returns n tokens derived from tag, distinct for distinct tags.
func tokens(tag uint32, n int) []uint32 {
	out := make([]uint32, n)
	for i := range out {
		out[i] = tag*100_000 + uint32(i)
	}
	return out
}

func cat(parts ...[]uint32) []uint32 {
	var out []uint32
	for _, p := range parts {
		out = append(out, p...)
	}
	return out
}

// An agent loop without a session key: each call's prompt is the previous
// call's prompt plus the model's answer and a tool result. Every call runs
// on the rank of the first, under every policy, while new conversations
// that share only the system prompt are still spread by the policy.
func TestUnkeyedContinuationFollowsItsRank(t *testing.T) {
	for _, p := range append(allPlacements, KVAware) {
		t.Run(p.String(), func(t *testing.T) {
			s := newScheduler(t, Options{Ranks: 4, ConversationAffinity: true, Placement: p})
			system := tokens(1, 200)
			call := cat(system, tokens(2, 7)) // the user's turn ends inside a block
			d := s.Place(Request{Prompt: call, PromptTokens: len(call)})
			s.Finish(&d.Ticket)
			home := d.Rank
			if d.Reason != ReasonUnbound {
				t.Fatalf("first call: %+v, want a placement by the policy", d)
			}
			for i := range 5 {
				call = cat(call, tokens(uint32(10+i), 30+i)) // answer and tool result
				d = s.Place(Request{Prompt: call, PromptTokens: len(call)})
				s.Finish(&d.Ticket)
				if d.Rank != home || d.Reason != ReasonContinues || d.HomeRank != home {
					t.Fatalf("call %d: %+v, want rank %d (continues)", i+2, d, home)
				}
			}
			// Another conversation with the same system prompt and a user
			// turn of the same length continues nothing.
			other := cat(system, tokens(3, 7))
			d = s.Place(Request{Prompt: other, PromptTokens: len(other)})
			if d.Reason != ReasonUnbound {
				t.Fatalf("a new conversation sharing the system prompt: %+v, want the policy's placement", d)
			}
			s.Finish(&d.Ticket)
			if c := s.Counters(); c.Continuations != 5 {
				t.Fatalf("counters %+v, want 5 continuations", c)
			}
		})
	}
}

// round_robin stays the default for new conversations: unkeyed prompts
// that continue nothing rotate.
func TestUnkeyedNewConversationsStillRotate(t *testing.T) {
	s := newScheduler(t, Options{Ranks: 2, ConversationAffinity: true})
	seen := map[int]bool{}
	for i := range 2 {
		pr := tokens(uint32(20+i), 40)
		d := s.Place(Request{Prompt: pr, PromptTokens: len(pr)})
		s.Finish(&d.Ticket)
		seen[d.Rank] = true
	}
	if len(seen) != 2 {
		t.Fatalf("two new unkeyed conversations on ranks %v, want both ranks", seen)
	}
}

func TestUnkeyedContinuationOverflowAndLimits(t *testing.T) {
	// A saturated home overflows for this call; the next goes home again.
	s := newScheduler(t, Options{Ranks: 2, ConversationAffinity: true, MaxRequestsPerRank: 1})
	call := tokens(1, 40)
	d := s.Place(Request{Prompt: call})
	home := d.Rank
	s.Finish(&d.Ticket)
	busy := s.Place(Request{ConversationID: "busy", PromptTokens: 1})
	if busy.Rank != home {
		// Put the busy conversation on the home rank.
		s.Finish(&busy.Ticket)
		busy = s.Place(Request{ConversationID: "busy2", PromptTokens: 1})
	}
	if busy.Rank != home {
		t.Fatalf("could not load rank %d", home)
	}
	call = cat(call, tokens(2, 20))
	d = s.Place(Request{Prompt: call})
	if !d.Overflow || d.HomeRank != home || d.Rank == home || d.Reason != ReasonContinues {
		t.Fatalf("saturated home: %+v", d)
	}
	s.Finish(&d.Ticket)
	s.Finish(&busy.Ticket)

	// Without affinity the prompt is not read.
	off := newScheduler(t, Options{Ranks: 2})
	a := off.Place(Request{Prompt: tokens(5, 40)})
	b := off.Place(Request{Prompt: cat(tokens(5, 40), tokens(6, 5))})
	if a.Rank == b.Rank || b.Reason != ReasonUnbound {
		t.Fatalf("affinity off: %+v then %+v, want round robin", a, b)
	}
	// The index is bounded by MaxSessions: the oldest prompt is forgotten.
	lim := newScheduler(t, Options{Ranks: 2, ConversationAffinity: true, MaxSessions: 2})
	for i := range 3 {
		d := lim.Place(Request{Prompt: tokens(uint32(30+i), 20)})
		lim.Finish(&d.Ticket)
	}
	if lim.conts.len() != 2 {
		t.Fatalf("index holds %d prompts, want 2", lim.conts.len())
	}
	if d := lim.Place(Request{Prompt: cat(tokens(30, 20), tokens(9, 3))}); d.Reason != ReasonUnbound {
		t.Fatalf("continuing a forgotten prompt: %+v", d)
	}
	if d := lim.Place(Request{Prompt: cat(tokens(32, 20), tokens(9, 3))}); d.Reason != ReasonContinues {
		t.Fatalf("continuing a remembered prompt: %+v", d)
	}
	// Prompts shorter than a block are not remembered.
	short := newScheduler(t, Options{Ranks: 2, ConversationAffinity: true})
	short.Place(Request{Prompt: tokens(40, ContinuationBlock-1)})
	if short.conts.len() != 0 {
		t.Fatal("a prompt shorter than a block was remembered")
	}
}
