package hftok

// Encoded is a text with its token ids and the points where encoding a
// longer text that starts the same way may resume (EncodeFrom).
type Encoded struct {
	Text string
	IDs  []uint32
	// cuts are (byte offset in Text, number of IDs) right after each added
	// token: encoding never looks across an added token, so Text[:off]
	// always encodes to IDs[:n].
	cuts []cut
}

type cut struct{ off, n int }

// Bytes is the memory e holds, for callers that bound a cache of them.
func (e *Encoded) Bytes() int {
	if e == nil {
		return 0
	}
	return len(e.Text) + 4*cap(e.IDs) + 16*cap(e.cuts) + 64
}

// EncodeFrom encodes text, reusing the ids of prev up to the last added
// token that lies in the prefix text shares with prev.Text (a chat prompt's
// turns end in added tokens: the next turn re-encodes only what is new).
// prev may be nil. The result equals Encode(text) token for token.
func (t *Tokenizer) EncodeFrom(prev *Encoded, text string) *Encoded {
	e := &Encoded{Text: text}
	start := 0
	if prev != nil {
		common := commonPrefix(prev.Text, text)
		// A match of an added token starting before a cut could, in the new
		// text, extend past it: resume only where every match window lies
		// in the common prefix.
		limit := common - t.maxAdded
		for i := len(prev.cuts) - 1; i >= 0; i-- {
			if c := prev.cuts[i]; c.off <= limit {
				e.IDs = append(make([]uint32, 0, c.n+(len(text)-c.off)/3), prev.IDs[:c.n]...)
				e.cuts = append(e.cuts, prev.cuts[:i+1]...)
				start = c.off
				break
			}
		}
	}
	e.IDs = t.appendCuts(e.IDs, text, start, func(off, n int) { e.cuts = append(e.cuts, cut{off, n}) })
	return e
}

func commonPrefix(a, b string) int {
	n := min(len(a), len(b))
	i := 0
	for i+8 <= n && a[i:i+8] == b[i:i+8] {
		i += 8
	}
	for i < n && a[i] == b[i] {
		i++
	}
	return i
}
