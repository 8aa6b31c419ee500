package fsm

import "fmt"

// UnknownEventError reports a required event type this build does not
// understand. A node that meets one halts instead of letting its state drift
// from the nodes that did apply the event.
type UnknownEventError struct {
	Type  EventType
	Index uint64 // the log index of the entry (0 when not decoding a log entry)
}

func (e *UnknownEventError) Error() string {
	where := "event"
	if e.Index != 0 {
		where = fmt.Sprintf("log entry %d", e.Index)
	}
	return fmt.Sprintf("fsm: %s holds unknown required event type 0x%02x; this node understands feature level %d: "+
		"upgrade it to a tether release that supports this event before it can apply the log",
		where, uint8(e.Type), FeatureLevelMax)
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
