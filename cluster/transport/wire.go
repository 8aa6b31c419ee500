package transport

import (
	"bufio"
	"crypto/hmac"
	"crypto/rand"
	"crypto/sha256"
	"encoding/binary"
	"fmt"
	"io"
	"slices"

	"github.com/tether-project/tether/internal/binread"
)

// The forwarding protocol (see DESIGN.md). After the stream byte 'F':
//
//	server → client  "TFW1" | server nonce [32]
//	client → server  u16 id length | client node id | client nonce [32] |
//	                 HMAC-SHA256(key, server nonce || client node id || "tether-forward-v1") [32]
//	server → client  u8 0 | HMAC-SHA256(key, client nonce || server nonce || "tether-forward-v1-server") [32]
//	             or  u8 1 | u16 length | reason, then close
//
// A Raft stream (byte 'R') starts with the same handshake, with magic
// "TRF1" and labels "tether-raft-v1"/"tether-raft-v1-server", and then
// belongs to hashicorp/raft's transport. A forwarding connection goes on
// with length-prefixed frames in both directions:
//
//	request   u32 length | u8 op   | u64 request id | payload
//	response  u32 length | u8 code | u64 request id | payload
//
// where length counts everything after itself. Requests on one connection
// are answered in any order (matched by id), so one connection carries many
// concurrent calls.
const (
	nonceSize = 32
	macSize   = sha256.Size
	// MaxNodeIDLen bounds a node id on the wire (and so in the config).
	MaxNodeIDLen     = 1024
	frameHeaderSize  = 4 + 1 + 8
	maxFrameSize     = 64 << 20
	handshakeOK      = 0
	handshakeRefused = 1
)

// Op is a forwarding request's operation.
type Op byte

// Request operations.
const (
	OpPropose  Op = 1 // uvarint n | n × (proposal id [16] | uvarint len | encoded event) → u64 index | fsm.EncodeResults
	OpAddVoter Op = 2 // str id | str addr | u8 hop → ok
	OpRemove   Op = 3 // str id | u8 hop → ok
	OpTransfer Op = 4 // str id | u8 hop → ok
	OpStatus   Op = 5 // → JSON Status
	OpRemoved  Op = 6 // str id | u64 index: the leader tells a node it was removed → ok
	// A joining node asks to be added with its configured suffrage (same
	// payload as OpAddVoter): the leader adds a voter while fewer than
	// Autopilot.Voters exist, a non-voter otherwise (OpJoinNonvoter always).
	OpJoinVoter    Op = 7
	OpJoinNonvoter Op = 8
)

// String names the operation (membership operations as errors name them).
func (op Op) String() string {
	switch op {
	case OpPropose:
		return "propose"
	case OpAddVoter:
		return "add voter"
	case OpRemove:
		return "remove server"
	case OpTransfer:
		return "transfer leadership"
	case OpStatus:
		return "status"
	case OpRemoved:
		return "removed notice"
	case OpJoinVoter:
		return "join as voter"
	case OpJoinNonvoter:
		return "join as non-voter"
	}
	return fmt.Sprintf("op %d", byte(op))
}

// Response codes.
const (
	codeOK          byte = 0
	codeNotLeader   byte = 1 // str message | str leader id | str leader addr
	codeUnavailable byte = 2 // str message
	codeClosed      byte = 3
	codeHalted      byte = 4
	codeBadRequest  byte = 5
	codeFailed      byte = 6
)

// handshakeProto names one use of the challenge-response handshake. Each
// stream kind has its own magic and MAC labels, so a transcript of one can
// never authenticate the other.
type handshakeProto struct {
	magic       string // 4 bytes, the server's first words
	clientLabel string
	serverLabel string
}

var (
	// protoForward authenticates forwarding connections ('F').
	protoForward = handshakeProto{magic: "TFW1", clientLabel: "tether-forward-v1", serverLabel: "tether-forward-v1-server"}
	// protoRaft authenticates Raft streams ('R') before they reach
	// hashicorp/raft's transport: without it, anyone who reaches the port
	// could send AppendEntries.
	protoRaft = handshakeProto{magic: "TRF1", clientLabel: "tether-raft-v1", serverLabel: "tether-raft-v1-server"}
)

func clientMAC(p handshakeProto, key, serverNonce []byte, clientID string) []byte {
	h := hmac.New(sha256.New, key)
	h.Write(serverNonce)
	h.Write([]byte(clientID))
	h.Write([]byte(p.clientLabel))
	return h.Sum(nil)
}

func serverMAC(p handshakeProto, key, clientNonce, serverNonce []byte) []byte {
	h := hmac.New(sha256.New, key)
	h.Write(clientNonce)
	h.Write(serverNonce)
	h.Write([]byte(p.serverLabel))
	return h.Sum(nil)
}

// serverHandshake authenticates a client; it returns the client's node id.
// checkID, when set, vets the claimed id once the MAC proved the key (the
// TLS identity check): its error refuses the client with that reason.
func serverHandshake(rw *bufio.ReadWriter, p handshakeProto, key []byte, checkID func(string) error) (string, error) {
	var serverNonce [nonceSize]byte
	if _, err := rand.Read(serverNonce[:]); err != nil {
		return "", fmt.Errorf("nonce: %w", err)
	}
	rw.WriteString(p.magic)
	rw.Write(serverNonce[:])
	if err := rw.Flush(); err != nil {
		return "", fmt.Errorf("send nonce: %w", err)
	}
	var idLen [2]byte
	if _, err := io.ReadFull(rw, idLen[:]); err != nil {
		return "", fmt.Errorf("read client hello: %w", err)
	}
	n := int(binary.BigEndian.Uint16(idLen[:]))
	if n == 0 || n > MaxNodeIDLen {
		refuse(rw, "bad node id length")
		return "", fmt.Errorf("%w: node id length %d", ErrAuth, n)
	}
	buf := make([]byte, n+nonceSize+macSize)
	if _, err := io.ReadFull(rw, buf); err != nil {
		return "", fmt.Errorf("read client hello: %w", err)
	}
	clientID := string(buf[:n])
	clientNonce := buf[n : n+nonceSize]
	mac := buf[n+nonceSize:]
	if !hmac.Equal(mac, clientMAC(p, key, serverNonce[:], clientID)) {
		refuse(rw, "authentication failed: wrong internal key")
		return "", fmt.Errorf("%w: client %q presented a wrong MAC", ErrAuth, clientID)
	}
	if checkID != nil {
		if err := checkID(clientID); err != nil {
			refuse(rw, err.Error())
			return "", fmt.Errorf("%w: %w", ErrAuth, err)
		}
	}
	rw.WriteByte(handshakeOK)
	rw.Write(serverMAC(p, key, clientNonce, serverNonce[:]))
	if err := rw.Flush(); err != nil {
		return "", fmt.Errorf("send handshake reply: %w", err)
	}
	return clientID, nil
}

func refuse(rw *bufio.ReadWriter, reason string) {
	if len(reason) > 1024 {
		reason = reason[:1024]
	}
	rw.WriteByte(handshakeRefused)
	var l [2]byte
	binary.BigEndian.PutUint16(l[:], uint16(len(reason)))
	rw.Write(l[:])
	rw.WriteString(reason)
	_ = rw.Flush()
}

// ClientHandshake runs the client side of the handshake of a stream of kind
// StreamRaft or StreamForward, after the kind byte was sent: what a peer
// dialing a node does (and what tests playing an intruder do).
func ClientHandshake(rw *bufio.ReadWriter, kind byte, key []byte, selfID string) error {
	p := protoForward
	if kind == StreamRaft {
		p = protoRaft
	}
	return clientHandshake(rw, p, key, selfID)
}

// clientHandshake authenticates to a server and checks the server's proof.
func clientHandshake(rw *bufio.ReadWriter, p handshakeProto, key []byte, selfID string) error {
	if len(selfID) == 0 || len(selfID) > MaxNodeIDLen {
		return fmt.Errorf("node id length %d out of range", len(selfID))
	}
	hello := make([]byte, len(p.magic)+nonceSize)
	if _, err := io.ReadFull(rw, hello); err != nil {
		return fmt.Errorf("read server hello: %w", err)
	}
	if string(hello[:len(p.magic)]) != p.magic {
		return fmt.Errorf("server hello: bad magic %q (want %q)", hello[:len(p.magic)], p.magic)
	}
	serverNonce := hello[len(p.magic):]
	var clientNonce [nonceSize]byte
	if _, err := rand.Read(clientNonce[:]); err != nil {
		return fmt.Errorf("nonce: %w", err)
	}
	var l [2]byte
	binary.BigEndian.PutUint16(l[:], uint16(len(selfID)))
	rw.Write(l[:])
	rw.WriteString(selfID)
	rw.Write(clientNonce[:])
	rw.Write(clientMAC(p, key, serverNonce, selfID))
	if err := rw.Flush(); err != nil {
		return fmt.Errorf("send client hello: %w", err)
	}
	status, err := rw.ReadByte()
	if err != nil {
		return fmt.Errorf("read handshake reply: %w", err)
	}
	switch status {
	case handshakeOK:
		proof := make([]byte, macSize)
		if _, err := io.ReadFull(rw, proof); err != nil {
			return fmt.Errorf("read server proof: %w", err)
		}
		if !hmac.Equal(proof, serverMAC(p, key, clientNonce[:], serverNonce)) {
			return fmt.Errorf("%w: the server does not hold our internal key", ErrAuth)
		}
		return nil
	case handshakeRefused:
		if _, err := io.ReadFull(rw, l[:]); err != nil {
			return fmt.Errorf("%w (no reason given)", ErrAuth)
		}
		reason := make([]byte, min(int(binary.BigEndian.Uint16(l[:])), 1024))
		_, _ = io.ReadFull(rw, reason)
		return fmt.Errorf("%w: %s", ErrAuth, reason)
	default:
		return fmt.Errorf("handshake reply: unknown status %d", status)
	}
}

func writeFrame(w *bufio.Writer, kind byte, id uint64, payload []byte) error {
	var h [frameHeaderSize]byte
	binary.BigEndian.PutUint32(h[0:4], uint32(1+8+len(payload)))
	h[4] = kind
	binary.BigEndian.PutUint64(h[5:13], id)
	if _, err := w.Write(h[:]); err != nil {
		return err
	}
	_, err := w.Write(payload)
	return err
}

func readFrame(r *bufio.Reader) (kind byte, id uint64, payload []byte, err error) {
	var h [frameHeaderSize]byte
	if _, err = io.ReadFull(r, h[:]); err != nil {
		return 0, 0, nil, err
	}
	n := binary.BigEndian.Uint32(h[0:4])
	if n < 9 || n > maxFrameSize {
		return 0, 0, nil, fmt.Errorf("frame length %d out of range [9, %d]", n, maxFrameSize)
	}
	payload, err = readN(r, int(n-9))
	if err != nil {
		return 0, 0, nil, fmt.Errorf("read frame payload: %w", err)
	}
	return h[4], binary.BigEndian.Uint64(h[5:13]), payload, nil
}

// readN reads exactly n bytes, growing its buffer as bytes arrive rather
// than trusting a length prefix with up to maxFrameSize of memory up front.
func readN(r io.Reader, n int) ([]byte, error) {
	const step = 1 << 20
	if n <= step {
		b := make([]byte, n)
		_, err := io.ReadFull(r, b)
		return b, err
	}
	b := make([]byte, 0, step)
	for len(b) < n {
		chunk := min(n-len(b), max(cap(b)-len(b), step))
		b = slices.Grow(b, chunk)
		k, err := io.ReadFull(r, b[len(b):len(b)+chunk])
		b = b[:len(b)+k]
		if err != nil {
			return nil, err
		}
	}
	return b, nil
}

// payloadErr is r's failure as the error of a payload (nil when none).
func payloadErr(r *binread.Reader) error {
	if r.Err == nil {
		return nil
	}
	return fmt.Errorf("payload %w", r.Err)
}

func appendBlob(b, v []byte) []byte {
	b = binary.AppendUvarint(b, uint64(len(v)))
	return append(b, v...)
}

func appendStr(b []byte, s string) []byte {
	b = binary.AppendUvarint(b, uint64(len(s)))
	return append(b, s...)
}

func boolByte(v bool) byte {
	if v {
		return 1
	}
	return 0
}
