package worker

import "time"

// Stages are the times one intent reached each stage of its handling, given
// to Config.OnStages after its answer: where an intent's time goes. A stage
// the intent did not reach (a replay fires nothing) is the zero time.
type Stages struct {
	// Key is the intent's operation key ("" when it was rejected before one
	// was derived).
	Key string
	// Stored is the intent's stream timestamp: when the server stored it.
	Stored time.Time
	// Delivered is when its handler started.
	Delivered time.Time
	// Claimed is when its claim (or the answer cache) answered.
	Claimed time.Time
	// Fired is when its effect returned.
	Fired time.Time
	// Recorded is when its outcome's ledger write returned.
	Recorded time.Time
	// Answered is when its answer was handed to the connection.
	Answered time.Time
}

// stage is one of the stages a job's Stages mark.
type stage int

const (
	stageDelivered stage = iota
	stageClaimed
	stageFired
	stageRecorded
)

// mark sets the time j reached stage s to now when the worker takes stage
// times (j.stages is set).
func (j *job) mark(s stage) {
	if j.stages == nil {
		return
	}
	now := time.Now()
	switch s {
	case stageDelivered:
		j.stages.Delivered = now
	case stageClaimed:
		j.stages.Claimed = now
	case stageFired:
		j.stages.Fired = now
	case stageRecorded:
		j.stages.Recorded = now
	}
}
