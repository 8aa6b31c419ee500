package edge

// BackgroundPending is how many background events (overflows, links, rank
// observations, evidence) and own placements' Binds this edge has not yet
// seen through the log: queued or being proposed. Tests wait for 0 before
// they take a quiet log's index.
func (e *Edge) BackgroundPending() int { return e.recorder.Pending() + e.placements.InFlight() }
