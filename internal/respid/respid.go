// Package respid mints and reads the response ids edges give clients of
// the Responses API. A stored response lives in the engine process that
// produced it, so a request naming it (previous_response_id, a retrieval,
// a cancel, a stream resume) must reach that process. The id the client
// sees carries the way there: the fleet, instance, rank and boot of the
// process that holds the response, the conversation it belongs to, the
// engine's own id for it, the edge that minted it and when, authenticated
// with a key derived from the cluster's internal key. Any edge reads it
// back with no state and no log lookup (edge/DESIGN.md, "Stored
// responses").
//
// Format: "resp_t1" + base64url(payload ‖ MAC), payload = version byte,
// fleet byte, flags byte (bit 0: the response continued a stored one, so
// its instance was the previous response's), then uvarints rank+1, boot id, minted (Unix ms), then
// length-prefixed strings instance, edge, conversation, upstream id; MAC =
// the first 16 bytes of HMAC-SHA256(k, payload), k = HMAC-SHA256(internal
// key, "tether response id v1"). The fields are readable by anyone who has
// the id (the client: its own conversation id, the instance name the debug
// route header also shows); only the MAC is secret.
package respid

import (
	"crypto/hmac"
	"crypto/sha256"
	"encoding/base64"
	"encoding/binary"
	"errors"
	"fmt"
	"strings"
	"time"
)

// Prefix starts every id an edge mints ("resp_" as OpenAI's and vLLM's,
// then the format's version).
const Prefix = "resp_t1"

// MaxLen bounds an id this package reads (a conversation id is at most
// 1 KiB, routing.MaxIDBytes).
const MaxLen = 4096

const (
	version = 1
	macLen  = 16
)

// ID is what a response id carries.
type ID struct {
	// Fleet is the fsm.Fleet of the instance holding the response.
	Fleet uint8
	// Instance holds the response; Rank is its data-parallel rank (-1
	// unknown); BootID the process's boot id when the instance reports one
	// (0: unknown).
	Instance string
	Rank     int
	BootID   uint64
	// Conversation is the request's conversation id ("" none).
	Conversation string
	// Upstream is the engine's own id of the response.
	Upstream string
	// Edge is the node id of the edge that minted the id; Minted when.
	Edge   string
	Minted time.Time
	// Continued: the request continued a stored response
	// (previous_response_id), so it ran where that one was stored; else
	// the edge placed it (the conversation's binding, or unbound).
	Continued bool
}

// Errors of Parse.
var (
	// ErrNotMinted: the string is not an id in this format (another
	// server's id, or garbage).
	ErrNotMinted = errors.New("not a response id minted by a tether edge")
	// ErrForged: the format is right but the MAC is not this cluster's
	// (another cluster's id, a changed internal key, or a forgery).
	ErrForged = errors.New("response id not authenticated by this cluster's internal key")
)

// ConversationPrefix starts every conversation id an edge mints (OpenAI's
// "conv_", then the format's version). A conversation of the
// Conversations API lives in the worker process that holds it, as a stored
// response does, and its id carries the way there in the same format
// (Upstream: the worker's own id of the conversation; Conversation unused),
// authenticated under a key of its own, so that no response id passes for
// a conversation id or the other way round.
const ConversationPrefix = "conv_t1"

// Codec mints and reads ids with one cluster key.
type Codec struct {
	key, convKey []byte
}

// NewCodec derives the MAC keys from the cluster's internal key (nil or
// empty: ids are checked against a fixed key, which proves nothing
// against a client that forges one; edges without an internal key say so
// at start).
func NewCodec(internalKey []byte) *Codec {
	derive := func(label string) []byte {
		m := hmac.New(sha256.New, internalKey)
		m.Write([]byte(label))
		return m.Sum(nil)
	}
	return &Codec{key: derive("tether response id v1"), convKey: derive("tether conversation id v1")}
}

// MintConversation encodes the id of a conversation.
func (c *Codec) MintConversation(id ID) string {
	id.Conversation, id.Continued = "", false
	return mint(ConversationPrefix, c.convKey, id)
}

// ParseConversation reads and authenticates a conversation id.
func (c *Codec) ParseConversation(s string) (ID, error) {
	payload, mac, err := split(ConversationPrefix, s)
	if err != nil {
		return ID{}, err
	}
	if !hmac.Equal(mac, sign(c.convKey, payload)) {
		return ID{}, ErrForged
	}
	return decode(payload)
}

// Mint encodes id.
func (c *Codec) Mint(id ID) string { return mint(Prefix, c.key, id) }

func mint(prefix string, key []byte, id ID) string {
	p := make([]byte, 0, 32+len(id.Instance)+len(id.Edge)+len(id.Conversation)+len(id.Upstream))
	var flags byte
	if id.Continued {
		flags |= 1
	}
	p = append(p, version, id.Fleet, flags)
	p = binary.AppendUvarint(p, uint64(max(id.Rank, -1)+1))
	p = binary.AppendUvarint(p, id.BootID)
	p = binary.AppendUvarint(p, uint64(max(id.Minted.UnixMilli(), 0)))
	for _, s := range []string{id.Instance, id.Edge, id.Conversation, id.Upstream} {
		p = binary.AppendUvarint(p, uint64(len(s)))
		p = append(p, s...)
	}
	p = append(p, sign(key, p)...)
	return prefix + base64.RawURLEncoding.EncodeToString(p)
}

func sign(key, payload []byte) []byte {
	m := hmac.New(sha256.New, key)
	m.Write(payload)
	return m.Sum(nil)[:macLen]
}

// Parse reads and authenticates an id.
func (c *Codec) Parse(s string) (ID, error) {
	payload, mac, err := split(Prefix, s)
	if err != nil {
		return ID{}, err
	}
	if !hmac.Equal(mac, sign(c.key, payload)) {
		return ID{}, ErrForged
	}
	return decode(payload)
}

// Decode reads an id without authenticating it (tether audit explain,
// which may not hold the key): every field is as the id says, not proven.
func Decode(s string) (ID, error) {
	payload, _, err := split(Prefix, s)
	if err != nil {
		return ID{}, err
	}
	return decode(payload)
}

// DecodeConversation reads a conversation id without authenticating it.
func DecodeConversation(s string) (ID, error) {
	payload, _, err := split(ConversationPrefix, s)
	if err != nil {
		return ID{}, err
	}
	return decode(payload)
}

// Minted reports whether s has this package's format (it may still fail
// to parse or authenticate).
func Minted(s string) bool { return strings.HasPrefix(s, Prefix) }

func split(prefix, s string) (payload, mac []byte, err error) {
	enc, ok := strings.CutPrefix(s, prefix)
	if !ok || len(s) > MaxLen {
		return nil, nil, ErrNotMinted
	}
	raw, err := base64.RawURLEncoding.DecodeString(enc)
	if err != nil || len(raw) < macLen+3 {
		return nil, nil, ErrNotMinted
	}
	return raw[:len(raw)-macLen], raw[len(raw)-macLen:], nil
}

func decode(p []byte) (ID, error) {
	if p[0] != version {
		return ID{}, fmt.Errorf("%w: version %d", ErrNotMinted, p[0])
	}
	if p[2]&^1 != 0 {
		return ID{}, ErrNotMinted
	}
	id := ID{Fleet: p[1], Continued: p[2]&1 != 0}
	p = p[3:]
	var nums [3]uint64
	for i := range nums {
		v, n := binary.Uvarint(p)
		if n <= 0 {
			return ID{}, ErrNotMinted
		}
		nums[i], p = v, p[n:]
	}
	if nums[0] > 1<<31 || nums[2] > 1<<62 {
		return ID{}, ErrNotMinted
	}
	id.Rank, id.BootID, id.Minted = int(nums[0])-1, nums[1], time.UnixMilli(int64(nums[2]))
	var strs [4]string
	for i := range strs {
		l, n := binary.Uvarint(p)
		if n <= 0 || l > uint64(len(p)-n) {
			return ID{}, ErrNotMinted
		}
		strs[i], p = string(p[n:n+int(l)]), p[n+int(l):]
	}
	if len(p) != 0 || strs[0] == "" || strs[3] == "" {
		return ID{}, ErrNotMinted
	}
	id.Instance, id.Edge, id.Conversation, id.Upstream = strs[0], strs[1], strs[2], strs[3]
	return id, nil
}
