package fsm

import "fmt"

// UnknownEventError reports a required event type this build does not
// understand. A node that meets one halts instead of letting its state drift
// from the nodes that did apply the event.
type UnknownEventError struct {
	Type  EventType
	Index uint64 // the log index of the entry (0 when not decoding a log entry)
	// NodeLevel is the feature level the node understands (the machine's
	// cap; 0 means FeatureLevelMax).
	NodeLevel uint32
}

func (e *UnknownEventError) Error() string {
	where := "event"
	if e.Index != 0 {
		where = fmt.Sprintf("log entry %d", e.Index)
	}
	what := fmt.Sprintf("unknown required event type 0x%02x", uint8(e.Type))
	if lvl := e.Type.Level(); lvl != 0 {
		// Known to this build, but above the level this node runs at.
		what = fmt.Sprintf("required event %v (type 0x%02x, feature level %d)", e.Type, uint8(e.Type), lvl)
	}
	return fmt.Sprintf("fsm: %s holds %s; this node understands feature level %d: "+
		"upgrade it to a tether release that supports this event before it can apply the log",
		where, what, nodeLevel(e.NodeLevel))
}

// FeatureLevelError reports a ClusterFeatures event that commits a level
// above the one this node understands: the cluster now relies on events or
// apply rules this node does not have, so it halts rather than drift.
type FeatureLevelError struct {
	Index     uint64 // log index of the entry
	Level     uint32 // the committed level
	NodeLevel uint32 // what this node understands (0 means FeatureLevelMax)
}

func (e *FeatureLevelError) Error() string {
	return fmt.Sprintf("fsm: log entry %d commits cluster feature level %d; this node understands feature level %d: "+
		"upgrade it to a tether release that supports level %d before it can apply the log",
		e.Index, e.Level, nodeLevel(e.NodeLevel), e.Level)
}

func nodeLevel(l uint32) uint32 {
	if l == 0 {
		return FeatureLevelMax
	}
	return l
}

// DecodeError reports a corrupt or truncated encoding. Offset is the byte
// offset in the decoded buffer (the whole entry for DecodeEntry) where the
// problem was found; Index is the log index when the machine was applying one.
type DecodeError struct {
	Index  uint64
	Offset int
	Msg    string
}

func (e *DecodeError) Error() string {
	if e.Index != 0 {
		return fmt.Sprintf("fsm: log entry %d is corrupt at byte %d: %s", e.Index, e.Offset, e.Msg)
	}
	return fmt.Sprintf("fsm: corrupt encoding at byte %d: %s", e.Offset, e.Msg)
}
