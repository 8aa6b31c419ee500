package archive

import "github.com/tether-project/tether/fsm"

// KeyEvent is one proposal of an archived entry that concerns a binding:
// its event names the key, or its apply evicted the key's binding. It is
// the one walk over a key's records that the admin API's history and the
// audit's explain build on.
type KeyEvent struct {
	Index    uint64
	Time     int64 // log time, unix nanoseconds
	Proposal fsm.RawProposal
	// Outcome is what applying the proposal did (Status 0: not recorded).
	Outcome Outcome
	// Names: the event names the key (fsm.EventKeys).
	Names bool
	// Evicted is the key's binding the apply removed, if it did.
	Evicted *fsm.Evicted
	// Err: the record's entry did not decode; only Index, Time and Err are
	// set.
	Err error
}

// KeyEvents lists, in log order, the proposals of recs (a key's records,
// from History) that concern (f, key), one per proposal, and one with Err
// set for a record that does not decode.
func KeyEvents(recs []Record, f fsm.Fleet, key string) []KeyEvent {
	var out []KeyEvent
	for _, r := range recs {
		props, err := r.Proposals()
		if err != nil {
			out = append(out, KeyEvent{Index: r.Index, Time: r.Time, Err: err})
			continue
		}
		for i, p := range props {
			ke := KeyEvent{Index: r.Index, Time: r.Time, Proposal: p}
			if i < len(r.Outcomes) {
				ke.Outcome = r.Outcomes[i]
			}
			if p.Event != nil {
				for _, k := range fsm.EventKeys(p.Event) {
					if k.Fleet == f && k.Key == key {
						ke.Names = true
						break
					}
				}
			}
			for j := range ke.Outcome.Evicted {
				if e := &ke.Outcome.Evicted[j]; e.Fleet == f && e.Key == key {
					ke.Evicted = e
				}
			}
			if ke.Names || ke.Evicted != nil {
				out = append(out, ke)
			}
		}
	}
	return out
}
