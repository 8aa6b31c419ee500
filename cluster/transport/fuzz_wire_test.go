package transport

import (
	"bufio"
	"bytes"
	"encoding/binary"
	"errors"
	"io"
	"os"
	"path/filepath"
	"strconv"
	"testing"

	"github.com/tether-project/tether/fsm"
)

var testKey = []byte("0123456789abcdef-test-internal-key")

// The forwarding wire protocol's decoders take bytes from the network:
// frames (readFrame), both sides of the handshake, and the payloads of
// every operation. None may panic or allocate beyond its input; what
// decodes re-encodes to an equivalent value. Seeds: testdata/fuzz
// (regenerated with CLUSTER_WRITE_FUZZ_SEEDS=1) plus the f.Add calls.

// FuzzReadFrame: any byte stream yields frames or an error; a frame read
// re-encodes to exactly the bytes it was read from.
func FuzzReadFrame(f *testing.F) {
	for _, s := range frameSeeds(f) {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, data []byte) {
		r := bufio.NewReader(bytes.NewReader(data))
		consumed := 0
		for {
			kind, id, payload, err := readFrame(r)
			if err != nil {
				return
			}
			var buf bytes.Buffer
			w := bufio.NewWriter(&buf)
			if err := writeFrame(w, kind, id, payload); err != nil {
				t.Fatal(err)
			}
			w.Flush()
			if !bytes.Equal(buf.Bytes(), data[consumed:consumed+buf.Len()]) {
				t.Fatalf("frame at %d re-encodes differently", consumed)
			}
			consumed += buf.Len()
		}
	})
}

// FuzzHandshake: the server side fed any client hello, and the client side
// fed any server hello, never panic and never authenticate without the key.
func FuzzHandshake(f *testing.F) {
	for _, s := range handshakeSeeds(f) {
		f.Add(s, false)
		f.Add(s, true)
	}
	f.Fuzz(func(t *testing.T, data []byte, raft bool) {
		p := protoForward
		if raft {
			p = protoRaft
		}
		var out bytes.Buffer
		rw := bufio.NewReadWriter(bufio.NewReader(bytes.NewReader(data)), bufio.NewWriter(&out))
		if id, err := serverHandshake(rw, p, testKey, nil); err == nil {
			// The server's nonce is fresh, so no fixed input can carry its MAC.
			t.Fatalf("server accepted a canned hello from %q", id)
		}
		rw = bufio.NewReadWriter(bufio.NewReader(bytes.NewReader(data)), bufio.NewWriter(io.Discard))
		if err := clientHandshake(rw, p, testKey, "fuzz-client"); err == nil {
			t.Fatal("client accepted a canned server proof")
		}
	})
}

// FuzzForwardPayloads: every operation's payload decoder, and the client's
// decoders of answers and errors.
func FuzzForwardPayloads(f *testing.F) {
	for _, s := range payloadSeeds(f) {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, payload []byte) {
		if req, err := decodeProposeRequest(payload); err == nil {
			if len(req.props)+len(req.rejected) != req.count {
				t.Fatalf("%d proposals + %d rejected for a count of %d", len(req.props), len(req.rejected), req.count)
			}
			// Re-encode the decodable ones: they decode to the same events.
			ids := make([]fsm.ProposalID, len(req.props))
			evs := make([][]byte, len(req.props))
			for i, p := range req.props {
				ids[i] = p.ID
				b, err := fsm.EncodeEvent(p.Event)
				if err != nil {
					t.Fatalf("a decoded event does not encode: %v", err)
				}
				evs[i] = b
			}
			again, err := decodeProposeRequest(encodeProposeRequest(ids, evs))
			if err != nil || len(again.props) != len(req.props) || len(again.rejected) != 0 {
				t.Fatalf("re-encoded request: %v", err)
			}
		}
		if index, results, err := decodeProposeResponse(payload, 1); err == nil {
			back, _, err := decodeProposeResponse(encodeProposeResponse(index, results), 1)
			if err != nil || back != index {
				t.Fatalf("re-encoded response: %v", err)
			}
		}
		if id, addr, fwd, err := decodeMembership(payload); err == nil {
			b := appendStr(appendStr(nil, id), addr)
			if _, _, fwd2, err := decodeMembership(append(b, boolByte(fwd))); err != nil || fwd2 != fwd {
				t.Fatalf("re-encoded membership request: %v", err)
			}
		}
		_, _, _ = decodeRemovedNotice(payload)
		for code := byte(0); code <= codeFailed+1; code++ {
			err := decodeError("peer", code, payload)
			var re *RemoteError
			if !errors.As(err, &re) {
				t.Fatalf("decodeError(%d) is %T", code, err)
			}
		}
	})
}

func frameSeeds(t testing.TB) [][]byte {
	var buf bytes.Buffer
	w := bufio.NewWriter(&buf)
	_ = writeFrame(w, byte(OpPropose), 1, payloadSeeds(t)[0])
	_ = writeFrame(w, codeOK, 2, nil)
	_ = writeFrame(w, byte(OpStatus), 3, []byte{0, 0, 0, 50})
	w.Flush()
	var huge [frameHeaderSize]byte
	binary.BigEndian.PutUint32(huge[:], maxFrameSize+1)
	return [][]byte{buf.Bytes(), huge[:], {0, 0, 0, 9, byte(OpRemove), 0, 0, 0, 0, 0, 0, 0, 7}, {0, 0, 0, 3}}
}

func handshakeSeeds(t testing.TB) [][]byte {
	hello := func(id string, mac []byte) []byte {
		b := binary.BigEndian.AppendUint16(nil, uint16(len(id)))
		b = append(b, id...)
		b = append(b, make([]byte, nonceSize)...)
		return append(b, mac...)
	}
	server := append([]byte(protoForward.magic), make([]byte, nonceSize)...)
	return [][]byte{
		hello("n1", make([]byte, macSize)),
		hello("", nil),
		{0xff, 0xff},
		append(append([]byte(nil), server...), handshakeOK),
		append(append(append([]byte(nil), server...), handshakeRefused, 0, 5), "nope!"...),
		append([]byte(protoRaft.magic), make([]byte, nonceSize+1+macSize)...),
	}
}

func payloadSeeds(t testing.TB) [][]byte {
	var ids []fsm.ProposalID
	var evs [][]byte
	for i, ev := range []fsm.Event{
		fsm.Bind{Fleet: fsm.FleetContext, Key: "k", Instance: "w1"},
		fsm.Evict{Fleet: fsm.FleetGeneration, Key: "k", Reason: fsm.EvictTTL, Epoch: fsm.MakeEpoch(9, 1)},
		fsm.RankObserved{Fleet: fsm.FleetContext, Key: "k", Epoch: 3, Rank: 1},
	} {
		b, err := fsm.EncodeEvent(ev)
		if err != nil {
			t.Fatal(err)
		}
		ids = append(ids, fsm.ProposalID{byte(i + 1)})
		evs = append(evs, b)
	}
	ids = append(ids, fsm.ProposalID{9})
	evs = append(evs, []byte{0x41, 1, 2}) // a type this build does not know
	res := encodeProposeResponse(42, []fsm.Result{{Status: fsm.StatusApplied, Found: true, Created: true,
		Binding: fsm.Binding{Fleet: fsm.FleetContext, Key: "k", Instance: "w1", Epoch: 7, Rank: 2, HasRank: true}}})
	member := append(appendStr(appendStr(nil, "n3"), "127.0.0.1:7400"), 1)
	removed := binary.BigEndian.AppendUint64(appendStr(nil, "n2"), 17)
	notLeader := appendStr(appendStr(appendStr(nil, "not the leader"), "n0"), "127.0.0.1:1")
	return [][]byte{encodeProposeRequest(ids, evs), res, member, removed, notLeader, {0xff, 0xff, 0xff, 0xff, 0x0f}, nil}
}

// TestWriteWireFuzzSeeds writes the seeds above to testdata/fuzz when
// CLUSTER_WRITE_FUZZ_SEEDS=1 (after a protocol change); otherwise it checks
// that the committed corpus exists.
func TestWriteWireFuzzSeeds(t *testing.T) {
	hs := handshakeSeeds(t)
	sets := map[string][]string{}
	for _, s := range frameSeeds(t) {
		sets["FuzzReadFrame"] = append(sets["FuzzReadFrame"], "[]byte("+strconv.Quote(string(s))+")\n")
	}
	for _, s := range payloadSeeds(t) {
		sets["FuzzForwardPayloads"] = append(sets["FuzzForwardPayloads"], "[]byte("+strconv.Quote(string(s))+")\n")
	}
	for i, s := range hs {
		sets["FuzzHandshake"] = append(sets["FuzzHandshake"], "[]byte("+strconv.Quote(string(s))+")\nbool("+strconv.FormatBool(i%2 == 1)+")\n")
	}
	for name, seeds := range sets {
		dir := filepath.Join("testdata", "fuzz", name)
		if os.Getenv("CLUSTER_WRITE_FUZZ_SEEDS") != "1" {
			if entries, err := os.ReadDir(dir); err != nil || len(entries) == 0 {
				t.Fatalf("no committed seed corpus in %s (run with CLUSTER_WRITE_FUZZ_SEEDS=1): %v", dir, err)
			}
			continue
		}
		if err := os.MkdirAll(dir, 0o755); err != nil {
			t.Fatal(err)
		}
		for i, s := range seeds {
			if err := os.WriteFile(filepath.Join(dir, "seed-"+strconv.Itoa(i)), []byte("go test fuzz v1\n"+s), 0o644); err != nil {
				t.Fatal(err)
			}
		}
	}
}

// A frame's memory follows the bytes that arrive, not the length it claims.
func TestReadFrameLargeAndTruncated(t *testing.T) {
	big := bytes.Repeat([]byte("0123456789abcdef"), 3<<16) // 3 MiB
	var buf bytes.Buffer
	w := bufio.NewWriter(&buf)
	if err := writeFrame(w, byte(OpPropose), 5, big); err != nil {
		t.Fatal(err)
	}
	w.Flush()
	kind, id, payload, err := readFrame(bufio.NewReader(bytes.NewReader(buf.Bytes())))
	if err != nil || kind != byte(OpPropose) || id != 5 || !bytes.Equal(payload, big) {
		t.Fatalf("3 MiB frame: kind %d id %d, %d bytes, %v", kind, id, len(payload), err)
	}
	// A header claiming 60 MiB followed by 10 bytes: an error, and readN
	// never held more than its first step.
	var h [frameHeaderSize]byte
	binary.BigEndian.PutUint32(h[:], 60<<20)
	if _, _, _, err := readFrame(bufio.NewReader(bytes.NewReader(append(h[:], make([]byte, 10)...)))); !errors.Is(err, io.ErrUnexpectedEOF) {
		t.Fatalf("truncated large frame: %v", err)
	}
}
